"""Constrained training (issue 44): the operator's margins as constraints, by Lagrange multipliers.

On the offload toy system of tests/test_policies.py the reward *is* the offload share; a constraint
that offload stay at the logging policy's mean (``lower`` is better, margin 0) therefore opposes the
reward head-on. PPO-Lagrangian must (1) raise the multiplier while the constraint is violated, (2)
leave the multiplier of a slack constraint at 0, and (3) end with a policy that keeps the
constrained KPI nearer its limit than the same PPO trained on the reward alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_policies import SPEC, TINY, TWIN_OPTS, offload_log

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import Feature, TwinSpec
from edgetwin.policies.evaluate import KpiColumns, TwinSystem, evaluate_policy
from edgetwin.policies.export import load_policy
from edgetwin.policies.lagrangian import KPIConstraint, LagrangianReward, constraints_from_log
from edgetwin.policies.train import TrainConfig, train_policy
from edgetwin.twin.twin import Twin


@pytest.fixture(scope="module")
def log():
    return offload_log()


@pytest.fixture(scope="module")
def twin(log) -> Twin:
    return Twin.fit(log, SPEC, members=1, seed=0, progress=False, population_model="empirical", **TINY)


def mean_offload(policy_dir: Path, twin: Twin) -> float:
    got = evaluate_policy(load_policy(policy_dir), TwinSystem(twin, n_agents=32, steps=8, stochastic=False),
                          episodes=4, seed=1, kpis=KpiColumns(offload="response.offload"))  # fmt: skip
    return float(got.mean["offload_ratio"])


def test_the_reward_is_penalised_by_the_multipliers_and_records_violations() -> None:
    c = KPIConstraint("kpi.latency", 10.0, higher_is_better=False)
    r = LagrangianReward(lambda cols: np.ones(len(cols["kpi.latency"])), [c], lambdas=[2.0])
    got = r({"kpi.latency": np.array([10.0, 15.0, 5.0])})
    np.testing.assert_allclose(got, [1.0, 1.0 - 2.0 * 0.5, 1.0 + 2.0 * 0.5])
    np.testing.assert_allclose(r.take_mean_violation(), [0.0])
    assert r.take_mean_violation() is None
    high = KPIConstraint("kpi.revenue", 10.0, higher_is_better=True)
    np.testing.assert_allclose(high.violation(np.array([8.0, 12.0])), [0.2, -0.2])


def test_constraints_come_from_the_spec_margins_and_the_logs_means(log) -> None:
    spec = TwinSpec(tuple(Feature(f.name, f.kind, f.low, f.high, better="lower" if f.name == "kpi.latency" else None,
                                  margin=0.1 if f.name == "kpi.latency" else None) for f in SPEC.features),
                    reward_weights=dict(SPEC.reward_weights))  # fmt: skip
    (c,) = constraints_from_log(spec, log)
    assert c.column == "kpi.latency" and not c.higher_is_better
    assert c.limit == pytest.approx(log["kpi.latency"].mean() * 1.1)
    with pytest.raises(InputError, match="declares no KPI direction"):
        constraints_from_log(SPEC, log)


def test_ppo_lagrangian_holds_a_kpi_the_reward_would_give_away(twin: Twin, log, tmp_path: Path) -> None:
    base = float(log["response.offload"].mean())
    held = KPIConstraint("response.offload", base, higher_is_better=False)  # the reward pushes it up
    slack = KPIConstraint("kpi.latency", 1e6, higher_is_better=False)  # never binding
    common = TrainConfig(steps=4096, seed=0, checkpoint_every=0, resume=False, twin_opts=TWIN_OPTS)
    free = train_policy(twin, common, out=tmp_path / "free")
    res = train_policy(twin, common, out=tmp_path / "held", constraints=[held, slack], dual_lr=2.0)
    info = {d["column"]: d for d in res.metadata["constraints"]}
    assert info["response.offload"]["lambda"] > 0.0
    assert info["kpi.latency"]["lambda"] == 0.0
    free_off, held_off = mean_offload(free.path, twin), mean_offload(tmp_path / "held", twin)
    assert free_off > base, (free_off, base)  # unconstrained PPO gives the KPI away
    assert abs(held_off - base) < abs(free_off - base), (held_off, free_off, base)


def test_a_validation_envs_scorer_penalises_alike_and_records_nothing() -> None:
    """Early stopping scores validation steps with the penalised reward; those steps must not enter
    the dual update, which is about the training rollouts."""
    c = KPIConstraint("kpi.latency", 10.0, higher_is_better=False)
    r = LagrangianReward(lambda cols: np.zeros(len(cols["kpi.latency"])), [c], lambdas=[1.0])
    cols = {"kpi.latency": np.array([20.0, 5.0])}
    np.testing.assert_allclose(r.scorer()(cols), [-1.0, 0.5])
    assert r.take_mean_violation() is None
    np.testing.assert_allclose(r(cols), [-1.0, 0.5])
    np.testing.assert_allclose(r.take_mean_violation(), [0.25])
