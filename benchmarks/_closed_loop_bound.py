"""What bounds the loop's verdict rate at 1,000 groups (issue 48): the pairs no finite canary decides.

`benchmarks/closed_loop.py --day-truth --seed S` recomputes, day by day, the 20-day truth the scale
runs stored only as its mean (`_closed_loop_scale.multi_day_truth`: each policy on the whole
1,000-group cluster, day ``d`` on seed ``S·1000 + 500 + d``), into
``docs/benchmarks/closed_loop/scale/day_truth_seed<S>.json``, and checks that the mean of the days
is the stored truth. ``--bound`` classifies the open pairs of the reseeded extended runs by that
truth (`verdict_bound`) into ``results_production.json``'s ``verdict_bound`` and the page.

**The definition, fixed before the classes were computed or compared with the verdicts.** For
each distinct (candidate, KPI) pair at 1,000 groups that the twin alone left open (3 seeds × 4
candidates × 7 pairs), in each of the two reseeded extended runs (`RUNS`: slice control, and fleet
control with per-arm CUPED):

* ``gap`` -- the 20-day truth's distance from the margin, in the verdict's relative units:
  ``|allowed − sign·truth_change|`` (``sign`` −1 where higher is better): how far the true
  fleet-wide effect lies from the line the verdict must place it on one side of.
* ``day_sd`` -- the day-to-day spread of the true effect: the standard deviation over the 20 truth
  days of the day's fleet-wide change ``(candidate_d − current_d) / |mean of current over the
  days|`` (same denominator every day, so that the days' mean is ``truth_change`` exactly).
* ``h16`` -- the half-width the loop's largest design (16 canary days, one fresh 10 % slice a day)
  would reach for the pair, projected from the terms its last look recorded
  (`edgetwin.loop.ppi.width_terms`: ``own``, ``shared``, ``day_one``, ``days``, ``df``,
  ``level``): ``t(level, df) · sqrt(own · days/16 + shared + day_one/16) / |base|`` -- the group
  split pooled over 16 days instead of ``days``, the fleet's and the twin's interference terms
  unchanged (no number of days shrinks them), the twin's day-to-day term over 16 days. It is the
  interference-carrying estimate's half-width, a lower bound of the hull's the verdict decides on
  (so the classes are generous to the design).

Classes (in this order, each pair in one):

1. ``within_day_spread``: ``gap < day_sd`` -- the 20-day effect lies within one day's spread of
   the margin: on many single days the effect is on the other side of it.
2. ``beyond_16_days``: not 1, and ``gap < h16`` -- even with the point estimate at the truth, the
   16-day interval would still straddle the margin.
3. ``decidable``: neither -- a 16-day canary whose estimate lands near the truth decides it.
4. ``no_terms``: no look recorded the pair's terms (a canary the guard stopped before any tick
   was judged), so ``h16`` is unknown; reported apart, in no rate.

Per run and class: the pairs, the ones the loop decided, the rate with its Clopper-Pearson 95 %
interval. And what the 60 % target asks of the 16-day design (a reading of the target, not a new
target): ``h_needed``, the largest uniform relative half-width at which at least 60 % of the pairs
have ``gap`` above it (with the point estimate at the truth, a pair is decided iff its half-width
is below its gap), and ``f_needed``, the largest factor ``f`` such that at least 60 % of the pairs
have ``gap > f · h16`` (below 1: the 16-day intervals must narrow by ``1/f``).

Added after the classes were first computed (not the definition; ``post_hoc_ratio``): the same
classes with the day's spread measured as the sd of the daily *ratio* ``(candidate_d −
current_d) / |current_d|`` (what one day's canary estimates), which differs from ``day_sd`` where a
large effect meets a baseline level that moves from day to day (cloud-only's carbon: −98 % every
day, on a carbon level that moves by 12 %). ``label_uncertain``: the pairs whose 20-day truth is
itself within two standard errors (``2·day_sd/sqrt(20)``) of the margin.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

#: the reseeded extended runs whose pairs are classified: results key -> per-seed file stem under scale/
RUNS = {"extended_reseeded": "extended_reseeded", "extended_fleet_control_reseeded": "extended_fc_reseeded"}
#: the fleet size the runs ran at, the loop's largest design in canary days, the verdict-rate target
FLEET, MAX_DAYS, TARGET = 1000, 16, 0.60
CLASSES = ("within_day_spread", "beyond_16_days", "decidable", "no_terms")
DECIDED = ("ok", "regress")


def day_truth(seed: int, days: int, work: Path, log: Any = print) -> dict[str, Any]:
    """Per policy and KPI, the ``days`` daily values behind the scale run's stored multi-day truth
    at `FLEET` groups (the same twin, candidates, current policy, configuration and day seeds as
    `_closed_loop_scale.run_seed` / `multi_day_truth`; the policies fresh, as every day's copy
    there is a deep copy). Returns ``{"seed", "days", "values": {policy: {kpi: [v_d]}}}``."""
    from _closed_loop_scale import SCALE_CANDIDATES, seed_twin
    from closed_loop import truth_kpis
    from whatif_gate import candidates, logging_policy

    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.twin.whatif import default_kpis

    spec, _train, twin = seed_twin(seed, work)
    lay = twin.layout
    kdefs = default_kpis(twin.spec, lay.outputs + ([] if lay.predict_reward else ["reward"]))
    allp = candidates(spec, twin, "production", seed)
    pols = {"current": logging_policy("production", spec, seed + 500),
            **{n: allp[n] for n in SCALE_CANDIDATES[:4]}}  # fmt: skip
    cfg = ClusterConfig(n_agents=FLEET, steps=96)
    values: dict[str, dict[str, list[float]]] = {n: {} for n in pols}
    t0 = time.perf_counter()
    for d in range(days):
        for name, pol in pols.items():
            lg, _ = generate_logs(cfg, 1, copy.deepcopy(pol), seed=seed * 1000 + 500 + d)
            for k, v in truth_kpis(lg, twin, list(kdefs), twin.spec).items():
                values[name].setdefault(k, []).append(float(v))
            del lg
        log(f"seed {seed} day {d + 1}/{days} [{time.perf_counter() - t0:.0f} s]")
    return {"seed": seed, "days": days, "fleet": FLEET, "values": values}


def check_against_stored(doc: dict[str, Any], stored: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Per policy, the largest relative gap between the mean of the recomputed days and the stored
    truth over the KPIs both have (``max_rel_gap``) -- 0 up to rounding when the days are the
    stored truth's own days."""
    out = {}
    for pol, ks in doc["values"].items():
        gaps = [abs(float(np.mean(v)) - stored[pol][k]) / max(abs(stored[pol][k]), 1e-12)
                for k, v in ks.items() if k in stored.get(pol, {})]  # fmt: skip
        out[pol] = {"kpis": len(gaps), "max_rel_gap": max(gaps) if gaps else None}
    return out


