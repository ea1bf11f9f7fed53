"""The scale page's episode-reset, PPO-rerun and causal-optimiser paragraphs (issue 47) are what
docs/benchmarks/scale/results.json renders, and what they say holds in that JSON: the reset is the
code before's to the bit and cheaper in every round's pair, the optimiser's step is faster and its
fits move no more than float rounding does."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import scale  # noqa: E402

RES = json.loads((ROOT / "docs" / "benchmarks" / "scale" / "results.json").read_text())
PAGE = (ROOT / "docs" / "benchmarks" / "scale" / "README.md").read_text()


def test_the_reset_table_is_the_jsons_and_the_reset_is_the_code_befores_bits() -> None:
    rows = RES["reset"]
    assert [r["agents"] for r in rows] == [100, 1000]
    text = scale.reset_text(rows, RES.get("reset_note"))
    assert text in PAGE
    for r in rows:
        assert r["identical"], "every timed reset of the two codes compared equal"
        # cheaper in every round (each round's two codes share their minutes of the load), not only by the median
        assert all(b > a for a, b in zip(r["rounds_ms"]["now"], r["rounds_ms"]["before"], strict=True))
        assert r["ratio"] == float(np.median([b / a for a, b in zip(r["rounds_ms"]["now"], r["rounds_ms"]["before"], strict=True)]))
        assert f"| {r['agents']:,} | {r['rounds']} x {r['resets']} | {r['ms']['now']:.2f} | {r['ms']['before']:.2f} | {r['ratio']:.2f}x |" in PAGE
    shares = rows[-1]["profile_shares"]
    assert set(shares) == {label for _, label in scale.RESET_PARTS} and 0 < sum(shares.values()) <= 1.0


def test_the_ppo_reruns_are_the_jsons() -> None:
    reruns = RES["ppo_reruns"]
    assert {run["code"] for run in reruns} >= {"this code", "before (869c062)"}
    assert scale.ppo_reruns_text(reruns) in PAGE
    for run in reruns:
        for r in run["rows"]:
            assert r["ratio"] == float(np.median(r["pairs"])) and len(r["pairs"]) == r["repeats"]


def test_the_causal_optimiser_paragraph_is_the_jsons_and_holds() -> None:
    ca = RES["causal_adam"]
    assert scale.causal_adam_text(ca) in PAGE
    for st in ca["stacks"]:
        assert st["ratio"] > 1.0 and st["ms_now"] < st["ms_before"], st["stack"]  # "faster"
        # "a gap of the size one ulp's nudge alone leaves": no larger than twice the control's
        assert st["prediction_gap"] <= 2.0 * st["control_gap"], st["stack"]


def test_the_reset_notes_numbers_are_the_jsons() -> None:
    note = RES["reset_note"]
    for r in RES["reset"]:
        for k in ("now", "before"):
            assert f"{r['ms'][k] / r['horizon']:.3f}" in note, (r["agents"], k)
    pairs = [x for run in RES["ppo_reruns"] for row in run["rows"] for x in row["pairs"]]
    assert f"range {min(pairs):.2f}-{max(pairs):.2f}" in note
    a, b = RES["reset"]
    assert f"still {a['vs_emulator']:.1f}x and {b['vs_emulator']:.1f}x the emulated cluster's reset" in note
    assert a["vs_emulator"] > 1 and b["vs_emulator"] > 1  # "still ... the emulated cluster's": the twin's is dearer
    share = b["profile_shares"]["the population model's draws"]
    assert f"({100 * share:.0f} % at 1,000 agents" in note and share == max(b["profile_shares"].values())  # "most of what is left"
    assert f"{b['draw_calls_per_reset']:.1f} calls a reset" in note and b["draw_calls_per_reset"] >= 3  # one per scenario at least


def test_choosing_lambda_with_the_flat_adam_is_faster_and_chooses_the_same() -> None:
    ch = RES["causal_adam"]["choice"]
    now, before = ch["cpu_s"]["now"], ch["cpu_s"]["before"]
    assert len(now) == len(before) == ch["rounds"] >= 2
    assert all(b > a for a, b in zip(now, before, strict=True))  # faster in every alternating pair
    assert ch["ratio"] == float(np.median([b / a for a, b in zip(now, before, strict=True)]))
    assert ch["chosen"]["now"] == ch["chosen"]["before"] and len(ch["chosen"]["now"]) == 3
    assert "the same λ" in scale.choice_text(ch)


def test_the_ppo_reruns_show_the_twins_env_cheaper_than_before_window_by_window() -> None:
    """The note's env ratios at 100 agents are the JSON's, and each window's run of this code has a
    lower twin / emulator env ratio than the code before's run just before it."""
    ratios: dict[str, list[float]] = {"before (869c062)": [], "this code": []}
    for run in RES["ppo_reruns"]:
        row = next(r for r in run["rows"] if r["agents"] == 100)
        env = scale.env_ms_per_tick(row)
        ratios[run["code"]].append(env["twin"] / env["emulator"])
    before, now = ratios["before (869c062)"], ratios["this code"]
    assert len(before) == len(now) >= 3
    assert all(n < b for b, n in zip(before, now, strict=True))
    note = RES["reset_note"]
    assert f"{', '.join(f'{v:.2f}' for v in before)} times the emulator's with the code before" in note
    assert f"and {', '.join(f'{v:.2f}' for v in now)} with this code" in note
