"""The scale page's tick sections (issue 47) are what docs/benchmarks/scale/results.json renders:
the throughput rows, the tick's phases beside the code before's (the output noise by predicted level
inside the fused noise pass now, its own pass before) and the PPO rows, so a number on the page is
the number in the run's JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import scale  # noqa: E402


def _rendered() -> tuple[dict, list[str], str]:
    res = json.loads((ROOT / "docs" / "benchmarks" / "scale" / "results.json").read_text())
    page = (ROOT / "docs" / "benchmarks" / "scale" / "README.md").read_text()
    return res, scale.section(res).splitlines(), page


def test_the_throughput_and_phase_tables_on_the_page_are_the_jsons() -> None:
    _, lines, page = _rendered()
    tables = [ln for ln in lines if ln.startswith("| ")]
    phase_rows = [ln for ln in lines if ln.startswith("| ") and ("noise by predicted level" in ln or "| the tick |" in ln)]
    assert phase_rows, "the phase tables name the noise by predicted level and the whole tick"
    for ln in tables:
        assert ln in page, ln


def test_the_phase_tables_show_the_code_before_beside_this_code() -> None:
    res, lines, _ = _rendered()
    assert res.get("tick_phases_before"), "the run compared with the code before (--compare-with)"
    for ph, old in zip(res["tick_phases"], res["tick_phases_before"], strict=True):
        assert ph["agents"] == old["agents"]
        # the noise by predicted level: inside the fused noise pass in both codes since issue 47's second round
        assert "  of it: noise by predicted level" in ph["phases_ms"]
        start = next(k for k, ln in enumerate(lines) if ln.startswith(f"Where a tick's CPU time goes at {ph['agents']:,} agents"))
        table = lines[start + 2 : next(k for k in range(start + 2, len(lines)) if lines[k].startswith("| the tick |")) + 1]
        for name, ms in old["phases_ms"].items():  # every phase of the code before, beside this code's
            row = next(ln for ln in table if ln.startswith(f"| {name} | "))
            assert row.endswith(f"| {ms:.3f} |"), row
        assert table[-1] == f"| the tick | {ph['tick_ms']:.3f} | 100 % | {old['tick_ms']:.3f} |"


def test_the_page_says_how_many_ticks_a_throughput_run_stepped() -> None:
    res, lines, _ = _rendered()
    text = "\n".join(lines)
    for r in res["throughput"]:
        assert r["ticks"] == scale.throughput_ticks(r["agents"])
        assert f"{r['ticks']} ticks at {r['agents']:,} agents" in text
