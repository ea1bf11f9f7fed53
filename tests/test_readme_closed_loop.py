"""README's closed-loop sentence says what docs/benchmarks/closed_loop/results_production.json says."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_closed_loop_numbers_are_the_scale_runs() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    r = json.loads((ROOT / "docs/benchmarks/closed_loop/results_production.json").read_text())["by_fleet_size"]
    pct = {k: 100 * v["canary_verdict_rate"] for k, v in r.items()}
    lo, hi = (100 * x for x in r["1000"]["canary_verdict_rate_ci"])
    assert (f"decide {pct['100']:.1f} % of them at 100 service groups, {pct['1000']:.1f} % [{lo:.1f} %, {hi:.1f} %] "
            f"at 1,000 and {pct['5000']:.1f} %") in readme  # fmt: skip
    decided = sum(v["canary_decided"] for v in r.values())
    assert all(v["canary_agreeing"] == v["canary_decided"] for v in r.values())
    assert f"all {decided} of those verdicts are right" in readme
    assert all(v["twin_alone"]["verdict_rate"]["k"] == 0 for v in r.values()) and "the twin alone decides none" in readme
    cand = r["1000"]["candidate_verdicts"]
    assert cand["agreement"]["k"] == cand["verdict_rate"]["k"]
    assert f"made for {cand['verdict_rate']['k']} of the {cand['verdict_rate']['n']} candidates at 1,000 groups, all right" in readme
