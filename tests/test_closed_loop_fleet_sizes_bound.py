"""The closed-loop page's verdict rate by fleet size on the one-day bound (benchmarks/_closed_loop_fleetsize_bound.py,
issue 48, session 14): the headline ``by_fleet_size`` moves to it with the headline it replaces kept, the day-term run is
marked superseded, the section is the JSON (regenerated and compared), the JSON is its seed files (recounted), and the
pairs that moved against the day-term run are those its seed files differ on."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks" / "closed_loop"


@pytest.fixture(scope="module")
def fb() -> Iterator[Any]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _closed_loop_fleetsize_bound

    yield _closed_loop_fleetsize_bound
    sys.path.remove(str(ROOT / "benchmarks"))


def _results() -> dict[str, Any]:
    return json.loads((OUT / "results_production.json").read_text())


def _section(heading: str) -> str:
    text = (OUT / "README.md").read_text()
    start = text.index(heading)
    nxt = text.find("\n## ", start + 1)
    return text[start: nxt + 1 if nxt != -1 else len(text)]


def test_replace_headline_keeps_the_old_one_once_and_marks_the_day_term_run(fb: Any) -> None:
    steps = {k: 7.0 for k in fb.prior.STEPS_KEYS}
    cur: dict[str, Any] = {fb.RUN_KEY: {"by_fleet_size": {"100": {"r": 1, "per_candidate_rounds": []}, "5000": {"r": 2}},
                                        **steps},
                           "by_fleet_size": {"100": {"r": 0, "design": "old"}, "5000": {"r": 0, "design": "old"}},
                           fb.prior.KEY: {"by_fleet_size": {}}, **{k: 3.0 for k in fb.prior.STEPS_KEYS}}  # fmt: skip
    assert fb.replace_headline(cur)
    assert cur["by_fleet_size"] == {"100": {"r": 1, "design": fb.DESIGN}, "5000": {"r": 2, "design": fb.DESIGN}}
    assert cur[fb.BEFORE_KEY]["by_fleet_size"]["100"]["design"] == "old"
    assert all(cur[k] == 7.0 and cur[fb.BEFORE_KEY][k] == 3.0 for k in fb.prior.STEPS_KEYS)
    assert cur[fb.prior.KEY][fb.prior.SUPERSEDED] == fb.KEY
    assert fb.replace_headline(cur) and cur[fb.BEFORE_KEY]["by_fleet_size"]["100"]["design"] == "old"  # kept once
    short = {fb.RUN_KEY: {"by_fleet_size": {"100": {}}}, "by_fleet_size": {"100": {}, "1000": {}}}
    assert not fb.replace_headline(short) and fb.BEFORE_KEY not in short  # a size missing: nothing moves


def test_changed_pairs_are_the_seed_files_differences(fb: Any, tmp_path: Path) -> None:
    def pair(policy: str, kpi: str, verdict: str, truth: float) -> dict[str, Any]:
        return {"policy": policy, "kpi": kpi, "twin_canary": verdict, "truth_change": truth}

    old = {"seed": 2, "by_fleet_size": {"100": {"pairs": [pair("a", "slo", "ok", 0.01), pair("a", "carbon", "straddle", 0.0),
                                                          pair("b", "slo", "regress", 0.2)], "per_candidate": []}}}  # fmt: skip
    (tmp_path / fb.prior.SEED_FILE.format(s=2)).write_text(json.dumps(old))
    new = {"seed": 2, "by_fleet_size": {"100": {"pairs": [pair("a", "slo", "straddle", 0.01), pair("a", "carbon", "abstain", 0.0),
                                                          pair("b", "slo", "regress", 0.2)], "per_candidate": []}}}  # fmt: skip
    assert fb.changed_pairs({"100": [new]}, tmp_path) == {"100": ["seed 2: a slo ok → straddle (truth +1.0 %)"]}


def test_the_section_is_the_json(fb: Any) -> None:
    from _docs import relink

    cur = _results()
    if fb.KEY not in cur:
        pytest.skip("no day_bound_by_fleet_size yet")
    want = relink(fb.section(cur[fb.KEY]), OUT / "README.md")
    assert _section(fb.SECTION).startswith(want.strip())


def test_the_json_is_its_seed_files_and_the_headline(fb: Any) -> None:
    """``day_bound_by_fleet_size`` recounted from the merged run's seed files, and the headline ``by_fleet_size`` (the
    issue's fields) its entries."""
    cur = _results()
    if fb.KEY not in cur:
        pytest.skip("no day_bound_by_fleet_size yet")
    again = json.loads(json.dumps(fb.fleet_sizes(cur, OUT / "scale")))
    again["headline_replaced"] = cur[fb.KEY]["headline_replaced"]
    assert again == cur[fb.KEY]
    assert cur[fb.KEY]["headline_replaced"] and sorted(cur["by_fleet_size"], key=int) == ["100", "1000", "5000"]
    for n, v in cur["by_fleet_size"].items():
        mine = cur[fb.KEY]["by_fleet_size"][n]
        assert (v["canary_decided"], v["open_after_twin"], v["canary_agreeing"]) == \
            (mine["canary_decided"], mine["open_after_twin"], mine["canary_agreeing"])
        assert v["design"] == fb.DESIGN and v["twin_canary_agent_steps"] == mine["agent_steps"]
        assert cur[fb.BEFORE_KEY]["by_fleet_size"][n]["design"] == fb.prior.DESIGN  # the day-term headline, kept
    assert cur[fb.prior.KEY][fb.prior.SUPERSEDED] == fb.KEY
