"""Behaviour cloning's budget on large logs (issue 22): a cap on gradient steps, and a leaner loss.

A fit of ``bc_epochs`` passes costs rows x epochs; `MailConfig.bc_max_steps` caps each behaviour-
cloning fit's gradient steps so that a million-row log does not cost 35 times a 29k-row one. These
tests count the optimiser's real steps (a global post-step hook), check that a cap above a fit's
size changes nothing (the tests' and quick benchmarks' fits stay bit-identical), and that
`NeglogpLoss` trains the same weights as imitation's own loss calculator.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from imitation.algorithms import bc
from torch.optim.optimizer import register_optimizer_step_post_hook

import edgetwin.imitation.mail as mail
from edgetwin.imitation.layout import Layout
from edgetwin.imitation.mail import MailConfig, bc_steps, behaviour_clone, fit_engines, gaussian_policy
from edgetwin.imitation.steps import build_steps
from tests.test_imitation import toy_log, toy_spec

torch.set_num_threads(1)


@contextmanager
def counted_steps() -> Iterator[list[int]]:
    """Counts every optimiser step taken inside the block (any optimiser)."""
    count = [0]

    def hook(*_: object) -> None:
        count[0] += 1

    handle = register_optimizer_step_post_hook(hook)
    try:
        yield count
    finally:
        handle.remove()


def data(n: int = 1500, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 6)).astype(np.float32)
    y = np.stack([np.tanh(x[:, 0]) + 0.5 * x[:, 1], x[:, 2] * x[:, 3]], 1).astype(np.float32)
    return x, y + 0.1 * rng.standard_normal(y.shape).astype(np.float32)


def weights(pol: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in pol.parameters()]


def fit(x: np.ndarray, y: np.ndarray, epochs: int, max_steps: int | None) -> tuple[list[torch.Tensor], int, dict]:
    torch.manual_seed(0)
    pol = gaussian_policy(x.shape[1], y.shape[1], [16, 16])
    with counted_steps() as n:
        res = behaviour_clone(x, y, pol, epochs, seed=0, max_steps=max_steps)
    return weights(pol), n[0], res


def test_bc_steps_counts_full_batches_and_applies_the_cap() -> None:
    assert bc_steps(1500, 4, 256) == 4 * 5  # the partial last batch is dropped
    assert bc_steps(1500, 4, 256, max_steps=7) == 7
    assert bc_steps(1500, 4, 256, max_steps=0) == 20  # 0: no cap
    assert bc_steps(1500, 0, 256) == 5  # at least one pass
    assert bc_steps(100, 3, 256) == 3  # fewer rows than a batch: one batch per pass
    # the default cap leaves 20 epochs alone up to 64,000 rows of a scenario and binds above
    cap = MailConfig().bc_max_steps
    assert bc_steps(64_000, 20, 256, cap) == 20 * 250
    assert bc_steps(1_000_000, 20, 256, cap) == cap


def test_a_cap_below_the_epochs_budget_takes_exactly_that_many_optimiser_steps() -> None:
    x, y = data()
    w_full, n_full, r_full = fit(x, y, epochs=4, max_steps=None)
    w_cap, n_cap, r_cap = fit(x, y, epochs=4, max_steps=7)
    assert (n_full, r_full["steps"]) == (20, 20)
    assert (n_cap, r_cap["steps"]) == (7, 7)
    assert any(not torch.equal(a, b) for a, b in zip(w_full, w_cap, strict=True))
    # a cap spanning a partial pass: one full pass (5 batches) and 3 batches of the next
    assert fit(x, y, epochs=4, max_steps=8)[1] == 8


def test_a_cap_at_or_above_the_epochs_budget_changes_nothing() -> None:
    x, y = data()
    w_none, n_none, _ = fit(x, y, epochs=3, max_steps=None)
    for cap in (15, MailConfig().bc_max_steps):
        w, n, _ = fit(x, y, epochs=3, max_steps=cap)
        assert n == n_none == 15
        assert all(torch.equal(a, b) for a, b in zip(w_none, w, strict=True))


def test_the_cap_reaches_every_behaviour_cloning_fit_of_a_twin() -> None:
    df, spec = toy_log(episodes=6), toy_spec()
    lay = Layout.fit(df, spec)
    st = build_steps(df, lay)
    with counted_steps() as n:
        fit_engines(st, lay, MailConfig(bc_epochs=50, bc_max_steps=3), seed=0)
    assert n[0] == 3 * len(lay.scenarios)
    with counted_steps() as n:
        fit_engines(st, lay, MailConfig(bc_epochs=2, bc_max_steps=3), seed=0)
    per_scenario = [bc_steps(len(st.rows(s)), 2, 256) for s in range(len(lay.scenarios))]
    assert n[0] == sum(min(3, k) for k in per_scenario)


def test_the_lean_loss_trains_the_same_weights_as_imitations(monkeypatch) -> None:
    x, y = data(n=2000, seed=3)
    w_lean, _, r_lean = fit(x, y, epochs=3, max_steps=None)
    monkeypatch.setattr(mail, "NeglogpLoss", lambda: bc.BehaviorCloningLossCalculator(ent_weight=0.0, l2_weight=0.0))
    w_imit, _, r_imit = fit(x, y, epochs=3, max_steps=None)
    assert all(torch.equal(a, b) for a, b in zip(w_lean, w_imit, strict=True))
    assert r_lean == r_imit
