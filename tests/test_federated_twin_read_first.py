"""The federated-twin page's "Read this first" paragraph quotes the true returns' range from its results.json."""

from __future__ import annotations

import json
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "federated_twin"


def test_the_true_returns_range_is_the_jsons() -> None:
    pols = json.loads((PAGE / "results.json").read_text())["part1"]["policies"]
    real = [float(p["real"]) for p in pols]
    assert [p["policy"] for p in pols[:2]] == ["random", "heuristic (SLO-aware)"]
    text = " ".join((PAGE / "README.md").read_text().split())
    within = sum(abs(r) <= 0.1 for r in real)
    assert (f"policies lie within {min(real):.2f} to {max(real):+.2f}, {within} of the {len(real)} within ±0.1".replace("-", "−")
            in text)  # fmt: skip
    assert f"random {real[0]:.3f}, SLO-aware heuristic {real[1]:.3f}" in text
