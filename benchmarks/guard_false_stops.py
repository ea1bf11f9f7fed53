"""How often the canary's guard stops a canary it should not stop, on the emulated cluster.

The guard (`edgetwin.edge.canary_guard.CanaryGuard`) promises: a canary whose candidate is within
all its margins is stopped with probability at most ``alpha`` (0.05) over the whole canary. Its
confidence sequence is only asymptotically valid, and its error rate was measured on Gaussian
synthetic streams; the emulated cluster's KPIs are heavy-tailed (task time: median ~100 ms, ticks
of 25 s). This benchmark counts the guard's stops where it runs, at the demo's sizes:

- a fleet of 100 service groups on the current (random logging) policy for one day of 96
  15-minute ticks, one fresh population per day (`edgetwin.emulator.logs.generate_logs`);
- a slice of 10 groups drawn at random, split 5 / 5 by the slice's keyed hash
  (`edgetwin.edge.canary_slice.SliceRouter`, the seed moved to the first exact 5 / 5 split, as
  `edgetwin.loop.rounds.balanced` does);
- the demo's `CanaryConfig`: 4 pre-period ticks, 23 h (92 ticks), the seven guarded KPIs and their
  margins (5 %, revenue 2 %), alpha 0.05, batch 4, min_reports 8.

**The path.** `edgetwin.edge.canary.Canary` is driven directly with the day's rows of the slice,
one tick at a time (`Canary._observe`, what `Canary.record` does after spooling the tick's
segment: routed, composed, guarded: everything the runtime does per tick except the bus and the
spool). Because every group runs the current policy (an A/A canary), the
day's fleet log *is* the canary's log for any slice; the runtime / bus path
(`edgetwin.loop.fleet.canary_on_cluster`) serves the same rows more slowly.

**The candidates.** ``aa``: the candidate is the current policy (every stop is false).
``at_margin``: the A/A rows with each guarded KPI of the candidate arm's rows worsened, each tick,
by exactly its margin of the control arm's mean that tick (``E[d] = 0``: the boundary of what the
guard must not stop; every stop is false). ``regressing``: worsened by 3x the margin (every stop
is right: the power). The worsening is applied to the rows (not a policy): it tests the guard's
statistics, not a candidate's behaviour. ``policy`` (with ``--policy DIR``): an exported policy
(e.g. the one `edgetwin demo --out DIR` trains, ``DIR/policy``) served to the candidate arm after
the pre-period, the emulator stepped with the mixed actions (`policy_day`); its truth is the whole
cluster on it vs on the random policy over ``--truth-days`` days (`policy_truth`).

Usage::

    python3 benchmarks/guard_false_stops.py --days 50 --slices 4 --policy DIR/policy --truth-days 60  # 200 per candidate
    python3 benchmarks/guard_false_stops.py --quick                        # 8 canaries, no page

Writes ``docs/benchmarks/canary_guard/README.md`` and ``results.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import binomtest

from edgetwin.edge.canary import Canary, CanaryConfig
from edgetwin.edge.canary_slice import CanarySlice, SliceRouter
from edgetwin.edge.kpi_watch import KPIMargin
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "canary_guard"
#: the demo's guarded KPIs and margins (its canary plan, `edgetwin demo` defaults, seed 0)
DEMO_MARGINS: tuple[KPIMargin, ...] = (
    KPIMargin("response.offload_ratio", 0.05, 0.0, True),
    KPIMargin("kpi.task_time_ms", 0.05, 0.0, False),
    KPIMargin("kpi.slo_violation", 0.05, 0.0, False),
    KPIMargin("kpi.energy_j", 0.05, 0.0, False),
    KPIMargin("kpi.carbon_g", 0.05, 0.0, False),
    KPIMargin("kpi.revenue", 0.02, 0.0, True),
    KPIMargin("reward", 0.05, 0.0, True),
)
#: candidate -> how many margins each guarded KPI of its arm is worsened by
CANDIDATES: dict[str, float] = {"aa": 0.0, "at_margin": 1.0, "regressing": 3.0}
AGENTS, STEPS, SLICE, HOURS, PRE_TICKS, ALPHA = 100, 96, 10, 23.0, 4, 0.05
DAY_SEED0 = 48_000  # day d's population: generate_logs(seed=DAY_SEED0 + d)


def fleet_day(day: int) -> pd.DataFrame:
    """One day of the fleet (``AGENTS`` groups x ``STEPS`` ticks) on the random logging policy."""
    df, _ = generate_logs(ClusterConfig(n_agents=AGENTS, steps=STEPS), 1, "random", seed=DAY_SEED0 + day)
    return df


def draw_slice(agents: Sequence[str], day: int, k: int) -> CanarySlice:
    """Slice ``k`` of day ``day``: ``SLICE`` groups at random, the assignment seed moved to the
    first exact half / half split of the keyed hash (`edgetwin.loop.rounds.balanced`)."""
    rng = np.random.default_rng([day, k, 48])
    chosen = tuple(str(a) for a in rng.choice(np.asarray(agents), SLICE, replace=False))
    for s in range(10_000):
        seed = 1000 * k + s
        r = SliceRouter(CanarySlice(chosen, (), 0.5, seed), "next", "current")
        if sum(r.arm(a) == "candidate" for a in chosen) == SLICE // 2:
            return CanarySlice(chosen, (), 0.5, seed)
    raise RuntimeError("no balanced split")  # pragma: no cover - 10 groups split evenly within a few seeds


def worsen(rows: pd.DataFrame, arms: np.ndarray, margins: Sequence[KPIMargin], times: float) -> pd.DataFrame:
    """The candidate arm's rows with each guarded KPI worsened by ``times`` its margin of the
    control arm's mean this tick (``worsening = times * allowed``: ``E[d] = (times - 1) * allowed``
    when the arms are alike)."""
    if times == 0.0:
        return rows
    rows = rows.copy()
    cand, ctrl = arms == "candidate", arms == "control"
    for m in margins:
        col = rows[m.kpi].to_numpy(dtype=np.float64).copy()
        shift = times * m.allowed(float(col[ctrl].mean()))
        col[cand] += -shift if m.higher_is_better else shift
        rows[m.kpi] = col
    return rows


def canary_config(sl: CanarySlice) -> CanaryConfig:
    """The demo's canary on ``sl`` (its plan's hours, margins, alpha; the guard's defaults)."""
    return CanaryConfig(candidate="cand", slice=sl, hours=HOURS, margins=DEMO_MARGINS, alpha=ALPHA,
                        pre_ticks=PRE_TICKS)  # fmt: skip


