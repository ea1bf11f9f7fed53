"""What narrows the loop's interval at 1,000 groups, measured on the loop's own first-day canaries (issue 48).

`benchmarks/closed_loop.py --levers --seed S` runs this per seed; ``--levers-merge`` pools the seeds
into ``docs/benchmarks/closed_loop/results_production.json``'s ``levers`` key and the page's section.

**Why this experiment, and what it is not.** The extended loop's open pairs at 1,000 groups stay open on
two terms of the interval (`edgetwin.loop.ppi.width_terms`, the page's "why open" table): the canaries'
group split (``own``) and the twin's uncertainty about the interference (its members' spread,
`edgetwin.loop.ppi.interference_var`), which no number of canary days shrinks. Each lever below changes
one of them; rerunning 16 days of the loop per lever at 1,000 groups does not fit the shared machine,
so each is measured on the *same* first-day canary the loop runs (same seed, twin, gate decision, plan,
slice, day and emulated canary: `canary_loop`'s day 1 exactly), judged at the extended loop's first look
(its level: 90 % spent over the 5 looks of 16 days, `look_level`), against the same 20-day truth. The
result is the day-1 verdict rate per lever, not the 16-day closed-loop rate (the page's table by day
says how the loop's rate grows after day 1).

* ``loop``: the loop's own estimate (the slice's control half, the 3-member twin).
* ``fleet_control``: the same canary judged against every group not on the candidate (the slice's
  control half and the 900 groups outside the slice, all on the current policy meanwhile:
  `edgetwin.loop.verdict.canary_verdict`'s ``fleet_rows``). The candidate arm, and so the share ×
  hours × loss the canary spends, is unchanged; the control arm grows from 50 to 950 groups. Valid
  because the candidate arm is a uniformly random draw from the fleet (a random slice split at
  random), so its complement is as valid a control as the slice's other half.
* ``members5`` / ``members5_fleet``: the same two with a 5-member twin whose first 3 members are
  the 3-member twin's own fits (its checkpoint: `Twin.fit` draws member ``m``'s bootstrap and seed
  from ``m`` alone), so the interference term's change is the 2 added members' doing; the twin's
  degrees of freedom for it go from 2 to 4. ``members5_first3``: the 5-member twin restricted to its
  first 3 members (the check that the twin's other parts, refitted with it, changed nothing).

**The switchback** (`edgetwin.loop.switchback.plan_switchback` under the same budget: 10 % of the groups
× 23 h, its sites' share of the groups × its hours): recorded per candidate, the blocks it buys on the
smallest edge site (edge-waw, a quarter of the groups) and its expected width, or why it does not fit.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

#: the levers, in the page's order: (key, control arm, twin members)
LEVERS = (("loop", "slice", 3, "pooled"), ("fleet_control", "fleet", 3, "pooled"),
          ("fleet_control_per_arm", "fleet", 3, "per_arm"), ("slice_per_arm", "slice", 3, "per_arm"),
          ("members5_first3", "slice", "5:3", "pooled"), ("members5", "slice", 5, "pooled"),
          ("members5_fleet_per_arm", "fleet", 5, "per_arm"))  # fmt: skip
LEVER_TEXT = {
    "loop": "the loop's (slice control, 3 members)",
    "fleet_control": "the rest of the fleet as control (3 members)",
    "members5": "5 twin members (slice control)",
    "members5_fleet": "5 twin members + the fleet as control",
    "fleet_control_per_arm": "the fleet as control, CUPED slope per arm (3 members)",
    "slice_per_arm": "slice control, CUPED slope per arm (3 members)",
    "members5_first3": "the 5-member twin's first 3 members (slice control; the replay of `members5`)",
    "members5_fleet_per_arm": "5 members + the fleet as control + CUPED slope per arm",
}
DECIDED = ("ok", "regress")


def twin_with_members(wdir: Path, members: int, train: Any, spec: Any, base: int) -> Any:
    """The benchmark's twin with ``members`` members whose first ``base`` are the cached ``base``-member
    twin's fits: its checkpoint is copied, so `Twin.fit` loads them and fits only the rest."""
    from whatif_gate import fit_or_load

    src, dst = wdir / f"twin-production-m{base}-ckpt", wdir / f"twin-production-m{members}-ckpt"
    if src.is_dir() and not dst.exists():
        shutil.copytree(src, dst)
    return fit_or_load(wdir, "production", members, train, spec)


