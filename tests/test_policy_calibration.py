"""Calibrated intervals of a policy's value (`edgetwin.twin.policy_calibration`).

The coverage test uses the confounded system of tests/test_causal_twin.py, where every policy's
value is known in closed form: a latency-like reward ``y = 3 + β·a + γ·u + 0.5·s + ε`` of a knob
``a``, a logged state ``s`` and a hidden load ``u`` that the production scheduler sees (it raises
the knob with the load) and the log does not; 10 % of the rows are a randomized canary arm. The causal
response model is fitted on the log; its bare interval of an unseen policy's value (the spread over
evaluation days) misses the real value almost always, the interval calibrated on the logged
policies' cross-fitted values covers it at least at the level its 10 calibration days support (90 %).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest
from test_causal_twin import one_torch_thread  # noqa: F401  (an autouse fixture: one torch thread here too)

from edgetwin.imitation.causal import INVARIANCE, CausalResponseModel
from edgetwin.twin.intervals import interval
from edgetwin.twin.policy_calibration import (
    LoggedActions,
    cross_fitted_policy_values,
    episode_folds,
    logged_policy_values,
    policy_value_calibration,
)

BETA, GAMMA = -1.0, 2.0


def confounded_days(days: int, n: int, seed: int, share_random: float = 0.1) -> pd.DataFrame:
    """``days`` episodes of ``n`` rows: ``episode``, ``policy``, ``s``, ``a`` and the ``reward`` y."""
    rng = np.random.default_rng(seed)
    out = []
    for d in range(days):
        s, u = rng.standard_normal(n), rng.standard_normal(n)
        a = np.clip(0.5 + 0.25 * u + 0.05 * s + 0.05 * rng.standard_normal(n), 0.0, 1.0)
        arm = rng.random(n) < share_random
        a[arm] = rng.uniform(0.0, 1.0, int(arm.sum()))
        y = 3.0 + BETA * a + GAMMA * u + 0.5 * s + 0.1 * rng.standard_normal(n)
        out.append(pd.DataFrame({"episode": d, "policy": np.where(arm, "canary", "production"), "s": s, "a": a,
                                 "reward": y}))
    return pd.concat(out, ignore_index=True)


def causal_fit(seed: int) -> Callable[[pd.DataFrame], CausalResponseModel]:
    def fit(rows: pd.DataFrame) -> CausalResponseModel:
        x, y = rows[["s", "a"]].to_numpy(), rows[["reward"]].to_numpy()
        return CausalResponseModel((16, 16), invariance=INVARIANCE, steps=150, seed=seed).fit(x, y, rows["policy"].to_numpy())

    return fit


def model_values(model: CausalResponseModel, rows: pd.DataFrame) -> pd.DataFrame:
    """The model's value of each (day, logged policy) with its logged actions, beside the logged one."""
    g = rows.assign(est=model.mean(rows[["s", "a"]].to_numpy())[:, 0]).groupby(["episode", "policy"])
    return pd.DataFrame({"estimate": g["est"].mean(), "truth": g["reward"].mean(), "rows": g.size()}).reset_index()


#: unseen policies of the knob: three constants and one that reads the logged state
UNSEEN = {
    "0.2": lambda s: np.full_like(s, 0.2),
    "0.5": lambda s: np.full_like(s, 0.5),
    "0.8": lambda s: np.full_like(s, 0.8),
    "against the state": lambda s: np.clip(0.5 - 0.2 * s, 0.0, 1.0),
}


def test_calibrated_value_intervals_cover_unseen_policies_at_their_level_uncalibrated_do_not() -> None:
    hits, plain, levels = [], [], []
    for seed in range(6):
        log = confounded_days(10, 300, seed)
        units = cross_fitted_policy_values(causal_fit(seed), log, folds=2, values=model_values)
        assert set(units["fold"]) == {0, 1} and set(units["policy"]) == {"canary", "production"}
        cal = policy_value_calibration(units)
        levels.append(cal.attained("reward"))
        model = causal_fit(seed)(log)
        s = np.random.default_rng(1000 + seed).standard_normal((4, 300))  # 4 evaluation days
        for pi in UNSEEN.values():
            v = np.array([model.mean(np.stack([d, pi(d)], 1))[:, 0].mean() for d in s])[None, :]
            truth = float(np.mean(3.0 + BETA * pi(s) + 0.5 * s))  # E[y | do(a = π(s))] on these days
            lo, hi = interval(v, cal, "reward")
            lo0, hi0 = interval(v, None, "reward")
            hits.append(lo <= truth <= hi)
            plain.append(lo0 <= truth <= hi0)
    assert levels == [0.9] * 6  # 10 independent days support 90 %
    assert np.mean(hits) >= 0.9, np.mean(hits)
    assert np.mean(plain) <= 0.3, np.mean(plain)  # the failure the calibration fixes