def policy_day(day: int, sl: CanarySlice | None, policy: Any) -> pd.DataFrame:
    """Day ``day`` (the population of `fleet_day`) with ``sl``'s candidate arm served ``policy``
    (an object with ``act(obs)``) after the pre-period, every other group the random logging
    policy; None: the whole fleet on ``policy`` from the first tick. The slice's rows (every
    group's without a slice), ``policy`` = ``cand`` / ``current``. Groups share sites, so the
    candidate arm's actions reach the control arm's groups as they would on the cluster."""
    from edgetwin.emulator.cluster import EdgeCluster
    from edgetwin.emulator.logs import episode_seed, make_policy
    from edgetwin.loop.fleet import _rows

    em = EdgeCluster(ClusterConfig(n_agents=AGENTS, steps=STEPS))
    obs = em.reset(seed=episode_seed(DAY_SEED0 + day, 0))
    current = make_policy("random", em.spec, seed=DAY_SEED0 + day)
    ids = em.agent_ids.astype(str).tolist()
    if sl is None:
        cand, keep = np.ones(em.n, dtype=bool), np.ones(em.n, dtype=bool)
    else:
        arms = SliceRouter(sl, "cand", "current").arms(ids)
        cand, keep = arms == "candidate", arms != "fleet"
    out = []
    for t in range(em.steps):
        actions = np.asarray(current.act(obs), dtype=np.float64)
        on = cand & (t >= PRE_TICKS or sl is None)
        if on.any():
            actions[on] = policy.act(obs[on])
        pol = np.where(on, "cand", "current").astype(object)
        new_obs, reward, done, info = em.step(actions)
        out.append(_rows(em, day, t, obs, actions, info, reward, pol, np.zeros(em.n), keep))
        obs = new_obs
        if done:
            break
    return pd.concat(out, ignore_index=True)


