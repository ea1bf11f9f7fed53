"""The 100-group closed loop rerun after planbase15 (benchmarks/_closed_loop_rerun_planbase.py, issue 48, session 16):
the JSON is its seed files against the stored run's (recomputed), the page's section is the JSON (regenerated), a pair
whose verdict moves and a day that differs are found on hand-altered seed files, and README's sentence about the rerun
quotes the JSON."""

from __future__ import annotations

import copy
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_closed_loop_fleet_sizes import OUT, ROOT, _results, _section


@pytest.fixture(scope="module")
def rp() -> Iterator[Any]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _closed_loop_rerun_planbase

    yield _closed_loop_rerun_planbase
    sys.path.remove(str(ROOT / "benchmarks"))


def test_the_json_is_its_seed_files(rp: Any) -> None:
    cur = _results()[rp.KEY]
    again = json.loads(json.dumps(rp.compare(OUT / "scale", cur["seeds"]), default=float))
    assert again == cur
    assert cur["seeds"] == [0, 1, 2] and cur["fleet_size"] == 100 and len(cur["loops"]) == 12


def test_the_section_is_the_json(rp: Any) -> None:
    from _docs import relink

    want = relink(rp.section(_results()[rp.KEY]), OUT / "README.md")
    assert _section(rp.SECTION).startswith(want.strip())


def test_a_moved_pair_and_a_differing_day_are_found(rp: Any, tmp_path: Path) -> None:
    """The stored run compared with itself has nothing moved; a rerun whose pair's verdict and whose third day's check
    differ is reported so (the comparison is not blind)."""
    scale = tmp_path / "scale"
    scale.mkdir()
    for s in (0, 1, 2):
        src = OUT / "scale" / rp.stored.SEED_FILE.format(s=s)
        shutil.copy(src, scale / src.name)
        doc = json.loads(src.read_text())
        doc["by_fleet_size"] = {rp.SIZE: doc["by_fleet_size"][rp.SIZE]}
        (scale / rp.SEED_FILE.format(s=s)).write_text(json.dumps(doc))
    same = rp.compare(scale, [0, 1, 2])
    assert same["changed"] == [] and all(x["same_verdicts"] and not x["days_differing"] for x in same["loops"])
    assert same["rerun"] == same["stored"]
    doc = json.loads((scale / rp.SEED_FILE.format(s=1)).read_text())
    entry = doc["by_fleet_size"][rp.SIZE]
    pair = next(p for p in entry["pairs"] if p["twin_canary"] == "straddle" and p["twin_alone"] not in ("ok", "regress"))
    pair["twin_canary"] = "ok"
    loop = next(c for c in entry["per_candidate"] if c["policy"] == pair["policy"] and len(c["rounds"]) >= 3)
    day3 = copy.deepcopy(loop["rounds"][2])
    day3["agent_steps"] = int(day3["agent_steps"]) + 1
    loop["rounds"][2] = day3
    (scale / rp.SEED_FILE.format(s=1)).write_text(json.dumps(doc))
    got = rp.compare(scale, [0, 1, 2])
    assert len(got["changed"]) == 1 and got["changed"][0].startswith(f"seed 1: {pair['policy']} {pair['kpi']} straddle → ok")
    mine = next(x for x in got["loops"] if x["seed"] == 1 and x["policy"] == pair["policy"])
    assert not mine["same_verdicts"] and mine["days_differing"] == [3]
    assert got["rerun"]["decided"]["k"] == same["rerun"]["decided"]["k"] + 1


def _moved_loop(cur: dict[str, Any]) -> dict[str, Any]:
    (loop,) = [x for x in cur["loops"] if not x["same_verdicts"]]
    return loop


def test_the_readme_and_the_analysis_quote_the_rerun(rp: Any) -> None:
    """README's sentence and "What the rerun says": the counts, the loops that keep their verdicts, the one that moved
    (its guard's KPI and ticks, both regressions by their 20-day truths), the first days' splits, and why the larger
    fleets were not rerun (their stored first days' slices exceed the matched-pair design's pairs)."""
    from edgetwin.loop.plan import MAX_PAIRS

    cur = _results()[rp.KEY]
    a, b = cur["rerun"], cur["stored"]
    d, g = a["decided"], a["agreement"]
    same = sum(x["same_verdicts"] for x in cur["loops"])
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert (f"Rerun at 100 groups on the code with that change ({rp.CODE.split(':')[0]}), the canaries decide {d['k']} of {d['n']} open "
            f"pairs, {g['k']} of those {g['n']} right, and {same} of the 12 candidates' loops give every pair the "
            "verdict they gave before (the twelfth's guard stopped its first day on reward instead of offload, both "
            "regressions); the 1,000- and 5,000-group slices are too large for matched pairs (at most 12)") in readme
    assert (d, g) == (b["decided"], b["agreement"]) and a["coverage"]["rate"] == b["coverage"]["rate"] == 1.0
    sec = _section(rp.SECTION)
    text = " ".join(sec[sec.index(rp.KEEP[0]):].split())
    split = [x for x in cur["loops"] if x["first_day_agent_steps"][0] != x["first_day_agent_steps"][1]]
    assert f"the first day of {len(split)} of the 12 loops puts another number of groups on the candidate" in text
    assert sum(x["first_day_agent_steps"] == [460, 368] for x in split) > len(split) / 2  # "mostly 4 of the 10 ... 5 with 5"
    assert f"{same} of the 12 loops give every pair its stored verdict" in text
    moved = _moved_loop(cur)
    assert moved["seed"] == 0 and moved["policy"] == "cloud-only, no capacity"
    doc = {f: json.loads((OUT / "scale" / f).read_text())["by_fleet_size"]["100"]
           for f in (rp.SEED_FILE.format(s=0), rp.stored.SEED_FILE.format(s=0))}  # fmt: skip
    new, old = ([c for c in doc[f]["per_candidate"] if c["policy"] == moved["policy"]][0]["rounds"][0]
                for f in (rp.SEED_FILE.format(s=0), rp.stored.SEED_FILE.format(s=0)))  # fmt: skip
    assert (new["guard_kpi"], old["guard_kpi"]) == ("reward", "response.offload_ratio")
    new_r, old_r = ([c for c in doc[f]["per_candidate"] if c["policy"] == moved["policy"]][0]["reason"]
                    for f in (rp.SEED_FILE.format(s=0), rp.stored.SEED_FILE.format(s=0)))  # fmt: skip
    assert "after 20 tick(s)" in new_r and "after 16 tick(s)" in old_r
    assert "stopped its first day on reward after 20 ticks instead of on offload after 16" in text
    truths = {p["kpi"]: p["truth_change"] for p in doc[rp.SEED_FILE.format(s=0)]["pairs"] if p["policy"] == moved["policy"]}
    assert truths["response.offload_ratio"] < -0.05 and truths["reward"] < -0.05  # both higher-is-better: regressions
    assert f"(20-day truths {100 * truths['response.offload_ratio']:.1f} % and {100 * truths['reward']:.1f} %)" in text
    for n, size in (("1000", 100), ("5000", 500)):  # "every stored first day took the largest slice ... beyond 12 pairs"
        for s in (0, 1, 2):
            loops = json.loads((OUT / "scale" / rp.stored.SEED_FILE.format(s=s)).read_text())["by_fleet_size"][n]["per_candidate"]
            assert all(c["rounds"][0]["n_groups"] == size for c in loops if c["rounds"])
        assert size // 2 > MAX_PAIRS