def _judge(preds: list[pd.DataFrame], measured: pd.DataFrame, plan: Any, day_var: Any, level: float,
           stop: Any = None, cuped: str = "pooled", n_looks: int = 5) -> dict[str, dict[str, Any]]:
    """One lever's verdict per KPI column on one canary, as the loop's first look makes it: the
    interval's, or where a stop ended the day the loop's stopped-day rule's (`_stop_rule`).
    ``stop``: the canary's `edgetwin.loop.day_verdict.Stop` (None: it ran its day)."""
    from edgetwin.loop.ppi import combine_estimates, ppi_estimates, ppi_verdict, t_quantile, width_terms

    mean = sum(preds[1:], preds[0]) / len(preds)
    est = ppi_estimates(mean, measured, {m.kpi: m.better for m in plan.margins}, "candidate", "baseline",
                        canary="canary", member_predictions=preds, day_var=day_var, cuped=cuped)  # fmt: skip
    pooled = {k: combine_estimates([e], level) for k, e in est.items()}
    _, checks = ppi_verdict(pooled, list(plan.margins))
    out = {}
    for c in checks:
        t = width_terms([est[c.kpi]])
        q, b = t_quantile(level, pooled[c.kpi]["df"]), abs(t["base"]) or float("nan")
        out[c.kpi] = {"verdict": c.verdict, "by": "interval", "change": c.change,
                      "interval": list(c.interval), "half": (c.worsening_interval[1] - c.worsening_interval[0]) / 2,
                      "gap": abs(c.allowed_change - (-1.0 if c.better == "higher" else 1.0) * c.change),
                      "df": float(pooled[c.kpi]["df"]),
                      "own": q * math.sqrt(max(t["own"], 0.0)) / b, "interference": q * math.sqrt(max(t["interference"], 0.0)) / b,
                      "shared": q * math.sqrt(max(t["shared"], 0.0)) / b, "day": q * math.sqrt(max(t["day"], 0.0)) / b,
                      "n_control": int(pooled[c.kpi].get("n_control", 0))}  # fmt: skip
    return _stop_rule(out, est, stop, n_looks, plan, day_var)


def _stop_rule(out: dict[str, dict[str, Any]], est: dict[str, Any], stop: Any, n_looks: int, plan: Any,
               day_var: Any) -> dict[str, dict[str, Any]]:
    """One lever's day-1 verdicts ``out`` after the loop's stopped-day rule, made by the loop's own
    function (`edgetwin.loop.day_verdict.stopped_verdict`; why: that module's docstring): a day the
    guard stopped refuses on the guard's KPI (``by`` "guard"); a day a stop cut short judges every
    other KPI on the completed days before it — day 1 has none, so they are ``open`` (``by`` "stop";
    ``on_ticks``: what the interval on the ticks it ran said, kept for the record, as the loop keeps
    the stopped day's estimates). A guard stop after the day's planned ticks is a whole day: judged
    on it, at the look's level. ``est``: the lever's estimates (unused for a day cut short)."""
    from edgetwin.loop.day_verdict import stopped_kpi_verdicts, stopped_verdict

    if stop is None:
        return out
    whole = [{k: {**v, "day": 0.0, "local:day": 0.0} for k, v in est.items()}] if est and not stop.short else []
    got = stopped_verdict(stop, whole, n_looks, plan, day_var)
    if got is None:
        return out
    labels = stopped_kpi_verdicts(stop, list(out), got[2])
    return {k: {**out[k], "verdict": v, "by": by, **({"on_ticks": out[k]["verdict"]} if by == "stop" else {})}
            for k, (v, by) in labels.items()}  # fmt: skip


