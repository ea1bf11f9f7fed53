"""The closed loop's verdict rate by fleet size on the one-day bound (issue 48, session 14): the
extended fleet-control loop of `_closed_loop_fleetsize` (the day-term run) rerun at 100, 1,000 and
5,000 groups on the code that carries `edgetwin.loop.day_bound` (a one-day verdict's day term
bounded by what the logs' level spread cannot reveal, the bound blended away as canary days come),
merged by ``--scale-merge ... --merge-as day_bound`` into ``extended_fleet_control_day_bound``.

Why a module beside `_closed_loop_fleetsize` and not a rerun of it: that run's section, its JSON
(``day_term_by_fleet_size``) and its checks of the stopped-day rule are what the day-term code
measured and stay on the page as that; this run replaces the headline ``by_fleet_size`` (the
issue's fields: README.md quotes it) so that the headline is the code the loop runs today, keeps
the headline it replaces under ``before_day_bound``, and counts every pair whose verdict moved
against the day-term run (the same seeds, twins, candidates, fleets, 20-day truths and budget).

    python benchmarks/closed_loop.py --scale-merge 0 1 2 --work W1K --scale-more W100 W5K --merge-as day_bound
    python benchmarks/closed_loop.py --fleet-size-page day_bound
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import _closed_loop_fleetsize as prior

SECTION = "## The verdict rate by fleet size with the one-day bound"
KEEP = ("### What the fleet sizes say (one-day bound)",)
VARIANT = "day_bound"
RUN_KEY = f"extended_fleet_control_{VARIANT}"
SEED_FILE = f"extended_fc_{VARIANT}_seed{{s}}.json"
KEY = "day_bound_by_fleet_size"
#: the code the merged run was made on (the 1,000-group run of session 13 on c551678's loop, equal to ea1dcfd's; the
#: 100-group run of session 14 on ea1dcfd; the 5,000-group run of session 15 on ffc40e1, whose loop gives ea1dcfd's slices
#: and verdicts: between them only the plan's day count (read after the slice is chosen) and a vectorised arm labelling)
CODE = ("ea1dcfd: main with issue 48's one-day bound (`edgetwin.loop.day_bound`; the 1,000-group seeds run on c551678, "
        "whose loop is ea1dcfd's, the 5,000-group seeds on ffc40e1, whose loop chooses ea1dcfd's slices and gives its "
        "verdicts: what changed between them is the plan's day count, counted after the slice is chosen, and the "
        "measured arms' labels in one vectorised groupby)")
#: where the headline this run replaces is kept
BEFORE_KEY = "before_day_bound"
#: what the headline ``by_fleet_size`` holds once `replace_headline` has run
DESIGN = ("extended canaries (up to 16 days, looks at 1, 2, 4, 8, 16), the rest of the fleet as control with a CUPED "
          "slope per arm (the jackknife's variance), canary days pooled by design weights, the verdict's calibrated day "
          "term with the one-day bound, the stopped-day rule "
          f"({RUN_KEY}; code {CODE})")


def changed_pairs(docs_of: dict[str, list[dict[str, Any]]], scale_dir: Path) -> dict[str, list[str]]:
    """Per fleet size, every pair decided in the day-term run (its seed files in ``scale_dir``) and
    not in this one, or decided otherwise (old → new, with its 20-day truth): `prior.rerun_check`'s
    ``changed`` against ``extended_fc_day_term_seed<S>.json``."""
    got = prior.rerun_check(docs_of, scale_dir, prior.SEED_FILE)
    return {n: e["changed"] for n, e in got.items()}


def fleet_sizes(cur: dict[str, Any], scale_dir: Path) -> dict[str, Any]:
    """``day_bound_by_fleet_size``: per fleet size of the merged run (`RUN_KEY`), `prior.size_entry`
    on its seed files, beside the day-term run's count of the same size (``day_term``) and the pairs
    whose verdict moved (``changed``); ``same_candidates``: every size recounted on the candidates
    that ran at all sizes for every seed."""
    run = cur[RUN_KEY]
    docs_of = {n: [json.loads((scale_dir / SEED_FILE.format(s=s)).read_text()) for s in v["seeds"]]
               for n, v in run["by_fleet_size"].items()}  # fmt: skip
    sizes = sorted(docs_of, key=int)
    moved = changed_pairs(docs_of, scale_dir)
    out: dict[str, Any] = {"run": RUN_KEY, "commands": run["scale_config"]["commands"], "by_fleet_size": {}}
    old = cur.get(prior.KEY, {}).get("by_fleet_size", {})
    for n in sizes:
        entry = prior.size_entry(docs_of[n], n) | {"code": CODE, "changed": moved.get(n, [])}
        if n in old:
            entry["day_term"] = {k: old[n][k] for k in ("decided", "agreement", "coverage", "agent_steps", "rounds", "wrong", "code")}
        out["by_fleet_size"][n] = entry
    common = set.intersection(*[{s["policy"] for s in d["by_fleet_size"][n]["per_candidate"]}
                                for n in sizes for d in docs_of[n]])  # fmt: skip
    seeds = set.intersection(*[{int(d["seed"]) for d in docs_of[n]} for n in sizes])
    out["same_candidates"] = {"candidates": sorted(common), "seeds": sorted(seeds),
                              "by_fleet_size": {n: prior.size_entry([d for d in docs_of[n] if int(d["seed"]) in seeds], n, common)
                                                for n in sizes}}  # fmt: skip
    return out


def replace_headline(cur: dict[str, Any]) -> bool:
    """The issue's headline ``by_fleet_size`` describes today's code: when the merged run covers every
    size the headline holds, its entries replace the headline's (each with `DESIGN`); the headline
    they replace (and its steps-ratio fields) is kept once under `BEFORE_KEY`, and the day-term run
    is marked as superseded (`prior.SUPERSEDED`) so that its own page command leaves the headline
    alone. False (nothing changes) when a size is missing."""
    run = cur[RUN_KEY]["by_fleet_size"]
    if not set(cur.get("by_fleet_size", {})) <= set(run):
        return False
    if BEFORE_KEY not in cur:
        cur[BEFORE_KEY] = {"by_fleet_size": cur.get("by_fleet_size", {}),
                           "what": "the headline before the one-day bound: the day-term run (`day_term_by_fleet_size`)",
                           **{k: cur.get(k) for k in prior.STEPS_KEYS}}  # fmt: skip
    for k in prior.STEPS_KEYS:
        cur[k] = cur[RUN_KEY][k]
    cur["by_fleet_size"] = {n: {k: v for k, v in run[n].items() if k != "per_candidate_rounds"} | {"design": DESIGN}
                            for n in sorted(run, key=int)}  # fmt: skip
    if prior.KEY in cur:
        cur[prior.KEY][prior.SUPERSEDED] = KEY
    return True


def section(res: dict[str, Any]) -> str:
    """The page's section (every number from ``res``, `fleet_sizes`' result)."""
    by = res["by_fleet_size"]
    head = (f"the headline `by_fleet_size` is this run's (the day-term run's kept under `{BEFORE_KEY}`)"
            if res.get("headline_replaced") else "the headline `by_fleet_size` is not moved (a size is missing)")
    ran = "; ".join(f"{int(n):,} groups: seeds {v['seeds']}, candidates per seed "
                    + ", ".join(f"{s}: {k}" for s, k in v["candidates_per_seed"].items()) for n, v in by.items())  # fmt: skip
    lines = [SECTION, "",
             "Commands: " + ", then ".join(f"`{c}`" for c in res["commands"]) + ", then `python benchmarks/closed_loop.py "
             "--fleet-size-page day_bound`. The extended fleet-control loop of \"The verdict rate by fleet size with the day "
             "term\" (up to 16 canary days, looks at 1, 2, 4, 8, 16, the rest of the fleet as control with a CUPED slope "
             "per arm) with the same seeds, twins, candidates, fleets, 20-day truths and budget (a fixed 10 % share, half on "
             f"the candidate), run on {CODE}: what changed since the day-term run is the CUPED-adjusted arms' variance (the "
             "jackknife's), the pooling of canary days by design weights, the verdict's relative change by interval "
             "division, and a one-day verdict's day term bounded by what the logs' level spread cannot reveal (the "
             "section \"The one-day canary's day term: what the level's spread cannot reveal\"). Results "
             f"`{RUN_KEY}` and `{KEY}` in results_production.json; {head}. "
             f"What ran: {ran}. Of the distinct (candidate, KPI) pairs the twin alone left open: decided by the canaries "
             "(`canary_verdict_rate`), of those agreeing with the 20-day truth (`confident_agreement`), and how often the "
             "last look's interval covers the 20-day truth (stated 90 % over the looks, over the open pairs the loop gave "
             "an interval); Clopper-Pearson 95 % over pairs (optimistic: a candidate's pairs share its canaries).", "",
             "| groups | seeds | canaries decided | right | interval covers the 20-day truth | canary agent-steps | "
             "canary days | day-term run: decided | right |",
             "|---|---|---|---|---|---:|---:|---|---|"]  # fmt: skip
    for n, v in by.items():
        b = v.get("day_term", {})
        lines.append(f"| {int(n):,} | {v['seeds']} | {prior._r(v['decided'])} | {prior._r(v['agreement'])} | "
                     f"{prior._r(v['coverage'])} | {v['agent_steps']:,} | {v['rounds']} | {prior._r(b.get('decided'))} | "
                     f"{prior._r(b.get('agreement'))} |")  # fmt: skip
    lines += prior.same_and_wrong(res)
    moved = [f"{int(n):,} groups: {c}" for n, v in by.items() for c in v["changed"]]
    lines += ["", "Pairs whose verdict moved against the day-term run (old → new, 20-day truth): "
              + ("; ".join(moved) if moved else "none") + "."]
    return "\n".join(lines) + "\n"


def write_page(out: Path) -> dict[str, Any]:
    """``--fleet-size-page day_bound``: `fleet_sizes` into results_production.json (`KEY`), the
    headline moved to this run (`replace_headline`), this section, and the day-term section
    regenerated so that it says the headline is no longer its own."""
    from _docs import write_section

    path = out / "results_production.json"
    cur = json.loads(path.read_text())
    cur[KEY] = fleet_sizes(cur, out / "scale")
    cur[KEY]["headline_replaced"] = replace_headline(cur)
    path.write_text(json.dumps(cur, indent=1, default=float))
    write_section(SECTION, section(cur[KEY]), doc=out / "README.md", keep=KEEP)
    if prior.KEY in cur:
        write_section(prior.SECTION, prior.section(cur[prior.KEY]), doc=out / "README.md", keep=prior.KEEP)
    return cur[KEY]
