"""The 100-group closed loop rerun on the code after planbase15 (issue 48, session 16): does the
headline `by_fleet_size` still describe the loop that ships?

Why this check: the headline run (`_closed_loop_fleetsize_bound`, the seed files
``scale/extended_fc_day_bound_seed<S>.json``) ran before planbase15 made the canary plan's expected
interval divide by the baseline level's own interval (`edgetwin.loop.plan_expected`). The loop's
first day calls `edgetwin.loop.plan.plan_canary`, whose choice between a coin-flip (``random``) and
a matched-pair split of the slice rests on that interval, and every extension day redraws the first
day's plan: so the slices, and through them the verdicts, may differ on today's code. The matched
pairs are on offer only up to `edgetwin.loop.plan.MAX_PAIRS` pairs, i.e. at 100 groups (a 10-group
slice), not at 1,000 or 5,000 (100- and 500-group slices): the rerun is made where the choice exists,
with the stored run's seeds, twins, candidates, fleets, 20-day truths and budget (``--reuse``), and
compared pair by pair and day by day. It does not replace the headline: it says whether it moved.

    python benchmarks/closed_loop.py --scale --seed S --fleet-sizes 100 --max-candidates 4 --truth-days 20 \\
        --work W --max-days 16 --reuse docs/benchmarks/closed_loop/scale --fleet-control --cuped per_arm   # S = 0 1 2
    python benchmarks/closed_loop.py --planbase-rerun W
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import _closed_loop_fleetsize as prior
import _closed_loop_fleetsize_bound as stored

SECTION = "## The 100-group loop rerun after the plan's expected interval carried the baseline's error"
KEEP = ("### What the rerun says",)
KEY = "rerun_after_planbase15"
SIZE = "100"
SEED_FILE = "planbase_rerun_seed{s}.json"
#: the code the rerun ran on (a `git archive` snapshot of main)
CODE = "98668bc: main after planbase15 (`edgetwin.loop.plan_expected`)"


def collect(work: Path, scale_dir: Path, seeds: tuple[int, ...] = (0, 1, 2)) -> list[int]:
    """Copy each seed's rerun (``work/scale-s<S>.json``, `_closed_loop_scale.run_seed`'s document)
    into ``scale_dir`` as `SEED_FILE`, its `SIZE` entry only; the seeds whose entry is complete."""
    done = []
    for s in seeds:
        path = work / f"scale-s{s}.json"
        if not path.is_file():
            continue
        doc = json.loads(path.read_text())
        entry = doc.get("by_fleet_size", {}).get(SIZE)
        if not entry or not entry.get("complete"):
            continue
        doc["by_fleet_size"] = {SIZE: entry}
        doc["code"] = CODE
        (scale_dir / SEED_FILE.format(s=s)).write_text(json.dumps(doc, indent=1, default=float))
        done.append(s)
    return done


def _day_differs(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two runs' same canary day differ in its candidate agent-steps, its stop, the KPI its guard
    stopped on or a KPI's check (agent-steps alone can coincide: 4 groups for 20 ticks, 5 for 16)."""
    keys = ("agent_steps", "stop", "guard_kpi", "checks")
    return tuple(a.get(k) for k in keys) != tuple(b.get(k) for k in keys)