def run_canary(day_log: pd.DataFrame, sl: CanarySlice, times: float, spool: Path) -> dict[str, Any]:
    """One canary of ``sl`` over ``day_log``, the candidate worsened ``times`` margins; its outcome.
    ``day_log``'s ``policy`` is kept when it names ``cand`` (a served candidate), else the rows are
    the current policy's."""
    cfg = canary_config(sl)
    canary = Canary(cfg, "current", spool)
    cols = ["episode", "t", "agent", "site", "scenario", "policy", "propensity", *(m.kpi for m in cfg.margins)]
    rows_all = day_log.loc[day_log["agent"].astype(str).isin(set(sl.agents)), cols].copy()  # what the guard reads
    if not (rows_all["policy"].astype(str) == "cand").any():
        rows_all["policy"] = "current"
    for t, rows in rows_all.groupby("t", sort=True):
        if not canary.active:
            break
        rows = rows.reset_index(drop=True)
        if int(t) >= PRE_TICKS:
            arms = canary.router.arms(rows["agent"].astype(str).tolist(), rows["site"].astype(str).tolist(),
                                      rows["scenario"].astype(str).tolist())  # fmt: skip
            rows = worsen(rows, arms, DEMO_MARGINS, times)
        canary.ticks += 1  # what `Canary.record` does after spooling the tick's segment (not needed here)
        canary._observe(rows)
    stop = canary.guard_stop
    return {"stopped": stop is not None, "kpi": stop.kpi if stop else None,
            "ticks": int(canary.ticks), "observations": int(canary.guard._cs[stop.kpi].n) if stop else None}  # fmt: skip


def clopper_pearson(k: int, n: int, level: float = 0.95) -> list[float]:
    if n == 0:
        return [0.0, 1.0]
    ci = binomtest(k, n).proportion_ci(confidence_level=level, method="exact")
    return [float(ci.low), float(ci.high)]


def measure_day(d: int, slices: int, names: Sequence[str], policy_dir: Path | None) -> dict[str, list[dict[str, Any]]]:
    """Day ``d``'s canaries (``slices`` of them per candidate in ``names``)."""
    policy = _load(policy_dir) if policy_dir is not None else None
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in names}
    day_log = fleet_day(d)
    agents = sorted(set(day_log["agent"].astype(str)))
    with tempfile.TemporaryDirectory(prefix="guard48-") as tmp:
        for k in range(slices):
            sl = draw_slice(agents, d, k)
            for c in names:
                rows = policy_day(d, sl, policy) if c == "policy" else day_log
                out = run_canary(rows, sl, CANDIDATES.get(c, 0.0), Path(tmp) / f"{c}-{d}-{k}")
                runs[c].append({"day": d, "slice": k, **out})
    return runs


def measure(days: int, slices: int, candidates: Sequence[str], policy_dir: Path | None = None, workers: int = 1,
            log: Any = print) -> dict[str, Any]:  # fmt: skip
    """Every candidate's canaries over ``days`` x ``slices``; per candidate the stop rate (overall
    and per KPI: the canary's first stopping KPI) with Clopper-Pearson 95 % intervals.
    ``policy_dir`` (an exported policy) adds the candidate ``policy``: that policy served to the
    candidate arm. Days run on ``workers`` processes; the result does not depend on how many."""
    from concurrent.futures import ProcessPoolExecutor

    names = [*candidates, *(["policy"] if policy_dir is not None else [])]
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in names}
    with ProcessPoolExecutor(max(1, workers)) as pool:
        futs = [pool.submit(measure_day, d, slices, names, policy_dir) for d in range(days)]
        for d, f in enumerate(futs):
            for c, rs in f.result().items():
                runs[c].extend(rs)
            log(f"day {d + 1}/{days}: " + ", ".join(f"{c} {sum(r['stopped'] for r in runs[c])}/{len(runs[c])}"
                                                     for c in names))  # fmt: skip
    return {c: summarize(runs[c]) for c in names}


def _load(policy_dir: Path) -> Any:
    from edgetwin.policies.export import load_policy

    return load_policy(policy_dir)


