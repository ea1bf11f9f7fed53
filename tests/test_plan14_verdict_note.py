"""`edgetwin canary verdict` names the KPIs whose one-day interval carries the first look's bound on
the change's day-to-day spread (issue 48, plan14): the loop's verdict said so
(`edgetwin.loop.day_verdict.bound_note` in `_pooled_verdict`), the operator's command did not. The
same note, from the same function, in the evidence's reason and on the text output, also on a
promotion."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from test_cli_canary_verdict import PRE, four_day_depot

from edgetwin.cli import main

torch.set_num_threads(1)
NOTE = "carry a bound on how much the change may move from day to day"


@pytest.fixture(scope="module")
def depot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The warehouse of `test_cli_canary_verdict` with a fleet log of four days on the current
    policy (the day term's source) and a canary of a candidate that clearly cuts lateness."""
    return four_day_depot(tmp_path_factory.mktemp("depot"), "fast", 1.0)


def _verdict(d: Path, fleet: str, *extra: str) -> int:
    try:
        main(["canary", "verdict", str(d / "twin"), "--canary-log", str(d / "canary.parquet"), "--fleet-log",
              str(d / fleet), "--plan", str(d / "plan.json"), "--current", str(d / "current"), "--candidate",
              str(d / "fast"), "--pre-ticks", str(PRE), *extra])  # fmt: skip
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def test_the_one_day_verdict_names_the_kpis_that_carry_the_bound(depot: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With four logged days the one-day verdict's day term is the bound wherever the bound exceeds
    the twin's calibrated replay (`guarded_day_variance`, the command's own call, checked here
    first), and its reason says so in `bound_note`'s words, on the JSON evidence and on the text
    output (a promotion included); with one logged day there is no day term and no note."""
    from edgetwin.loop.verdict import guarded_day_variance
    from edgetwin.policies.gate import resolve_policy
    from edgetwin.twin.twin import Twin as TwinT

    twin = TwinT.load(depot / "twin")
    fleet = pd.read_parquet(depot / "fleet-4.parquet")
    dv = guarded_day_variance(twin, ["kpi.late"], [fleet], resolve_policy(str(depot / "fast"), twin, name="candidate-v2"),
                              resolve_policy(str(depot / "current"), twin, name="current-v1"), 0)  # fmt: skip
    assert dv["kpi.late"][0] > dv.revealed["kpi.late"]  # the bound is the first look's term here
    code = _verdict(depot, "fleet-4.parquet", "--json")
    doc = json.loads(capsys.readouterr().out)
    assert code in (0, 1, 3)
    assert NOTE in doc["reason"] and "one canary day: kpi.late carry" in doc["reason"]
    assert _verdict(depot, "fleet-4.parquet") == code
    text = capsys.readouterr().out
    assert "  why: " in text and NOTE in text
    assert _verdict(depot, "fleet-1.parquet", "--json") in (0, 1, 3)
    assert NOTE not in json.loads(capsys.readouterr().out)["reason"]


def test_the_note_is_the_loops_one_function() -> None:
    """`judge_canary` (the command's verdict) and the loop's `_pooled_verdict` both call `bound_note`,
    and the docs' sentence on it names the command."""
    import inspect

    from edgetwin.loop import day_verdict, evidence

    assert "bound_note(" in inspect.getsource(evidence.judge_canary)
    assert "bound_note(" in inspect.getsource(day_verdict._pooled_verdict)
    text = " ".join((Path(__file__).resolve().parents[1] / "docs" / "canary.md").read_text().split())
    assert ("a one-day verdict's reason names the KPIs that carry it (`bound_note`; the loop's and "
            "`edgetwin canary verdict`'s alike)") in text
