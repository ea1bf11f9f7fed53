"""The canary plan from the gate's abstention: within the budget, deterministic for a seed, readable
by `CanaryConfig.from_plan`; bad budgets exit 2 with one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import TwinSpec
from edgetwin.edge.canary import CanaryConfig
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs
from edgetwin.loop.plan import CanaryPlan, PlanBudget, parse_max_loss, parse_share, plan_canary
from edgetwin.policies.gate import resolve_policy, run_gate
from edgetwin.twin.twin import Twin
from edgetwin.twin.whatif import fixed_policy

torch.set_num_threads(1)
CLUSTER = ClusterConfig(n_agents=40, steps=24)


class Constant:
    def __init__(self, spec, action):  # type: ignore[no-untyped-def]
        self.spec = spec
        self.action = np.asarray(action, dtype=np.float64)

    def act(self, obs: np.ndarray) -> np.ndarray:
        return np.tile(self.action, (len(obs), 1))


@pytest.fixture(scope="module")
def gated(canary_world_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The twin of tests/conftest.py's `canary_world_dir` (2 random episodes of this cluster, seed 0; 2 members, no
    adversarial round, 2 BC epochs; fitted once per run), a day it was not fitted on, the always-edge candidate, the
    logging baseline and the gate's decision; ``root`` holds the log, its spec and the twin for the CLI."""
    root = tmp_path_factory.mktemp("plan")
    spec = TwinSpec.load(canary_world_dir / "spec.toml")
    twin = Twin.load(canary_world_dir / "twin")
    log, _ = generate_logs(CLUSTER, 1, "random", seed=7)  # recent traffic the twin was not fitted on
    log.to_parquet(root / "log.parquet")
    spec.save(root / "log.spec.toml")
    twin.save(root / "twin")
    cand = fixed_policy("always-edge", Constant(spec, [1.0, 0.3, 0.2]))
    base = resolve_policy("logging", twin, name="current")
    decision = run_gate(twin, cand, base, log=log, episodes=1, seed=0)  # every KPI with a direction, 5 %
    return {"root": root, "twin": twin, "log": log, "cand": cand, "base": base, "decision": decision, "spec": spec}


def test_plan_is_within_budget_deterministic_and_feeds_the_canary(gated) -> None:  # type: ignore[no-untyped-def]
    budget = PlanBudget(max_share=0.25, hours=24.0)
    p1 = plan_canary(gated["decision"], gated["twin"], gated["log"], gated["cand"], gated["base"], budget, seed=3)
    p2 = plan_canary(gated["decision"], gated["twin"], gated["log"], gated["cand"], gated["base"], budget, seed=3)
    assert p1.to_dict() == p2.to_dict()  # same seed, same plan
    assert 4 <= p1.n_groups <= 10 and len(p1.slice.agents) == p1.n_groups == len(set(p1.slice.agents))
    assert set(p1.slice.agents) <= set(gated["log"]["agent"].astype(str))
    assert 0 < p1.hours <= 24 * 4 / 4 - 1  # one 6 h episode minus the pre-canary hour
    for k in p1.kpis:  # the expected interval is centred on the twin's estimate and reported with its worst case
        assert k.expected[0] < k.expected[1] and np.isfinite(k.worst_on_slice) and k.fleet_loss >= 0
    assert p1.why
    # JSON round trip, and the edge's canary reads it
    again = CanaryPlan.from_dict(json.loads(p1.to_json()))
    assert again.to_dict() == p1.to_dict()
    cfg = CanaryConfig.from_plan(again, "v-cand", spec=gated["spec"])
    assert cfg.slice.agents == p1.slice.agents and cfg.hours == p1.hours
    assert {m.kpi for m in cfg.margins} >= {"kpi.slo_violation"}
    slo = next(m for m in cfg.margins if m.kpi == "kpi.slo_violation")
    assert not slo.higher_is_better and slo.max_regression == pytest.approx(0.05)
    p3 = plan_canary(gated["decision"], gated["twin"], gated["log"], gated["cand"], gated["base"], budget, seed=4)
    assert p3.slice.agents != p1.slice.agents or p3.n_groups != p1.n_groups