def compare(scale_dir: Path, seeds: list[int]) -> dict[str, Any]:
    """The rerun's seed files against the stored run's at `SIZE`: both runs' `prior.size_entry`
    (decided, agreement, coverage, canary days, agent-steps), every pair whose verdict moved
    (`prior.rerun_check`'s ``changed``, old → new with its 20-day truth), and per candidate loop
    whether its pairs' verdicts are the stored ones, its canary days that differ, and its first
    day's candidate agent-steps before and after (the split of the slice: a matched-pair split puts
    half the slice on the candidate, coin flips a random share)."""
    new = [json.loads((scale_dir / SEED_FILE.format(s=s)).read_text()) for s in seeds]
    old = [json.loads((scale_dir / stored.SEED_FILE.format(s=s)).read_text()) for s in seeds]
    moved = prior.rerun_check({SIZE: new}, scale_dir, stored.SEED_FILE)[SIZE]["changed"]
    loops = []
    for d_new, d_old in zip(new, old, strict=True):
        o_of = {c["policy"]: c for c in d_old["by_fleet_size"][SIZE]["per_candidate"]}
        pairs_of = {(p["policy"], p["kpi"]): p["twin_canary"] for p in d_old["by_fleet_size"][SIZE]["pairs"]}
        for c in d_new["by_fleet_size"][SIZE]["per_candidate"]:
            o = o_of[c["policy"]]
            mine = {p["kpi"]: p["twin_canary"] for p in d_new["by_fleet_size"][SIZE]["pairs"] if p["policy"] == c["policy"]}
            # the days both loops ran (their lengths are kept beside: a loop may stop earlier in one)
            days = [i + 1 for i, (a, b) in enumerate(zip(o["rounds"], c["rounds"], strict=False)) if _day_differs(a, b)]
            loops.append({"seed": int(d_new["seed"]), "policy": c["policy"],
                          "same_verdicts": all(pairs_of[(c["policy"], k)] == v for k, v in mine.items()),
                          "days": [len(o["rounds"]), len(c["rounds"])], "days_differing": days,
                          "first_day_agent_steps": [int(o["rounds"][0]["agent_steps"]) if o["rounds"] else 0,
                                                    int(c["rounds"][0]["agent_steps"]) if c["rounds"] else 0]})  # fmt: skip
    return {"code": CODE, "fleet_size": int(SIZE), "seeds": seeds, "commands": [
        f"python benchmarks/closed_loop.py --scale --seed S --fleet-sizes {SIZE} --max-candidates 4 --truth-days 20 "
        "--work W --max-days 16 --reuse docs/benchmarks/closed_loop/scale --fleet-control --cuped per_arm",
        "python benchmarks/closed_loop.py --planbase-rerun W"],
        "rerun": prior.size_entry(new, SIZE), "stored": prior.size_entry(old, SIZE), "changed": moved, "loops": loops}


def section(res: dict[str, Any]) -> str:
    """The page's section (every number from ``res``, `compare`'s result)."""
    a, b = res["rerun"], res["stored"]
    loops = res["loops"]
    same = sum(x["same_verdicts"] for x in loops)
    touched = sum(bool(x["days_differing"]) for x in loops)
    paired = sum(x["first_day_agent_steps"][0] != x["first_day_agent_steps"][1] for x in loops)
    lines = [SECTION, "",
             "Commands: " + ", then ".join(f"`{c}`" for c in res["commands"]) + f" (S: each of the seeds, W: the rerun's work directory), on "
             f"{res['code']}. The loop of \"The verdict rate by fleet size with the one-day bound\" at {res['fleet_size']} "
             "groups, the same seeds, twins, candidates, fleets, 20-day truths and budget, on the code whose canary plan "
             "divides the expected change by the baseline level's own interval: its first day may split the 10-group slice "
             "by coin flips where the stored run paired it, and every extension day redraws the first day's plan. Results "
             f"`{KEY}` in results_production.json, seed files `scale/{SEED_FILE.format(s='<S>')}`.", "",
             "| run | seeds | canaries decided | right | interval covers the 20-day truth | canary agent-steps | canary days |",
             "|---|---|---|---|---|---:|---:|"]
    for name, v in (("stored (headline)", b), ("rerun", a)):
        lines.append(f"| {name} | {v['seeds']} | {prior._r(v['decided'])} | {prior._r(v['agreement'])} | "
                     f"{prior._r(v['coverage'])} | {v['agent_steps']:,} | {v['rounds']} |")
    lines += ["", f"Of the {len(loops)} candidate loops, {same} give every pair the stored run's verdict; {touched} have a "
              f"canary day whose candidate agent-steps, stop, guard's KPI or a KPI's check differ; {paired} have a first day of another size "
              "on the candidate arm (the slice's split). Pairs whose verdict moved (old → new, 20-day truth): "
              + ("; ".join(res["changed"]) if res["changed"] else "none") + "."]
    return "\n".join(lines) + "\n"


def write_page(work: Path, out: Path) -> dict[str, Any]:
    """``--planbase-rerun W``: `collect` the rerun's seeds from ``W``, `compare` them with the
    stored run into results_production.json (`KEY`) and the page's section."""
    from _docs import write_section

    seeds = collect(work, out / "scale")
    if not seeds:
        raise SystemExit(f"--planbase-rerun {work}: no complete {SIZE}-group scale-s<S>.json there")
    path = out / "results_production.json"
    cur = json.loads(path.read_text())
    cur[KEY] = compare(out / "scale", seeds)
    path.write_text(json.dumps(cur, indent=1, default=float))
    write_section(SECTION, section(cur[KEY]), doc=out / "README.md", keep=KEEP)
    return cur[KEY]