def canary_stop(c: dict[str, Any]) -> Any:
    """A stored candidate's day-1 `Stop` (its ``stop``, ``guard_kpi``, ``ticks_ran``; the planned ticks
    are its plan's hours in 15-minute ticks, `CanaryConfig.ticks`, where the run did not store them)."""
    from edgetwin.loop.day_verdict import Stop

    planned = c.get("ticks_planned") or max(1, math.ceil(float(c["plan"]["hours"]) * 3600.0 / 900.0 - 1e-9))
    return Stop(str(c["stop"]), int(c["ticks_ran"]), int(planned), (c["guard_kpi"],) if c.get("guard_kpi") else ())


def rejudge_stored(doc: dict[str, Any]) -> dict[str, Any]:
    """A stored seed's levers (``levers_seed<S>.json``, run before the stopped-day rule) with every
    candidate whose day 1 a stop cut short judged by the rule (`_stop_rule`), the verdicts before kept
    per candidate under ``before_stopped_day``. Exact for a day cut short: the rule reads none of its
    estimates (day 1 has no completed day before it); a guard stop after the day's planned ticks
    would need them (refused: rerun ``--levers``)."""
    level_looks = len(doc.get("looks") or [1, 2, 4, 8, 16])
    for name, c in doc["candidates"].items():
        stop = canary_stop(c)
        if not stop.decides or "before_stopped_day" in c:
            continue
        if not stop.short:
            raise SystemExit(f"seed {doc['seed']} {name!r}: a guard stop after the day's ticks is judged on its "
                             "estimates, which the stored levers do not hold: rerun --levers")  # fmt: skip
        c["before_stopped_day"] = {k: {kpi: v.get("verdict") for kpi, v in lv.items()} for k, lv in c["levers"].items()}
        c["levers"] = {k: _stop_rule(lv, {}, stop, level_looks, None, None) for k, lv in c["levers"].items()}
        c["ticks_planned"] = stop.planned
    doc["stopped_day_rule"] = ("a day-1 canary a stop cut short: the guard's KPI refused by the guard, every other "
                               "KPI open (edgetwin.loop.day_verdict.stopped_verdict)")  # fmt: skip
    return doc


def _switchback(decision: Any, twin: Any, fleet_log: pd.DataFrame, cand: Any, base: Any, budget: Any, seed: int) -> dict[str, Any]:
    """The switchback the planner could pick under the same budget, or why it does not fit."""
    from edgetwin.contract.errors import InputError
    from edgetwin.loop.switchback import plan_switchback

    try:
        sb = plan_switchback(decision, twin, fleet_log, cand, base, budget, seed=seed, sims=2)
    except InputError as e:
        return {"fits": False, "why": str(e)}
    return {"fits": True, "sites": list(sb.sites), "n_blocks": sb.n_blocks, "block_ticks": sb.block_ticks,
            "carryover_ticks": sb.carryover_ticks, "site_share": sb.site_share,
            "expected_width": dict(getattr(sb, "expected_width", {}) or {})}  # fmt: skip


