"""A twin not fooled by the scheduler that wrote its logs, on a system whose effect is known.

The system: a latency ``y = β·a + γ·u + 0.5·s + ε`` of a knob ``a ∈ [0, 1]`` (β = -1: the knob helps),
a logged state ``s`` and a hidden load ``u`` (γ = 2) that the production scheduler sees and the log
does not: it raises the knob when the load is high (``a = 0.5 + 0.25·u + 0.05·s`` plus 5 % noise),
so in its rows a high knob goes with high latency. A share of the service groups is on a randomized
arm (``a`` uniform). The true effect of moving the knob from 0.2 to 0.8 is ``0.6·β``, in closed form.
Today's one-step regression (`SupervisedResponseModel`) reads the habit as the law (a positive
effect: the wrong sign); the causal model gets β within 0.3.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd
import pytest
import torch as th

from edgetwin.contract.policy import FunctionPolicy, NoisyPolicy
from edgetwin.contract.spec import Feature, TwinSpec
from edgetwin.imitation.baselines import SupervisedResponseModel
from edgetwin.imitation.causal import INVARIANCE, CausalResponseModel

BETA, GAMMA = -1.0, 2.0
TOLERANCE = 0.3  # on β, whose scale is 1; today's error is above 5


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Small full-batch fits: one thread is ~15x faster than two on a shared 2-core machine."""
    before = th.get_num_threads()
    th.set_num_threads(1)
    yield
    th.set_num_threads(before)


