"""`edgetwin canary verdict` on a system that is not the emulated cluster: a small warehouse of
service groups written here, with its own columns (one profile, one state, one action, one response,
one KPI). Its canary logs follow the log contract (``policy`` = the registry version that served
each row). A candidate that clearly cuts lateness is promoted (exit 0), one that clearly raises it is
refused (exit 1); a canary log that names no candidate, or a bad plan, is one line and exit 2."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from edgetwin.cli import main
from edgetwin.contract.spec import Feature, TwinSpec
from edgetwin.policies.candidates import ConstantPolicy
from edgetwin.policies.export import export_policy
from edgetwin.twin.twin import Twin

torch.set_num_threads(1)
N_GROUPS, STEPS, PRE = 40, 16, 2


def warehouse_spec() -> TwinSpec:
    feats = (
        Feature("profile.size", "continuous", 0.0, 10.0),
        Feature("state.backlog", "continuous", 0.0, 40.0),
        Feature("action.speed", "continuous", 0.0, 1.0),
        Feature("response.done", "continuous", 0.0, None),
        Feature("kpi.late", "continuous", 0.0, None),
    )
    return TwinSpec(feats, name="warehouse", step_seconds=900.0, reward_weights={"kpi.late": -1.0})


def warehouse_day(speed: Callable[[np.ndarray, int, np.random.Generator], np.ndarray], seed: int, episode: str,
                  policy: Callable[[int], str]) -> pd.DataFrame:  # fmt: skip
    """One day of the warehouse: group i gets ``speed(i_indices, t, rng)``; work done grows with
    speed, what is left over is late and half of it carries over. The population (sizes) is the
    same for every day of one ``seed`` population (``seed // 100``), as one fleet's groups are."""
    sizes = np.random.default_rng(seed // 100).uniform(1, 5, N_GROUPS)
    rng = np.random.default_rng(seed)
    backlog = rng.uniform(0, 2, N_GROUPS)
    idx = np.arange(N_GROUPS)
    rows = []
    for t in range(STEPS):
        s = np.clip(speed(idx, t, rng), 0, 1)
        work = backlog + sizes
        done = np.minimum(work, 6.0 * s + rng.normal(0, 0.2, N_GROUPS).clip(-0.5, 0.5)).clip(0)
        late = work - done
        rows.append(pd.DataFrame({
            "episode": episode, "t": t, "agent": [f"w{i}" for i in idx], "site": "hall", "scenario": "weekday",
            "profile.size": sizes, "state.backlog": backlog, "action.speed": s, "response.done": done,
            "kpi.late": late, "reward": -late, "policy": [policy(i) for i in idx],
        }))  # fmt: skip
        backlog = np.clip(0.5 * late, 0, 40)
    return pd.concat(rows, ignore_index=True)


def four_day_depot(d: Path, candidate: str, speed: float) -> Path:
    """Into ``d``: the warehouse's twin fitted on four random-speed days, the ``current`` (speed 0.4)
    and ``candidate`` (``speed``) policies, fleet logs of one and of four days on the current policy
    (``fleet-1.parquet``, ``fleet-4.parquet``: the day term's source), a canary of 12 random groups
    on the candidate after the pre-period (``canary.parquet``) and its plan (``plan.json``). The
    fixture of the tests of `edgetwin canary verdict`'s day term (tests/test_verdict_day_term.py,
    tests/test_plan14_verdict_note.py)."""
    spec = warehouse_spec()
    train = pd.concat([warehouse_day(lambda i, t, r: r.uniform(0, 1, len(i)), 100 + e, f"d{e}", lambda i: "logging")
                       for e in range(4)], ignore_index=True)  # fmt: skip
    Twin.fit(train, spec, seed=0, members=2, progress=False, rounds=0, bc_epochs=2,
             population_model="empirical").save(d / "twin")  # fmt: skip
    for name, s in (("current", 0.4), (candidate, speed)):
        export_policy(ConstantPolicy(spec, [s]), d / name, spec)
    days = [warehouse_day(lambda i, t, r: np.full(len(i), 0.4), 103 + k, f"f{k}", lambda i: "v1") for k in range(4)]
    days[-1]["episode"] = "fleet"
    days[-1].to_parquet(d / "fleet-1.parquet")
    pd.concat(days, ignore_index=True).to_parquet(d / "fleet-4.parquet")
    arm = np.zeros(N_GROUPS, bool)
    arm[np.random.default_rng(3).choice(N_GROUPS, 12, replace=False)] = True
    canary = warehouse_day(lambda i, t, r: np.where(arm[i] & (t >= PRE), speed, 0.4), 107, "canary",
                           lambda i: "v2" if arm[i] else "v1")  # fmt: skip
    canary.loc[canary["t"] < PRE, "policy"] = "v1"
    canary.to_parquet(d / "canary.parquet")
    plan = {
        "candidate": candidate, "baseline": "current",
        "slice": {"agents": [f"w{i}" for i in range(N_GROUPS)], "treat_share": 0.3, "seed": 0},
        "hours": (STEPS - PRE) / 4, "margins": [{"kpi": "kpi.late", "max_regression": 0.05, "higher_is_better": False}],
        "kpis": [], "n_groups": N_GROUPS, "fleet_groups": N_GROUPS, "share": 1.0, "budget": {}, "decides": False,
        "why": ["test"],
    }  # fmt: skip
    (d / "plan.json").write_text(json.dumps(plan))
    return d


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("warehouse")
    spec = warehouse_spec()
    train = pd.concat([warehouse_day(lambda i, t, r: r.uniform(0, 1, len(i)), 100 + e, f"d{e}", lambda i: "logging")
                       for e in range(6)], ignore_index=True)  # fmt: skip
    twin = Twin.fit(train, spec, seed=0, members=2, progress=False, rounds=0, bc_epochs=2, population_model="empirical")
    twin.save(d / "twin")
    spec.save(d / "spec.toml")
    for name, s in (("current", 0.4), ("fast", 1.0), ("slow", 0.05)):
        export_policy(ConstantPolicy(spec, [s]), d / name, spec)
    fleet = warehouse_day(lambda i, t, r: np.full(len(i), 0.4), 106, "fleet", lambda i: "v1")
    fleet.to_parquet(d / "fleet.parquet")
    arm = np.zeros(N_GROUPS, bool)
    arm[np.random.default_rng(3).choice(N_GROUPS, 12, replace=False)] = True
    for name, s in (("fast", 1.0), ("slow", 0.05)):
        canary = warehouse_day(lambda i, t, r, s=s: np.where(arm[i] & (t >= PRE), s, 0.4), 107, "canary",
                               lambda i: "v2" if arm[i] else "v1")  # fmt: skip
        # the pre-ticks were served by the current version everywhere
        canary.loc[canary["t"] < PRE, "policy"] = "v1"
        # as the edge joins them (edgetwin.edge.canary_join): the arm and the action's propensity
        canary["arm"] = np.where(canary["t"] < PRE, "fleet", np.where(canary["policy"] == "v2", "candidate", "control"))
        canary["propensity"] = np.nan
        canary.to_parquet(d / f"canary-{name}.parquet")
    plan = {
        "candidate": "cand", "baseline": "current",
        "slice": {"agents": [f"w{i}" for i in range(N_GROUPS)], "treat_share": 0.3, "seed": 0},
        "hours": (STEPS - PRE) / 4, "margins": [{"kpi": "kpi.late", "max_regression": 0.05, "higher_is_better": False}],
        "kpis": [], "n_groups": N_GROUPS, "fleet_groups": N_GROUPS, "share": 1.0, "budget": {}, "decides": True,
        "why": ["test"],
    }  # fmt: skip
    (d / "plan.json").write_text(json.dumps(plan))
    return {"dir": d}


def _verdict(d: Path, candidate: str, *extra: str, log: str | None = None) -> int:
    try:
        main(["canary", "verdict", str(d / "twin"), "--canary-log", str(d / (log or f"canary-{candidate}.parquet")),
              "--fleet-log", str(d / "fleet.parquet"), "--plan", str(d / "plan.json"), "--current", str(d / "current"),
              "--candidate", str(d / candidate), "--pre-ticks", str(PRE), *extra])  # fmt: skip
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def test_verdict_exit_codes_on_a_system_that_is_not_the_emulator(warehouse, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    d = warehouse["dir"]
    assert _verdict(d, "fast", "--json", "--out", str(d / "fast.json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "promote" and doc["candidate_version"] == "v2" and doc["current_version"] == "v1"
    (check,) = doc["checks"]
    assert check["kpi"] == "kpi.late" and check["interval"][1] < 0  # lateness falls, the whole interval
    assert doc["level"] == pytest.approx(0.9)
    assert json.loads((d / "fast.json").read_text()) == doc
    assert _verdict(d, "slow", "--json") == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "refuse" and doc["checks"][0]["interval"][0] > 0.05


def test_verdict_bad_input_is_one_line_and_exit_2(warehouse, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    d = warehouse["dir"]
    assert _verdict(d, "fast", "--candidate-version", "v9") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "v9" in err and "Traceback" not in err
    (d / "bad-plan.json").write_text("{}")
    try:
        main(["canary", "verdict", str(d / "twin"), "--canary-log", str(d / "canary-fast.parquet"), "--fleet-log",
              str(d / "fleet.parquet"), "--plan", str(d / "bad-plan.json"), "--current", str(d / "current"),
              "--candidate", str(d / "fast")])  # fmt: skip
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "plan" in err


def _cut_short(d: Path, candidate: str, ticks: int) -> str:
    """The candidate's canary log as if a stop had ended it after ``ticks`` ticks of the candidate:
    the site logs no canary row after a stop (`edgetwin.edge.runtime_canary`)."""
    log = pd.read_parquet(d / f"canary-{candidate}.parquet")
    log = log[log["t"] < PRE + ticks]
    name = f"canary-{candidate}-{ticks}.parquet"
    log.to_parquet(d / name)
    return name


def test_a_canary_cut_short_is_judged_by_the_loops_stopped_day_rule(warehouse, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """Issue 48: the hours before a stop are not the day the verdict is about. Judged on the 5 ticks
    it ran, the fast candidate's log would promote (its whole day does); cut short with no stop
    recorded, every KPI stays open (exit 3) and the reason says what would decide it."""
    d = warehouse["dir"]
    short = _cut_short(d, "fast", 5)
    assert _verdict(d, "fast", "--json", log=short) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "undecided"
    (check,) = doc["checks"]
    assert check["verdict"] == "open" and check["interval"][1] < 0  # its 5 ticks alone would have promoted
    assert "the hours before a stop are not the day the verdict is about" in doc["reason"]
    assert "holds 5 of the plan's 14 tick(s)" in doc["reason"]
    assert "a canary that runs its whole day (14 tick(s) after the pre-period) would decide them" in doc["reason"]
    # the plan's day at 30-min ticks is 7 ticks: the same 5 ticks are still short; the whole log is not
    assert _verdict(d, "fast", "--tick-seconds", "1800", log=short) == 3
    capsys.readouterr()


def test_a_guard_stop_the_status_names_refuses_by_the_guard(warehouse, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """`canary status --json` names the guard's stop: refused (exit 1) on the guard's KPI by the guard,
    whatever its interval on the hours it ran; a status of another run, or of a canary of another
    length, is one line and exit 2."""
    d = warehouse["dir"]
    short = _cut_short(d, "fast", 5)
    status = {"run": "run-1", "sites": {"hall": {"site": "hall", "run": "run-1", "phase": "stopped", "ticks": PRE + 5,
              "candidate": "v2",
              "planned_ticks": STEPS, "stop_reason": "guard", "guard": {"stop": {"kpi": "kpi.late"}}},
              "dock": "no reply: TimeoutError"}}  # fmt: skip
    (d / "status.json").write_text(json.dumps(status))
    assert _verdict(d, "fast", "--json", "--status", str(d / "status.json"), log=short) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "refuse" and [c["verdict"] for c in doc["checks"]] == ["regress"]
    assert "guard stopped it: kpi.late regressed beyond its margin" in doc["reason"]
    assert "judged on no day: the guard stopped the first day after 5 tick(s)" in doc["reason"]
    # a guard stop at the day's last tick: the day is whole, its other KPIs judged on it (here none)
    assert _verdict(d, "fast", "--json", "--status", str(d / "status.json")) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [c["verdict"] for c in doc["checks"]] == ["regress"] and "every other KPI on its 1 whole day(s)" in doc["reason"]
    hall: dict[str, Any] = status["sites"]["hall"]  # type: ignore[assignment]
    for bad, what in (({"sites": {"hall": {**hall, "candidate": "v7"}}}, "'v7'"),
                      ({"sites": {"hall": {**hall, "planned_ticks": STEPS + 4}}}, "ticks"), ({"run": "x"}, "status")):
        (d / "status-bad.json").write_text(json.dumps(bad))
        assert _verdict(d, "fast", "--status", str(d / "status-bad.json"), log=short) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--status" in err and what in err


def test_the_docs_say_how_canary_verdict_judges_a_stopped_canary() -> None:
    """docs/canary.md's sentences on a stopped canary name the rule's one function, the exit codes the
    two tests above assert, and the options that exist; the loop, `judge_canary` and the levers
    benchmark all call that function (a second version of the rule would fail this)."""
    import inspect
    import sys

    from edgetwin.cli.canary import canary_verdict_cmd
    from edgetwin.loop import evidence, rounds

    root = Path(__file__).resolve().parents[1]
    text = " ".join((root / "docs" / "canary.md").read_text().split())
    for claim in ("**A canary a stop cut short is judged as the loop judges it** (`edgetwin.loop.day_verdict.stopped_verdict`",
                  "the verdict is *refuse* (exit 1): the guard's KPI *regress*, by the guard, and every other KPI *open*",
                  "leaves every KPI *open*: *undecided*, exit 3", "--status status.json [--tick-seconds 900]",
                  "(`edgetwin.loop.day_verdict.stopped_verdict`, which `edgetwin canary verdict` and the levers benchmark "
                  "call too)"):  # fmt: skip
        assert claim in text, claim
    params = inspect.signature(canary_verdict_cmd).parameters
    assert {"status_path", "tick_seconds"} <= set(params)
    sys.path.insert(0, str(root / "benchmarks"))
    try:
        import _closed_loop_levers as levers
    finally:
        sys.path.remove(str(root / "benchmarks"))
    for fn in (rounds.canary_loop, evidence.judge_stopped, levers._stop_rule):
        assert "stopped_verdict(" in inspect.getsource(fn), fn.__name__
