"""`edgetwin canary verdict` carries the loop's day-to-day term (issue 48): with a fleet log of several
days the interval is about the change over those days (`guarded_day_variance`, the loop's call), and
with one day it says it is about the canary's day only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_cli_canary_verdict import PRE, four_day_depot

from edgetwin.cli import main

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return four_day_depot(tmp_path_factory.mktemp("shop"), "cand", 0.35)


def _verdict(d: Path, fleet: str, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    try:
        main(["canary", "verdict", str(d / "twin"), "--canary-log", str(d / "canary.parquet"), "--fleet-log",
              str(d / fleet), "--plan", str(d / "plan.json"), "--current", str(d / "current"), "--candidate",
              str(d / "cand"), "--pre-ticks", str(PRE), "--json"])  # fmt: skip
    except SystemExit as e:
        assert int(e.code or 0) in (0, 1, 3), e.code
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_the_operators_verdict_carries_the_day_term(shop: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one = _verdict(shop, "fleet-1.parquet", capsys)
    many = _verdict(shop, "fleet-4.parquet", capsys)
    assert "about the canary's day only" in str(one["reason"])
    assert "about the canary's day only" not in str(many["reason"])
    (c1,), (c4,) = one["checks"], many["checks"]  # type: ignore[misc]
    # the same canary and fleet day: the same point, an interval at least as wide with the days' term
    assert c4["change"] == pytest.approx(c1["change"], rel=1e-6, abs=1e-9)
    assert c4["interval"][1] - c4["interval"][0] > c1["interval"][1] - c1["interval"][0]
