"""The closed loop at 100, 1,000 and 5,000 service groups, counted honestly (issue 48, item 5).

`benchmarks/closed_loop.py --scale` runs this per seed; ``--scale-merge`` pools the seeds into
``docs/benchmarks/closed_loop/results_production.json`` (``seeds``, ``by_fleet_size``,
``canary_steps_ratio``) and the page's section. What it counts, and why:

* **Distinct pairs.** A (candidate, guarded KPI) pair per *measured quantity*: the gate's ``return``
  (the per-episode sum of the reward) and ``reward`` (its per-step mean) are the same column over
  the same number of steps, so their relative changes are identical (the run checks it and records
  the largest gap between their truths); they are one pair (the ``reward`` one is kept). Likewise
  any two guarded KPIs that measure one column.
* **Multi-day truth.** Each policy (the current one and every candidate) runs the *whole* cluster
  of the fleet's size for ``--truth-days`` (>= 20) days (the same day seeds for every policy:
  same populations and noise); the truth is the relative change of the KPI's mean over those
  days, and a pair *regresses* when it is worse than its check's margin.
* **Who decided.** The twin alone (today's gate, `run_gate` on the canary day's fleet log) decides
  some pairs; the loop (`canary_loop`) runs canaries for the rest. ``canary_verdict_rate`` is the
  share of the pairs the twin alone left open that the loop decided after its canaries;
  ``confident_agreement`` is the share of those verdicts that agree with the truth. The twin
  alone's verdicts are scored separately.
* **Intervals.** Every rate carries its Clopper-Pearson 95 % interval (``*_ci``;
  `scipy.stats.binomtest`), over the pairs of every seed (a pair is one Bernoulli draw; pairs of
  one candidate share a canary, so the intervals are somewhat optimistic: stated on the page).
* **Steps ratio.** Canary alone (`closed_loop.kayenta_verdict` per pair on a seeded random slice)
  at growing slice sizes (`SCALE_SWEEP`) gives agent-steps against verdict rate; the agent-steps at
  which it reaches the loop's verdict rate over all pairs (twin alone's and the canaries') at at
  least the loop's agreement, over the loop's own canary agent-steps (`closed_loop.steps_to_reach`).

Cost (a shared 2-core machine): the twin is fitted once per seed (the quick configuration: 60
groups, 3 days, 3 members; its replay uses the fleet's own logged population, so one twin serves
every fleet size) and reused at every size; the emulator runs a 5,000-group day in about a second.
"""

from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

#: the candidates run at scale (a subset of `whatif_gate.candidates`, to fit a shared machine): one
#: near the current policy, two that move work to the edge, one that abandons it, and random actions
SCALE_CANDIDATES = ("slo-aware heuristic", "least-loaded, cheap", "cloud-only, no capacity", "uniform random",
                    "constant (0.5, 1.0, 0.5)")  # fmt: skip
#: canary alone's sweep runs at fleets up to this size only (its canaries at 5,000 groups did not fit the machine)
SWEEP_MAX_GROUPS = 1000
#: canary alone's slices at scale: (share of the groups, hours)
SCALE_SWEEP = ((0.02, 23.0), (0.10, 23.0), (0.30, 23.0), (1.00, 23.0))
#: the quick twin (`closed_loop.py --quick`'s): training groups, days, members; Twin.update's options
TWIN_GROUPS, TWIN_DAYS, TWIN_MEMBERS = 60, 3, 3
UPDATE = {"epochs": 2, "max_steps": 300}
DECIDED = ("ok", "regress")


def cp(k: int, n: int) -> list[float] | None:
    """Clopper-Pearson 95 % interval of ``k`` successes in ``n`` draws (None when ``n == 0``)."""
    from scipy.stats import binomtest

    if n <= 0:
        return None
    ci = binomtest(int(k), int(n)).proportion_ci(0.95, "exact")
    return [float(ci.low), float(ci.high)]


def distinct_pairs(kdefs: dict[str, Any], column_of: Any) -> dict[str, list[str]]:
    """Guarded KPI names grouped by the quantity they measure: ``{kept KPI: [every KPI of it]}``.

    KPIs with the same log column (`closed_loop.kpi_column`; ``return`` and ``reward`` both read
    ``reward``) are one pair; the one named like the column is kept. KPIs with no such column (a
    quantile, a weighted mean) are their own pair."""
    groups: dict[str, list[str]] = {}
    for name, kd in sorted(kdefs.items()):
        groups.setdefault(column_of(kd) or f"kpi:{name}", []).append(name)
    return {(col if col in names else names[0]): names for col, names in groups.items()}


def multi_day_truth(cfg: Any, pols: dict[str, Any], kdefs: list[Any], twin: Any, days: int, seed: int) -> dict[str, Any]:
    """Per policy (``pols``: name -> policy, the current one included), each KPI's value averaged
    over ``days`` days of the whole cluster ``cfg`` (day ``d`` on seed ``seed * 1000 + 500 + d`` for
    every policy: the same populations and noise). Returns ``{policy: {kpi: mean over days}}``."""
    from closed_loop import truth_kpis

    from edgetwin.emulator.logs import generate_logs

    out: dict[str, dict[str, list[float]]] = {n: {} for n in pols}
    for d in range(days):
        for name, pol in pols.items():
            log, _ = generate_logs(cfg, 1, copy.deepcopy(pol), seed=seed * 1000 + 500 + d)
            for k, v in truth_kpis(log, twin, kdefs, twin.spec).items():
                out[name].setdefault(k, []).append(v)
            del log
    return {n: {k: float(np.mean(v)) for k, v in ks.items()} for n, ks in out.items()}


def loop_pairs(name: str, decision: Any, res: Any, canaries: list[tuple[Any, Any]], nominal: dict[str, Any]) -> dict[str, str]:
    """The loop's verdict per nominal KPI after its last round (the twin alone's where no canary
    judged the KPI). A canary the guard stopped: its KPI ``regress`` (the guard's), every other KPI as
    judged on the completed days before the stopped one (`edgetwin.loop.day_verdict._guard_verdict`), or
    open when there were none."""
    if res is None or not res.rounds:
        return {k: c.verdict for k, c in nominal.items()}
    rd = res.rounds[-1]
    by_col = {c["kpi"]: c["verdict"] for c in rd.checks}
    if rd.stop_reason == "guard" and not rd.checks:  # no completed day before the stop: the guard's KPI alone
        gk = getattr(canaries[rd.round - 1][1].guard_stop, "kpi", None)
        by_col = {gk: "regress"} if gk else {}
    from closed_loop import kpi_column

    kd = {k.name: k for k in decision.result.kpis}
    return {k: by_col.get(kpi_column(kd[k]) or "", c.verdict) for k, c in nominal.items()}


