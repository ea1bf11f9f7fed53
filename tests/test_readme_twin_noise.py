"""The README's sentence on the output noise model says what the benchmarks' JSON and page say."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_noise_model_numbers_are_the_benchmarks() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    gate = json.loads((ROOT / "docs/benchmarks/whatif_gate/results_random.json").read_text())
    assert f"agree with the cluster {100 * gate['confident_agreement']:.1f} % of the time (90.6 % with one std)" in readme
    before = "| confident agreement (target ≥ 95 %) | 29 / 32 = 90.6 % (CP 90 %: 77.5-97.4) |"
    assert before in (ROOT / "docs/benchmarks/whatif_gate/README.md").read_text()
    page = (ROOT / "docs/benchmarks/twin_fidelity/README.md").read_text()
    row = "| 3 seeds pooled | 153 / 198 = 77.3 % (CP 90 % 72-82) | **144 / 198 = 72.7 % (CP 90 % 67-78)** |"
    assert row in page
    assert "cover 72.7 % of 198 (candidate, KPI) changes over 3 seeds (77.3 % with one std)" in readme
    assert (ROOT / "edgetwin/imitation/noise.py").is_file()