def test_a_loss_budget_caps_the_slice(gated) -> None:  # type: ignore[no-untyped-def]
    free = plan_canary(gated["decision"], gated["twin"], gated["log"], gated["cand"], gated["base"],
                       PlanBudget(max_share=0.25), seed=0)  # fmt: skip
    k = next(k for k in free.kpis if k.worst_on_slice > 0)
    tight = k.worst_on_slice * 2.5 / free.fleet_groups  # room for ~2 candidate groups only
    capped = plan_canary(gated["decision"], gated["twin"], gated["log"], gated["cand"], gated["base"],
                         PlanBudget(max_share=0.25, max_loss={k.kpi: tight}), seed=0)  # fmt: skip
    kk = next(x for x in capped.kpis if x.kpi == k.kpi)
    assert kk.fleet_loss <= tight + 1e-12 and capped.n_groups <= 5
    with pytest.raises(InputError, match="loss budget"):
        plan_canary(gated["decision"], gated["twin"], gated["log"], gated["cand"], gated["base"],
                    PlanBudget(max_share=0.25, max_loss={k.kpi: tight / 10}), seed=0)  # fmt: skip
    with pytest.raises(InputError, match="unknown KPI"):
        plan_canary(gated["decision"], gated["twin"], gated["log"], gated["cand"], gated["base"],
                    PlanBudget(max_loss={"kpi.nope": 0.01}), seed=0)  # fmt: skip


def test_budget_parsing() -> None:
    assert parse_share("10%") == pytest.approx(0.1) and parse_share("1") == 1.0
    for bad in ("0", "0%", "150%", "1.5", "-5%", "ten"):
        with pytest.raises(InputError):
            parse_share(bad)
    assert parse_max_loss(["kpi.slo_violation=0.5%"]) == {"kpi.slo_violation": pytest.approx(0.005)}
    for bad in (["kpi.x=0"], ["kpi.x=-1%"], ["kpi.x"], ["kpi.x=1%", "kpi.x=2%"]):
        with pytest.raises(InputError):
            parse_max_loss(bad)


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--max-share", "0"], "--max-share"),
        (["--max-share", "150%"], "--max-share"),
        (["--max-loss", "kpi.slo_violation=0"], "--max-loss"),
        (["--max-loss", "kpi.nope=0.5%"], "--max-loss"),
        (["--hours", "0"], "--hours"),
    ],
)
def test_cli_bad_budget_exits_2_with_one_line(gated, flags, needle, capsys) -> None:  # type: ignore[no-untyped-def]
    from edgetwin.cli import main

    root: Path = gated["root"]
    with pytest.raises(SystemExit) as ex:
        main(["canary", "plan", str(root / "twin"), "--policy", "random", "--log", str(root / "log.parquet"), *flags])
    assert ex.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err


