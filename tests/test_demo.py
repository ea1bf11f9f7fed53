"""The main job, `edgetwin demo`, end to end at a tiny size: every stage runs and writes its artifact."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from edgetwin.demo import DemoSizes, run_demo


def test_demo_runs_every_stage_and_reports_where_things_went(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    # 96 steps: the shipped what-if scenarios have windows up to step 60 of a 96-step day.
    lines: list[str] = []
    res = run_demo(tmp_path / "demo", seed=3, agents=20, episodes=2, steps=96, log=lines.append,
                   sizes=DemoSizes.tiny())
    assert lines[0].startswith("time budget: not measured for these sizes")  # the first line it prints
    default = DemoSizes().budget_line(100, 3, 96)
    assert default.startswith("time budget: ~59 s") and "twin 31 s" in default
    for name in ("log", "spec", "twin", "policy", "whatif_report", "summary"):
        assert Path(res.artifacts[name]).exists(), name
    assert res.numbers["log_rows"] == 20 * 2 * 96
    assert res.numbers["usable_rows"] + res.numbers["quarantined_rows"] == res.numbers["log_rows"]
    html = Path(res.artifacts["whatif_report"]).read_text()
    assert "<html" in html.lower() and "data:image/png;base64" in html
    # promoted and served, or refused or abstained on by the gate with the reason: all honest outcomes
    if res.numbers.get("promoted_version"):
        assert res.numbers["served_decisions"] == 20 * 96
    else:
        assert res.numbers.get("gate_refused") or res.numbers.get("gate_abstained")
    summary = json.loads(Path(res.artifacts["summary"]).read_text())
    assert summary["numbers"]["log_rows"] == res.numbers["log_rows"]
