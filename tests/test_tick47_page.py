"""Issue 47, fifth round: the Scale page's fifth-round paragraph (results.json's ``throughput_note``,
rendered into docs/benchmarks/scale/README.md) quotes the run it stored as ``throughput_fifth_round``:
the per-run pairs and best-run ratios of both codes, the 10,000-agent phase timers, the budget, and
that the 20-seed rollouts were the code before's to the bit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _paragraph() -> tuple[str, dict]:
    res = json.loads((ROOT / "docs/benchmarks/scale/results.json").read_text())
    note = res["throughput_note"]
    assert "**Fifth round" in note
    return note.split("**Fifth round", 1)[1], res


def test_the_fifth_round_quotes_its_stored_run() -> None:
    text, res = _paragraph()
    run = res["throughput_fifth_round"]
    assert f"at {run['commit']}" in text
    for tp in run["throughput"]:
        assert f"{tp['agents']:,} agents {tp['ratio_cpu']:.2f}x" in text
        assert ", ".join(f"{x:.2f}" for x in tp["paired_cpu"]) in text
        assert ", ".join(f"{x:.2f}" for x in tp["paired_cpu_before"]) in text
        assert f"the code before {tp['ratio_cpu_before']:.2f}x" in text
    big = run["throughput"][1]
    assert f"median {np.median(big['paired_cpu']):.2f}" in text
    assert f"median {np.median(big['paired_cpu_before']):.2f}" in text
    now, before = run["tick_phases"][1], run["tick_phases_before"][1]
    assert now["agents"] == before["agents"] == 10_000
    assert f"the tick {before['tick_ms']:.2f} -> {now['tick_ms']:.2f} ms" in text
    end = "fused: end of tick (all of it)"
    assert f"the end of tick {before['phases_ms'][end]:.2f} -> {now['phases_ms'][end]:.2f} ms" in text
    # the budget: 1.5x the emulator's agent-steps per CPU-second in this run, and the network's time in it
    budget = 1e3 * 10_000 / (1.5 * big["emulator_cpu"])
    assert f"({budget:.2f} ms in this loaded one)" in text
    assert f"network alone took 2.60 ms ({now['phases_ms']['network']:.2f} here)" in text
    assert big["ratio_cpu"] < 1.5 and "**1.5x at 10,000 agents missed**" in text
    # the same bits: every KPI of the 20-seed rollouts, with and without noise
    assert run["kpis_seeds"] == 20 and "20-seed rollouts" in text
    assert all(v == 0.0 for v in run["kpis_max_rel"].values())
    assert all(v == 0.0 for v in run["kpis_max_abs_diff"].values())


def test_the_quiet_budget_it_quotes_is_the_stored_quiet_run() -> None:
    """"a tick of 3.25 ms in the quiet run above ... the network alone took 2.60 ms ... the other
    4.33 ms of the 6.94 ms tick": the tables' run (the fourth round's)."""
    text, res = _paragraph()
    big = res["throughput"][1]
    ph = res["tick_phases"][1]
    assert big["agents"] == ph["agents"] == 10_000
    assert f"a tick of {1e3 * 10_000 / (1.5 * big['emulator_cpu']):.2f} ms in the quiet run above" in text
    net, tick = ph["phases_ms"]["network"], ph["tick_ms"]
    assert f"{net:.2f} ms" in text and f"the other {tick - net:.2f} ms of the {tick:.2f} ms tick" in text
    rest_target = 1e3 * 10_000 / (1.5 * big["emulator_cpu"]) - net
    assert f"to fall to {rest_target:.2f} ms, by {100 * (1 - rest_target / (tick - net)):.0f} %" in text
    assert (ROOT / "tests/test_tick47_site_sums.py").is_file() and "tests/test_tick47_site_sums.py" in text
