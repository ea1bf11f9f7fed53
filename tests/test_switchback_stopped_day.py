"""A site-level switchback that a stop cut short is judged by the loop's stopped-day rule (issue 48):
`edgetwin canary verdict --design switchback` on the site's own log (the runtime driven over the
in-process bus, as `tests/test_edge_switchback.py` drives it, whose fixture this reuses) refuses a
switchback whose guard stopped it (exit 1, by the guard) when `--status` names the stop, and leaves
every KPI open (exit 3) when only the log says it was cut short — never a verdict on the blocks
that ran (`edgetwin.loop.switchback.judge_switchback`'s docstring says why)."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from test_cli_canary_commands import _run
from test_edge_switchback import GROUPS, LATE, OTHER, PLAN, SITE, _drive, _served_arm, _start_cli, fleet  # noqa: F401

from edgetwin.edge.kpi_watch import KPIMargin
from edgetwin.loop.switchback import judge_switchback

TOTAL = PLAN.start_tick + PLAN.ticks  # 26 ticks: 2 pre-ticks, 8 blocks of 3


def _status(candidate: str, reason: str, stop_kpi: str | None = None) -> dict[str, Any]:
    """What `edgetwin canary status RUN --json` prints for the switchback's one site."""
    site = {"site": SITE, "run": "sb", "phase": "stopped", "candidate": candidate, "current": "v1", "ticks": TOTAL,
            "planned_ticks": TOTAL, "stop_reason": reason, "guard": {"stop": {"kpi": stop_kpi}} if stop_kpi else {}}
    return {"run": "sb", "sites": {SITE: site}}


def _verdict(operator: dict[str, Any], log: Path, candidate: str, capsys: pytest.CaptureFixture[str],
             *extra: str) -> tuple[int, dict[str, Any]]:  # fmt: skip
    """`edgetwin canary verdict --design switchback --json` on ``log``: (exit code, its JSON or {"err"})."""
    d = operator["d"]
    code = _run("canary", "verdict", str(d / "twin"), "--canary-log", str(log), "--fleet-log", str(d / "fleet.parquet"),
                "--plan", str(d / "plan.json"), "--current", str(d / "v1"), "--candidate", str(d / candidate),
                "--design", "switchback", "--json", *extra)  # fmt: skip
    got = capsys.readouterr()
    return code, (json.loads(got.out) if got.out else {"err": got.err})


