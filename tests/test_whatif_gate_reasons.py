"""The what-if-gate benchmark's rows say why the product's gate would abstain (issue 44): the
interval's own verdict, and the product gate's (`gate_verdict`: an evidence problem or too few
calibration days for the level asked); ``--pool-out`` pools another set of seeds without touching
the pooled file the page cites."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_whatif_gate_split import _module  # the benchmark script as a module

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
ROOT = BENCH.parent


def test_gate_verdict_is_decides_order_of_checks() -> None:
    wg = _module()
    # enough days: the interval's verdict stands
    assert [wg.gate_verdict(v, None, 0.9) for v in ("ok", "regress", "straddle", "unsupported")] == [
        "ok", "regress", "straddle", "unsupported"]
    # 3 calibration days support 75 %: a check that would decide is below the 90 % asked
    assert wg.gate_verdict("ok", None, 0.75) == "below_level"
    assert wg.gate_verdict("regress", None, 0.75) == "below_level"
    assert wg.gate_verdict("straddle", None, 0.75) == "straddle"
    # no evidence replaces ok and straddle, never a confident regression (decide: it still refuses)
    assert wg.gate_verdict("ok", "not calibrated", 0.9) == "no_evidence"
    assert wg.gate_verdict("straddle", "not calibrated", 0.75) == "no_evidence"
    assert wg.gate_verdict("regress", "not calibrated", 0.9) == "regress"
    assert wg.gate_verdict("unsupported", "not calibrated", 0.9) == "unsupported"


def _run(rows: list[dict], seed: int) -> dict:
    return {"seed": seed, "rows": rows}


def _row(agree: bool | None, verdict: str) -> dict:
    return {"policy": "p", "kpi": "return", "covered": True, "agree": agree, "verdict": verdict,
            "interval": [0.0, 0.2], "w_interval": [-0.2, 0.0], "twin_change_w": 0.0, "real_regress": False,
            "real_change": 0.0,
            "twin_change": 0.0, "out_of_support": 0.0}


def test_pool_out_writes_elsewhere_and_leaves_the_cited_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wg = _module()
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_run([_row(True, "ok"), _row(None, "straddle")], 7)))
    b.write_text(json.dumps(_run([_row(False, "regress")], 8)))
    cited = ROOT / "docs" / "benchmarks" / "whatif_gate" / "seeds" / "pooled_random.json"
    before = cited.read_bytes()
    out = tmp_path / "pooled.json"
    monkeypatch.setattr(sys, "argv", ["whatif_gate.py", "--logging", "random", "--pool", str(a), str(b),
                                      "--pool-out", str(out)])
    wg.main()
    assert cited.read_bytes() == before
    pooled = json.loads(out.read_text())
    assert pooled["seeds"] == [7, 8] and pooled["pairs"] == 3 and pooled["confident_pairs"] == 2
    assert pooled["confident_agreed"] == 1


def test_held_days_is_a_whole_number_of_days_and_needs_its_own_file(monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    wg = _module()
    assert wg.held_days_arg("9") == 9
    for bad in ("0", "nine", "2.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            wg.held_days_arg(bad)
    assert wg.calibration_log("held", "H", "R", 9) == ("H", 9)
    # the page's results are of 3 held-out days: another number writes only to its own --json file
    monkeypatch.setattr(sys, "argv", ["whatif_gate.py", "--held-days", "9"])
    with pytest.raises(SystemExit) as e:
        wg.main()
    assert e.value.code == 2 and "--held-days other than 3 needs --json" in capsys.readouterr().err
