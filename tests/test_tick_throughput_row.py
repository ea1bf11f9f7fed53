"""The Scale rows of docs/benchmarks/README.md for the twin's throughput (issue 47) say what
docs/benchmarks/scale/results.json holds: the ratios, the code before's, the pairs' range, the
tick's phase-timer totals, and that the rollouts of this code are the code before's to the bit."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _row(words: str) -> str:
    return [line for line in (ROOT / "docs/benchmarks/README.md").read_text().splitlines()
            if line.startswith("| [Scale]") and words in line][0]


def test_the_throughput_rows_are_results_json() -> None:
    res = json.loads((ROOT / "docs/benchmarks/scale/results.json").read_text())
    for i, words in ((0, "relative to the emulator's, 1,000 agents"), (1, "relative to the emulator's, 10,000 agents")):
        tp, row = res["throughput"][i], _row(words)
        assert f"| {tp['ratio_cpu']:.2f}× |" in row
        assert "the code before" in row and f"{tp['ratio_cpu_before']:.2f}×" in row
        pairs = tp["paired_cpu"]
        assert f"pairs {min(pairs):.2f}-{max(pairs):.2f}" in row
        assert row.split("|")[5].strip().startswith("met") == (tp["ratio_cpu"] >= (1.0 if i == 0 else 1.5))
    now, before = res["tick_phases"][0], res["tick_phases_before"][0]
    assert now["agents"] == before["agents"] == 1000
    assert f"{before['tick_ms']:.2f} -> {now['tick_ms']:.2f} ms" in _row("1,000 agents")
    # the same bits: every KPI of the 20-seed rollouts equal before and now
    modes = res["throughput_kpis"]["modes"]
    assert all(r["diff"] == 0.0 and r["max_rel"] == 0.0 for rows in modes.values() for r in rows.values())


def test_the_throughput_notes_pairs_are_results_json() -> None:
    """The note's head (the quiet rerun) quotes each size's per-run pairs, now and before, in run order."""
    res = json.loads((ROOT / "docs/benchmarks/scale/results.json").read_text())
    head = res["throughput_note"].split("**What changed", 1)[0]
    for tp in res["throughput"]:
        assert ", ".join(f"{x:.2f}" for x in tp["paired_cpu"]) in head
        assert ", ".join(f"{x:.2f}" for x in tp["paired_cpu_before"]) in head
        assert f"{tp['ratio_cpu']:.2f}x" in head and f"{tp['ratio_cpu_before']:.2f}x" in head
    if "every pair above 1" in head:
        assert min(res["throughput"][0]["paired_cpu"]) > 1.0