def test_a_switchback_the_guard_stopped_refuses_by_the_guard_and_is_open_without_its_status(
    fleet: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]  # noqa: F811 - the fixture
) -> None:
    """The site's guard stops a candidate that leaves most work late mid-run; its log then holds no
    row after the stop. Before: one line and exit 2 ("block(s) [6, 7] ... have no judged tick").
    Now: with the status naming the guard's stop, refused by the guard (exit 1); without a status,
    a log short of the plan's ticks: open (exit 3), saying what would decide it."""
    bus = f"memory://sb-{uuid.uuid4().hex}"
    assert _start_cli(fleet, bus, "sb-slow", "v3") == 0
    seen = _drive(bus, fleet, tmp_path / "cache", TOTAL, seed=12)
    assert seen["stop_reason"] == "guard" and seen["guard_stop"].kpi == LATE
    log = seen["log"]
    ran = int(log["t"].nunique()) - PLAN.start_tick
    assert 0 < ran < PLAN.ticks  # the stop cut it short: no row after it
    log.to_parquet(tmp_path / "sb.parquet")
    capsys.readouterr()

    code, doc = _verdict(fleet, tmp_path / "sb.parquet", "v3", capsys)
    assert code == 3 and doc["verdict"] == "undecided", doc
    assert f"a stop the log does not name (it holds {ran} of the plan's {PLAN.ticks} tick(s)" in doc["reason"]
    assert "the hours before a stop are not the day the verdict is about" in doc["reason"]
    assert (f"open: {LATE} — a switchback that runs its whole plan of 8 blocks ({PLAN.ticks} tick(s) after the "
            "pre-period) would decide them") in doc["reason"]  # fmt: skip

    (tmp_path / "status.json").write_text(json.dumps(_status("v3", "guard", LATE)))
    code, doc = _verdict(fleet, tmp_path / "sb.parquet", "v3", capsys, "--status", str(tmp_path / "status.json"))
    assert code == 1 and doc["verdict"] == "refuse", doc
    assert f"the canary's guard stopped it: {LATE} regressed beyond its margin" in doc["reason"]
    assert f"judged on no day: the guard stopped the first day after {ran} tick(s)" in doc["reason"]
    assert doc["checks"] == []  # the blocks after the stop never ran: no estimate, not even for the record
    # the text output says why
    d = fleet["d"]
    code = _run("canary", "verdict", str(d / "twin"), "--canary-log", str(tmp_path / "sb.parquet"), "--fleet-log",
                str(d / "fleet.parquet"), "--plan", str(d / "plan.json"), "--current", str(d / "v1"), "--candidate",
                str(d / "v3"), "--design", "switchback", "--status", str(tmp_path / "status.json"))  # fmt: skip
    text = " ".join(capsys.readouterr().out.split())
    assert code == 1 and "switchback verdict: REFUSE" in text and "why: the canary's guard stopped it" in text
    # a status of another candidate's run: one line, exit 2
    (tmp_path / "other.json").write_text(json.dumps(_status("v2", "guard", LATE)))
    code, doc = _verdict(fleet, tmp_path / "sb.parquet", "v3", capsys, "--status", str(tmp_path / "other.json"))
    assert code == 2 and "--status" in doc["err"] and "'v2'" in doc["err"] and len(doc["err"].strip().splitlines()) == 1


def test_a_switchback_log_short_of_its_plan_is_open_not_judged_on_its_blocks(
    fleet: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]  # noqa: F811 - the fixture
) -> None:
    """A candidate that clearly cuts lateness, its log one tick short: every block has judged ticks
    and, judged on them, it would promote (before: exit 0); now open (exit 3), its estimate shown for
    the record. The whole log promotes; with a status naming a guard stop at its last tick (the day
    whole) it is refused by the guard, the guard's KPI *regress*."""
    bus = f"memory://sb-{uuid.uuid4().hex}"
    assert _start_cli(fleet, bus, "sb-fast", "v2") == 0
    seen = _drive(bus, fleet, tmp_path / "cache", TOTAL, seed=11)
    assert seen["stop_reason"] == "completed"
    log = seen["log"]
    log.to_parquet(tmp_path / "whole.parquet")
    log[log["t"] < TOTAL - 1].to_parquet(tmp_path / "short.parquet")
    capsys.readouterr()

    code, doc = _verdict(fleet, tmp_path / "short.parquet", "v2", capsys)
    assert code == 3 and doc["verdict"] == "undecided", doc
    (check,) = doc["checks"]
    assert check["verdict"] == "open" and check["interval"][1] < -0.05  # its blocks alone would have promoted
    assert f"it holds {PLAN.ticks - 1} of the plan's {PLAN.ticks} tick(s)" in doc["reason"]
    assert f"their estimates shown are on the {PLAN.ticks - 1} tick(s) it ran, for the record" in doc["reason"]

    code, doc = _verdict(fleet, tmp_path / "whole.parquet", "v2", capsys)
    assert code == 0 and doc["verdict"] == "promote", doc
    (tmp_path / "done.json").write_text(json.dumps(_status("v2", "completed")))
    assert _verdict(fleet, tmp_path / "whole.parquet", "v2", capsys, "--status", str(tmp_path / "done.json"))[0] == 0
    (tmp_path / "guard.json").write_text(json.dumps(_status("v2", "guard", LATE)))
    code, doc = _verdict(fleet, tmp_path / "whole.parquet", "v2", capsys, "--status", str(tmp_path / "guard.json"))
    assert code == 1 and [c["verdict"] for c in doc["checks"]] == ["regress"], doc
    assert "every other KPI on its 1 whole day(s)" in doc["reason"]