def test_episode_folds_hold_out_every_episode_once() -> None:
    folds = episode_folds(["d0", "d1", "d2", "d3", "d4"], 2)
    held = [e for _, h in folds for e in h]
    assert sorted(held) == ["d0", "d1", "d2", "d3", "d4"]
    for train, h in folds:
        assert not set(train) & set(h) and set(train) | set(h) == {"d0", "d1", "d2", "d3", "d4"}
    with pytest.raises(ValueError):
        episode_folds(["d0"], 2)


def test_one_score_per_independent_day_and_the_level_it_supports() -> None:
    """Units of one day are one score (their largest error); 3 days support 75 %, not 90 %; a zero
    estimate under a nonzero truth is an infinite score, never dropped."""
    units = pd.DataFrame({
        "episode": [0, 0, 1, 2], "policy": ["p", "arm", "p", "p"],
        "estimate": [1.0, 2.0, 1.0, 1.0], "truth": [1.1, 3.0, 0.95, 1.0],
    })
    cal = policy_value_calibration(units)
    assert cal.scores["reward"] == pytest.approx([0.5, 0.05, 0.0])
    assert cal.n_independent["reward"] == 3 and not cal.exact["reward"]
    assert cal.quantile["reward"] == pytest.approx(0.5) and cal.attained("reward") == pytest.approx(0.75)
    assert cal.method == "relative" and "2 logged policies" in cal.source
    lo, hi = interval(np.array([[2.0, 2.0]]), cal, "reward")
    assert (lo, hi) == pytest.approx((1.0, 3.0))
    inf = policy_value_calibration(units.assign(estimate=[0.0, 2.0, 1.0, 1.0]))
    assert inf.quantile["reward"] == np.inf and inf.problem("reward")


def test_logged_policy_values_replay_the_logged_actions_of_each_policy() -> None:
    """On a twin of a small cluster log with a randomized arm: the replay answers every tick with the
    logged actions, and there is one unit per (day, policy) with the logged mean as its truth."""
    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import Regime, generate_logs
    from edgetwin.twin.fidelity import logged_rollout
    from edgetwin.twin.twin import Twin
    from edgetwin.twin.whatif.replay import logged_episodes

    regimes = [Regime("heuristic", 1, noise=0.1), Regime("heuristic", 1, noise=0.1, arms={"r": "random"}, arm_share=0.5)]
    log, spec = generate_logs(ClusterConfig(n_agents=8, steps=6), regimes=regimes, seed=0)
    twin = Twin.fit(log, spec, members=2, progress=False, population_model="empirical", response_model="supervised",
                    bc_epochs=1, bc_max_steps=20)
    ep = logged_episodes(log, twin)[1]
    sim = logged_rollout(twin, LoggedActions(ep.action), log[log["episode"].astype(str) == ep.name], all_members=True)
    acts = [c for c in log.columns if c.startswith("action.")]
    key = ["t", "agent"]
    for m in (0, 1):
        got = sim[sim["episode"] == f"{ep.name}-m{m}"].sort_values(key)[acts].to_numpy()
        want = log[log["episode"].astype(str) == ep.name].assign(agent=lambda d: d["agent"].astype(str)).sort_values(key)[acts]
        np.testing.assert_allclose(got, want.to_numpy(), atol=1e-6)
    units = logged_policy_values(twin, log)
    assert len(units) == len(log.groupby(["episode", "policy"]))
    real = log.assign(episode=log["episode"].astype(str)).groupby(["episode", "policy"])["reward"].mean()
    for _, u in units.iterrows():
        assert u["truth"] == pytest.approx(real[(u["episode"], u["policy"])]) and np.isfinite(u["estimate"])