def confounded_log(n: int, share_random: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``x = [s, a] (n, 2)``, ``y (n, 1)`` and the policy of each row."""
    rng = np.random.default_rng(seed)
    s, u = rng.standard_normal(n), rng.standard_normal(n)
    spec = TwinSpec((Feature("state.s"), Feature("state.u"), Feature("action.a", low=0.0, high=1.0)))
    production = NoisyPolicy(FunctionPolicy(lambda o: 0.5 + 0.25 * o[:, [1]] + 0.05 * o[:, [0]]), spec, 0.05, seed=seed)
    a = production.act(np.stack([s, u], 1))[:, 0]
    arm = rng.random(n) < share_random
    a[arm] = rng.uniform(0.0, 1.0, int(arm.sum()))
    y = BETA * a + GAMMA * u + 0.5 * s + 0.1 * rng.standard_normal(n)
    return np.stack([s, a], 1), y[:, None], np.where(arm, "canary", "production")


def effect(model: object, s: np.ndarray) -> float:
    """The model's average slope of y in the knob between 0.2 and 0.8 (the truth: β)."""
    hi = model.mean(np.stack([s, np.full_like(s, 0.8)], 1))  # type: ignore[attr-defined]
    lo = model.mean(np.stack([s, np.full_like(s, 0.2)], 1))  # type: ignore[attr-defined]
    return float((hi - lo).mean()) / 0.6


@pytest.mark.parametrize("seed", [0, 1])
def test_causal_model_learns_the_effect_today_learns_the_habit(seed: int) -> None:
    x, y, policy = confounded_log(6000, share_random=0.1, seed=seed)
    today = SupervisedResponseModel((32, 32), seed=seed).fit(x, y)
    causal = CausalResponseModel((32, 32), invariance=INVARIANCE, steps=250, seed=seed).fit(x, y, policy)
    assert effect(today, x[:, 0]) > 0  # the sign is wrong: the habit, read as a law
    assert abs(effect(causal, x[:, 0]) - BETA) < TOLERANCE
    # the invariance holds: both policies' residuals have the same spread
    r = y - causal.mean(x)
    sd = [r[policy == p].std() for p in ("canary", "production")]
    assert abs(np.log(sd[0] / sd[1])) < 0.1


def unconfounded_log(n: int, share_random: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same knob (``β = -1``), no hidden load: production decides from the logged state only
    (``a = 0.2 + 0.1·s`` plus noise), so one-step regression is consistent; the noise grows with the
    knob (sd ``0.1 + 1.5·a``), so the randomized arm's residuals are legitimately wider than
    production's and asking them to be alike (a large λ) is a wrong assumption here."""
    rng = np.random.default_rng(seed)
    s = rng.standard_normal(n)
    a = np.clip(0.2 + 0.1 * s + 0.05 * rng.standard_normal(n), 0.0, 1.0)
    arm = rng.random(n) < share_random
    a[arm] = rng.uniform(0.0, 1.0, int(arm.sum()))
    y = BETA * a + 0.5 * s + (0.1 + 1.5 * a) * rng.standard_normal(n)
    return np.stack([s, a], 1), y[:, None], np.where(arm, "canary", "production")


def test_cross_fitted_invariance_is_strong_under_hidden_confounding() -> None:
    """``invariance="cv"`` (the default) chooses λ from the log alone: on the confounded system the
    unpenalised fit predicts the randomized arm worst (held-out), the strong penalty is within the
    noise of the best and the most invariant, so it is chosen and the effect is right."""
    x, y, policy = confounded_log(4000, share_random=0.1, seed=0)
    causal = CausalResponseModel((32, 32), steps=250, seed=0).fit(x, y, policy)
    assert causal.chosen >= 30 and causal.cv_errors[0.0] > causal.cv_errors[causal.chosen]
    assert abs(effect(causal, x[:, 0]) - BETA) < TOLERANCE


@pytest.mark.slow  # the default run's 10-minute budget; the invariance test stays in the default run: test_cross_fitted_invariance_is_strong_under_hidden_confounding
def test_cross_fitted_invariance_stays_weak_without_hidden_confounding() -> None:
    """Where the policies decided from the logged state only and the noise depends on the action,
    a strong penalty distorts the fit (held-out error twice the unpenalised one's): the choice
    is a weak λ (≤ 3) and the effect is regression's, right within the tolerance."""
    x, y, policy = unconfounded_log(4000, share_random=0.1, seed=0)
    causal = CausalResponseModel((32, 32), steps=250, seed=0).fit(x, y, policy)
    assert causal.cv_errors[300.0] > 1.5 * causal.cv_errors[0.0]
    assert causal.chosen <= 3.0
    assert abs(effect(causal, x[:, 0]) - BETA) < TOLERANCE


def test_cross_fitted_folds_keep_groups_together() -> None:
    """Rows of one group (an agent's day) are never split between training and held-out folds:
    with every row of a policy in one group, that policy has nothing held out of its own group,
    and the choice still runs and is deterministic."""
    x, y, policy = confounded_log(600, share_random=0.3, seed=2)
    groups = np.arange(600) // 50
    a = CausalResponseModel((8,), steps=30, seed=1).fit(x, y, policy, groups=groups)
    b = CausalResponseModel((8,), steps=30, seed=1).fit(x, y, policy, groups=groups)
    assert a.chosen == b.chosen and a.cv_errors == b.cv_errors and set(a.cv_errors) == {0.0, 3.0, 30.0, 300.0}
    assert np.array_equal(a.mean(x), b.mean(x))


def test_with_one_policy_it_is_plain_regression_and_cannot_tell() -> None:
    """Without a second policy there is nothing to be invariant across: the habit stays (and the
    overlap report is what says so, see test_overlap_*)."""
    x, y, policy = confounded_log(3000, share_random=0.0, seed=0)
    causal = CausalResponseModel((32, 32), steps=300, seed=0).fit(x, y, policy)
    assert causal.history[-1][1] == 0.0 and effect(causal, x[:, 0]) > 0
    assert causal.chosen == 0.0 and causal.cv_errors == {}  # nothing to cross-fit across


def test_deterministic_given_the_seed() -> None:
    x, y, policy = confounded_log(1000, share_random=0.2, seed=3)
    a = CausalResponseModel((16,), steps=50, seed=4).fit(x, y, policy).mean(x)
    b = CausalResponseModel((16,), steps=50, seed=4).fit(x, y, policy).mean(x)
    c = CausalResponseModel((16,), steps=50, seed=5).fit(x, y, policy).mean(x)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_twin_fit_chooses_the_causal_model_when_the_logs_allow_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two logged policies with overlap: ``Twin.fit(response_model="auto")`` picks the causal response
    model, the overlap report is in the twin's meta, and the twin saves (as data), loads and rolls out
    exactly as before saving."""
    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import Regime, SLOAwarePolicy, generate_logs
    from edgetwin.twin.twin import Twin

    regimes = [Regime("heuristic", 2, noise=0.1), Regime("heuristic", 1, noise=0.1, arms={"r": "random"}, arm_share=0.3)]
    log, spec = generate_logs(ClusterConfig(n_agents=16, steps=8), regimes=regimes, seed=0)
    twin = Twin.fit(log, spec, members=1, progress=False, population_model="empirical", bc_epochs=1, bc_max_steps=20,
                    response_model="auto")
    assert twin.meta["response_model"] == "causal"
    assert twin.meta["overlap"]["verdict"] == "some" and set(twin.meta["overlap"]["policies"]) == {
        "heuristic+noise0.1",
        "r",
    }
    assert all(isinstance(c, CausalResponseModel) for c in twin.members[0].clients.values())
    again = Twin.load(twin.save(tmp_path / "twin"))
    assert sorted(p.name for p in (tmp_path / "twin").rglob("client_*")) and not list((tmp_path / "twin").rglob("*.pkl"))
    df = again.rollout(SLOAwarePolicy(spec), episodes=1, seed=0)
    assert len(df) and np.isfinite(df["reward"]).all()
    pd.testing.assert_frame_equal(df, twin.rollout(SLOAwarePolicy(spec), episodes=1, seed=0))
