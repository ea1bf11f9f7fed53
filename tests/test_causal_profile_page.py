"""The scale page's causal-fit section (issue 47): the ratio it states is the median of the stored
rounds' ratios, each round's ratio is its two fits' CPU seconds, and the page says what fit.json holds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_the_stored_ratio_is_the_median_of_alternating_unprofiled_rounds() -> None:
    import scale  # type: ignore[import-not-found]

    cp = json.loads((ROOT / "docs/benchmarks/scale/fit.json").read_text())["causal_fit"]
    rounds = cp["rounds"]
    assert len(rounds) >= 3 and [r["first"] for r in rounds[:3]] == ["causal", "mail", "causal"]
    for r in rounds:
        assert abs(r["ratio_cpu"] - r["causal"]["cpu_s"] / r["mail"]["cpu_s"]) < 1e-12
    assert cp["ratio_cpu"] == float(np.median([r["ratio_cpu"] for r in rounds]))
    text = "\n".join(scale.causal_fit_lines(cp, "docs/benchmarks/scale/fit.json"))
    assert f"**{cp['ratio_cpu']:.2f}x**" in text and ("MISSED" in text) == (cp["ratio_cpu"] > 1.5)
    page = (ROOT / "docs/benchmarks/scale/README.md").read_text()
    assert text.strip() in page
    row = [line for line in (ROOT / "docs/benchmarks/README.md").read_text().splitlines()
           if "causal fit's CPU time relative to MAIL-MMSG's" in line][0]
    assert f"| {cp['ratio_cpu']:.2f}× |" in row and "--rounds 3" in row
