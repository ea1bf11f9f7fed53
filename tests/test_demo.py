"""The main job, `edgetwin demo`, end to end at a tiny size: every stage runs and writes its artifact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from edgetwin.demo import QUIET_SECONDS, DemoSizes, quiet_total, run_demo


def test_demo_runs_every_stage_and_reports_where_things_went(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    # 96 steps: the shipped what-if scenarios have windows up to step 60 of a 96-step day.
    lines: list[str] = []
    res = run_demo(tmp_path / "demo", seed=3, agents=20, episodes=2, steps=96, log=lines.append,
                   sizes=DemoSizes.tiny())
    assert lines[0].startswith("time budget: not measured for these sizes")  # the first line it prints
    default = DemoSizes().budget_line(100, 3, 96)
    assert default.startswith(f"time budget: ~{quiet_total()} s on a quiet 2-core machine")
    assert all(f"{k} {v} s" in default for k, v in QUIET_SECONDS.items())
    assert quiet_total() <= 60  # issue 38: the default demo within a minute on a quiet 2-core machine
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


@pytest.mark.slow  # two tiny demos: ~30 s on a quiet 2-core machine
def test_demo_answers_do_not_depend_on_the_second_core(tmp_path: Path) -> None:
    """The what-if report written in the spare worker (the saved twin, reloaded) is the one written
    in-process, and the same seed gives the same verdicts and numbers."""
    torch.set_num_threads(1)
    kw = dict(seed=5, agents=20, episodes=2, steps=96, log=lambda _: None, sizes=DemoSizes.tiny())
    a = run_demo(tmp_path / "a", spare_core=True, **kw)  # type: ignore[arg-type]
    b = run_demo(tmp_path / "b", spare_core=False, **kw)  # type: ignore[arg-type]
    assert "second_core_startup" in a.cpu_seconds and "second_core_startup" not in b.cpu_seconds
    assert a.numbers == b.numbers
    ja = json.loads((tmp_path / "a" / "whatif" / "whatif.json").read_text())
    jb = json.loads((tmp_path / "b" / "whatif" / "whatif.json").read_text())
    assert ja["comparisons"] == jb["comparisons"] and ja["results"] == jb["results"]


@pytest.mark.slow
def test_default_demo_reaches_the_edge_through_the_canary(tmp_path: Path) -> None:
    """Issue 34's demo: the gate abstains, one canary round on <= 10 % of the service groups for
    <= 1 simulated day decides promote, and the edge runtime serves the promoted version."""
    torch.set_num_threads(1)
    res = run_demo(tmp_path / "demo", seed=0, log=lambda _: None)
    n = res.numbers
    assert n.get("gate_abstained")
    assert n["canary"]["rounds"] == 1
    assert n["canary"]["share"] <= 0.10 and n["canary"]["hours"] <= 24.0
    # issue 48 item 7: the demo follows the statistics: with small-sample intervals its one-day canary
    # may promote, or end undecided saying how many more days it needs (never a verdict below its level)
    if n["canary"]["verdict"] == "promote":
        assert n["promoted_version"] == "v1" and n["served_decisions"] == 100 * 96
    else:
        assert n["canary"]["verdict"] == "abstain" and "undecided: " in n["canary"]["reason"]
        assert "more day" in n["canary"]["reason"] or "will not decide" in n["canary"]["reason"]
    assert n["offload_improvement_over_random"] > 0.2  # the trained policy offloads more than random