def run_levers(seed: int, work: Path, out: Path, extended: Path, n: int = 1000, max_days: int = 16,
               log: Any = print, switchback: bool = True) -> dict[str, Any]:
    """Every lever on every candidate's first-day canary at ``n`` groups for one seed (module
    docstring); ``extended``: that seed's ``extended_seed<S>.json`` (its 20-day truth and the loop's
    own day-1 verdicts, which the ``loop`` lever must reproduce). Saved to ``out`` after each candidate."""
    from _closed_loop_scale import SCALE_CANDIDATES, TWIN_DAYS, TWIN_GROUPS, TWIN_MEMBERS
    from closed_loop import MAX_HOURS, MAX_SHARE
    from whatif_gate import candidates, fit_or_load, logging_policy

    from edgetwin.contract.errors import InputError
    from edgetwin.edge.canary import CanaryConfig
    from edgetwin.emulator.cluster import ClusterConfig, cluster_spec
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.loop.day_verdict import Stop, guard_kpis
    from edgetwin.loop.fleet import canary_on_cluster
    from edgetwin.loop.plan import PlanBudget, plan_canary
    from edgetwin.loop.ppi import (
        CanaryAssignment,
        look_days,
        look_level,
        measured_group_means,
        replay_spec,
        twin_group_predictions,
    )
    from edgetwin.loop.rounds import balanced, candidate_version_name, decision_day_variance
    from edgetwin.policies.gate import run_gate

    ext = json.loads(extended.read_text())
    if int(ext.get("seed", -1)) != seed or int(ext.get("max_days", 0)) != max_days:
        raise SystemExit(f"--extended {extended}: another seed or --max-days than this run")
    entry = ext["by_fleet_size"][str(n)]
    small = ClusterConfig(n_agents=TWIN_GROUPS, steps=96)
    spec = cluster_spec(small)
    train, _ = generate_logs(small, episodes=TWIN_DAYS, policy=logging_policy("production", spec, seed), seed=seed)
    wdir = work / f"production-n{TWIN_GROUPS}-d{TWIN_DAYS}-s{seed}"
    twin3 = fit_or_load(wdir, "production", TWIN_MEMBERS, train, spec)
    twin5 = twin_with_members(wdir, 5, train, spec, TWIN_MEMBERS)
    allp = candidates(spec, twin3, "production", seed)
    current = logging_policy("production", spec, seed + 500)
    budget = PlanBudget(max_share=MAX_SHARE, hours=MAX_HOURS, max_loss={})
    cfg = ClusterConfig(n_agents=n, steps=96)
    fleet_seed = seed * 1000 + 7
    fleet_log, _ = generate_logs(cfg, 1, copy.deepcopy(current), seed=fleet_seed)
    recent = generate_logs(cfg, 6, copy.deepcopy(current), seed=seed * 1000 + 300)[0]
    level = look_level(0.9, len(look_days(max_days)))
    doc: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
    doc.update(seed=seed, n=n, max_days=max_days, level=level, extended=str(extended), levers=[lv[0] for lv in LEVERS],
               looks=look_days(max_days))  # fmt: skip
    doc.setdefault("candidates", {})
    ran_here = {s["policy"] for s in entry["per_candidate"]}
    for name in [c for c in SCALE_CANDIDATES if c in ran_here]:
        if name in doc["candidates"]:
            continue
        t0 = time.perf_counter()
        pol = allp[name]
        cand_spec, base_spec = replay_spec(name, pol), replay_spec("current", current)
        decision = run_gate(twin3, cand_spec, base_spec, log=fleet_log, episodes=1, seed=seed)
        day_var = decision_day_variance(twin3, decision, [recent], cand_spec, base_spec, seed)
        plan = balanced(plan_canary(decision, twin3, fleet_log, cand_spec, base_spec, budget, seed=seed, round_no=1,
                                    day_var=day_var, max_days=max_days))  # fmt: skip
        version = candidate_version_name(cand_spec.name)
        ccfg = CanaryConfig.from_plan(plan, version, spec=twin3.spec)
        res = canary_on_cluster(cfg, copy.deepcopy(current), copy.deepcopy(pol), ccfg, seed=fleet_seed,
                                episode=f"canary-{seed}-1")  # fmt: skip
        ran = max(1, min(ccfg.ticks, int(res.ticks) - int(ccfg.pre_ticks)))
        window = (int(ccfg.pre_ticks), int(ccfg.pre_ticks) + ran)
        cols = [m.kpi for m in plan.margins]
        slice_m = measured_group_means(res.log, cols, version, start_t=ccfg.pre_ticks)
        fleet_m = measured_group_means(pd.concat([res.log, res.fleet_log], ignore_index=True), cols, version,
                                       start_t=ccfg.pre_ticks)  # fmt: skip
        treated = frozenset(str(a) for a in slice_m.index[(slice_m["arm"] == "candidate").to_numpy()])
        pols = {"candidate": cand_spec, "baseline": base_spec, "canary": CanaryAssignment(cand_spec, base_spec, treated)}

        p3, p5 = ([twin_group_predictions(tw, pols, fleet_log, cols, episodes=1, seed=seed, window=window, members=[m])
                   for m in range(k)] for tw, k in ((twin3, 3), (twin5, 5)))  # fmt: skip
        guard_kpi = getattr(res.guard_stop, "kpi", None) if res.stop_reason == "guard" else None
        stop = Stop(res.stop_reason, int(res.ticks) - int(ccfg.pre_ticks), ccfg.ticks, guard_kpis(res.guard_stop))
        got: dict[str, Any] = {}
        for key, control, mem, cuped in LEVERS:
            preds = p3 if mem == 3 else p5 if mem == 5 else p5[:3]
            try:
                got[key] = _judge(preds, slice_m if control == "slice" else fleet_m, plan, day_var, level, stop, cuped,
                                  len(look_days(max_days)))  # fmt: skip
            except (InputError, ValueError, KeyError):  # the loop's: a guard stop before both arms had a tick
                if guard_kpi is None:
                    raise
                got[key] = {guard_kpi: {"verdict": "regress", "by": "guard"}}
        summ = next(s for s in entry["per_candidate"] if s["policy"] == name)
        day1 = (summ.get("rounds") or [{}])[0].get("checks", {})
        doc["candidates"][name] = {
            "plan": {"n_groups": plan.n_groups, "hours": plan.hours, "design": plan.slice.design},
            "stop": res.stop_reason, "guard_kpi": guard_kpi, "ticks_ran": ran, "ticks_planned": ccfg.ticks,
            "candidate_agent_steps": int(((res.log["policy"].astype(str) == version) & (res.log["t"] >= ccfg.pre_ticks)).sum()),
            "levers": got, "extended_day1": day1,
            "switchback": _switchback(decision, twin3, fleet_log, cand_spec, base_spec, budget, seed) if switchback else None,
            "seconds": time.perf_counter() - t0,
        }  # fmt: skip
        out.write_text(json.dumps(doc, indent=1, default=float))
        log(f"seed {seed} {name!r}: " + ", ".join(
            f"{lv[0]} {sum(v['verdict'] in DECIDED for v in got[lv[0]].values())}" for lv in LEVERS)
            + f" decided of {len(cols)} [{time.perf_counter() - t0:.0f} s]")  # fmt: skip
    return doc