def test_cli_plan_json_and_file(gated, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from edgetwin.cli import main
    root: Path = gated["root"]
    args = ["canary", "plan", str(root / "twin"), "--policy", "random", "--log", str(root / "log.parquet"),
            "--max-share", "25%", "--episodes", "1", "--json", "--seed", "1", "--out", str(tmp_path / "plan.json"),
            "--max-regression", "kpi.slo_violation=0"]  # margin 0: a near-zero change straddles it
    try:
        main(args)
    except SystemExit as ex:
        assert not ex.code
    doc = json.loads(capsys.readouterr().out)
    assert doc["gate"]["verdict"] in ("promote", "refuse", "abstain")
    assert doc["plan"] is not None  # random vs the logging policy's clone at margin 0: the twin cannot tell
    if doc["plan"] is not None:  # abstained: the plan is printed and written, and loads back
        plan = CanaryPlan.load(tmp_path / "plan.json")
        assert json.loads(plan.to_json()) == doc["plan"] and plan.n_groups <= 10
    else:
        assert doc["gate"]["verdict"] != "abstain"


def test_the_plan_says_how_many_days_a_decision_needs() -> None:
    """Issue 48 item 1: half-width 0.2 around a point 0.1 from the margin needs 4 days (the width
    halves); a point on the margin is never decided by more days."""
    from edgetwin.loop.plan import days_to_decide

    assert days_to_decide(-0.05, 0.2, 0.05) == 4
    assert days_to_decide(-0.30, 0.2, 0.05) == 1
    assert days_to_decide(0.05, 0.2, 0.05) is None


def test_cli_bad_design_exits_2_with_one_line_before_loading_anything(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from edgetwin.cli import main

    with pytest.raises(SystemExit) as ex:  # the twin and log need not exist: the flag is checked first
        main(["canary", "plan", str(tmp_path / "twin"), "--policy", "random", "--log", str(tmp_path / "log.parquet"),
              "--design", "switchbacks"])  # fmt: skip
    assert ex.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--design" in err and "switchbacks" in err and "matched_pairs" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("design", ["random", "matched_pairs"])
def test_cli_plan_design_flag_picks_the_design(gated, tmp_path: Path, capsys, design: str) -> None:  # type: ignore[no-untyped-def]
    from edgetwin.cli import main

    root: Path = gated["root"]
    args = ["canary", "plan", str(root / "twin"), "--policy", "random", "--log", str(root / "log.parquet"),
            "--max-share", "25%", "--episodes", "1", "--json", "--seed", "1", "--design", design,
            "--max-regression", "kpi.slo_violation=0"]  # fmt: skip
    try:
        main(args)
    except SystemExit as ex:
        assert not ex.code
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan"] is not None
    # the plan weighed only the design asked for (auto weighs both)
    assert set(doc["plan"]["expected_width"]) == {design}
    assert doc["plan"]["slice"]["design"] in (design, "random")  # random when no seed splits every pair


@pytest.mark.slow  # the default run's 10-minute budget; the plan stays in the default run: test_plan_is_within_budget_deterministic_and_feeds_the_canary
def test_cli_plan_weighs_a_switchback_of_a_site(gated, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """``--switchback-site``: the switchback is planned on the same budget, written beside --out, and
    weighed against the group split (both widths named; interference or not, said)."""
    import pandas as pd

    from edgetwin.cli import main
    from edgetwin.loop.switchback import SwitchbackPlan

    root: Path = gated["root"]
    log = pd.read_parquet(root / "log.parquet")
    last = log[log["episode"] == log["episode"].iloc[-1]]
    site = str(last.groupby(last["site"].astype(str))["agent"].nunique().idxmin())
    out_path = tmp_path / "plan.json"
    args = ["canary", "plan", str(root / "twin"), "--policy", "random", "--log", str(root / "log.parquet"),
            "--max-share", "25%", "--episodes", "1", "--json", "--seed", "1", "--design", "random",
            "--max-regression", "kpi.slo_violation=0", "--switchback-site", site, "--out", str(out_path)]  # fmt: skip
    try:
        main(args)
    except SystemExit as ex:
        assert not ex.code
    doc = json.loads(capsys.readouterr().out)
    sb = SwitchbackPlan.from_dict(doc["switchback"]["plan"])
    assert sb.sites == (site,) and sb.n_blocks >= 4 and sb.expected_width
    first, second = doc["switchback"]["weighed"]
    assert f"{sb.expected_width_sum:.3g}" in first and f"{doc['plan']['expected_width']['random']:.3g}" in first
    assert ("prefer the switchback" in second) != ("group split's fleet-wide interval" in second)
    assert SwitchbackPlan.from_dict(json.loads(out_path.with_suffix(".switchback.json").read_text())) == sb


def test_cli_plan_names_switchback_site_for_an_unknown_site(gated, capsys) -> None:  # type: ignore[no-untyped-def]
    from edgetwin.cli import main

    root: Path = gated["root"]
    with pytest.raises(SystemExit) as ex:
        main(["canary", "plan", str(root / "twin"), "--policy", "random", "--log", str(root / "log.parquet"),
              "--max-share", "25%", "--episodes", "1", "--seed", "1", "--design", "random",
              "--max-regression", "kpi.slo_violation=0", "--switchback-site", "no-such-site"])  # fmt: skip
    assert ex.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--switchback-site" in err and "no-such-site" in err
