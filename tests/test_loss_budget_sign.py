"""A relative loss budget (``--max-loss``) is refused on a KPI that takes both signs or whose fleet
level is not positive: "2 % worse" than a mean near zero means nothing. A KPI of one positive
sign is still capped as before; the CLI says so in one line with exit code 2."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from edgetwin.contract.errors import InputError
from edgetwin.loop.plan import PlanBudget, check_loss_budget_signs, plan_canary
from edgetwin.twin.whatif.kpis import KpiDef


@pytest.fixture(scope="module")
def gated(canary_world_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """tests/test_canary_plan.py's world, its twin read from tests/conftest.py's `canary_world_dir`
    (the same fit: 2 random episodes of a 40-agent, 24-step cluster, seed 0; 2 members, no
    adversarial round, 2 BC epochs; fitted once per run), not fitted again here: a day the twin was
    not fitted on (seed 7, in ``root`` with its spec and the twin for the CLI), the always-edge
    candidate, the logging baseline and the gate's decision."""
    import shutil

    import numpy as np
    import torch

    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.policies.gate import resolve_policy, run_gate
    from edgetwin.twin.twin import Twin
    from edgetwin.twin.whatif import fixed_policy

    class Constant:
        def __init__(self, spec: object, action: list[float]) -> None:
            self.spec, self.action = spec, np.asarray(action, dtype=np.float64)

        def act(self, obs: np.ndarray) -> np.ndarray:
            return np.tile(self.action, (len(obs), 1))

    torch.set_num_threads(1)  # as tests/test_canary_plan.py sets at import
    root = tmp_path_factory.mktemp("plan")
    shutil.copytree(canary_world_dir / "twin", root / "twin")
    twin = Twin.load(root / "twin")
    log, spec = generate_logs(ClusterConfig(n_agents=40, steps=24), 1, "random", seed=7)
    log.to_parquet(root / "log.parquet")
    spec.save(root / "log.spec.toml")
    cand = fixed_policy("always-edge", Constant(spec, [1.0, 0.3, 0.2]))
    base = resolve_policy("logging", twin, name="current")
    decision = run_gate(twin, cand, base, log=log, episodes=1, seed=0)  # every KPI with a direction, 5 %
    return {"root": root, "twin": twin, "log": log, "cand": cand, "base": base, "decision": decision, "spec": spec}


def _plan(g, max_loss):  # type: ignore[no-untyped-def]
    return plan_canary(g["decision"], g["twin"], g["log"], g["cand"], g["base"],
                       PlanBudget(max_share=0.25, max_loss=max_loss), seed=0)  # fmt: skip


def test_a_loss_budget_on_a_two_signed_kpi_is_refused(gated) -> None:  # type: ignore[no-untyped-def]
    reward = gated["log"]["reward"]
    assert reward.min() < 0 < reward.max()  # the operator's multi-objective takes both signs
    for kpi in ("reward", "return"):  # the return is the reward's sum: the same sign problem
        with pytest.raises(InputError) as e:
            _plan(gated, {kpi: 0.02})
        assert e.value.where == "--max-loss" and kpi in e.value.message and "both signs" in e.value.message
        assert "fleet mean" in e.value.message and "one sign" in e.value.message


def test_a_one_signed_kpi_is_still_capped(gated) -> None:  # type: ignore[no-untyped-def]
    slo = gated["log"]["kpi.slo_violation"]
    assert slo.min() >= 0 and slo.mean() > 0
    free = _plan(gated, {})
    k = next((k for k in free.kpis if k.kpi == "kpi.slo_violation" and k.worst_on_slice > 0), None)
    assert k is not None, "the plan should weigh kpi.slo_violation's worst case on this log"
    tight = k.worst_on_slice * 2.5 / free.fleet_groups  # room for ~2 candidate groups only
    capped = _plan(gated, {k.kpi: tight})
    kk = next(x for x in capped.kpis if x.kpi == k.kpi)
    assert kk.budget == pytest.approx(tight) and kk.fleet_loss <= tight + 1e-12 and capped.n_groups <= 5
    with pytest.raises(InputError, match="loss budget"):  # a cap too tight for any canary: refused as before
        _plan(gated, {k.kpi: tight / 10})


def test_the_rule_is_about_sign_only() -> None:
    kdefs = {"x": KpiDef("x", "x", "mean", better="lower")}

    def log(values: list[float]) -> pd.DataFrame:
        return pd.DataFrame({"episode": [0] * len(values), "x": values})

    check_loss_budget_signs({"x": 0.02}, kdefs, log([0.0, 1e-9, 3.0]))  # one sign, positive level: fine
    with pytest.raises(InputError, match="both signs"):  # one tiny negative value is enough
        check_loss_budget_signs({"x": 0.02}, kdefs, log([-1e-9, 5.0, 7.0]))
    with pytest.raises(InputError, match=r"≤ 0"):  # one sign but a level of 0 or below
        check_loss_budget_signs({"x": 0.02}, kdefs, log([-2.0, -1.0]))
    with pytest.raises(InputError, match=r"≤ 0"):
        check_loss_budget_signs({"x": 0.02}, kdefs, log([0.0, 0.0]))
    check_loss_budget_signs({}, kdefs, log([-1.0, 1.0]))  # no cap, nothing to refuse


def test_cli_refuses_it_in_one_line_with_exit_2(gated, capsys) -> None:  # type: ignore[no-untyped-def]
    from edgetwin.cli import main

    root: Path = gated["root"]
    with pytest.raises(SystemExit) as ex:
        main(["canary", "plan", str(root / "twin"), "--policy", "random", "--log", str(root / "log.parquet"),
              "--max-loss", "reward=2%", "--max-loss", "kpi.slo_violation=2%"])  # fmt: skip
    assert ex.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "--max-loss" in err and "reward" in err and "both signs" in err and "slo_violation" not in err


def test_a_switchback_refuses_it_too(gated) -> None:  # type: ignore[no-untyped-def]
    """`plan_switchback` caps its risk by the same relative budget, so it refuses the same KPIs as `plan_canary`."""
    from edgetwin.loop.switchback import plan_switchback

    g = gated
    with pytest.raises(InputError) as e:
        plan_switchback(g["decision"], g["twin"], g["log"], g["cand"], g["base"],
                        PlanBudget(max_share=0.25, hours=6.0, max_loss={"reward": 0.02}),
                        block_ticks=2, carryover_ticks=1, sims=1)  # fmt: skip
    assert e.value.where == "--max-loss" and "reward" in e.value.message and "both signs" in e.value.message