def run_candidate(ctx: dict[str, Any], name: str, pol: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One candidate at one fleet size: twin alone, the loop, canary alone on the loop's canaries and
    on the sweep's slices. Returns ``(pairs, summary)``; the pairs still lack their truth."""
    from closed_loop import MAX_HOURS, MAX_SHARE, kayenta_pairs, kpi_column, random_slice_config

    from edgetwin.contract.errors import InputError
    from edgetwin.contract.margins import KPIMargin
    from edgetwin.loop.fleet import canary_on_cluster
    from edgetwin.loop.ppi import replay_spec
    from edgetwin.loop.rounds import canary_loop, candidate_version_name
    from edgetwin.policies.gate import run_gate

    twin, fleet_log, cfg, current, seed = ctx["twin"], ctx["fleet_log"], ctx["cfg"], ctx["current"], ctx["seed"]
    cand_spec, base_spec = replay_spec(name, pol), replay_spec("current", current)  # each replay afresh
    decision = run_gate(twin, cand_spec, base_spec, log=fleet_log, episodes=1, seed=seed)
    nominal = {c.kpi: c for c in decision.checks if c.scenario == "nominal"}
    kdefs = {k.name: k for k in decision.result.kpis if k.name in nominal}
    ctx.setdefault("kdefs", {}).update(kdefs)
    canaries: list[tuple[Any, Any]] = []
    res, loop_error = None, None
    try:
        ext = {"days": ctx["day_source"], "max_days": ctx["max_days"], "other_days": [ctx["recent"]]} if ctx["max_days"] > 1 else {}
        res = canary_loop(twin, fleet_log, copy.deepcopy(pol), copy.deepcopy(current), cfg, candidate_spec=cand_spec,
                          baseline_spec=base_spec, budget=ctx["budget"], max_rounds=3, seed=seed,
                          fleet_seed=ctx["fleet_seed"], old_logs=[ctx["train"]], update_options=UPDATE,
                          decision=decision, log=lambda s: None, fleet_control=ctx.get("fleet_control", False),
                          cuped=ctx.get("cuped", "pooled"),
                          on_canary=lambda r, plan, cres: canaries.append((plan, _lean(cres))), **ext)  # fmt: skip
    except InputError as e:  # no first round within the budget: the loop stays where the twin was
        loop_error = str(e)
    tc = loop_pairs(name, decision, res, canaries, nominal)
    cols = {k: (kpi_column(kd), kd.better) for k, kd in kdefs.items() if kpi_column(kd) is not None}
    margins = tuple(KPIMargin(c, 0.05, 0.0, b == "higher") for c, b in dict(cols.values()).items())
    # the loop publishes its candidate under its own registry version: canary alone reads the
    # candidate arm's rows by the benchmark's name for it (as closed_loop.py's quick run does)
    version = candidate_version_name(cand_spec.name)
    alone_logs = [cres.log.assign(policy=cres.log["policy"].astype(str).replace(version, "candidate"))
                  for _p, cres in canaries]  # fmt: skip
    if not alone_logs:  # the loop ran none: one canary of the budget's size on a seeded random slice
        ccfg, _ = random_slice_config(ctx["agents"], MAX_SHARE, MAX_HOURS - 1.0, margins, seed * 1000 + 1, twin.spec, {})
        alone_logs.append(canary_on_cluster(cfg, copy.deepcopy(current), copy.deepcopy(pol), ccfg,
                                            seed=ctx["fleet_seed"], episode=f"alone-{seed}").log)  # fmt: skip
    alone = kayenta_pairs(alone_logs, cols, 4)
    alone_steps = sum(int(((lg["policy"].astype(str) == "candidate") & (lg["t"] >= 4)).sum()) for lg in alone_logs)
    sweep, sweep_steps = {}, {}
    reused = ctx.get("reuse", {}).get(name)
    if reused is not None:  # the same seeded sweep of an earlier run (it does not depend on the loop)
        sweep, sweep_steps = reused
    for i, (share, hours) in enumerate(ctx["sweep"] if reused is None else ()):
        ccfg, _ = random_slice_config(ctx["agents"], share, hours, margins, seed * 1000 + 100 + i, twin.spec, {})
        lg = canary_on_cluster(cfg, copy.deepcopy(current), copy.deepcopy(pol), ccfg, seed=ctx["fleet_seed"],
                               episode=f"sweep-{seed}-{i}").log  # fmt: skip
        label = sweep_label(len(ctx["agents"]), share, hours)
        sweep[label] = kayenta_pairs([lg], cols, ccfg.pre_ticks)
        sweep_steps[label] = int(((lg["policy"].astype(str) == "candidate") & (lg["t"] >= ccfg.pre_ticks)).sum())
    keep = distinct_pairs(kdefs, kpi_column)
    pairs = [{"policy": name, "kpi": k, "column": kpi_column(kdefs[k]), "merged": names, "better": nominal[k].better,
              "allowed_change": float(nominal[k].allowed_change), "twin_alone": nominal[k].verdict,
              "twin_canary": tc[k], "canary_alone": alone.get(k, "straddle"),
              "sweep": {lb: v.get(k, "straddle") for lb, v in sweep.items()}} for k, names in keep.items()]  # fmt: skip
    summary = {"policy": name, "twin_alone": decision.verdict, "twin_canary": res.verdict if res else "abstain",
               "reason": (res.reason if res else f"no canary: {loop_error}")[:400],
               "rounds": [{"n_groups": r.plan["n_groups"], "hours": r.plan["hours"], "stop": r.stop_reason,
                           "agent_steps": r.candidate_agent_steps, "verdict": r.verdict, "look": r.look,
                           "checks": {c["kpi"]: c["verdict"] for c in r.checks},
                           "guard_kpi": getattr(canaries[r.round - 1][1].guard_stop, "kpi", None)
                           if r.stop_reason == "guard" and len(canaries) >= r.round else None,
                           "widths": {c["kpi"]: [c.get("expected_width"), c.get("realised_width")] for c in r.checks},
                           "why": {c["kpi"]: {"change": c["change"], "interval": c["interval"],
                                              "worsening": c["worsening_interval"], "allowed": c["allowed_change"],
                                              "terms": c.get("terms")} for c in r.checks}}
                          for r in (res.rounds if res else [])],
               "twin_canary_agent_steps": res.agent_steps if res else 0, "canary_alone_agent_steps": alone_steps,
               "max_days": ctx["max_days"],
               "sweep_agent_steps": sweep_steps, "kdefs": list(kdefs)}  # fmt: skip
    return pairs, summary


def _lean(cres: Any) -> Any:
    """What the benchmark keeps of a loop canary's `CanaryResult`: its slice's log and the guard's
    stop (not the rest of the fleet's rows: 16 days of 1,000-group fleets would not fit memory)."""
    from types import SimpleNamespace

    return SimpleNamespace(log=cres.log, guard_stop=cres.guard_stop)


def sweep_label(n: int, share: float, hours: float) -> str:
    return f"{100 * share:g} % ({max(4, int(math.floor(share * n + 1e-9)))} groups) × {hours:g} h"


def seed_twin(seed: int, work: Path) -> tuple[Any, Any, Any]:
    """One seed's ``(spec, training logs, twin)``: `TWIN_DAYS` days of `TWIN_GROUPS` groups under the
    production logging policy, the twin fitted once and cached under ``work`` (the scale run and the
    per-day truth, `_closed_loop_bound.day_truth`, share it)."""
    from whatif_gate import fit_or_load, logging_policy

    from edgetwin.emulator.cluster import ClusterConfig, cluster_spec
    from edgetwin.emulator.logs import generate_logs

    small = ClusterConfig(n_agents=TWIN_GROUPS, steps=96)
    spec = cluster_spec(small)
    train, _ = generate_logs(small, episodes=TWIN_DAYS, policy=logging_policy("production", spec, seed), seed=seed)
    wdir = work / f"production-n{TWIN_GROUPS}-d{TWIN_DAYS}-s{seed}"
    wdir.mkdir(parents=True, exist_ok=True)
    return spec, train, fit_or_load(wdir, "production", TWIN_MEMBERS, train, spec)


def run_seed(seed: int, sizes: list[int], truth_days: int, work: Path, out: Path, n_candidates: int = 0,
             log: Any = print, max_days: int = 1, reuse: Path | None = None, skip: int = 0,
             reuse_loop: Path | None = None, fresh_sizes: list[int] | None = None, fleet_control: bool = False,
             cuped: str = "pooled") -> dict[str, Any]:
    """Every fleet size for one seed (its own training logs and twin, candidates and fleets), saved
    to ``out`` after each size (a run cut short keeps the sizes it finished).

    ``max_days`` > 1: each candidate's canary is extended up to that many days (`canary_loop`'s
    ``days``: day ``d`` a fresh population on seed ``seed·1000 + 200 + d``, judged at
    `edgetwin.loop.ppi.look_days`), its day-to-day variance from 6 recent days of the fleet's own
    size (seed ``seed·1000 + 300``). ``skip``: leave out the first ``skip`` candidates (a second
    process for the rest of the list, in its own ``--work``; ``--scale-more`` merges its candidates
    into the first's). ``reuse``: an earlier run's ``seed<S>.json`` (same seed,
    candidates, twin and truth days) whose multi-day truth and canary-alone sweep are taken as
    they are (both are seeded and do not depend on the loop), so that only the loop runs again.
    ``fleet_control``, ``cuped``: the loop's control arm and pre-period slope (`canary_loop`'s)."""
    from closed_loop import MAX_HOURS, MAX_SHARE
    from whatif_gate import candidates, logging_policy

    from edgetwin.loop.plan import PlanBudget

    t0 = time.perf_counter()
    spec, train, twin = seed_twin(seed, work)
    allp = candidates(spec, twin, "production", seed)
    names = list(SCALE_CANDIDATES)[: n_candidates or None]
    pols = {n: allp[n] for n in names[skip:]}
    current = logging_policy("production", spec, seed + 500)
    # a fixed 10 % share (issue 48): no loss cap, which would shrink the slice with the twin's worst
    # case (closed_loop.py's headline run keeps its 2 % cap)
    budget = PlanBudget(max_share=MAX_SHARE, hours=MAX_HOURS, max_loss={})
    doc: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
    doc.update(seed=seed, candidates=names, truth_days=truth_days, twin={"groups": TWIN_GROUPS, "days": TWIN_DAYS,
               "members": TWIN_MEMBERS}, update=UPDATE, sweep=[list(s) for s in SCALE_SWEEP],
               budget={"max_share": MAX_SHARE, "hours": MAX_HOURS, "max_loss": {}}, sweep_max_groups=SWEEP_MAX_GROUPS)  # fmt: skip
    doc.setdefault("by_fleet_size", {})
    doc["seconds_fit"] = time.perf_counter() - t0
    doc["max_days"], doc["skip_candidates"], doc["canary_alone_relabelled"] = int(max_days), int(skip), True
    doc["fleet_control"], doc["cuped"] = bool(fleet_control), str(cuped)
    old_doc = json.loads(reuse.read_text()) if reuse is not None else None
    if old_doc is not None:
        same = all(old_doc.get(k) == doc.get(k) for k in ("seed", "truth_days", "twin")) and \
            old_doc.get("candidates", [])[: len(names)] == names[: len(old_doc.get("candidates", []))]
        if not same:
            raise SystemExit(f"--reuse {reuse}: another seed, twin, truth or candidate list than this run")
        doc["reused"] = {"from": str(reuse), "what": ["truth", "canary-alone sweep"]}
    loops = json.loads(reuse_loop.read_text()) if reuse_loop is not None else None
    if loops is not None:
        doc["reused_loops"] = {"from": str(reuse_loop), "fresh_sizes": sorted(int(x) for x in fresh_sizes or ())}
    for n in sizes:
        again = reused_loops(loops, n, seed, doc) if loops is not None and n not in set(fresh_sizes or ()) else None
        run_size(doc, n, twin, train, current, pols, budget, truth_days, seed, out, log, max_days=max_days,
                 fleet_control=fleet_control, cuped=cuped, reuse=(old_doc or {}).get("by_fleet_size", {}).get(str(n)), reuse_loop=again)  # fmt: skip
    return doc


def reused_loops(old: dict[str, Any], n: int, seed: int, doc: dict[str, Any]) -> dict[str, Any]:
    """From an earlier extended run's ``extended_seed<S>.json`` (same seed, twin, candidates, truth
    days and ``max_days``): candidate -> ``(pairs, summary)`` at fleet size ``n`` for every candidate
    every round of whose loop ran its day (no guard, loss-budget or other stop). How a stopped day
    is judged (`edgetwin.loop.day_verdict._guard_verdict`, `_stopped_day_verdict`) changes nothing on
    any other path, and the loop is seeded, so those loops are what a rerun would compute (fresh
    runs of such loops are the check: the page says which). A run from before the canary-alone
    relabelling (no ``canary_alone_relabelled``) has its Kayenta measure on the loop's canaries
    dropped (``canary_alone`` None): that run read the candidate arm by the wrong name."""
    same = all(old.get(k) == doc.get(k) for k in ("seed", "truth_days", "twin", "max_days")) and old.get("seed") == seed
    same = same and bool(old.get("fleet_control", False)) == bool(doc.get("fleet_control", False)) and \
        old.get("cuped", "pooled") == doc.get("cuped", "pooled")
    if not same:
        raise SystemExit("--reuse-loop: another seed, twin, truth days or --max-days than this run")
    entry = old.get("by_fleet_size", {}).get(str(n), {})
    out = {}
    relabelled = bool(old.get("canary_alone_relabelled"))
    for s in entry.get("per_candidate", []):
        if not s["rounds"] or any(r.get("stop") != "completed" for r in s["rounds"]):
            continue
        pairs = [p if relabelled else {**p, "canary_alone": None} for p in entry["pairs"] if p["policy"] == s["policy"]]
        out[s["policy"]] = (pairs, {**s, "loop_reused": True} | ({} if relabelled else {"canary_alone_agent_steps": None}))
    return out


def sweep_for(n: int) -> tuple[tuple[float, float], ...]:
    """Canary alone's sweep at a fleet of ``n`` groups: every `SCALE_SWEEP` point up to 100 groups,
    without the whole-fleet point up to `SWEEP_MAX_GROUPS` (serving 1,000 groups the candidate
    through the runtime for a day did not fit the shared machine), none above."""
    if n <= 100:
        return SCALE_SWEEP
    return tuple(p for p in SCALE_SWEEP if p[0] < 1.0) if n <= SWEEP_MAX_GROUPS else ()


def run_size(doc: dict[str, Any], n: int, twin: Any, train: Any, current: Any, pols: dict[str, Any], budget: Any,
             truth_days: int, seed: int, out: Path, log: Any, max_days: int = 1,
             reuse: dict[str, Any] | None = None, reuse_loop: dict[str, Any] | None = None,
             fleet_control: bool = False, cuped: str = "pooled") -> None:
    """One fleet size: each candidate's pairs with their multi-day truth, saved to ``out`` after every
    candidate (``complete`` once all are done; a rerun resumes with the candidates not yet done).
    ``reuse_loop``: candidate -> ``(pairs, summary)`` taken as they are (`reused_loops`)."""
    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs

    entry = doc["by_fleet_size"].setdefault(str(n), {"pairs": [], "per_candidate": [], "truth": {}, "complete": False})
    if entry.get("complete", True):
        return
    t1 = time.perf_counter()
    cfg = ClusterConfig(n_agents=n, steps=96)
    fleet_seed = seed * 1000 + 7
    fleet_log, _ = generate_logs(cfg, 1, copy.deepcopy(current), seed=fleet_seed)
    ctx = {"twin": twin, "fleet_log": fleet_log, "cfg": cfg, "current": current, "seed": seed, "budget": budget,
           "fleet_seed": fleet_seed, "train": train, "sweep": sweep_for(n),
           "agents": sorted(fleet_log["agent"].astype(str).unique()), "max_days": int(max_days),
           "fleet_control": bool(fleet_control), "cuped": str(cuped)}  # fmt: skip
    if max_days > 1:
        ctx["day_source"] = lambda d: (generate_logs(cfg, 1, copy.deepcopy(current), seed=seed * 1000 + 200 + d)[0],
                                       seed * 1000 + 200 + d)  # fmt: skip
        ctx["recent"] = generate_logs(cfg, 6, copy.deepcopy(current), seed=seed * 1000 + 300)[0]
    if reuse is not None:
        ctx["reuse"] = {s["policy"]: ({lb: {p["kpi"]: p["sweep"][lb] for p in reuse["pairs"] if p["policy"] == s["policy"]}
                                      for lb in s["sweep_agent_steps"]}, s["sweep_agent_steps"])
                        for s in reuse["per_candidate"]}  # fmt: skip
        entry["truth"].update(reuse.get("truth", {}))
    entry["sweep"] = [list(p) for p in sweep_for(n)]
    done = {s["policy"] for s in entry["per_candidate"]}
    for name, pol in pols.items():
        if name in done:
            continue
        old = (reuse_loop or {}).get(name)
        pairs, summ = old if old is not None else run_candidate(ctx, name, pol)
        truth = entry["truth"]
        if "current" not in truth:
            truth.update(multi_day_truth(cfg, {"current": current}, list(ctx["kdefs"].values()), twin, truth_days, seed))
        if name not in truth:
            truth.update(multi_day_truth(cfg, {name: pol}, list(ctx["kdefs"].values()), twin, truth_days, seed))
        for p in pairs:
            rb, rc = truth["current"][p["kpi"]], truth[p["policy"]][p["kpi"]]
            ch = (rc - rb) / abs(rb) if rb else float("nan")
            sign = -1.0 if p["better"] == "higher" else 1.0
            p["truth_change"] = ch
            p["truth_regress"] = bool(sign * ch > p["allowed_change"])
            p["merged_truth_gap"] = max((abs(_rel(truth, p["policy"], m) - ch) for m in p["merged"]), default=0.0)
        entry["pairs"] += pairs
        entry["per_candidate"].append(summ)
        entry.setdefault("seconds", {})[name] = time.perf_counter() - t1
        out.write_text(json.dumps(doc, indent=1, default=float))
        log(f"seed {seed} n {n} {name!r}: twin alone {summ['twin_alone']}, loop {summ['twin_canary']} "
            f"({len(summ['rounds'])} rounds, {summ['twin_canary_agent_steps']} steps) [{time.perf_counter() - t1:.0f} s]")
    entry["complete"] = True
    out.write_text(json.dumps(doc, indent=1, default=float))
    log(f"seed {seed} n {n} done in {time.perf_counter() - t1:.0f} s")


def _rel(truth: dict[str, dict[str, float]], policy: str, kpi: str) -> float:
    rb = truth["current"][kpi]
    return (truth[policy][kpi] - rb) / abs(rb) if rb else float("nan")



# ------------------------------------------------------------------------------------ scoring
def rate(k: int, n: int) -> dict[str, Any]:
    """``k`` of ``n`` with its share and Clopper-Pearson 95 % interval."""
    return {"k": int(k), "n": int(n), "rate": (k / n) if n else None, "ci": cp(k, n)}


def agree(p: dict[str, Any], arm: str) -> bool:
    return (p[arm] == "regress") == bool(p["truth_regress"])


def candidate_level(pairs: list[dict[str, Any]], per: list[dict[str, Any]]) -> dict[str, Any]:
    """The operator's decision per (seed, candidate): the loop's overall verdict (promote / refuse)
    against the truth (a candidate regresses when any of its pairs does over the multi-day truth)."""
    regress: dict[tuple[Any, str], bool] = {}
    for p in pairs:
        key = (p.get("seed"), p["policy"])
        regress[key] = regress.get(key, False) or bool(p["truth_regress"])
    decided = right = 0
    for s in per:
        if s["twin_canary"] in ("promote", "refuse"):
            decided += 1
            right += (s["twin_canary"] == "refuse") == regress.get((s.get("seed"), s["policy"]), False)
    return {"verdict_rate": rate(decided, len(per)), "agreement": rate(right, decided),
            "truly_regressing": sum(regress.values())}  # fmt: skip


def score_size(pairs: list[dict[str, Any]], per: list[dict[str, Any]]) -> dict[str, Any]:
    """One fleet size over every seed's distinct pairs: who decided what, how often right, at what cost.

    ``canary_verdict_rate``: of the pairs the twin alone left open, the share the loop decided after
    its canaries; ``confident_agreement`` / ``agreement_ci``: of those verdicts, the share that
    agree with the multi-day truth. ``twin_alone``: the gate's own verdicts and their agreement.
    ``loop``: every pair, the twin alone's verdict where it decided and the loop's elsewhere (what
    the operator gets). ``canary_alone``: Kayenta-style on the loop's canaries, same pairs."""
    open_ = [p for p in pairs if p["twin_alone"] not in DECIDED]
    twin_dec = [p for p in pairs if p["twin_alone"] in DECIDED]
    can_dec = [p for p in open_ if p["twin_canary"] in DECIDED]
    loop = [{**p, "x": p["twin_alone"] if p["twin_alone"] in DECIDED else p["twin_canary"]} for p in pairs]
    loop_dec = [p for p in loop if p["x"] in DECIDED]
    measured = [p for p in pairs if p.get("canary_alone") is not None]  # a reused loop's was not (`reused_loops`)
    ca_dec = [p for p in measured if p["canary_alone"] in DECIDED]
    ca_open_dec = [p for p in open_ if p.get("canary_alone") in DECIDED]
    ca_open_n = sum(p.get("canary_alone") is not None for p in open_)
    vr, ag = rate(len(can_dec), len(open_)), rate(sum(agree(p, "twin_canary") for p in can_dec), len(can_dec))
    return {
        "pairs": len(pairs), "truth_regress": sum(bool(p["truth_regress"]) for p in pairs),
        "canary_verdict_rate": vr["rate"], "canary_verdict_rate_ci": vr["ci"],
        "canary_decided": len(can_dec), "open_after_twin": len(open_), "canary_agreeing": ag["k"],
        "confident_agreement": ag["rate"], "agreement_ci": ag["ci"],
        "twin_alone": {"verdict_rate": rate(len(twin_dec), len(pairs)),
                       "agreement": rate(sum(agree(p, "twin_alone") for p in twin_dec), len(twin_dec))},
        "loop": {"verdict_rate": rate(len(loop_dec), len(pairs)),
                 "agreement": rate(sum(agree(p, "x") for p in loop_dec), len(loop_dec))},
        "canary_alone_pairs_measured": len(measured),
        "canary_alone": {"verdict_rate": rate(len(ca_dec), len(measured)),
                         "agreement": rate(sum(agree(p, "canary_alone") for p in ca_dec), len(ca_dec)),
                         "open_verdict_rate": rate(len(ca_open_dec), ca_open_n),
                         "open_agreement": rate(sum(agree(p, "canary_alone") for p in ca_open_dec), len(ca_open_dec))},
        "candidate_verdicts": candidate_level(pairs, per),
        "twin_canary_agent_steps": sum(s["twin_canary_agent_steps"] for s in per),
        "canary_alone_agent_steps": sum(s["canary_alone_agent_steps"] or 0 for s in per),
        "rounds": sum(len(s["rounds"]) for s in per),
        "max_merged_truth_gap": max((p.get("merged_truth_gap", 0.0) for p in pairs), default=0.0),
        "by_day": by_day(pairs, per),
        "why_open": why_open(pairs, per),
        "loops_reused": [f"seed {s.get('seed')}: {s['policy']}" for s in per if s.get("loop_reused")],
    }  # fmt: skip


def verdict_at(pair: dict[str, Any], summary: dict[str, Any], day: int) -> str:
    """The loop's verdict on ``pair`` had it stopped after canary day ``day``: its last look (or
    guard stop) on or before that day, the twin alone's before any (a loop that had stopped earlier
    keeps its last verdict). With one round per day, round ``r`` is day ``r``."""
    rounds = [r for i, r in enumerate(summary.get("rounds", []), start=1) if i <= day and r.get("look", True)]
    if not rounds:
        return str(pair["twin_alone"])
    last = rounds[-1]
    if last.get("stop") == "guard" and not last.get("checks"):
        return "regress" if last.get("guard_kpi") and last.get("guard_kpi") == pair.get("column") else str(pair["twin_alone"])
    return str(last.get("checks", {}).get(pair.get("column") or "", pair["twin_alone"]))


def why_open(pairs: list[dict[str, Any]], per: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Why the pairs the canaries left open stay open (issue 48): per KPI column, over the open pairs
    whose last look recorded its interval's terms (`edgetwin.loop.ppi.width_terms`), the medians of
    the distance from the point estimate to the margin (``gap``: how far the interval must shrink)
    and of the half-widths each term alone gives at the look's level and degrees of freedom
    (``t·sqrt(term)/|base|``, relative; the delta method's baseline part left out): the canaries'
    group split (``own``), the fleet's and the twin's interference terms, which no number of days
    shrinks (``shared``, of it ``interference``), the day-to-day term after the days run (``day``)
    and one day's day-to-day spread (``day_one_sd``: ``sqrt(day var)/|base|``, the spread of the
    daily fleet-wide change itself), the hull's half-width (``half``: the interval the verdict
    decides on, with the no-interference estimate's) beside the interference-carrying estimate's
    alone (``transport``: its three terms together), the t quantile's degrees of freedom (``df``),
    and how many pairs each term dominates.
    ``floor``: pairs whose shared term alone reaches the gap (no number of canary days decides
    them); ``days_16``: pairs whose day-to-day term alone would still reach the gap after 16 days
    (``t·day_one_sd/4``)."""
    from edgetwin.loop.ppi import t_quantile

    summ = {(s.get("seed"), s["policy"]): s for s in per}
    rows: dict[str, list[dict[str, float]]] = {}
    counts: dict[str, int] = {}
    for p in pairs:
        if p["twin_alone"] in DECIDED or p["twin_canary"] in DECIDED:
            continue
        col = p.get("column") or ""
        counts[col] = counts.get(col, 0) + 1
        looks = [r for r in summ.get((p.get("seed"), p["policy"]), {}).get("rounds", [])
                 if isinstance(r, dict) and r.get("look", True)]
        why = (looks[-1].get("why") or {}).get(col) if looks else None
        t = (why or {}).get("terms")
        if not t or not t.get("base"):
            continue
        q, b = t_quantile(t["level"], t["df"]), abs(t["base"])
        half = {k: q * math.sqrt(max(t[k], 0.0)) / b for k in ("own", "shared", "interference", "day")}
        lo, hi = why["worsening"]
        sign = -1.0 if p["better"] == "higher" else 1.0
        rows.setdefault(col, []).append({
            **half, "gap": abs(why["allowed"] - sign * why["change"]), "half": (hi - lo) / 2,
            "day_one_sd": math.sqrt(max(t["day_one"], 0.0)) / b, "days": t["days"], "q": q, "df": t["df"],
            "day_16": q * math.sqrt(max(t["day_one"], 0.0)) / b / 4.0,
            "transport": q * math.sqrt(max(t["own"] + t["shared"] + t["day"], 0.0)) / b,
        })  # fmt: skip
    out = []
    for col in sorted(counts):
        got = rows.get(col, [])
        med = {k: float(np.median([g[k] for g in got])) if got else None
               for k in ("gap", "half", "transport", "own", "shared", "interference", "day", "day_one_sd", "days", "df", "q")}
        dom = {k: sum(max(("own", "shared", "day"), key=lambda x: g[x]) == k for g in got) for k in ("own", "shared", "day")}
        out.append({"kpi": col, "open": counts[col], "with_terms": len(got), "median": med, "dominant": dom,
                    "floor": sum(g["shared"] >= g["gap"] for g in got),
                    "days_16": sum(g["day_16"] >= g["gap"] for g in got),
                    "day_one_over_margin": sum(g["day_one_sd"] > 0.05 for g in got)})  # fmt: skip
    return out


def by_day(pairs: list[dict[str, Any]], per: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The canary verdict rate and its agreement as the canaries are extended: per look day ``d``
    (`edgetwin.loop.ppi.look_days` of the run's ``max_days``), the share of the pairs the twin alone
    left open that the loop had decided had it stopped after day ``d`` (`verdict_at`; the same
    schedule's looks and levels: stopping early at a planned look keeps the level), with
    Clopper-Pearson intervals, and the loop's candidate agent-steps up to that day."""
    from edgetwin.loop.ppi import look_days

    summ = {(s.get("seed"), s["policy"]): s for s in per}
    n_days = max((len(s.get("rounds", [])) for s in per), default=0)
    if n_days <= 1:
        return []
    max_days = max(int(s.get("max_days", n_days)) for s in per)
    open_ = [p for p in pairs if p["twin_alone"] not in DECIDED]
    out = []
    for d in look_days(max_days):
        got = [(p, verdict_at(p, summ[(p.get("seed"), p["policy"])], d)) for p in open_]
        dec = [(p, v) for p, v in got if v in DECIDED]
        right = sum((v == "regress") == bool(p["truth_regress"]) for p, v in dec)
        steps = sum(r["agent_steps"] for s in per for i, r in enumerate(s.get("rounds", []), start=1) if i <= d)
        out.append({"day": d, "verdict_rate": rate(len(dec), len(open_)), "agreement": rate(right, len(dec)),
                    "agent_steps": steps})  # fmt: skip
    return out


def steps_ratio(pairs: list[dict[str, Any]], per: list[dict[str, Any]], loop: dict[str, Any]) -> dict[str, Any]:
    """Canary alone's agent-steps to reach the loop's verdict rate at at least its agreement (over
    every pair; `closed_loop.steps_to_reach` on `SCALE_SWEEP`'s points), over the loop's canary
    agent-steps. ``ratio`` None with ``lower_bound`` when no sweep point reaches it."""
    from closed_loop import steps_to_reach

    labels = list(pairs[0]["sweep"]) if pairs else []
    points = []
    for lb in labels:
        dec = [p for p in pairs if p["sweep"][lb] in DECIDED]
        points.append({"label": lb, "canary_agent_steps": sum(s["sweep_agent_steps"][lb] for s in per),
                       "verdict_rate": len(dec) / len(pairs),
                       "confident_agreement": (sum((p["sweep"][lb] == "regress") == bool(p["truth_regress"]) for p in dec)
                                               / len(dec)) if dec else None})  # fmt: skip
    steps = sum(s["twin_canary_agent_steps"] for s in per)
    same = same_canaries(pairs, per)
    if not loop["verdict_rate"]["k"]:
        return {"ratio": None, "lower_bound": None, "how": "the loop decided no pair: no verdict rate to match",
                "canary_alone_steps": None, "twin_canary_steps": steps, "sweep": points, "same_canaries": same}  # fmt: skip
    reach = steps_to_reach(points, loop["verdict_rate"]["rate"] or 0.0, loop["agreement"]["rate"])
    ratio = reach["steps"] / steps if reach["steps"] is not None and steps > 0 else None
    lower = reach.get("max_steps", 0.0) / steps if reach["steps"] is None and steps > 0 else None
    return {"ratio": ratio, "lower_bound": lower, "how": reach["how"], "canary_alone_steps": reach["steps"],
            "twin_canary_steps": steps, "sweep": points, "same_canaries": same}  # fmt: skip


def same_canaries(pairs: list[dict[str, Any]], per: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Both arms of the steps comparison on the same canary agent-steps: canary alone
    (`closed_loop.kayenta_verdict` per pair over every canary the loop ran for that candidate, all
    its days pooled) against the loop (the twin alone's verdict where it decided, the loop's
    elsewhere), over the candidates where canary alone was measured on the loop's canaries (a
    reused loop's was not). Canary alone's agent-steps are the loop's canaries' candidate rows,
    counted as the loop counts its own (`LoopRound.candidate_agent_steps`: candidate-arm group-ticks
    after the pre-period). None when no candidate was measured."""
    keys = {(s.get("seed"), s["policy"]) for s in per if s.get("canary_alone_agent_steps") is not None}
    ps = [p for p in pairs if (p.get("seed"), p["policy"]) in keys and p.get("canary_alone") is not None]
    if not ps:
        return None
    ca = [p for p in ps if p["canary_alone"] in DECIDED]
    lp = [{**p, "x": p["twin_alone"] if p["twin_alone"] in DECIDED else p["twin_canary"]} for p in ps]
    ld = [p for p in lp if p["x"] in DECIDED]
    sel = [s for s in per if (s.get("seed"), s["policy"]) in keys]
    return {"candidates": len(sel), "pairs": len(ps),
            "canary_alone": {"verdict_rate": rate(len(ca), len(ps)), "agreement": rate(sum(agree(p, "canary_alone") for p in ca), len(ca)),
                             "agent_steps": sum(int(s["canary_alone_agent_steps"]) for s in sel)},
            "loop": {"verdict_rate": rate(len(ld), len(ps)), "agreement": rate(sum(agree(p, "x") for p in ld), len(ld)),
                     "agent_steps": sum(int(s["twin_canary_agent_steps"]) for s in sel)}}  # fmt: skip


def reuse_check(seed_docs: list[dict[str, Any]], old_dir: Path) -> dict[str, Any]:
    """Candidates run afresh whose loop an earlier run (``old_dir/extended_seed<S>.json``) had ended
    without the guard's stop: is every pair's verdict and the loop's agent-steps the same? (The
    check that `reused_loops`' reuse gives what a rerun would.)"""
    same, differ = [], []
    for d in seed_docs:
        path = old_dir / f"extended_seed{d['seed']}.json"
        if not path.is_file():
            continue
        old = json.loads(path.read_text())
        for n, e in d["by_fleet_size"].items():
            oe = old.get("by_fleet_size", {}).get(n, {})
            olds = {s["policy"]: s for s in oe.get("per_candidate", [])}
            for s in e["per_candidate"]:
                o = olds.get(s["policy"])
                if s.get("loop_reused") or o is None or not o["rounds"] or o["rounds"][-1]["stop"] == "guard":
                    continue
                a = {p["kpi"]: p["twin_canary"] for p in e["pairs"] if p["policy"] == s["policy"]}
                b = {p["kpi"]: p["twin_canary"] for p in oe["pairs"] if p["policy"] == s["policy"]}
                key = f"seed {d['seed']}, {int(n):,} groups, {s['policy']}"
                ok = a == b and s["twin_canary_agent_steps"] == o["twin_canary_agent_steps"]
                (same if ok else differ).append(key)
    return {"identical": same, "differing": differ}


def first_sweep(seed_docs: list[dict[str, Any]]) -> list[list[float]]:
    """The run-wide sweep (an entry written before sweeps were recorded per size)."""
    return list(seed_docs[0].get("sweep", []))


def merge(seed_docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The seeds pooled per fleet size: `score_size` and `steps_ratio` over every seed's pairs,
    plus each seed's own scores (``per_seed``) and which seeds ran which size (a run cut short)."""
    sizes = sorted({int(n) for d in seed_docs for n in d["by_fleet_size"]})
    out: dict[str, Any] = {}
    for n in sizes:
        runs = [d for d in seed_docs if str(n) in d["by_fleet_size"]]
        pairs = [{**p, "seed": d["seed"]} for d in runs for p in d["by_fleet_size"][str(n)]["pairs"]]
        per = [{**s, "seed": d["seed"]} for d in runs for s in d["by_fleet_size"][str(n)]["per_candidate"]]
        sc = score_size(pairs, per)
        out[str(n)] = {**sc, "seeds": [d["seed"] for d in runs], "steps": steps_ratio(pairs, per, sc["loop"]),
                       "candidates": {str(d["seed"]): [s["policy"] for s in d["by_fleet_size"][str(n)]["per_candidate"]]
                                      for d in runs},
                       "sweep": runs[0]["by_fleet_size"][str(n)].get("sweep", first_sweep(seed_docs)),
                       "per_seed": {str(d["seed"]): score_size(d["by_fleet_size"][str(n)]["pairs"],
                                                               d["by_fleet_size"][str(n)]["per_candidate"])
                                    for d in runs}}  # fmt: skip
    return out


def run_scale(args: Any, out_dir: Path) -> None:
    """``--scale``: one seed's run; ``--scale-merge SEED ...``: the pooled results and the page."""
    args.work.mkdir(parents=True, exist_ok=True)
    if args.scale:
        if args.truth_days < 20:
            print(f"note: --truth-days {args.truth_days} < 20: not the issue's multi-day truth", flush=True)
        run_seed(args.seed, list(args.fleet_sizes), args.truth_days, args.work, args.work / f"scale-s{args.seed}.json",
                 args.max_candidates, log=lambda s: print(s, flush=True), max_days=args.max_days,
                 reuse=args.reuse / f"seed{args.seed}.json" if args.reuse else None, skip=args.skip_candidates,
                 reuse_loop=args.reuse_loop / f"extended_seed{args.seed}.json" if args.reuse_loop else None,
                 fresh_sizes=list(args.fresh_sizes), fleet_control=bool(args.fleet_control),
                 cuped=getattr(args, "cuped", "pooled"))  # fmt: skip
        return
    docs, where = [], {}
    for s in args.scale_merge:
        doc = json.loads((args.work / f"scale-s{s}.json").read_text())
        where.update({n: args.work for n in doc["by_fleet_size"]})
        for more in args.scale_more:  # e.g. the 5,000-group runs, made in their own process and directory
            path = more / f"scale-s{s}.json"
            if path.is_file():
                for n, entry in json.loads(path.read_text())["by_fleet_size"].items():
                    if n not in doc["by_fleet_size"]:
                        doc["by_fleet_size"][n] = entry
                        where[n] = more
                    else:  # the same size in two processes (``--skip-candidates``): the candidates the first
                        # lacks, and a loop run afresh in place of one taken from an earlier run (`reused_loops`)
                        have = doc["by_fleet_size"][n]
                        done = {c["policy"] for c in have["per_candidate"] if not c.get("loop_reused")}
                        new = [c for c in entry["per_candidate"] if c["policy"] not in done
                               and (not c.get("loop_reused") or c["policy"] not in {h["policy"] for h in have["per_candidate"]})]
                        names = {c["policy"] for c in new}
                        have["per_candidate"] = [c for c in have["per_candidate"] if c["policy"] not in names] + new
                        have["pairs"] = [p for p in have["pairs"] if p["policy"] not in names] + \
                            [p for p in entry["pairs"] if p["policy"] in names]
                        have["truth"] = {**entry.get("truth", {}), **have.get("truth", {})}
        docs.append(doc)
    runs: dict[tuple[str, int], list[str]] = {}  # (work directory, candidates) -> fleet sizes
    for n in sorted(where, key=int):
        k = max(len(d["by_fleet_size"][n]["per_candidate"]) for d in docs if n in d["by_fleet_size"])
        runs.setdefault((str(where[n]), k), []).append(n)
    cmds = [f"python benchmarks/closed_loop.py --scale --seed S --fleet-sizes {' '.join(ns)} --max-candidates {k} "
            f"--truth-days {args.truth_days} --work {w}" for (w, k), ns in runs.items()]
    cmds.append(f"python benchmarks/closed_loop.py --scale-merge {' '.join(map(str, args.scale_merge))} --work {args.work}"
                + (" --scale-more " + " ".join(map(str, args.scale_more)) if args.scale_more else "")
                + (f" --merge-as {args.merge_as}" if getattr(args, "merge_as", "") else ""))
    if max(int(d.get("max_days", 1)) for d in docs) > 1:
        ext = []
        for w in [args.work, *args.scale_more]:
            path = next((w / f"scale-s{s}.json" for s in args.scale_merge if (w / f"scale-s{s}.json").is_file()), None)
            if path is not None:
                d = json.loads(path.read_text())
                only = sorted(s for s in args.scale_merge if (w / f"scale-s{s}.json").is_file())
                seeds = "S" if len(only) == len(args.scale_merge) else "S (S in " + ", ".join(map(str, only)) + ")"
                ext.append(f"python benchmarks/closed_loop.py --scale --seed {seeds} --fleet-sizes {' '.join(d['by_fleet_size'])} "
                           f"--max-candidates {len(d['candidates'])}"
                           + (f" --skip-candidates {d['skip_candidates']}" if d.get("skip_candidates") else "")
                           + f" --truth-days {d['truth_days']} --work {w} --max-days {d['max_days']} "
                           "--reuse docs/benchmarks/closed_loop/scale"
                           + (f" --fleet-control --cuped {d.get('cuped', 'pooled')}" if d.get("fleet_control") else "")
                           + (" --reuse-loop " + str(Path(d["reused_loops"]["from"]).parent) if d.get("reused_loops") else "")
                           + (" --fresh-sizes " + " ".join(map(str, d["reused_loops"]["fresh_sizes"]))
                              if (d.get("reused_loops") or {}).get("fresh_sizes") else ""))  # fmt: skip
        write_extended(docs, out_dir, args.no_write, [*ext, cmds[-1]], variant=getattr(args, "merge_as", "") or "")
        return
    write_scale(docs, out_dir, args.no_write, cmds)


# ------------------------------------------------------------------------------------ output
SCALE_SECTION = "## Closed loop at 100, 1,000 and 5,000 groups: distinct pairs, multi-day truth, seeds"
#: hand-written subsections of the scale section that a rerun keeps
SCALE_KEEP = ("### What the scale run says",)


def _r(x: dict[str, Any] | None) -> str:
    """``k/n = p % [lo, hi]`` of a `rate` (``—`` when nothing was counted)."""
    if not x or not x["n"]:
        return "— (0 counted)"
    lo, hi = x["ci"]
    return f"{x['k']}/{x['n']} = {100 * x['rate']:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def scale_section(res: dict[str, Any]) -> str:
    """The page's section for the pooled scale run (`merge`'s result plus what was run)."""
    c = res["scale_config"]
    lines = [SCALE_SECTION, "",
             "Commands (per seed S): " + ", then ".join(f"`{x}`" for x in c.get("commands", [])) + ". What ran (the machine: 2 cores shared by six sessions; the full design did not fit): "
             + "; ".join(f"{int(n):,} groups: seeds {v['seeds']}, candidates per seed "
                         + ", ".join(f"{sd}: {len(cs)}" for sd, cs in v["candidates"].items()) for n, v in res["by_fleet_size"].items())
             + f". Candidates, in this order (the first of {len(c['candidates'])} of the what-if gate benchmark's 9 where "
             "fewer ran; PPO not trained at scale): " + ", ".join(c["candidates"]) + f". Twin: the quick one ({c['twin']['groups']} groups, {c['twin']['days']} "
             f"days, {c['twin']['members']} members) fitted once per seed and reused at every size. Budget per round: "
             f"a fixed {100 * c['budget']['max_share']:g} % share (half on the candidate), ≤ 1 day, no loss cap, ≤ 3 "
             f"rounds, `Twin.update` {c['update']['epochs']} epochs × {c['update']['max_steps']} steps between rounds. "
             f"Truth: each policy on the whole cluster of that size for {c['truth_days']} days (the same day seeds "
             "for every policy). Pairs: distinct (candidate, KPI) pairs of the gate's 7 measured quantities (return "
             "and reward are one pair; their truths differ by at most "
             f"{max(v['max_merged_truth_gap'] for v in res['by_fleet_size'].values()):.1e}). Intervals: Clopper-Pearson "
             "95 %, over pairs (a candidate's pairs share its canaries, so they are not independent draws and the "
             "intervals are optimistic).", "",
             "| groups | seeds | pairs (truly regressing) | twin alone decided / right | left open → canaries decided "
             "(`canary_verdict_rate`, target ≥ 60 % at 1,000) | canary verdicts right (`confident_agreement`, ≥ 97 %) "
             "| loop over all pairs: decided / right | canary alone (Kayenta, same canaries): decided / right "
             "| candidates the loop promoted or refused / right | loop canary agent-steps |",
             "|---|---|---|---|---|---|---|---|---|---:|"]  # fmt: skip
    for n, v in res["by_fleet_size"].items():
        ta, lp, ca = v["twin_alone"], v["loop"], v["canary_alone"]
        lines.append(f"| {int(n):,} | {v['seeds']} | {v['pairs']} ({v['truth_regress']}) | {_r(ta['verdict_rate'])} / "
                     f"{_r(ta['agreement'])} | {_r(rate(v['canary_decided'], v['open_after_twin']))} | "
                     f"{_r(rate(v['canary_agreeing'], v['canary_decided']))} | "
                     f"{_r(lp['verdict_rate'])} / {_r(lp['agreement'])} | {_r(ca['verdict_rate'])} / {_r(ca['agreement'])} | "
                     f"{_r(v['candidate_verdicts']['verdict_rate'])} / {_r(v['candidate_verdicts']['agreement'])} | "
                     f"{v['twin_canary_agent_steps']:,} |")  # fmt: skip
    lines += ["", "Canary alone at growing slices (Kayenta-style on a seeded random slice per candidate, every pair), "
              "and the agent-steps it needs to match the loop (`canary_steps_ratio`: canary alone's ÷ the loop's, "
              "target ≥ 2×):", "", "| groups | slice | agent-steps | verdict rate | confident agreement |",
              "|---|---|---:|---:|---:|"]  # fmt: skip
    for n, v in res["by_fleet_size"].items():
        for p in v["steps"]["sweep"]:
            ag = "n/a" if p["confident_agreement"] is None else f"{100 * p['confident_agreement']:.1f} %"
            lines.append(f"| {int(n):,} | {p['label']} | {p['canary_agent_steps']:,} | {100 * p['verdict_rate']:.1f} % | {ag} |")
    lines += ["", "| groups | loop: verdict rate / agreement / agent-steps | canary alone reaches it at | ratio |", "|---|---|---|---|"]
    lines += steps_rows(res["by_fleet_size"], 1)
    return "\n".join(lines) + "\n"


def steps_rows(by_size: dict[str, Any], digits: int) -> list[str]:
    """The steps-ratio table's rows, one per fleet size (`steps_ratio`'s result under ``steps``)."""
    rows = []
    for n, v in by_size.items():
        s, lp = v["steps"], v["loop"]
        if not s["sweep"]:
            ratio = "not measured (no canary-alone sweep at this size)"
        elif s["ratio"] is not None:
            ratio = f"{s['ratio']:.2f}× ({s['how']})"
        else:
            ratio = f"not reached (≥ {s['lower_bound']:.{digits}f}×: {s['how']})" if s["lower_bound"] is not None else f"n/a ({s['how']})"
        at = "—" if s["canary_alone_steps"] is None else f"{s['canary_alone_steps']:,.0f}"
        rows.append(f"| {int(n):,} | {_r(lp['verdict_rate'])} / {_r(lp['agreement'])} / {s['twin_canary_steps']:,} | {at} | {ratio} |")
    return rows


def write_scale(seed_docs: list[dict[str, Any]], out_dir: Path, no_write: bool, commands: list[str] | None = None) -> dict[str, Any]:
    """Pool the seeds (`merge`) into ``results_production.json`` (``seeds``, ``by_fleet_size`` →
    ``"100"`` / ``"1000"`` / ``"5000"`` → ``canary_verdict_rate``, ``confident_agreement``,
    ``agreement_ci``, ...; ``canary_steps_ratio`` at 1,000 groups, or the largest size measured)
    and the page's section."""
    from _docs import write_section

    by = merge(seed_docs)
    first = seed_docs[0]
    cfg = {k: first[k] for k in ("candidates", "truth_days", "twin", "update", "sweep", "budget", "sweep_max_groups")}
    cfg["commands"] = list(commands or [])
    res = {"seeds": sorted(d["seed"] for d in seed_docs), "by_fleet_size": by, "scale_config": cfg}
    head = "1000" if "1000" in by else max(by, key=int)
    ratio = by[head]["steps"]
    out = {"seeds": res["seeds"], "scale_config": cfg, "canary_steps_ratio_fleet_size": int(head),
           "canary_steps_ratio": ratio["ratio"], "canary_steps_ratio_lower_bound": ratio["lower_bound"],
           "by_fleet_size": {n: {k: v for k, v in b.items() if k != "per_seed"} | {"per_seed": b["per_seed"]}
                             for n, b in by.items()}}  # fmt: skip
    print(json.dumps({n: {k: b[k] for k in ("pairs", "canary_verdict_rate", "confident_agreement", "agreement_ci")}
                      for n, b in by.items()}, indent=1, default=float))  # fmt: skip
    if not no_write:
        path = out_dir / "results_production.json"
        cur = json.loads(path.read_text()) if path.exists() else {}
        if "quick_canary_steps_ratio" not in cur and "canary_steps_ratio" in cur:
            cur["quick_canary_steps_ratio"] = cur["canary_steps_ratio"]  # the one-seed, 60-group run's (its section)
        if "one_day" in cur:  # the headline is the extended run's (`headline`): the one-day run keeps its own key
            cur["one_day"] = {k: out[k] for k in out if k != "seeds"} | {"seeds": out["seeds"]}
            headline(cur, cur["extended"])
        else:
            cur.update(out)
        path.write_text(json.dumps(cur, indent=1, default=float))
        for d in seed_docs:
            (out_dir / "scale").mkdir(exist_ok=True)
            (out_dir / "scale" / f"seed{d['seed']}.json").write_text(json.dumps(d, indent=1, default=float))
        write_section(SCALE_SECTION, scale_section(res), doc=out_dir / "README.md", keep=SCALE_KEEP)
    return res


# ------------------------------------------------------------------------------------ extension
EXT_SECTION = "## Extended canaries: the verdict rate as the canaries run more days"
EXT_KEEP = ("### What the extension says",)


def extended_section(res: dict[str, Any], heading: str = EXT_SECTION, design: str = "") -> str:
    """The page's section for the extended run (`merge`'s result, every seed's ``max_days`` > 1);
    ``design``: a sentence on what this run's loop does differently (the fleet-control run's)."""
    c = res["scale_config"]
    lines = [heading, "",
             "Commands (per seed S): " + ", then ".join(f"`{x}`" for x in c.get("commands", [])) + ". " + design
             + f"The same seeds, twins, candidates, fleets, truths and budget as the section above (the 20-day truth and "
             f"canary alone's sweep are taken from its `scale/seed<S>.json`: both are seeded and do not depend on the "
             f"loop); what changes is the loop: a candidate that is not hurting (its day ran its hours, the guard "
             f"silent, the edge's loss-budget stop not reached) is extended for up to {res['max_days']} canary days, one "
             "canary a day on a fresh random slice of that day's fleet (a new population each day, "
             "as the truth's days are), the first day's plan kept; judged at days "
             f"{', '.join(map(str, res['looks']))} (each look at {100 * res['look_level']:.1f} %: 90 % spent over the looks); "
             "the rounds pooled with the fleet's and the interference's terms as perfectly correlated and the day-to-day "
             "term (the twin's replay of 6 recent days of the fleet's own size) independent across days only; "
             "`Twin.update` after each look; the loop stops early when no open KPI can decide in the days left "
             "(futility). A canary the guard stopped refuses its candidate (the guard's KPI *regresses*, always-valid); "
             "a day the guard or the loss budget cut short gives no verdict on the other KPIs, which are judged on the "
             "completed days before it, pooled at the look's level, or stay open (`edgetwin.loop.rounds._guard_verdict`, "
             "`_stopped_day_verdict`; sections merged before that rule judged them on the ticks the stopped day ran). "
             + reuse_text(res) + "What ran: " + "; ".join(f"{int(n):,} groups: seeds {v['seeds']}, candidates per seed "
             + ", ".join(f"{sd}: {len(cs)}" for sd, cs in v["candidates"].items()) for n, v in res["by_fleet_size"].items())
             + ". Intervals: Clopper-Pearson 95 % over pairs (optimistic: a candidate's pairs share its canaries).", "",
             "| groups | seeds | pairs (truly regressing) | left open by the twin alone → canaries decided (`canary_verdict_rate`, "
             "target ≥ 60 % at 1,000) | canary verdicts right (`confident_agreement`, ≥ 97 %) | candidates promoted or "
             "refused / right | loop canary agent-steps | canary days run |",
             "|---|---|---|---|---|---|---:|---:|"]  # fmt: skip
    for n, v in res["by_fleet_size"].items():
        days = sum(len(s["rounds"]) for s in v.get("per_candidate_rounds", []))
        lines.append(f"| {int(n):,} | {v['seeds']} | {v['pairs']} ({v['truth_regress']}) | "
                     f"{_r(rate(v['canary_decided'], v['open_after_twin']))} | "
                     f"{_r(rate(v['canary_agreeing'], v['canary_decided']))} | "
                     f"{_r(v['candidate_verdicts']['verdict_rate'])} / {_r(v['candidate_verdicts']['agreement'])} | "
                     f"{v['twin_canary_agent_steps']:,} | {days} |")  # fmt: skip
    lines += ["", "The verdict rate by canary day (had the loop stopped after day d: its last look on or before d; "
              "same schedule and levels):", "",
              "| groups | day | canaries decided | verdicts right | loop canary agent-steps so far |", "|---|---:|---|---|---:|"]
    for n, v in res["by_fleet_size"].items():
        for row in v.get("by_day", []):
            lines.append(f"| {int(n):,} | {row['day']} | {_r(row['verdict_rate'])} | {_r(row['agreement'])} | "
                         f"{row['agent_steps']:,} |")  # fmt: skip
    lines += ["", "Steps ratio against canary alone's one-day sweep (the slices of the section above; `canary_steps_ratio`: "
              "canary alone's agent-steps to reach the loop's verdict rate over all pairs at at least its agreement, "
              "over the loop's):", "", "| groups | loop: verdict rate / agreement / agent-steps | canary alone reaches it at | ratio |",
              "|---|---|---|---|"]  # fmt: skip
    lines += steps_rows(res["by_fleet_size"], 2)
    lines += same_canaries_rows(res["by_fleet_size"])
    lines += why_open_rows(res["by_fleet_size"])
    return "\n".join(lines) + "\n"


def reuse_text(res: dict[str, Any]) -> str:
    """The page's sentence on which loops were taken from an earlier run and the check that they
    are what a rerun gives (`reused_loops`, `reuse_check`)."""
    reused = {n: v.get("loops_reused", []) for n, v in res["by_fleet_size"].items()}
    if not any(reused.values()):
        return ""
    chk = res.get("reuse_check", {})
    same, differ = chk.get("identical", []), chk.get("differing", [])
    return ("Loops taken as they were from the earlier extended run (" + ", ".join(res.get("reused_loops", [])) + "; none "
            "ended on the guard's stop, the only path this run changes; their Kayenta measure on the loop's canaries is "
            "not counted): " + "; ".join(f"{int(n):,} groups: {', '.join(v)}" for n, v in reused.items() if v)
            + f". The check: {len(same)} such loop(s) run afresh gave the same verdict on every pair and the same "
            f"agent-steps ({'; '.join(same) or 'none'})" + (f", {len(differ)} did not ({'; '.join(differ)})" if differ else "")
            + ". ")  # fmt: skip


def same_canaries_rows(by_size: dict[str, Any]) -> list[str]:
    """Both arms on the same agent-steps (`same_canaries`), one row per fleet size measured."""
    rows = []
    for n, v in by_size.items():
        sc = v["steps"].get("same_canaries")
        if sc:
            ca, lp = sc["canary_alone"], sc["loop"]
            rows.append(f"| {int(n):,} | {sc['candidates']} candidates, {sc['pairs']} pairs | {lp['agent_steps']:,} | "
                        f"{_r(lp['verdict_rate'])} / {_r(lp['agreement'])} | {ca['agent_steps']:,} | "
                        f"{_r(ca['verdict_rate'])} / {_r(ca['agreement'])} |")  # fmt: skip
    return _table("Both arms on the same canary agent-steps (`same_canaries`: canary alone, Kayenta-style, judging every "
                  "canary the loop ran for the candidate, all its days pooled; agent-steps counted alike for both: the "
                  "candidate arm's group-ticks after the pre-period; candidates whose loop ran afresh in this run):",
                  "| groups | candidates | loop agent-steps | loop: decided / right | canary alone agent-steps | canary "
                  "alone: decided / right |", "|---|---|---:|---|---:|---|", rows)  # fmt: skip


def _table(intro: str, header: str, rule: str, rows: list[str]) -> list[str]:
    """A page table after its introducing paragraph (nothing when it has no rows)."""
    return ["", intro, "", header, rule, *rows] if rows else []


def why_open_rows(by_size: dict[str, Any]) -> list[str]:
    """The page's why-the-pairs-stay-open table (`why_open`), one row per fleet size and KPI."""
    def pct(x: float | None) -> str:
        return "—" if x is None else f"{100 * x:.1f} %"

    rows = []
    for n, v in by_size.items():
        for w in v.get("why_open", []):
            m, d = w["median"], w["dominant"]
            df = "—" if m["df"] is None else f"{m['df']:.0f}"
            rows.append(f"| {int(n):,} | {w['kpi']} | {w['open']} ({w['with_terms']}) | {pct(m['gap'])} | {pct(m['half'])} | "
                        f"{pct(m['transport'])} | {df} | {pct(m['own'])} | {pct(m['shared'])} ({pct(m['interference'])}) | {pct(m['day'])} | "
                        f"{pct(m['day_one_sd'])} | {d['own']} / {d['shared']} / {d['day']} | {w['floor']} | {w['days_16']} |")  # fmt: skip
    return _table("Why the pairs stay open (`why_open`): per KPI, the open pairs (those with their last look's terms "
            "recorded), medians of the distance from the point estimate to the margin (gap: what the interval's "
            "half-width must get below) and of the relative half-width each term alone gives at the look's level and "
            "degrees of freedom: the canaries' group split (own: shrinks with more groups and days), the fleet's and "
            "the twin's interference terms (shared, of it interference: no number of canary days shrinks them), the "
            "day-to-day term after the days run (shrinks as 1/days) and one day's spread of the fleet-wide change "
            "(sd of one day, relative); the hull's half-width beside the interference-carrying estimate's alone (the "
            "rest is the two ends' disagreement about the interference) and the t reference's degrees of freedom; "
            "which term dominates; pairs whose shared term alone reaches the gap (no days "
            "decide them) and whose day-to-day term alone would still reach it after 16 days:",
            "| groups | KPI | open (with terms) | gap | hull half-width | with interference alone | df | own | "
            "shared (interference) | day-to-day | sd of one day | dominant own / shared / day | shared ≥ gap | "
            "day term ≥ gap at 16 days |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|", rows)  # fmt: skip


#: what the issue's headline fields hold at each fleet size (`headline`)
EXTENDED_DESIGN = ("extended canaries (up to 16 days, looks at 1, 2, 4, 8, 16) with a guard-stopped candidate's "
                   "other KPIs judged on the ticks it ran")
ONE_DAY_DESIGN = "one day, ≤ 3 rounds (not rerun with the extension: 5,000 groups did not fit the shared machine)"


def headline(cur: dict[str, Any], ext: dict[str, Any]) -> None:
    """The issue's fields (``by_fleet_size`` → ``"100"`` / ``"1000"`` / ``"5000"`` →
    ``canary_verdict_rate``, ``confident_agreement``, ``agreement_ci``; ``canary_steps_ratio``) from
    the extended run where it ran, the one-day run's elsewhere, each entry naming its ``design``.
    The one-day run's own keys move, once, to ``one_day`` (its page section reads its seed files)."""
    if "one_day" not in cur and "by_fleet_size" in cur:
        cur["one_day"] = {k: cur[k] for k in ("by_fleet_size", "canary_steps_ratio", "canary_steps_ratio_lower_bound",
                                              "canary_steps_ratio_fleet_size", "scale_config") if k in cur}  # fmt: skip
    by = {n: {k: v for k, v in b.items() if k != "per_candidate_rounds"} | {"design": EXTENDED_DESIGN}
          for n, b in ext["by_fleet_size"].items()}  # fmt: skip
    for n, b in cur.get("one_day", {}).get("by_fleet_size", {}).items():
        by.setdefault(n, {**b, "design": ONE_DAY_DESIGN})
    cur["by_fleet_size"] = {n: by[n] for n in sorted(by, key=int)}
    cur.update({k: ext[k] for k in ("canary_steps_ratio", "canary_steps_ratio_lower_bound", "canary_steps_ratio_fleet_size")})


#: the fleet-control extended run (`write_extended`'s ``fleet_control``): its key, section and what it changes
EXT_FC_KEY = "extended_fleet_control"
EXT_FC_SECTION = "## Extended canaries with the rest of the fleet as control"
EXT_FC_KEEP = ("### What the fleet control says",)
EXT_FC_DESIGN = (
    "**This run's loop judges each canary against every group not on the candidate** (`canary_loop(fleet_control="
    "True, cuped=\"per_arm\")`): the candidate arm, and so the share × hours × loss each canary spends, is the "
    "section above's (half of a random 10 % slice); the control arm is the slice's other half and the 900 groups "
    "outside the slice, all on the current policy meanwhile (valid: the candidate arm is a uniformly random draw "
    "from the fleet); the pre-period slope is each arm's own (Lin 2013: with 50 against 950 groups a pooled slope "
    "is the control arm's, and a candidate that changes how a group follows its pre-period widens its arm's "
    "term instead of narrowing it). Chosen before this run from the interval widths alone (the 1,000-group "
    "design table of the coverage section, on simulated canaries, and the levers section's half-widths on "
    "the loop's own first-day canaries), never from a verdict. Results: `extended_fleet_control` in "
    "results_production.json (the headline's `by_fleet_size` then kept the slice-control loop of the section above; now `before_day_term`). ")
EXTENDED_FC_DESIGN = ("extended canaries (up to 16 days, looks at 1, 2, 4, 8, 16), the rest of the fleet as control "
                      "with a CUPED slope per arm (extended_fleet_control)")


def fc_variant(variant: str) -> tuple[str, str, str, tuple[str, ...], str]:
    """A fleet-control run's results key, seed-file prefix, page heading, kept subsections and design text;
    ``variant`` (``--merge-as``, e.g. ``reseeded``) puts a rerun beside the stored one instead of over it."""
    if not variant:
        return EXT_FC_KEY, "extended_fc_seed", EXT_FC_SECTION, EXT_FC_KEEP, EXT_FC_DESIGN
    key = f"{EXT_FC_KEY}_{variant}"
    design = EXT_FC_DESIGN.replace(f"`{EXT_FC_KEY}`", f"`{key}`")
    if variant == "day_bound":  # at 100 and 5,000 groups as well (benchmarks/_closed_loop_fleetsize_bound.py)
        design = design.replace("the 900 groups outside the slice", "the groups outside the slice (90 % of the "
                                "fleet)").replace(
            "the headline's `by_fleet_size` then kept the slice-control loop of the section above; now `before_day_term`",
            "the headline's `by_fleet_size` moves to this run once it covers every size the headline holds, the day-term "
            "run's then kept under `before_day_bound`: the section \"The verdict rate by fleet size with the one-day "
            "bound\" says whether it has") + \
            "Run with the one-day bound on the verdict's day term (the section \"The one-day canary's day term\"). "
    if variant == "day_term":  # run at 5,000 groups as well (benchmarks/_closed_loop_fleetsize.py)
        design = design.replace("the 900 groups outside the slice", "the groups outside the slice (900 of 1,000, "
                                "4,500 of 5,000)").replace(
            "the headline's `by_fleet_size` then kept the slice-control loop of the section above; now `before_day_term`",
            "the headline's `by_fleet_size` is this run's, the slice-control loop's kept under `before_day_term`: "
            "the fleet-size section below") + "Run with the verdict's calibrated day term (the day-term section). "
    return (key, f"extended_fc_{variant}_seed", f"{EXT_FC_SECTION} ({variant})", (f"{EXT_FC_KEEP[0]} ({variant})",), design)


def write_extended(seed_docs: list[dict[str, Any]], out_dir: Path, no_write: bool, commands: list[str],
                   variant: str = "") -> dict[str, Any]:
    """Pool the extended run's seeds (`merge`) into ``results_production.json``'s ``extended`` key
    (``max_days``, ``looks``, ``by_fleet_size`` → ``"1000"`` → ``canary_verdict_rate``,
    ``confident_agreement``, ``agreement_ci``, ``by_day``, ``steps``; ``canary_steps_ratio``) and
    the page's section; the one-day run's keys are left as they are. A fleet-control run goes to
    its own key (`fc_variant`: ``variant`` names a rerun kept beside the stored one)."""
    from _docs import write_section

    from edgetwin.loop.ppi import look_days, look_level

    by = merge(seed_docs)
    check = reuse_check(seed_docs, out_dir / "scale") if not all(d.get("fleet_control") for d in seed_docs) else \
        {"identical": [], "differing": []}
    for n, b in by.items():
        if not any("canary_alone_relabelled" in d for d in seed_docs):  # runs before that fix: its measure read no candidate row
            b["canary_alone"] = "not measured in this run (the loop's canaries name the candidate by its registry version)"
            for ps in b.get("per_seed", {}).values():
                ps["canary_alone"] = b["canary_alone"]
        b["per_candidate_rounds"] = [{"seed": d["seed"], "policy": s["policy"], "rounds": s["rounds"]}
                                     for d in seed_docs if n in d["by_fleet_size"] for s in d["by_fleet_size"][n]["per_candidate"]]  # fmt: skip
    max_days = max(int(d.get("max_days", 1)) for d in seed_docs)
    looks = list(look_days(max_days))
    cfg = {k: seed_docs[0][k] for k in ("candidates", "truth_days", "twin", "update", "sweep", "budget", "sweep_max_groups")}
    cfg["commands"] = list(commands)
    head = "1000" if "1000" in by else max(by, key=int)
    res = {"seeds": sorted(d["seed"] for d in seed_docs), "max_days": max_days, "looks": looks,
           "look_level": look_level(0.9, len(looks)), "scale_config": cfg, "by_fleet_size": by,
           "canary_steps_ratio_fleet_size": int(head), "canary_steps_ratio": by[head]["steps"]["ratio"],
           "canary_steps_ratio_lower_bound": by[head]["steps"]["lower_bound"], "reuse_check": check,
           "reused_loops": sorted({str(d["reused_loops"]["from"]) for d in seed_docs if d.get("reused_loops")})}  # fmt: skip
    print(json.dumps({n: {k: b[k] for k in ("pairs", "canary_verdict_rate", "confident_agreement", "agreement_ci")}
                      | {"by_day": [(r["day"], r["verdict_rate"]["rate"], r["agreement"]["rate"]) for r in b["by_day"]]}
                      for n, b in by.items()}, indent=1, default=float))  # fmt: skip
    if not no_write:
        path = out_dir / "results_production.json"
        cur = json.loads(path.read_text()) if path.exists() else {}
        fc = all(d.get("fleet_control") for d in seed_docs)
        (out_dir / "scale").mkdir(exist_ok=True)
        if fc:  # its own key, seed files and section (the headline, which README.md quotes, is the lead's to move)
            key, name, heading, keep, design = fc_variant(variant)
            cur[key] = res | {"design": EXTENDED_FC_DESIGN + (f", {variant}" if variant else "")}
        elif variant:  # a slice-control rerun beside the stored one: the headline (README.md's) is not moved
            cur[f"extended_{variant}"] = res
            name, heading, keep = f"extended_{variant}_seed", f"{EXT_SECTION} ({variant})", (f"{EXT_KEEP[0]} ({variant})",)
            design = (f"**A rerun of the slice-control loop of \"{EXT_SECTION[3:]}\"** (results: `extended_{variant}` in "
                      "results_production.json; the headline's `by_fleet_size` keeps the stored run; \"the section above\" "
                      "below is the 1,000-group scale section). ")
        else:
            cur["extended"] = res
            headline(cur, res)
            name, heading, keep, design = "extended_seed", EXT_SECTION, EXT_KEEP, ""
        path.write_text(json.dumps(cur, indent=1, default=float))
        for d in seed_docs:
            (out_dir / "scale" / f"{name}{d['seed']}.json").write_text(json.dumps(d, indent=1, default=float))
        write_section(heading, extended_section(res, heading, design), doc=out_dir / "README.md", keep=keep)
    return res
