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
from tests.test_canary_plan import gated  # noqa: F401  (the module's twin, recent log, candidate and gate decision)


def _plan(g, max_loss):  # type: ignore[no-untyped-def]
    return plan_canary(g["decision"], g["twin"], g["log"], g["cand"], g["base"],
                       PlanBudget(max_share=0.25, max_loss=max_loss), seed=0)  # fmt: skip


def test_a_loss_budget_on_a_two_signed_kpi_is_refused(gated) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    reward = gated["log"]["reward"]
    assert reward.min() < 0 < reward.max()  # the operator's multi-objective takes both signs
    for kpi in ("reward", "return"):  # the return is the reward's sum: the same sign problem
        with pytest.raises(InputError) as e:
            _plan(gated, {kpi: 0.02})
        assert e.value.where == "--max-loss" and kpi in e.value.message and "both signs" in e.value.message
        assert "fleet mean" in e.value.message and "one sign" in e.value.message


def test_a_one_signed_kpi_is_still_capped(gated) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
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


def test_cli_refuses_it_in_one_line_with_exit_2(gated, capsys) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from edgetwin.cli import main

    root: Path = gated["root"]
    with pytest.raises(SystemExit) as ex:
        main(["canary", "plan", str(root / "twin"), "--policy", "random", "--log", str(root / "log.parquet"),
              "--max-loss", "reward=2%", "--max-loss", "kpi.slo_violation=2%"])  # fmt: skip
    assert ex.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "--max-loss" in err and "reward" in err and "both signs" in err and "slo_violation" not in err


def test_a_switchback_refuses_it_too(gated) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """`plan_switchback` caps its risk by the same relative budget, so it refuses the same KPIs as `plan_canary`."""
    from edgetwin.loop.switchback import plan_switchback

    g = gated
    with pytest.raises(InputError) as e:
        plan_switchback(g["decision"], g["twin"], g["log"], g["cand"], g["base"],
                        PlanBudget(max_share=0.25, hours=6.0, max_loss={"reward": 0.02}),
                        block_ticks=2, carryover_ticks=1, sims=1)  # fmt: skip
    assert e.value.where == "--max-loss" and "reward" in e.value.message and "both signs" in e.value.message