def daily_changes(values: dict[str, dict[str, list[float]]], policy: str, kpi: str) -> np.ndarray:
    """The day's fleet-wide change of ``kpi``, ``(candidate_d − current_d) / |mean of current|``
    (shape ``(days,)``): its mean is the multi-day truth's relative change."""
    cur = np.asarray(values["current"][kpi], dtype=float)
    cand = np.asarray(values[policy][kpi], dtype=float)
    return (cand - cur) / abs(float(np.mean(cur)))


def h16_of(terms: dict[str, float] | None, days: int = MAX_DAYS) -> float | None:
    """The interference-carrying estimate's relative half-width after ``days`` canary days,
    projected from one look's `width_terms` (see the module's definition); None without terms."""
    from edgetwin.loop.ppi import t_quantile

    if not terms or not terms.get("base"):
        return None
    var = terms["own"] * terms["days"] / days + terms["shared"] + terms["day_one"] / days
    return float(t_quantile(terms["level"], terms["df"]) * math.sqrt(max(var, 0.0)) / abs(terms["base"]))


def last_look_terms(per_candidate: list[dict[str, Any]], policy: str, column: str) -> dict[str, float] | None:
    """The terms the candidate's last look recorded for ``column`` (None if none did)."""
    for s in per_candidate:
        if s["policy"] != policy:
            continue
        looks = [r for r in s.get("rounds", []) if r.get("look", True)]
        for r in reversed(looks):
            t = ((r.get("why") or {}).get(column) or {}).get("terms")
            if t and t.get("base"):
                return dict(t)
    return None