# ------------------------------------------------------------------------------------ pooling
def merge_levers(docs: list[dict[str, Any]], extended_docs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Pool the seeds: per lever, the day-1 verdict rate over the distinct pairs the twin alone left open
    and the share right against the 20-day truth (Clopper-Pearson 95 %), the median of each term's
    relative half-width on the pairs left open by the loop's own estimate, and how many of those the
    interference term alone reaches the gap on; the ``loop`` lever's reproduction of the extended run's
    day-1 verdicts; the switchback's fit under the budget."""
    from _closed_loop_scale import rate

    pairs = []
    for d in docs:
        ext = extended_docs[int(d["seed"])]
        for p in ext["by_fleet_size"][str(d["n"])]["pairs"]:
            c = d["candidates"].get(p["policy"])
            if c is None or p["twin_alone"] in DECIDED:
                continue
            pairs.append({"seed": d["seed"], "policy": p["policy"], "column": p["column"],
                          "truth_regress": bool(p["truth_regress"]), "truth_change": p["truth_change"],
                          "levers": {k: c["levers"][k].get(p["column"]) for k in c["levers"]},
                          "extended_day1": c["extended_day1"].get(p["column"])})  # fmt: skip
    out: dict[str, Any] = {"seeds": sorted(int(d["seed"]) for d in docs), "n": int(docs[0]["n"]),
                           "level": float(docs[0]["level"]), "pairs_open_after_twin": len(pairs), "by_lever": {}}  # fmt: skip
    loop_open = [p for p in pairs if (p["levers"]["loop"] or {}).get("verdict") not in DECIDED]
    for key, *_ in LEVERS:
        dec = [p for p in pairs if (p["levers"][key] or {}).get("verdict") in DECIDED]
        right = sum((p["levers"][key]["verdict"] == "regress") == p["truth_regress"] for p in dec)
        # open by the stopped-day rule (`_stop_rule`): their widths are of the hours before a stop, not a day's
        terms = [p["levers"][key] for p in loop_open if p["levers"][key] and p["levers"][key].get("by") != "stop"]

        def med(k: str, terms: list[dict[str, Any]] = terms) -> float | None:
            v = [t[k] for t in terms if t.get(k) is not None and math.isfinite(t[k])]
            return float(np.median(v)) if v else None

        out["by_lever"][key] = {
            "text": LEVER_TEXT[key], "verdict_rate": rate(len(dec), len(pairs)), "agreement": rate(right, len(dec)),
            "open_by_stop": sum((p["levers"][key] or {}).get("by") == "stop" for p in pairs),
            "wrong": [f"seed {p['seed']} {p['policy']} {p['column']}: {p['levers'][key]['verdict']} "
                      f"(20-day truth {100 * p['truth_change']:+.1f} %)" for p in dec
                      if (p["levers"][key]["verdict"] == "regress") != p["truth_regress"]],
            "on_loop_open": {"pairs": len(terms), **{f"median_{k}": med(k) for k in ("gap", "half", "own", "interference", "shared", "df")},
                             "interference_reaches_gap": sum(t["interference"] >= t["gap"] for t in terms),
                             "shared_reaches_gap": sum(t["shared"] >= t["gap"] for t in terms)},
        }  # fmt: skip
    # the extended run judged a day 1 a stop cut short on its ticks (before the stopped-day rule): compared
    # on the days that ran whole only
    same = [p for p in pairs if p["extended_day1"] is not None and (p["levers"]["loop"] or {}).get("by") != "stop"]
    out["loop_reproduces_extended_day1"] = {"pairs": len(same), "same_verdict": sum(
        (p["levers"]["loop"] or {}).get("verdict") == p["extended_day1"] for p in same),
        "stopped_pairs_left_out": sum(p["extended_day1"] is not None for p in pairs) - len(same)}
    out["switchback"] = [{"seed": d["seed"], "policy": name, **(c.get("switchback") or {"fits": None})}
                         for d in docs for name, c in d["candidates"].items()]  # fmt: skip
    out["switchback_fits"] = sum(bool(x.get("fits")) for x in out["switchback"])
    out["seconds"] = sum(c["seconds"] for d in docs for c in d["candidates"].values())
    return out


# ------------------------------------------------------------------------------------ the page
SECTION = "## What narrows the interval at 1,000 groups: the levers on the loop's first-day canaries"
KEEP = ("### What the levers say",)


def _r(x: dict[str, Any]) -> str:
    if not x["n"]:
        return "—"
    lo, hi = x["ci"]
    return f"{x['k']}/{x['n']} = {100 * x['rate']:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def _left_out(res: dict[str, Any]) -> str:
    n = res["loop_reproduces_extended_day1"].get("stopped_pairs_left_out", 0)
    return (f" ({n} pairs the stopped-day rule leaves open left out: the extended run judged them on the ticks its "
            "stopped day ran, before the rule)") if n else ""


def _stop_text(res: dict[str, Any]) -> str:
    """What the section says of the stopped-day rule (`_stop_rule`)."""
    n = max((b.get("open_by_stop", 0) for b in res["by_lever"].values()), default=0)
    if "open_by_stop" not in next(iter(res["by_lever"].values()), {}):
        return "A first day a stop cut short is judged on the ticks it ran (before the stopped-day rule). "
    text = (f"A first day a stop cut short is judged by the loop's stopped-day rule (`edgetwin.loop.day_verdict."
            f"stopped_verdict`): the guard's KPI refused by the guard, every other KPI open ({n} pairs per lever; left out "
            "of the medians below: their widths are of the hours before the stop). ")  # fmt: skip
    if res.get("rejudged"):
        text += res["rejudged"] + " "
    return text


def levers_section(res: dict[str, Any], commands: list[str]) -> str:
    """The page's section from `merge_levers`' result."""
    lines = [SECTION, "", f"Commands: {'; then '.join(f'`{c}`' for c in commands)}. " + (__doc__ or "").split("\n\n")[2]
             .replace("\n", " ").replace("**Why this experiment, and what it is not.** ", "What and why: ")
             + f" Seeds {res['seeds']}; {res['pairs_open_after_twin']} distinct (candidate, KPI) pairs the twin alone "
             f"left open; each look at {100 * res['level']:.1f} %; Clopper-Pearson 95 % over pairs (optimistic: a "
             f"candidate's pairs share its canary). The `loop` row reproduces the extended run's day-1 verdict on "
             f"{res['loop_reproduces_extended_day1']['same_verdict']} of {res['loop_reproduces_extended_day1']['pairs']} "
             f"pairs{_left_out(res)}. {_stop_text(res)}Wall time {res['seconds'] / 60:.0f} min.", "",
             "| lever | day-1 verdicts on the open pairs | right (20-day truth) | on the pairs the loop's day 1 left open: median gap / half-width / own / interference / df | interference term alone ≥ gap | shared term alone ≥ gap |",
             "|---|---|---|---|---:|---:|"]  # fmt: skip
    for b in res["by_lever"].values():
        o = b["on_loop_open"]
        df = "—" if o["median_df"] is None else f"{o['median_df']:.0f}"
        lines.append(f"| {b['text']} | {_r(b['verdict_rate'])} | {_r(b['agreement'])} | {_pct(o['median_gap'])} / "
                     f"{_pct(o['median_half'])} / {_pct(o['median_own'])} / {_pct(o['median_interference'])} / {df} | "
                     f"{o['interference_reaches_gap']} of {o['pairs']} | {o['shared_reaches_gap']} of {o['pairs']} |")
    wrong = [f"{b['text']}: {w}" for b in res["by_lever"].values() for w in b["wrong"]]
    if wrong:
        lines += ["", "Verdicts the 20-day truth contradicts: " + "; ".join(wrong) + "."]
    fits = [s for s in res["switchback"] if s.get("fits")]
    lines += ["", f"The site-level switchback under the same budget (`plan_switchback`: the group split's 10 % of the "
              f"groups × hours, spent over the switching site's share): fits for {len(fits)} of "
              f"{len(res['switchback'])} candidates."]
    by_what: dict[str, list[str]] = {}
    for s in res["switchback"]:
        what = (f"{s['n_blocks']} blocks of {s['block_ticks']} ticks on {s['sites']} (carryover {s['carryover_ticks']})"
                if s.get("fits") else f"does not fit: {s.get('why')}")
        by_what.setdefault(what, []).append(f"seed {s['seed']} {s['policy']}")
    lines += [f"- {what} ({'; '.join(who)})" for what, who in by_what.items()]
    return "\n".join(lines) + "\n"


def run_lever_cli(args: Any, out_dir: Path) -> None:
    """``--levers`` (one seed) or ``--levers-merge`` (pool the seeds into the results and the page)."""
    from _docs import write_section

    scale = out_dir / "scale"
    if getattr(args, "levers_rejudge", None) is not None:
        rejudge_cli(list(args.levers_rejudge), out_dir, bool(args.no_write))
        return
    if args.levers:
        args.work.mkdir(parents=True, exist_ok=True)
        run_levers(args.seed, args.work, args.work / f"levers-s{args.seed}.json", scale / f"extended_seed{args.seed}.json",
                   max_days=16, log=lambda s: print(s, flush=True))  # fmt: skip
        return
    seeds = list(args.levers_merge or [])
    docs = [json.loads((args.work / f"levers-s{s}.json").read_text()) for s in seeds]
    ext = {s: json.loads((scale / f"extended_seed{s}.json").read_text()) for s in seeds}
    res = merge_levers(docs, ext)
    res["commands"] = [f"python benchmarks/closed_loop.py --levers --seed S --work {args.work} (S in {', '.join(map(str, seeds))})",
                       f"python benchmarks/closed_loop.py --levers-merge {' '.join(map(str, seeds))} --work {args.work}"]
    print(json.dumps({k: {"rate": v["verdict_rate"], "agree": v["agreement"]} for k, v in res["by_lever"].items()}, indent=1))
    if args.no_write:
        return
    path = out_dir / "results_production.json"
    cur = json.loads(path.read_text())
    cur["levers"] = res
    path.write_text(json.dumps(cur, indent=1, default=float))
    (scale / "levers").mkdir(exist_ok=True)
    for d in docs:
        (scale / "levers" / f"levers_seed{d['seed']}.json").write_text(json.dumps(d, indent=1, default=float))
    write_section(SECTION, levers_section(res, res["commands"]), doc=out_dir / "README.md", keep=KEEP)


BEFORE_DIR = "before_stopped_day"
BEFORE_KEY = "levers_before_stopped_day"


def rejudge_cli(seeds: list[int], out_dir: Path, no_write: bool = False) -> dict[str, Any]:
    """``--levers-rejudge``: the stored seeds' days a stop cut short judged by the stopped-day rule
    (`rejudge_stored`), pooled (`merge_levers`) into results_production.json's ``levers`` and the
    page; the seed files and the ``levers`` entry before kept once (``scale/levers/before_stopped_day``,
    ``levers_before_stopped_day``). Reads no canary again: the rule uses none of a stopped day's estimates."""
    from _docs import write_section

    scale, path = out_dir / "scale", out_dir / "results_production.json"
    cur = json.loads(path.read_text())
    before = scale / "levers" / BEFORE_DIR
    docs = []
    for s in seeds:
        f = scale / "levers" / f"levers_seed{s}.json"
        if not no_write and not (before / f.name).exists():
            before.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, before / f.name)
        docs.append(rejudge_stored(json.loads(f.read_text())))
    ext = {s: json.loads((scale / f"extended_seed{s}.json").read_text()) for s in seeds}
    res = merge_levers(docs, ext)
    old = cur.get(BEFORE_KEY) or cur["levers"]
    cmd = f"python benchmarks/closed_loop.py --levers-rejudge {' '.join(map(str, seeds))}"
    res["commands"] = [*[c for c in old.get("commands", []) if "--levers-rejudge" not in c], cmd]
    res["rejudged"] = (f"The canaries are the stored runs' (`{old.get('commands', ['?'])[0]}`), rejudged by `{cmd}`: the "
                       "rule reads none of a stopped day's estimates, so this is what the runs give under it; the "
                       f"verdicts before it are kept (`{BEFORE_KEY}`, `scale/levers/{BEFORE_DIR}`).")  # fmt: skip
    print(json.dumps({k: {"rate": v["verdict_rate"], "agree": v["agreement"], "open_by_stop": v["open_by_stop"]}
                      for k, v in res["by_lever"].items()}, indent=1))  # fmt: skip
    if no_write:
        return res
    cur.setdefault(BEFORE_KEY, {**cur["levers"], "what": "the levers before the stopped-day rule: a first day a stop "
                                "cut short judged on the ticks it ran"})  # fmt: skip
    cur["levers"] = res
    path.write_text(json.dumps(cur, indent=1, default=float))
    for d in docs:
        (scale / "levers" / f"levers_seed{d['seed']}.json").write_text(json.dumps(d, indent=1, default=float))
    write_section(SECTION, levers_section(res, res["commands"]), doc=out_dir / "README.md", keep=KEEP)
    return res

