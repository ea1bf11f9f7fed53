"""The closed loop's verdict rate by fleet size with today's code (issue 48): the extended
fleet-control loop with the verdict's calibrated day term, merged by ``--scale-merge ... --merge-as
day_term`` into ``extended_fleet_control_day_term``, against the headline ``by_fleet_size`` (the
slice-control runs made before the day term).

Per fleet size: of the distinct (candidate, KPI) pairs the twin alone left open, the share the
loop's canaries decided (``canary_verdict_rate``, Clopper-Pearson 95 %), how many of those agree
with the 20-day truth (``confident_agreement``), how often the last look's interval covers the
20-day truth, the candidate arm's agent-steps and the canary days run; per seed the day-term
section's `loop_scores`. Because fewer candidates may run at the largest size (two per seed at
5,000 groups, the old run's), ``same_candidates`` recounts every size on the candidates that ran at
all of them, so that the rate by fleet size compares the same questions.

    python benchmarks/closed_loop.py --scale-merge 0 1 2 --work W5K [--scale-more W1K] --merge-as day_term
    python benchmarks/closed_loop.py --fleet-size-page
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SECTION = "## The verdict rate by fleet size with the day term"
KEEP = ("### What the fleet sizes say",)
#: ``--merge-as`` name of the run: `_closed_loop_scale.fc_variant` gives its key and seed files
VARIANT = "day_term"
RUN_KEY = f"extended_fleet_control_{VARIANT}"
SEED_FILE = f"extended_fc_{VARIANT}_seed{{s}}.json"
KEY = "day_term_by_fleet_size"
#: the code the merged run was made on (`write_page` records it)
CODE = "68e4f7b: main at a5d40b3 with issue 48's stopped-day rule (`edgetwin.loop.rounds._stopped_day_verdict`)"
#: the run before the stopped-day rule: its code, and where its seed files are kept (`before_guard_days`)
BEFORE_CODE = "2c7cd63: main at 51e038e with the 5,000-group bus frame, `fleet_frame_bytes`"
BEFORE_DIR = "before_guard_days"
BEFORE_KEY = "before_guard_days"
#: the page's sections measured with the loop's rule before the stopped-day rule, not rerun (`section`'s note)
#: ("What narrows the interval at 1,000 groups" was rejudged by the rule, `_closed_loop_levers.rejudge_cli`; "Closed
#: loop: twin alone vs canary alone vs twin + canary", the quick runs, rerun on the code with the rule)
OLD_RULE_SECTIONS = ("Closed loop at 100, 1,000 and 5,000 groups", "Extended canaries", "Extended canaries with the rest of the fleet as control", "… (reseeded)",
                     "What bounds the verdict rate at 1,000 groups",
                     "The verdict's day-to-day term (its 1,000-group reruns)")  # fmt: skip


#: which of the page's runs read the verdict's relative change by interval division (9f6a854 on), and which by the
#: delta method before it (`edgetwin.contract.relative_change`; `section`'s note)
INTERVAL_DIVISION_NOTE = (
    "The verdict's relative change is read by interval division since 9f6a854 (the effect's interval over every "
    "baseline level the baseline's own interval allows; the delta method before it undercovered large effects over "
    "noisy baselines: `edgetwin.contract.relative_change`). Rerun on it: \"Coverage of the verdict's interval at the "
    "loop's arm sizes\" (with the delta method's numbers beside) and, at 1,000 groups, \"Extended canaries with the rest "
    "of the fleet as control (interval_division)\" (16 of 84 open pairs decided, 14 right, against this section's 15, 15 "
    "right). Every other section of this page, this one included, was measured with the delta method and not rerun. "
    "Since 7fad20a the CUPED-adjusted arms' variance is the jackknife's and since 1616a88 canary days are pooled by "
    "design weights (\"CUPED's slope and heavy tails\" below): rerun on them are the coverage experiment, the 1,000-group "
    "design table and that section; every closed-loop run on this page (the 1,000-group interval_division run included) "
    "predates both, except the runs on the one-day bound (\"Extended canaries with the rest of the fleet as control "
    "(day_bound)\" and \"The verdict rate by fleet size with the one-day bound\"), made on all three.")


def _stopped(summary: dict[str, Any]) -> bool:
    """A candidate's loop had a canary day a stop cut short (guard, loss budget, …): the only path
    the stopped-day rule changes."""
    return any(r.get("stop") != "completed" for r in summary.get("rounds", []))


def rerun_check(docs_of: dict[str, list[dict[str, Any]]], before: Path, seed_file: str = SEED_FILE) -> dict[str, Any]:
    """Per fleet size, what ran afresh and what was taken from the run before the stopped-day rule
    (``before``: its seed files): ``reused`` (loops that never stopped, `_closed_loop_scale.reused_loops`),
    ``rerun_stopped`` (loops with a stopped day, run afresh), and for the loops that never stopped but
    ran afresh all the same, whether every pair's verdict and the loop's agent-steps are the stored
    run's (``identical`` / ``differing``): the check that taking them as they were is what a rerun gives;
    ``changed``: every pair decided in one run and not the other, or decided otherwise (old → new, with
    its 20-day truth; an open pair's label, straddle or the twin alone's, is not a change). ``seed_file``:
    the run before's seed-file name (this run's own by default: the run before kept in ``before``)."""
    from _closed_loop_scale import DECIDED

    out: dict[str, Any] = {}
    for n, docs in docs_of.items():
        e: dict[str, list[str]] = {"reused": [], "rerun_stopped": [], "identical": [], "differing": [], "changed": []}
        for d in docs:
            path = before / seed_file.format(s=d["seed"])
            old = json.loads(path.read_text())["by_fleet_size"].get(n, {}) if path.is_file() else {}
            olds = {s["policy"]: s for s in old.get("per_candidate", [])}
            cur = d["by_fleet_size"][n]
            oldp = {(p["policy"], p["kpi"]): p for p in old.get("pairs", [])}
            for p in cur["pairs"]:
                q = oldp.get((p["policy"], p["kpi"]))
                if q is not None and q["twin_canary"] != p["twin_canary"] and set(DECIDED) & {q["twin_canary"], p["twin_canary"]}:
                    e["changed"].append(f"seed {d['seed']}: {p['policy']} {p['kpi']} {q['twin_canary']} → "
                                        f"{p['twin_canary']} (truth {100 * float(p['truth_change']):+.1f} %)")
            for s in cur["per_candidate"]:
                key = f"seed {d['seed']}: {s['policy']}"
                o = olds.get(s["policy"])
                if s.get("loop_reused"):
                    e["reused"].append(key)
                elif o is None or _stopped(o) or _stopped(s):
                    e["rerun_stopped"].append(key)
                else:
                    a = {p["kpi"]: p["twin_canary"] for p in cur["pairs"] if p["policy"] == s["policy"]}
                    b = {p["kpi"]: p["twin_canary"] for p in old["pairs"] if p["policy"] == s["policy"]}
                    same = a == b and s["twin_canary_agent_steps"] == o["twin_canary_agent_steps"]
                    e["identical" if same else "differing"].append(key)
        out[n] = e
    return out


def _scores(pairs: list[dict[str, Any]], per: list[dict[str, Any]]) -> dict[str, Any]:
    """`_closed_loop_dayterm.loop_scores` over the given pairs and candidates (one seed's, or one
    seed's restricted to some candidates)."""
    from _closed_loop_dayterm import loop_scores

    return loop_scores({"by_fleet_size": {"n": {"pairs": pairs, "per_candidate": per}}}, "n")


def _pool(scores: list[dict[str, Any]]) -> dict[str, Any]:
    """Seeds' `loop_scores` summed: decided, agreement, coverage (Clopper-Pearson 95 %), the wrong
    verdicts, rounds (canary days) and agent-steps."""
    from _closed_loop_scale import rate

    out: dict[str, Any] = {m: rate(sum(s[m]["k"] for s in scores), sum(s[m]["n"] for s in scores))
                           for m in ("decided", "agreement", "coverage")}  # fmt: skip
    out["wrong"] = [w for s in scores for w in s["wrong"]]
    out["rounds"] = sum(s["rounds"] for s in scores)
    out["agent_steps"] = sum(s["agent_steps"] for s in scores)
    return out


def size_entry(docs: list[dict[str, Any]], n: str, only: set[str] | None = None) -> dict[str, Any]:
    """One fleet size over the seed files ``docs`` (each `run_seed`'s document): per seed and pooled
    `loop_scores`, with the issue's field names; ``only``: count these candidates only."""
    per_seed: dict[str, Any] = {}
    for d in docs:
        e = d["by_fleet_size"].get(n)
        if e is None or not e.get("complete"):
            continue
        per = [s for s in e["per_candidate"] if only is None or s["policy"] in only]
        pairs = [p for p in e["pairs"] if only is None or p["policy"] in only]
        per_seed[str(d["seed"])] = _scores(pairs, per) | {"candidates": [s["policy"] for s in per]}
    pooled = _pool(list(per_seed.values()))
    dec, ag = pooled["decided"], pooled["agreement"]
    return {"seeds": sorted(int(s) for s in per_seed), "candidates_per_seed": {s: len(v["candidates"]) for s, v in per_seed.items()},
            "canary_verdict_rate": dec["rate"], "canary_verdict_rate_ci": dec["ci"], "canary_decided": dec["k"],
            "open_after_twin": dec["n"], "confident_agreement": ag["rate"], "agreement_ci": ag["ci"],
            "canary_agreeing": ag["k"], **pooled, "per_seed": per_seed}  # fmt: skip


def before_entry(head: dict[str, Any]) -> dict[str, Any]:
    """The headline ``by_fleet_size`` entry's rate and agreement (made before the day term)."""
    return {k: head.get(k) for k in ("canary_verdict_rate", "canary_verdict_rate_ci", "canary_decided", "open_after_twin",
                                     "confident_agreement", "agreement_ci", "canary_agreeing", "seeds", "design")}  # fmt: skip


#: what the headline ``by_fleet_size`` holds once `replace_headline` has run
DESIGN = ("extended canaries (up to 16 days, looks at 1, 2, 4, 8, 16), the rest of the fleet as control with a CUPED "
          f"slope per arm, the verdict's calibrated day term ({RUN_KEY}; code {CODE})")


#: set on ``day_term_by_fleet_size`` when a later run's fleet sizes (its key) replaced the headline this run had set
#: (`_closed_loop_fleetsize_bound.write_page`): `replace_headline` then leaves the headline alone
SUPERSEDED = "superseded_by"

#: the headline's steps-ratio fields, replaced with ``by_fleet_size``
STEPS_KEYS = ("canary_steps_ratio", "canary_steps_ratio_lower_bound", "canary_steps_ratio_fleet_size")


def before_headline(cur: dict[str, Any]) -> dict[str, Any]:
    """The headline ``by_fleet_size`` as it was before the day term (moved to ``before_day_term`` once replaced)."""
    return cur.get("before_day_term", {}).get("by_fleet_size") or cur.get("by_fleet_size", {})


def replace_headline(cur: dict[str, Any]) -> bool:
    """The issue's headline ``by_fleet_size`` describes today's code: when the merged run (`RUN_KEY`)
    covers every size the headline holds, its entries replace the headline's (each with its
    ``design``), the old ones kept once under ``before_day_term``; else nothing changes (False). Once
    a later run has superseded this one (`SUPERSEDED`), the headline is that run's and stays so (True:
    this run had replaced it)."""
    run = cur[RUN_KEY]["by_fleet_size"]
    old = before_headline(cur)
    if cur.get(KEY, {}).get(SUPERSEDED):  # it had replaced the headline; a later run has replaced it since
        return True
    if not set(old) <= set(run):
        return False
    before = cur.setdefault("before_day_term", {"by_fleet_size": old, "what": "the headline before the day term: the "
                                                "slice-control extended loop at 100 and 1,000 groups, one canary day at 5,000"})  # fmt: skip
    for k in STEPS_KEYS:  # the steps ratio is the headline's too (`_closed_loop_scale.headline`)
        before.setdefault(k, cur.get(k))
        cur[k] = cur[RUN_KEY][k]
    cur["by_fleet_size"] = {n: {k: v for k, v in run[n].items() if k != "per_candidate_rounds"} | {"design": DESIGN}
                            for n in sorted(run, key=int)}  # fmt: skip
    return True


def fleet_sizes(cur: dict[str, Any], scale_dir: Path) -> dict[str, Any]:
    """``day_term_by_fleet_size``: per fleet size of the merged run (`RUN_KEY`), `size_entry` on its
    seed files beside the headline's ``before_day_term`` entry; ``same_candidates``: every size
    recounted on the candidates that ran at all sizes for every seed."""
    run = cur[RUN_KEY]
    docs_of = {n: [json.loads((scale_dir / SEED_FILE.format(s=s)).read_text()) for s in v["seeds"]]
               for n, v in run["by_fleet_size"].items()}  # fmt: skip
    sizes = sorted(docs_of, key=int)
    out: dict[str, Any] = {"run": RUN_KEY, "commands": run["scale_config"]["commands"], "by_fleet_size": {},
                           "rerun": rerun_check(docs_of, scale_dir / BEFORE_DIR)}  # fmt: skip
    for n in sizes:
        entry = size_entry(docs_of[n], n) | {"code": CODE}
        entry["before_day_term"] = before_entry(before_headline(cur).get(n, {}))
        prev = cur.get(BEFORE_KEY, {}).get(KEY, {}).get("by_fleet_size", {}).get(n)
        if prev is not None:  # the same size before the stopped-day rule
            entry[BEFORE_KEY] = {k: prev[k] for k in ("decided", "agreement", "coverage", "agent_steps", "rounds", "wrong", "code")}
        out["by_fleet_size"][n] = entry
    common = set.intersection(*[{s["policy"] for s in d["by_fleet_size"][n]["per_candidate"]}
                                for n in sizes for d in docs_of[n]])  # fmt: skip
    seeds = set.intersection(*[{int(d["seed"]) for d in docs_of[n]} for n in sizes])
    out["same_candidates"] = {"candidates": sorted(common), "seeds": sorted(seeds),
                              "by_fleet_size": {n: size_entry([d for d in docs_of[n] if int(d["seed"]) in seeds], n, common)
                                                for n in sizes}}  # fmt: skip
    return out


def keep_before(cur: dict[str, Any]) -> bool:
    """Once, before a run on `CODE` replaces ``day_term_by_fleet_size``: the one made before the
    stopped-day rule (`BEFORE_CODE`; its seed files under ``scale/before_guard_days``) under
    `BEFORE_KEY`, with the headline ``by_fleet_size`` it had set. True when kept now."""
    old = cur.get(KEY)
    if BEFORE_KEY in cur or not old or all(v.get("code") == CODE for v in old["by_fleet_size"].values()):
        return False
    cur[BEFORE_KEY] = {"what": "the closed loop by fleet size before issue 48's stopped-day rule: a canary day the guard "
                               "stopped judged every other KPI on the ticks it ran (seed files: scale/before_guard_days)",
                       "code": BEFORE_CODE, KEY: old, "by_fleet_size": cur.get("by_fleet_size")}  # fmt: skip
    return True


def _r(r: dict[str, Any] | None) -> str:
    if not r or not r.get("n"):
        return "—"
    lo, hi = r["ci"]
    return f"{r['k']}/{r['n']} = {100 * r['rate']:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def _head(b: dict[str, Any]) -> str:
    if b.get("canary_verdict_rate") is None:
        return "—"
    lo, hi = b["canary_verdict_rate_ci"]
    return f"{b['canary_decided']}/{b['open_after_twin']} = {100 * b['canary_verdict_rate']:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def _head_ag(b: dict[str, Any]) -> str:
    if b.get("confident_agreement") is None:
        return "—"
    lo, hi = b["agreement_ci"]
    return f"{b['canary_agreeing']}/{b['canary_decided']} = {100 * b['confident_agreement']:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def same_and_wrong(res: dict[str, Any]) -> list[str]:
    """A fleet-size section's lines after its main table: every size recounted on the candidates and
    seeds all sizes ran (``same_candidates``), then the wrong verdicts (shared by the day-bound page,
    `_closed_loop_fleetsize_bound.section`)."""
    by, same = res["by_fleet_size"], res["same_candidates"]
    lines = ["", f"The same, counted on the candidates ({', '.join(same['candidates'])}) and seeds ({same['seeds']}) every "
             "size ran, so that the sizes answer the same questions:", "",
             "| groups | canaries decided | right | interval covers the 20-day truth | canary agent-steps | canary days |",
             "|---|---|---|---|---:|---:|"]  # fmt: skip
    for n, v in same["by_fleet_size"].items():
        lines.append(f"| {int(n):,} | {_r(v['decided'])} | {_r(v['agreement'])} | {_r(v['coverage'])} | "
                     f"{v['agent_steps']:,} | {v['rounds']} |")  # fmt: skip
    wrong = [f"{int(n):,} groups: {w}" for n, v in by.items() for w in v["wrong"]]
    return [*lines, "", "Wrong verdicts: " + ("; ".join(wrong) if wrong else "none") + "."]


def section(res: dict[str, Any]) -> str:
    """The page's section (every number from ``res``, `fleet_sizes`' result)."""
    by = res["by_fleet_size"]
    ran = "; ".join(f"{int(n):,} groups: seeds {v['seeds']}, candidates per seed "
                    + ", ".join(f"{s}: {k}" for s, k in v["candidates_per_seed"].items()) for n, v in by.items())  # fmt: skip
    lines = [SECTION, "",
             "Commands: " + ", then ".join(f"`{c}`" for c in res["commands"]) + ", then `python benchmarks/closed_loop.py "
             "--fleet-size-page`. The extended fleet-control loop of the day-term section (up to 16 canary days, looks at "
             "1, 2, 4, 8, 16, the rest of the fleet as control with a CUPED slope per arm, the day term calibrated by the "
             "logs and the canaries' own days), with the same seeds, twins, "
             "candidates, fleets, 20-day truths and budget (a fixed 10 % share, half on the candidate) as the scale "
             f"section, run on {CODE}; results `{RUN_KEY}` and `{KEY}` in results_production.json. " + _rule_text(res) + " "
             f"What ran: {ran}. Before: the headline `by_fleet_size` as it was before the day term (the "
             "slice-control loop; its 5,000-group entry one canary day and ≤ 3 rounds), now "
             + _headline_text(res) + ". Of the distinct (candidate, KPI) pairs the twin alone left open: decided by the canaries "
             "(`canary_verdict_rate`), of those agreeing with the 20-day truth (`confident_agreement`), and how often the "
             "last look's interval covers the 20-day truth (stated 90 % over the looks; over the open pairs the loop gave "
             "an interval, which a candidate whose canary was stopped on its first day no longer gets); Clopper-Pearson 95 % "
             "over pairs (optimistic: a candidate's pairs share its canaries).", "",
             "| groups | seeds | with the day term: canaries decided | right | interval covers the 20-day truth | "
             "canary agent-steps | canary days | before the day term: decided | right |",
             "|---|---|---|---|---|---:|---:|---|---|"]  # fmt: skip
    for n, v in by.items():
        b = v["before_day_term"]
        lines.append(f"| {int(n):,} | {v['seeds']} | {_r(v['decided'])} | {_r(v['agreement'])} | "
                     f"{_r(v['coverage'])} | {v['agent_steps']:,} | {v['rounds']} | {_head(b)} | {_head_ag(b)} |")  # fmt: skip
    lines += same_and_wrong(res)
    if any(BEFORE_KEY in v for v in by.values()):
        lines += ["", f"Before the stopped-day rule (`{BEFORE_KEY}`, code {BEFORE_CODE}: a stopped day's other KPIs "
                  "judged on the ticks it ran), the same sizes, seeds and candidates:", "",
                  "| groups | canaries decided | right | interval covers the 20-day truth | canary agent-steps | "
                  "canary days | pairs whose verdict changed with the rule |", "|---|---|---|---|---:|---:|---|"]  # fmt: skip
        for n, v in by.items():
            b = v.get(BEFORE_KEY)
            if b is not None:
                ch = res.get("rerun", {}).get(n, {}).get("changed", [])
                lines.append(f"| {int(n):,} | {_r(b['decided'])} | {_r(b['agreement'])} | {_r(b['coverage'])} | "
                             f"{b['agent_steps']:,} | {b['rounds']} | {'; '.join(ch) if ch else 'none'} |")  # fmt: skip
    lines += ["", "Measured with the loop's rule before the stopped-day rule and not rerun (a stopped canary day's "
              "other KPIs judged on the ticks it ran, or, before issue 48's guard verdict, left open; loss-budget stops "
              "judged on the ticks they ran): the sections " + ", ".join(f"\"{t}\"" for t in OLD_RULE_SECTIONS)
              + "; the section \"Extended canaries with the rest of the fleet as control (day_term)\" is this run's; "
              "\"What narrows the interval at 1,000 groups\" is rejudged by the rule (`--levers-rejudge`) and \"Closed loop: "
              "twin alone vs canary alone vs twin + canary\" (the quick runs) rerun with it."]
    lines += ["", INTERVAL_DIVISION_NOTE]
    return "\n".join(lines) + "\n"


def _headline_text(res: dict[str, Any]) -> str:
    """Where the headline ``by_fleet_size`` stands against this run: set by it, replaced since, or not moved."""
    if not res.get("headline_replaced"):
        return "still the headline"
    if res.get(SUPERSEDED):
        return (f"`before_day_term.by_fleet_size`; this run was the headline until the rerun on the one-day bound "
                f"(`{res[SUPERSEDED]}`, the section \"The verdict rate by fleet size with the one-day bound\") replaced it")
    return "`before_day_term.by_fleet_size`; the headline is this run's"


def _rule_text(res: dict[str, Any]) -> str:
    """What the stopped-day rule changed and which loops ran afresh (`rerun_check`)."""
    rr = res.get("rerun", {})
    parts = []
    for n, e in rr.items():
        p = f"{int(n):,} groups: {len(e['rerun_stopped'])} loop(s) with a stopped day run afresh"
        if e["reused"]:
            p += f", {len(e['reused'])} that never stopped taken from the run before ({', '.join(e['reused'])})"
        if e["identical"] or e["differing"]:
            p += (f", {len(e['identical']) + len(e['differing'])} that never stopped run afresh all the same, "
                  f"{len(e['identical'])} of them identical to the run before")
        parts.append(p)
    return ("The stopped-day rule: a canary day the guard or the loss budget cut short gives no verdict on the other "
            "KPIs, which are judged on the completed days before it or stay open (`edgetwin.loop.day_verdict."
            "stopped_verdict`); it changes only loops with a stopped day. " + ("; ".join(parts) + "." if parts else ""))


def write_page(out: Path) -> dict[str, Any]:
    """``--fleet-size-page``: `fleet_sizes` into results_production.json (`KEY`) and the section."""
    from _docs import write_section

    path = out / "results_production.json"
    cur = json.loads(path.read_text())
    keep_before(cur)
    later = cur.get(KEY, {}).get(SUPERSEDED)
    cur[KEY] = fleet_sizes(cur, out / "scale")
    if later:
        cur[KEY][SUPERSEDED] = later
    cur[KEY]["headline_replaced"] = replace_headline(cur)
    path.write_text(json.dumps(cur, indent=1, default=float))
    write_section(SECTION, section(cur[KEY]), doc=out / "README.md", keep=KEEP)
    return cur[KEY]