def policy_truth(policy: Any, days: int) -> dict[str, dict[str, float]]:
    """Per guarded KPI, the fleet-wide relative worsening of the whole cluster on ``policy`` vs
    on the random logging policy, over ``days`` days (the same populations): the ratio of the
    multi-day means, and the per-day spread. Its share of the margin says which stops are false."""
    from edgetwin.emulator.cluster import EdgeCluster
    from edgetwin.emulator.logs import make_policy

    spec = EdgeCluster(ClusterConfig(n_agents=AGENTS, steps=STEPS)).spec
    cur, new = [], []
    for d in range(days):
        cur.append(policy_day(d, None, make_policy("random", spec, seed=DAY_SEED0 + d)))
        new.append(policy_day(d, None, policy))
    out = {}
    for m in DEMO_MARGINS:
        c = np.array([float(x[m.kpi].mean()) for x in cur])
        n = np.array([float(x[m.kpi].mean()) for x in new])
        per_day = [m.worsening(a, b) / abs(a) for a, b in zip(c, n, strict=True)]
        rel = m.worsening(float(c.mean()), float(n.mean())) / abs(float(c.mean()))
        out[m.kpi] = {"worsening": rel, "day_sd": float(np.std(per_day, ddof=1)) if days > 1 else math.nan,
                      "margin": m.max_regression, "within_margin": rel < m.max_regression}  # fmt: skip
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Stops over ``runs``: overall and by the stopping KPI, with Clopper-Pearson intervals."""
    n, k = len(runs), sum(r["stopped"] for r in runs)
    by_kpi = {}
    for m in DEMO_MARGINS:
        km = sum(r["kpi"] == m.kpi for r in runs)
        by_kpi[m.kpi] = {"stops": km, "rate": km / n if n else 0.0, "ci": clopper_pearson(km, n)}
    obs = [r["observations"] for r in runs if r["stopped"]]
    return {"canaries": n, "stops": k, "rate": k / n if n else 0.0, "ci": clopper_pearson(k, n), "by_kpi": by_kpi,
            "stop_ticks": [r["ticks"] for r in runs if r["stopped"]], "stop_observations": obs,
            "runs": [[r["day"], r["slice"], r["kpi"]] for r in runs if r["stopped"]]}  # fmt: skip


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def write_page(res: dict[str, Any], out: Path) -> None:
    """``results.json`` and the page (``README.md``), every number on the page from the JSON."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    lines = [
        "# The canary's guard: how often it stops a canary it should not",
        "",
        "Written by `benchmarks/guard_false_stops.py` (its docstring says how); numbers from",
        "`results.json`. The guard promises a false stop in at most alpha = "
        f"{res['alpha']:g} of canaries whose candidate is within its margins.",
        "",
        f"Setting: {res['setup']}.",
        "",
        "| guard | candidate | canaries | stops | stop rate | 95 % CP interval | within alpha? |",
        "|---|---|---|---|---|---|---|",
    ]
    for g, cands in res["guards"].items():
        for c, s in cands.items():
            ok = ("power" if c == "regressing" else "see its truth below" if c == "policy"
                  else "yes" if s["ci"][1] <= res["alpha"] else "**no**" if s["ci"][0] > res["alpha"] else "undecided")  # fmt: skip
            lines.append(f"| {g} | {c} | {s['canaries']} | {s['stops']} | {_pct(s['rate'])} | "
                         f"[{_pct(s['ci'][0])}, {_pct(s['ci'][1])}] | {ok} |")  # fmt: skip
    lines += ["", "Stops by the KPI that stopped the canary (A/A and at the margin: all false):", "",
              "| guard | candidate | " + " | ".join(m.kpi for m in DEMO_MARGINS) + " |",
              "|---|---|" + "---|" * len(DEMO_MARGINS)]  # fmt: skip
    for g, cands in res["guards"].items():
        for c, s in cands.items():
            lines.append(f"| {g} | {c} | " + " | ".join(str(s["by_kpi"][m.kpi]["stops"]) for m in DEMO_MARGINS) + " |")
    truth = res.get("policy_truth")
    if truth:
        lines += ["", f"The `policy` candidate ({res['policy']}): its fleet-wide relative worsening per KPI, the whole "
                  f"cluster on it vs on the random logging policy over {res['truth_days']} days (the same populations; "
                  "negative: better). A stop on a KPI within its margin is false.", "",
                  "| KPI | worsening | day-to-day sd | margin | within? |", "|---|---|---|---|---|"]  # fmt: skip
        for k, v in truth.items():
            lines.append(f"| {k} | {_pct(v['worsening'])} | {_pct(v['day_sd'])} | {_pct(v['margin'])} | "
                         f"{'yes' if v['within_margin'] else 'no'} |")  # fmt: skip
    lines += ["", "Batch observations of the stopping KPI's sequence at each stop (as shipped; min_reports 8 ticks in "
              "batches of 4 allow a stop from 2):", ""]  # fmt: skip
    for c, s in res["guards"]["as shipped"].items():
        lines.append(f"- {c}: {sorted(s['stop_observations']) or 'no stop'}")
    lines += ["", *conclusion(res)]
    (out / "README.md").write_text("\n".join(lines) + "\n")


