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


def test_the_readme_extension_numbers_are_the_extended_run() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    ext = json.loads((ROOT / "docs/benchmarks/closed_loop/results_production.json").read_text())["extended"]
    r = ext["by_fleet_size"]["1000"]
    lo, hi = (100 * x for x in r["canary_verdict_rate_ci"])
    looks = ", ".join(str(d) for d in ext["looks"][:-1]) + f" and {ext['looks'][-1]}"
    assert f"for up to {ext['max_days']} canary days" in readme and f"looks at days {looks}" in readme
    assert (f"at 1,000 groups to {100 * r['canary_verdict_rate']:.1f} % [{lo:.1f} %, {hi:.1f} %], all "
            f"{r['canary_decided']} of those verdicts right") in readme  # fmt: skip
    assert r["canary_agreeing"] == r["canary_decided"]
    cand = r["candidate_verdicts"]
    assert cand["agreement"]["k"] == cand["verdict_rate"]["k"]
    assert f"decides {cand['verdict_rate']['k']} of the {cand['verdict_rate']['n']} candidates, all right" in readme


def test_the_readme_switchback_numbers_are_the_benchmarks() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    doc = (ROOT / "docs/benchmarks/switchback/README.md").read_text()
    assert "--switchback-site" in readme
    for claim in ("+11.2", "-5.2", "+10.8"):  # the page's numbers behind the README's rounded ones
        assert claim in doc.replace("−", "-"), claim
    assert "SLO violations at +11 % on its site where a group split of the same budget said -5 % against the fleet's +11 %" in readme


def test_the_readme_switchback_wire_numbers_are_the_wire_run() -> None:
    """The README's account of a switchback through the wire is docs/benchmarks/switchback/wire.json's."""
    import json
    import re

    readme = " ".join((ROOT / "README.md").read_text().split())
    wire = json.loads((ROOT / "docs/benchmarks/switchback/wire.json").read_text())
    said = re.search(r"equal the direct run's on (\d+ of \d+) days", readme)
    assert said, "the README no longer states the wire run's agreement"
    served = re.search(r"on (\d+ of \d+) days; the largest KPI difference between the wire's log and the direct run is 0 ",
                       wire["findings"][0])  # fmt: skip
    assert served and served.group(1) == said.group(1)
    assert "canary verdict --design switchback" in readme
