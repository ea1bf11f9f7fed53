"""The causal fit's cost (issue 47): its invariance weight chosen once per scenario for every member,
the cross-fitting's λ trained side by side as one stack, tanh by numpy in training — the same model
as before, up to float rounding, and the same twin serially and on a process pool."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch as th

from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import Regime, generate_logs
from edgetwin.imitation import causal
from edgetwin.imitation.causal import CausalResponseModel, InvarianceChoice, choose_invariance
from edgetwin.twin.twin import Twin

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_parallel import twin_content  # noqa: E402

FIT = {"members": 2, "rounds": 1, "bc_epochs": 1, "bc_max_steps": 20, "population_model": "empirical", "progress": False,
       "response_model": "causal"}


@pytest.fixture(autouse=True)
def one_torch_thread() -> Any:
    before = th.get_num_threads()
    th.set_num_threads(1)
    yield
    th.set_num_threads(before)


@pytest.fixture(scope="module")
def two_policies() -> tuple[Any, Any]:
    regimes = [Regime("heuristic", 2, noise=0.1), Regime("heuristic", 1, noise=0.1, arms={"r": "random"}, arm_share=0.3)]
    return generate_logs(ClusterConfig(n_agents=16, steps=8), regimes=regimes, seed=0)


def toy(n: int = 900, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3)).astype(np.float32)
    y = (x @ rng.standard_normal((3, 2)) + 0.3 * rng.standard_normal((n, 2))).astype(np.float32)
    return x, y, np.where(rng.random(n) < 0.2, 1, 0)


def test_the_stacked_fits_are_the_fits_one_at_a_time() -> None:
    """Each λ of a stack gets its own gradient and its own Adam state: the stack's nets are the
    nets fitted alone (to float rounding), and they differ from each other (λ matters)."""
    x, y, codes = toy()
    model = CausalResponseModel((16,), steps=60, batch=256, seed=3)
    stacked = model._train_stack(x, y, codes, (0.0, 30.0), 60, 256)
    alone = [model._train_stack(x, y, codes, (lam,), 60, 256)[0] for lam in (0.0, 30.0)]
    with th.no_grad():
        for a, b in zip(stacked, alone, strict=True):
            np.testing.assert_allclose(a(th.from_numpy(x)).numpy(), b(th.from_numpy(x)).numpy(), atol=2e-4)
        assert float((stacked[0](th.from_numpy(x)) - stacked[1](th.from_numpy(x))).abs().max()) > 1e-3


def test_a_given_choice_is_used_and_equals_choosing_it_here() -> None:
    """`choose_invariance` then `fit(chosen=...)` is `fit` choosing it itself: the same λ, held-out
    errors and net."""
    x, y, codes = toy(600, seed=1)
    itself = CausalResponseModel((8,), steps=40, seed=2).fit(x, y, codes)
    given = choose_invariance(x, y, codes, None, (8,), steps=40, seed=2)
    other = CausalResponseModel((8,), steps=40, seed=2).fit(x, y, codes, chosen=given)
    assert other.chosen == itself.chosen == given.invariance and other.cv_errors == itself.cv_errors
    assert np.array_equal(other.mean(x), itself.mean(x))
    forced = CausalResponseModel((8,), steps=40, seed=2).fit(x, y, codes, chosen=InvarianceChoice(300.0, {}, {}))
    assert forced.chosen == 300.0 and not np.array_equal(forced.mean(x), itself.mean(x))


def test_the_twin_chooses_the_invariance_once_per_scenario(two_policies: tuple[Any, Any], monkeypatch: Any) -> None:
    df, spec = two_policies
    calls: list[int] = []
    real = causal.select_invariance

    def counted(*a: Any, **k: Any) -> float:
        calls.append(len(a[1]))
        return real(*a, **k)

    monkeypatch.setattr(causal, "select_invariance", counted)
    twin = Twin.fit(df, spec, seed=0, **FIT)
    scenarios = len(twin.layout.scenarios)
    assert len(calls) == scenarios  # not members x scenarios
    for s in range(scenarios):
        chosen = {(m.clients[s].chosen, tuple(sorted(m.clients[s].cv_errors.items()))) for m in twin.members}
        assert len(chosen) == 1  # every member fits at the one choice
    # the members still differ (their bootstrap draws and seeds)
    a, b = (m.clients[0].mean(np.zeros((1, twin.members[0].clients[0].net[0].in_features), np.float32)) for m in twin.members)
    assert not np.array_equal(a, b)


@pytest.mark.slow  # two twins of 600-step causal fits and a pool start: ~1 min of CPU
def test_the_same_causal_twin_serially_and_on_a_pool(two_policies: tuple[Any, Any], tmp_path: Path) -> None:
    df, spec = two_policies
    fit = {**FIT, "population_model": "gan-smmsg", "population_hyper": {"steps": 20}}
    serial = Twin.fit(df, spec, seed=5, workers=1, **fit).save(tmp_path / "serial")
    pooled = Twin.fit(df, spec, seed=5, workers=2, **fit).save(tmp_path / "pool")
    assert twin_content(serial) == twin_content(pooled)