def classify(gap: float, day_sd: float, h16: float | None) -> str:
    """The pair's class (`CLASSES`), by the module's definition."""
    if gap < day_sd:
        return "within_day_spread"
    if h16 is None:
        return "no_terms"
    return "beyond_16_days" if gap < h16 else "decidable"


def needed(values: list[float], target: float = TARGET) -> float:
    """The largest ``x`` such that at least ``target`` of ``values`` exceed ``x`` (nan if empty)."""
    v = sorted(values, reverse=True)
    if not v:
        return float("nan")
    k = math.ceil(target * len(v) - 1e-9)  # at least this many must exceed it
    return float(v[k - 1]) if k >= 1 else float("inf")


def run_day_truth_cli(seed: int, days: int, work: Path, out: Path) -> dict[str, Any]:
    """``--day-truth``: the per-day truth of ``seed`` into ``out/scale/day_truth_seed<S>.json``,
    with its check against the stored 20-day truth (``scale/seed<S>.json``)."""
    path = out / "scale" / f"seed{seed}.json"
    try:
        stored = json.loads(path.read_text())["by_fleet_size"][str(FLEET)]["truth"]
    except (OSError, KeyError, ValueError) as e:
        print(f"--day-truth --seed {seed}: no stored {FLEET}-group truth in {path} ({type(e).__name__})", file=sys.stderr)
        raise SystemExit(2) from None
    doc = day_truth(seed, days, work, log=lambda s: print(s, flush=True))
    doc["check"] = check_against_stored(doc, stored)
    (out / "scale" / f"day_truth_seed{seed}.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc["check"], indent=1), flush=True)
    return doc


def classified_pairs(run_docs: list[dict[str, Any]], day_docs: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every open pair of one run's per-seed docs (``scale/<stem>_seed<S>.json``) at `FLEET` groups
    with ``gap``, ``day_sd``, ``h16``, its class and whether the loop decided it (``decided``,
    ``right``). ``day_docs``: seed -> `day_truth`'s doc. Raises ValueError when a seed's day
    truth is missing or its days' mean is not the pair's stored truth (1e-9 relative)."""
    out = []
    for doc in run_docs:
        seed = int(doc["seed"])
        if seed not in day_docs:
            raise ValueError(f"no day truth for seed {seed}: run closed_loop.py --day-truth --seed {seed}")
        values = day_docs[seed]["values"]
        entry = doc["by_fleet_size"][str(FLEET)]
        for p in entry["pairs"]:
            if p["twin_alone"] in DECIDED:
                continue
            ch = daily_changes(values, p["policy"], p["kpi"])
            if not math.isclose(float(np.mean(ch)), p["truth_change"], rel_tol=1e-9, abs_tol=1e-12):
                raise ValueError(f"seed {seed} {p['policy']!r} {p['kpi']}: the days' mean {np.mean(ch):.6g} is not "
                                 f"the stored truth {p['truth_change']:.6g}")  # fmt: skip
            sign = -1.0 if p["better"] == "higher" else 1.0
            gap = abs(p["allowed_change"] - sign * p["truth_change"])
            day_sd = float(np.std(ch, ddof=1))
            cur, cand = (np.asarray(values[n][p["kpi"]], dtype=float) for n in ("current", p["policy"]))
            ratio_sd = float(np.std((cand - cur) / np.abs(cur), ddof=1)) if np.all(cur != 0) else float("nan")
            terms = last_look_terms(entry["per_candidate"], p["policy"], p.get("column") or "")
            h16 = h16_of(terms)
            decided = p["twin_canary"] in DECIDED
            out.append({"seed": seed, "policy": p["policy"], "kpi": p["kpi"], "column": p.get("column"),
                        "gap": gap, "day_sd": day_sd, "h16": h16, "day_ratio_sd": ratio_sd, "truth_days": len(ch),
                        "twin_day_sd": (math.sqrt(max(terms["day_one"], 0.0)) / abs(terms["base"])) if terms else None,
                        "class": classify(gap, day_sd, h16), "decided": decided,
                        "right": decided and (p["twin_canary"] == "regress") == bool(p["truth_regress"])})  # fmt: skip
    return out


def by_kpi(pairs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per KPI column: the pairs, the medians of ``gap``, ``day_sd`` (the emulator's days), the
    twin's own one-day spread at the last look (``twin_day_sd``: ``sqrt(day_one)/|base|``, the term
    the verdict carries) and ``h16``, the classes' counts and the pairs decided."""
    out: dict[str, dict[str, Any]] = {}
    for col in sorted({str(p["column"]) for p in pairs}):
        got = [p for p in pairs if str(p["column"]) == col]

        def med(k: str, got: list[dict[str, Any]] = got) -> float | None:
            v = [p[k] for p in got if p[k] is not None]
            return float(np.median(v)) if v else None

        out[col] = {"pairs": len(got), "decided": sum(p["decided"] for p in got),
                    **{k: med(k) for k in ("gap", "day_sd", "twin_day_sd", "h16")},
                    "classes": {c: sum(p["class"] == c for p in got) for c in CLASSES}}  # fmt: skip
    return out


def verdict_bound(run_docs: dict[str, list[dict[str, Any]]], day_docs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Per run (`RUNS`): the classes' counts, decided and right with Clopper-Pearson intervals, and
    what the 60 % target asks of the 16-day design (``h_needed``, ``f_needed``; the module's
    definition); the pairs themselves under ``pairs``."""
    from _closed_loop_scale import cp

    res: dict[str, Any] = {"fleet": FLEET, "max_days": MAX_DAYS, "target": TARGET, "classes": list(CLASSES), "runs": {}}
    for key, docs in run_docs.items():
        pairs = classified_pairs(docs, day_docs)
        by: dict[str, Any] = {}
        for c in CLASSES:
            got = [p for p in pairs if p["class"] == c]
            k, r = sum(p["decided"] for p in got), sum(p["right"] for p in got)
            by[c] = {"pairs": len(got), "decided": k, "rate": k / len(got) if got else None, "ci": cp(k, len(got)),
                     "right": r}  # fmt: skip
        gaps = [p["gap"] for p in pairs]
        ratios = [p["gap"] / p["h16"] for p in pairs if p["h16"]]
        h16s = [p["h16"] for p in pairs if p["h16"] is not None]
        res["runs"][key] = {
            "pairs": len(pairs), "decided": sum(p["decided"] for p in pairs), "by_class": by,
            "h_needed": needed(gaps), "f_needed": needed(ratios), "f_pairs": len(ratios),
            "median_gap": float(np.median(gaps)), "median_h16": float(np.median(h16s)) if h16s else None,
            "median_day_sd": float(np.median([p["day_sd"] for p in pairs])),
            "reachable": sum(p["class"] == "decidable" for p in pairs) / len(pairs) if pairs else None,
            "by_kpi": by_kpi(pairs),
            # post hoc: pairs whose 20-day label is itself within two of its standard errors of the margin
            "label_uncertain": sum(p["gap"] < 2.0 * p["day_sd"] / math.sqrt(p["truth_days"]) for p in pairs),
            "post_hoc_ratio": {c: {"pairs": sum(classify(p["gap"], p["day_ratio_sd"], p["h16"]) == c for p in pairs),
                                   "decided": sum(classify(p["gap"], p["day_ratio_sd"], p["h16"]) == c and p["decided"]
                                                  for p in pairs)} for c in CLASSES},
            "pairs_detail": pairs,
        }  # fmt: skip
    return res


SECTION = "## What bounds the verdict rate at 1,000 groups: the pairs no finite canary decides"
#: the hand-written subsection a rerun keeps
KEEP = ("### What the bound says",)
RUN_TEXT = {"extended_reseeded": "slice control (the loop's default)",
            "extended_fleet_control_reseeded": "fleet control, per-arm CUPED"}  # fmt: skip
CLASS_TEXT = {"within_day_spread": "within one day's spread of the margin (gap < sd of the daily effect)",
              "beyond_16_days": "beyond the 16-day design (gap < its half-width h16)",
              "decidable": "decidable by the 16-day design",
              "no_terms": "no recorded terms (h16 unknown)"}  # fmt: skip


def _pct(x: float | None) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f} %"


def _rate(c: dict[str, Any]) -> str:
    if not c["pairs"]:
        return "—"
    lo, hi = c["ci"]
    return f"{c['decided']}/{c['pairs']} = {100 * c['rate']:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def bound_section(res: dict[str, Any]) -> str:
    """The page's section from ``results_production.json``'s ``verdict_bound``."""
    lines = [SECTION, "",
             "Commands: `python benchmarks/closed_loop.py --day-truth --seed S --truth-days 20 --work /tmp/l48c-dt` "
             "(S = 0, 1, 2: the 20-day truth of the scale runs recomputed day by day into `scale/day_truth_seed<S>.json`; "
             "its days' mean is the stored truth), then `python benchmarks/closed_loop.py --bound` (results: "
             "`verdict_bound` in results_production.json). The definition (`benchmarks/_closed_loop_bound.py`, committed "
             "before the classes were computed): per open (candidate, KPI) pair of the two reseeded extended runs at "
             f"{res['fleet']:,} groups, **gap** = the 20-day truth's distance from the margin (relative, the verdict's "
             "units); **sd of the daily effect** = the standard deviation over the 20 truth days of the day's fleet-wide "
             "change (over the days' mean of the current policy); **h16** = the half-width the loop's largest design "
             f"({res['max_days']} canary days, one fresh 10 % slice a day) would reach, projected from the pair's last "
             "look's terms: the group split pooled over 16 days, the fleet's and the twin's interference terms unchanged, "
             "the twin's day-to-day term over 16 days, at the look's level and t degrees of freedom (the "
             "interference-carrying estimate's alone: a lower bound of the hull's, generous to the design). Classes, in "
             "order: gap < sd of the daily effect; gap < h16; decidable; no recorded terms. Intervals: Clopper-Pearson "
             "95 % over pairs (optimistic: a candidate's pairs share its canaries).", ""]  # fmt: skip
    lines += ["| run | class | pairs decided (rate [95 % CI]) | of them right |", "|---|---|---|---:|"]
    for key, r in res["runs"].items():
        for c in res["classes"]:
            b = r["by_class"][c]
            lines.append(f"| {RUN_TEXT.get(key, key)} | {CLASS_TEXT[c]} | {_rate(b)} | "
                         f"{b['right'] if b['pairs'] else '—'} |")  # fmt: skip
    lines += ["", f"What the {100 * res['target']:.0f} % target asks of the {res['max_days']}-day design (a reading of the "
              "target, which stays ≥ 60 %; with each point estimate at its truth a pair is decided iff its half-width is "
              "below its gap): the uniform relative half-width below which 60 % of the open pairs' gaps lie (h needed), "
              "and the factor f by which every pair's h16 would have to be multiplied (f < 1: narrowed by 1/f) for 60 % "
              "of the pairs to have gap > f · h16:", "",
              "| run | open pairs | share decidable by the 16-day design | median gap | median h16 | median sd of the daily "
              "effect | h needed for 60 % | f needed for 60 % (pairs with h16) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for key, r in res["runs"].items():
        lines.append(f"| {RUN_TEXT.get(key, key)} | {r['pairs']} | {_pct(r['reachable'])} | {_pct(r['median_gap'])} | "
                     f"{_pct(r['median_h16'])} | {_pct(r['median_day_sd'])} | {_pct(r['h_needed'])} | "
                     f"{r['f_needed']:.2f} ({r['f_pairs']}) |")  # fmt: skip
    keys = list(res["runs"])
    first = res["runs"][keys[0]]
    names = " / ".join(RUN_TEXT.get(k, k).split(" (")[0].split(",")[0] for k in keys)
    lines += ["", f"Per KPI (medians; where two values: {names}); the twin's one-day spread is the day-to-day term the "
              "verdict carries (`sqrt(day_one)/|base|` at the last look, from the twin's replay of 6 recent days), beside "
              "the emulator's over the 20 truth days:", "",
              "| KPI | open pairs | gap | sd of the daily effect (emulator) | the twin's one-day sd | h16 | within a day's "
              "spread / beyond 16 days / decidable | decided |", "|---|---:|---:|---:|---:|---:|---|---|"]  # fmt: skip
    for col, a in first["by_kpi"].items():
        bs = [res["runs"][k]["by_kpi"][col] for k in keys]
        lines.append(f"| {col} | {a['pairs']} | {_pct(a['gap'])} | {_pct(a['day_sd'])} | "
                     f"{' / '.join(_pct(b['twin_day_sd']) for b in bs)} | {' / '.join(_pct(b['h16']) for b in bs)} | "
                     + " ; ".join("/".join(str(b["classes"][c]) for c in CLASSES[:3]) for b in bs)
                     + f" | {' / '.join(str(b['decided']) for b in bs)} |")  # fmt: skip
    lines += ["", "Added after the classes were first computed (not the definition): with the day's spread measured as the "
              "sd of the daily ratio (candidate ÷ current that day − 1: what one day's canary estimates), the classes "
              "within a day's spread / beyond 16 days / decidable hold "
              + "; ".join(f"{RUN_TEXT.get(k, k)}: " + " / ".join(
                  f"{r['post_hoc_ratio'][c]['pairs']} ({r['post_hoc_ratio'][c]['decided']} decided)" for c in CLASSES[:3])
                  for k, r in res["runs"].items()) + f" pairs. The 20-day truth itself lies within two of its standard "
              f"errors (2 × the sd of the daily effect / √20) of the margin for {first['label_uncertain']} of the "
              f"{first['pairs']} pairs: their label is not sure either."]  # fmt: skip
    return "\n".join(lines) + "\n"


def run_bound_cli(out: Path) -> dict[str, Any]:
    """``--bound``: classify from the stored JSONs into ``results_production.json``'s
    ``verdict_bound`` and the page's section."""
    from _docs import write_section

    scale = out / "scale"
    try:
        days = {int(p.stem.removeprefix("day_truth_seed")): json.loads(p.read_text())
                for p in sorted(scale.glob("day_truth_seed*.json"))}  # fmt: skip
        cur = json.loads((out / "results_production.json").read_text())
        runs = {key: [json.loads((scale / f"{stem}_seed{s}.json").read_text()) for s in cur[key]["seeds"]]
                for key, stem in RUNS.items()}  # fmt: skip
        res = verdict_bound(runs, days)
    except (OSError, KeyError, ValueError) as e:  # a missing or foreign input: one line, exit 2
        print(f"--bound: {type(e).__name__}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    cur["verdict_bound"] = res
    (out / "results_production.json").write_text(json.dumps(cur, indent=1, default=float))
    write_section(SECTION, bound_section(res), out / "README.md", keep=KEEP)
    return res