def test_a_switchback_site_with_no_row_leaves_the_day_short() -> None:
    """The day is the plan's ticks at every one of its sites: a two-site switchback whose log holds
    one site's rows only is not judged on that site (open), nor is any other stop the status names."""
    ticks = np.arange(TOTAL)
    arm = np.array([_served_arm(PLAN, int(t)) for t in ticks])
    rng = np.random.default_rng(0)
    log = pd.DataFrame({"t": np.repeat(ticks, 3), "site": SITE, "agent": np.tile(GROUPS[:3], len(ticks)),
                        "arm": np.repeat(arm, 3), "policy": np.where(np.repeat(arm, 3) == "candidate", "v2", "v1"),
                        LATE: rng.uniform(1, 2, 3 * len(ticks))})  # fmt: skip
    margins = [KPIMargin(LATE, max_regression=0.05)]
    verdict, _checks, reason, est = judge_switchback(log, PLAN, margins)
    assert verdict in ("promote", "refuse", "undecided") and "tick(s) after the pre-period" not in reason
    two = dataclasses.replace(PLAN, sites=(SITE, OTHER))
    verdict, checks, reason, _est = judge_switchback(log, two, margins)
    assert verdict == "undecided" and [c.verdict for c in checks] == ["open"]
    assert f"it holds 0 of the plan's {PLAN.ticks} tick(s)" in reason
    short = log[log["t"] < TOTAL - 4]  # block 7 has no judged tick left
    for stop, by in (("operator", "operator"), ("budget", "loss budget")):
        status = {"sites": {SITE: {"candidate": "v2", "planned_ticks": TOTAL, "stop_reason": stop}}}
        verdict, checks, reason, _est = judge_switchback(short, PLAN, margins, status=status)
        assert verdict == "undecided" and checks == [], reason
        assert reason.startswith(f"undecided: judged on no day: the canary's {by} stopped the first day after "
                                 f"{PLAN.ticks - 4} tick(s)") and "would decide them" in reason  # fmt: skip
        # a stop the status names after the plan's last tick: the day ran whole, judged on its blocks
        assert judge_switchback(log, PLAN, margins, status=status)[1][0].verdict != "open"


def test_the_docs_say_how_a_stopped_switchback_is_judged() -> None:
    """docs/canary.md's sentence on a stopped switchback names the functions it goes through, and
    judge_switchback goes through them (no second copy of the rule)."""
    import inspect

    from edgetwin.loop import evidence, switchback

    root = Path(__file__).resolve().parents[1]
    text = " ".join((root / "docs" / "canary.md").read_text().split())
    for claim in ("**A switchback a stop cut short is judged by the same stopped-day rule as a split's canary** "
                  "(`edgetwin.loop.evidence.canary_stop` and `judge_stopped`, over `edgetwin.loop.day_verdict.stopped_verdict`)",
                  "With `--status` naming the guard's stop the verdict is *refuse* (exit 1), by the guard; a log short of "
                  "the plan's ticks, or any other stop, leaves every KPI *open*: *undecided*, exit 3",
                  "that a switchback that runs its whole plan would decide them — never a verdict on the blocks it ran",
                  "`tests/test_switchback_stopped_day.py`",
                  "--candidate runs/policy [--status status.json] --out verdict.json"):  # fmt: skip
        assert claim in text, claim
    src = inspect.getsource(switchback.judge_switchback) + inspect.getsource(switchback._switchback_stop)
    assert "judge_stopped(" in src and "canary_stop(" in src
    assert "stopped_verdict(" in inspect.getsource(evidence.judge_stopped)