def conclusion(res: dict[str, Any]) -> list[str]:
    """What the numbers say (every number from ``res``)."""
    g, alpha = res["guards"]["as shipped"], res["alpha"]
    false = [c for c in ("aa", "at_margin") if c in g]
    out = ["## What it says", ""]
    for c in false:
        s = g[c]
        verdict = "within" if s["ci"][1] <= alpha else ("beyond" if s["ci"][0] > alpha else "not distinguishable from")
        out.append(f"- {c}: {s['stops']} false stops in {s['canaries']} canaries ({_pct(s['rate'])}, 95 % CP upper "
                   f"{_pct(s['ci'][1])}): {verdict} alpha {alpha:g}.")  # fmt: skip
    if "regressing" in g:
        s = g["regressing"]
        out.append(f"- regressing (3x every margin): stopped {s['stops']} of {s['canaries']} ({_pct(s['rate'])}, "
                   f"[{_pct(s['ci'][0])}, {_pct(s['ci'][1])}]): where edgetwin loses: at the demo's sizes the guard "
                   "almost never stops a candidate 3x beyond its margins within the day (it is a guard against "
                   "gross regressions, not a test of the margin).")  # fmt: skip
    if {"aa", "at_margin"} <= set(g):
        same = sorted(map(tuple, g["aa"]["runs"])) == sorted(map(tuple, g["at_margin"]["runs"]))
        out.append(f"- aa and at_margin share their days and slices (the at-margin rows are the A/A rows worsened): "
                   f"their stops are {'the same canaries' if same else 'different canaries'}, not independent "
                   "evidence.")  # fmt: skip
    if "policy" in g:
        s, tt = g["policy"], (res.get("policy_truth") or {}).get("kpi.task_time_ms")
        out.append(f"- policy ({res.get('policy')}: the trained policy of an `edgetwin demo --out DIR` run, defaults, "
                   f"seed 0): {s['stops']} stops in {s['canaries']} canaries (95 % CP upper {_pct(s['ci'][1])}).")  # fmt: skip
        if tt:
            se = tt["day_sd"] / math.sqrt(max(res["truth_days"], 1))
            where = ("within" if tt["worsening"] + 2 * se < tt["margin"] else
                     "beyond" if tt["worsening"] - 2 * se > tt["margin"] else "not distinguishable from")  # fmt: skip
            out.append(f"  Its task time over {res['truth_days']} days of the whole cluster: {_pct(tt['worsening'])} "
                       f"(day-to-day sd {_pct(tt['day_sd'])}, a standard error of about {_pct(se)} on that mean): "
                       f"{where} its {_pct(tt['margin'])} margin (+- 2 se). One day's change (sd {_pct(tt['day_sd'])}) "
                       "says little about it.")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=int, default=60)
    ap.add_argument("--slices", type=int, default=4, help="slices per day")
    ap.add_argument("--candidates", default="aa,at_margin,regressing")
    ap.add_argument("--quick", action="store_true", help="2 days x 4 slices, no page")
    ap.add_argument("--policy", type=Path, default=None,
                    help="an exported policy directory (e.g. `edgetwin demo`'s policy/) served as a further candidate")
    ap.add_argument("--truth-days", type=int, default=20, help="days of the whole cluster per policy for its truth")
    ap.add_argument("--workers", type=int, default=2, help="processes (days in parallel)")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    days = 2 if a.quick else a.days
    cands = [c for c in a.candidates.split(",") if c]
    bad = [c for c in cands if c not in CANDIDATES]
    if bad:
        print(f"--candidates: unknown {bad} (known: {sorted(CANDIDATES)})", file=sys.stderr)
        return 2
    t0 = time.time()
    policy = None
    if a.policy is not None:
        from edgetwin.contract.errors import InputError

        try:
            policy = _load(a.policy)
        except InputError as e:
            print(f"--policy {a.policy}: {e}", file=sys.stderr)
            return 2
    guards = {"as shipped": measure(days, a.slices, cands, a.policy, a.workers)}
    truth = policy_truth(policy, 2 if a.quick else a.truth_days) if policy is not None else None
    res = {
        "alpha": ALPHA, "days": days, "slices_per_day": a.slices, "day_seed0": DAY_SEED0,
        "setup": (f"{AGENTS} groups, one day of {STEPS} 15-minute ticks per population (seeds {DAY_SEED0} + day), "
                  f"{a.slices} random slices of {SLICE} groups per day split {SLICE // 2} / {SLICE // 2}, "
                  f"{PRE_TICKS} pre-period ticks then {HOURS:g} h, the demo's 7 guarded KPIs, alpha {ALPHA:g}, "
                  "batch 4, min_reports 8; `Canary._observe` driven directly with the emulator's rows, tick by tick"),
        "guards": guards, "policy": str(a.policy) if a.policy else None, "policy_truth": truth, "truth_days": a.truth_days if truth else 0,
        "seconds": round(time.time() - t0, 1),
    }  # fmt: skip
    print(json.dumps({g: {c: [s["stops"], s["canaries"], s["ci"]] for c, s in v.items()} for g, v in guards.items()}))
    if truth:
        print(json.dumps({k: round(v["worsening"], 4) for k, v in truth.items()}))
    if not a.quick:
        write_page(res, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
