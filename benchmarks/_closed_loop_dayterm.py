"""Why the verdict's day-to-day term is too small (issue 48): the twin's replayed day spread against
the logs' observed one and the emulator's truth days, on a cached 1,000-group setup of the scale run.

Per seed, for the scale run's four candidates and the KPI columns the bound section reports:

* ``twin_same_seed``: `edgetwin.loop.verdict.day_to_day_variance` as the loop called it before
  this change (the last 6 recent days of the fleet's own size, member 0, every day replayed on the
  same world seed): the sd of the daily fleet-wide change and of the baseline level;
* ``twin_per_day_seed``: the same replay with each day on its own world seed;
* ``observed_level``: the sd over the same 6 logged days of the baseline fleet mean *as logged*
  (what any operator's logs show; no twin, no emulator);
* ``truth``: the emulator's sd of the daily fleet-wide change and of the current policy's level
  over the 20 truth days (`scale/day_truth_seed<S>.json`, `_closed_loop_bound.day_truth`);
* ``product``: the day term the loop now carries (`day_to_day_variance`, calibrated).

Everything relative to the baseline level (the verdict's units). The product never sees ``truth``.

    python benchmarks/closed_loop.py --day-diagnosis --seed S --work /tmp/l48b-fc
"""

from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCALE_DIR = ROOT / "docs" / "benchmarks" / "closed_loop" / "scale"
COLUMNS = ("kpi.carbon_g", "kpi.energy_j", "kpi.revenue", "kpi.slo_violation", "kpi.task_time_ms",
           "response.offload_ratio", "reward")  # fmt: skip
FLEET, RECENT_DAYS = 1000, 6


def _replay(twin: Any, day: Any, cols: list[str], cand: Any, base: Any, seed: int) -> tuple[list[float], list[float]]:
    from edgetwin.loop.ppi import twin_group_predictions

    pr = twin_group_predictions(twin, {"candidate": cand, "baseline": base}, day, cols, episodes=1, seed=seed,
                                members=[0])  # fmt: skip
    return ([float(np.mean(pr[("candidate", c)] - pr[("baseline", c)])) for c in cols],
            [float(np.mean(pr[("baseline", c)])) for c in cols])  # fmt: skip


def diagnose(seed: int, work: Path, log: Any = print) -> dict[str, Any]:
    """The diagnosis of one seed (see the module docstring); ``work``: the scale run's cache."""
    from _closed_loop_scale import SCALE_CANDIDATES, seed_twin
    from whatif_gate import candidates, logging_policy

    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.loop.ppi import replay_spec
    from edgetwin.loop.verdict import day_to_day_variance

    t0 = time.perf_counter()
    spec, _train, twin = seed_twin(seed, work)
    allp = candidates(spec, twin, "production", seed)
    current = logging_policy("production", spec, seed + 500)
    cfg = ClusterConfig(n_agents=FLEET, steps=96)
    recent = generate_logs(cfg, RECENT_DAYS, copy.deepcopy(current), seed=seed * 1000 + 300)[0]  # as run_size draws it
    cols = [c for c in COLUMNS if c in recent.columns]
    names = list(pd_unique(recent["episode"]))
    days = [recent[recent["episode"] == e] for e in names]
    obs = np.array([[float(d[c].mean()) for c in cols] for d in days])  # (days, cols): the logged baseline fleet means
    truth = json.loads((SCALE_DIR / f"day_truth_seed{seed}.json").read_text())["values"]
    tb = {c: np.asarray(truth["current"][c], dtype=float) for c in cols}
    base_spec = replay_spec("current", current)
    out: dict[str, Any] = {"seed": seed, "days": len(names), "fleet": FLEET, "columns": cols, "candidates": {}}
    out["observed_level_sd"] = {c: float(np.std(obs[:, j], ddof=1) / abs(np.mean(obs[:, j]))) for j, c in enumerate(cols)}
    out["truth_level_sd"] = {c: float(np.std(tb[c], ddof=1) / abs(np.mean(tb[c]))) for c in cols}
    for name in SCALE_CANDIDATES[:4]:
        cand = replay_spec(name, allp[name])
        rows: dict[str, Any] = {}
        for variant in ("same_seed", "per_day_seed"):
            d_, b_ = zip(*[_replay(twin, day, cols, cand, base_spec,
                                   seed if variant == "same_seed" else seed * 7919 + 101 * i + 1)
                           for i, day in enumerate(days)], strict=True)  # fmt: skip
            d, b = np.asarray(d_), np.asarray(b_)
            lvl = np.abs(obs.mean(axis=0))
            rows[variant] = {"effect_sd": {c: float(np.std(d[:, j], ddof=1) / lvl[j]) for j, c in enumerate(cols)},
                             "level_sd": {c: float(np.std(b[:, j], ddof=1) / lvl[j]) for j, c in enumerate(cols)}}  # fmt: skip
        prod = day_to_day_variance(twin, [recent], cols, cand, base_spec, seed=seed)
        rows["product"] = {c: {"effect_sd": float(np.sqrt(prod[c][0]) / abs(np.mean(obs[:, j]))), "df": prod[c][2]}
                           for j, c in enumerate(cols) if c in prod}  # fmt: skip
        te = {c: np.asarray(truth[name][c], dtype=float) - tb[c] for c in cols}
        rows["truth_effect_sd"] = {c: float(np.std(te[c], ddof=1) / abs(np.mean(tb[c]))) for c in cols}
        out["candidates"][name] = rows
        log(f"seed {seed} {name!r} done [{time.perf_counter() - t0:.0f} s]")
    out["seconds"] = time.perf_counter() - t0
    return out


def pd_unique(s: Any) -> list[Any]:
    import pandas as pd

    return list(pd.unique(s))


def _median(docs: list[dict[str, Any]], col: str, where: str, key: str) -> float | None:
    """Median over seeds and candidates of one sd: ``where`` "seed" (a seed's own entry ``key``),
    else the candidate's ``where`` entry's ``key`` (``product``: its ``effect_sd``)."""
    if where == "seed":
        v = [d[key][col] for d in docs]
    elif where == "truth":
        v = [r["truth_effect_sd"][col] for d in docs for r in d["candidates"].values()]
    elif where == "product":
        v = [r["product"][col]["effect_sd"] for d in docs for r in d["candidates"].values() if col in r["product"]]
    else:
        v = [r[where][key][col] for d in docs for r in d["candidates"].values()]
    return float(np.median(v)) if v else None


#: the table's columns: (header, where, key) for `_median`
TABLE = (("emulator: sd of the daily effect (20 truth days)", "truth", ""),
         ("twin, one seed for every day (before)", "same_seed", "effect_sd"),
         ("twin, a seed per day", "per_day_seed", "effect_sd"),
         ("the day term now carried (calibrated)", "product", ""),
         ("logs: sd of the baseline level (6 days)", "seed", "observed_level_sd"),
         ("emulator: sd of the level (20 days)", "seed", "truth_level_sd"),
         ("twin, a seed per day: sd of the level", "per_day_seed", "level_sd"))  # fmt: skip


def table(docs: list[dict[str, Any]]) -> str:
    """Markdown: per KPI, medians over seeds and candidates of each sd (percent of the baseline)."""
    lines = ["| KPI | " + " | ".join(h for h, _, _ in TABLE) + " |", "|---|" + "---:|" * len(TABLE)]
    for c in docs[0]["columns"]:
        vals = [_median(docs, c, w, k) for _, w, k in TABLE]
        lines.append(f"| {c} | " + " | ".join("—" if v is None else f"{100 * v:.2f} %" for v in vals) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------ coverage with day-varying truth
def _pool_twin_only(rounds: list[dict[str, float]], level: float) -> dict[str, float]:
    """The rounds pooled as before this change (the twin's day term alone, no between-day term from
    the rounds): `edgetwin.loop.ppi._pool` without `with_day_term`, for the comparison only. The
    twin's term is its calibrated replay (``diff_var_day_revealed``), without the first look's
    bound on what the level cannot reveal (`edgetwin.loop.day_bound.unrevealed_day_bound`)."""
    from edgetwin.loop.ppi import _pool_terms, finish_estimate, welch_df

    rounds = [_revealed_only(r) for r in rounds]
    diff, dv, own, shared_v, day_v = _pool_terms(rounds, "diff")
    base, bv, _, _, _ = _pool_terms(rounds, "base")
    dfs = [float(r.get("df", float("inf"))) for r in rounds]
    day_df = min(float(r.get("day_df", float("inf"))) for r in rounds)
    df = welch_df([(v, d) for v, d in zip(own, dfs, strict=True)] + [(shared_v, min(dfs)), (day_v, day_df)])
    return finish_estimate(diff, dv, base, bv, level, df=df)


def _revealed_only(r: dict[str, float]) -> dict[str, float]:
    """One round with its day term the twin's calibrated replay alone (``diff_var_day_revealed``)."""
    rev = r.get("diff_var_day_revealed")
    if rev is None:
        return r
    out = dict(r)
    first = float(r.get("diff_var_day", 0.0))
    out["diff_se"] = math.sqrt(max(float(r["diff_se"]) ** 2 - first + float(rev), 0.0))
    out["diff_var_day"] = float(rev)
    return out


def day_coverage(days_data: list[dict[str, Any]], runs: int, seed: int, day_sd: float, canary_days: int,
                 share: float = 0.10, treat: float = 0.5, twin_error: float = 0.2, twin_bias: float = -0.05,
                 group_sd: float = 0.10) -> dict[str, dict[str, Any]]:
    """Coverage of the multi-day truth by the verdict's interval when the effect moves from day to
    day, on `closed_loop.coverage_experiment`'s simulated canaries (the emulator's per-group SLO
    rates, the same candidate types and simulated twin, whose day-to-day replay does not carry the
    effect's day shock ``u_d`` ~ N(0, ``day_sd``)): each run is ``canary_days`` canaries on distinct
    random days (a fresh random ``share`` slice a day, ``treat`` of it on the candidate), each
    estimated by `ppi_mean_difference` with the product's day term (`calibrated_day_variance` over 6
    other days: the twin's replayed changes and levels, and the days' observed fleet means), pooled
    by `combine_estimates` (the rounds' own between-day term once they span >= 2 days) and, for
    comparison, with the twin's day term alone (`_pool_twin_only`: the pooling before this change).
    Returns per type: ``truth``, ``coverage`` / ``coverage_twin_only`` (with Clopper-Pearson 95 %
    intervals), ``median_width`` / ``median_width_twin_only``, decided shares."""
    from closed_loop import COVERAGE_TYPES, MARGIN
    from scipy.stats import binomtest

    from edgetwin.contract.margins import KPIMargin
    from edgetwin.loop.ppi import LEVEL, combine_estimates, ppi_mean_difference, ppi_verdict
    from edgetwin.loop.verdict import calibrated_day_variance

    rng = np.random.default_rng([seed, 48, canary_days])
    margin = [KPIMargin("kpi.slo_violation", MARGIN)]
    n_days = len(days_data)
    out: dict[str, dict[str, Any]] = {}
    for name, delta in COVERAGE_TYPES.items():
        u = rng.normal(0.0, day_sd, n_days)
        worlds = []
        for dd in days_data:
            y = dd["y"]
            yc = y * (1.0 + delta + u[len(worlds)] + rng.normal(0.0, group_sd, len(y)))
            fb = y * np.exp(rng.normal(0.0, twin_error, len(y)))
            worlds.append((y, yc, fb, fb * (1.0 + delta + twin_bias), dd["x"]))
        truth = float(sum(w[1].sum() for w in worlds) / sum(w[0].sum() for w in worlds) - 1.0)
        hit = {"new": 0, "old": 0}
        dec = {"new": 0, "old": 0}
        widths: dict[str, list[float]] = {"new": [], "old": []}
        for _ in range(runs):
            chosen = rng.choice(n_days, canary_days, replace=False)
            rounds = []
            for i, d in enumerate(chosen):
                y, yc, fb, fc, x = worlds[int(d)]
                n = len(y)
                k = max(4, int(round(share * n)))
                sl = rng.choice(n, k, replace=False)
                n_c = max(2, int(round(treat * k)))
                cand, ctrl = sl[:n_c], sl[n_c:]
                others = rng.choice([j for j in range(n_days) if j not in set(chosen.tolist())], 6, replace=False)
                chg = np.array([[np.mean(worlds[j][3] - worlds[j][2])] for j in others])
                lvl = np.array([[np.mean(worlds[j][2])] for j in others])
                obs = np.array([[np.mean(worlds[j][0])] for j in others])
                dvar = calibrated_day_variance(chg, lvl, obs, ["k"])
                dv, bv, ddf = dvar["k"]
                e = ppi_mean_difference(fc, fb, yc[cand], fc[cand], y[ctrl], fb[ctrl], LEVEL, x_cand=x[cand],
                                        x_ctrl=x[ctrl], day_var=(dv, bv), day_df=ddf)  # fmt: skip
                e["diff_var_day_revealed"] = dvar.revealed["k"]  # as `edgetwin.loop.verdict.stamp_revealed`
                e["day"] = float(i)
                rounds.append(e)
            for key, est in (("new", combine_estimates(rounds, LEVEL)), ("old", _pool_twin_only(rounds, LEVEL))):
                est.setdefault("twin_diff", 0.0)
                est.setdefault("twin_rel", 0.0)
                est.update(n_fleet=float(len(worlds[0][0])), n_candidate=1.0, n_control=1.0)
                verdict, checks = ppi_verdict({"kpi.slo_violation": est}, margin)
                lo, hi = checks[0].interval
                hit[key] += lo <= truth <= hi
                dec[key] += verdict != "abstain"
                widths[key].append(hi - lo)

        def ci(k: int) -> list[float]:
            return [float(x) for x in binomtest(k, runs).proportion_ci(0.95, "exact")]

        out[name] = {"truth": truth, "runs": runs, "level": LEVEL, "coverage": hit["new"] / runs, "coverage_ci": ci(hit["new"]),
                     "coverage_twin_only": hit["old"] / runs, "coverage_twin_only_ci": ci(hit["old"]),
                     "median_width": float(np.median(widths["new"])), "median_width_twin_only": float(np.median(widths["old"])),
                     "decided": dec["new"] / runs, "decided_twin_only": dec["old"] / runs}  # fmt: skip
    return out


def run_day_coverage(fleet: int, days: int, runs: int, seed: int, day_sd: float, canary_days: list[int]) -> dict[str, Any]:
    """`day_coverage` at each of ``canary_days`` on one seed's ``days`` emulated days of ``fleet`` groups."""
    from closed_loop import _emulated_days

    t0 = time.perf_counter()
    data = _emulated_days(fleet, days, seed)
    res = {str(k): day_coverage(data, runs, seed, day_sd, k) for k in canary_days}
    return {"fleet": fleet, "days": days, "runs": runs, "seed": seed, "day_sd": day_sd, "by_canary_days": res,
            "seconds": time.perf_counter() - t0}


# ------------------------------------------------------------------ the loop before and after
SECTION = "## The verdict's day-to-day term: calibrated by the logs, estimated from the canaries' own days"
#: the forward pointer to `BOUND_SECTION` (issue 48's one-day bound)
DAY48_NOTE = (" The calibrated term's assumption fails on the emulated cluster's own days, so the first look now also carries a "
              "bound on what the level's spread cannot reveal, which canaries on several days blend with their own spread: "
              "\"The one-day canary's day term\" below.")
#: the stored runs before this change (the reseeded extended runs at 1,000 groups) and the reruns' files
RUNS = {"fc": ("fleet control, per-arm CUPED", "extended_fc_reseeded_seed{s}.json", "day_term_fc_seed{s}.json"),
        "sl": ("slice control (the loop's default)", "extended_reseeded_seed{s}.json", "day_term_sl_seed{s}.json")}  # fmt: skip


def loop_scores(doc: dict[str, Any], n: str = "1000") -> dict[str, Any]:
    """One seed's extended run at fleet size ``n``: of the pairs the twin alone left open, how many the loop
    decided (Clopper-Pearson 95 %), how many of those agree with the 20-day truth, the wrong ones,
    and how often the last look's interval of each open pair covers the 20-day truth."""
    from _closed_loop_scale import DECIDED, agree, rate

    entry = doc["by_fleet_size"][n]
    last = {s["policy"]: (s["rounds"][-1] if s["rounds"] else {}) for s in entry["per_candidate"]}
    open_ = [p for p in entry["pairs"] if p["twin_alone"] not in DECIDED]
    dec = [p for p in open_ if p["twin_canary"] in DECIDED]
    wrong = [f"{p['policy']} {p['kpi']} {p['twin_canary']} (truth {100 * p['truth_change']:+.1f} %)"
             for p in dec if not agree(p, "twin_canary")]  # fmt: skip
    cov = []
    for p in open_:
        why = (last.get(p["policy"]) or {}).get("why", {}).get(p["column"])
        if why and why.get("interval") and all(math.isfinite(float(x)) for x in why["interval"]):
            lo, hi = why["interval"]
            cov.append(bool(lo <= p["truth_change"] <= hi))
    return {"decided": rate(len(dec), len(open_)), "agreement": rate(len(dec) - len(wrong), len(dec)), "wrong": wrong,
            "coverage": rate(sum(cov), len(cov)),
            "rounds": sum(len(s["rounds"]) for s in entry["per_candidate"]),
            "agent_steps": sum(int(s["twin_canary_agent_steps"]) for s in entry["per_candidate"])}  # fmt: skip


def compare_loops(scale_dir: Path, seeds: list[int]) -> dict[str, Any]:
    """Per run (``RUNS``) and seed with a complete rerun: `loop_scores` before and after."""
    out: dict[str, Any] = {}
    for key, (_label, before, after) in RUNS.items():
        for s in seeds:
            a = scale_dir / after.format(s=s)
            if not a.is_file():
                continue
            doc_a = json.loads(a.read_text())
            if not doc_a["by_fleet_size"].get("1000", {}).get("complete"):
                continue
            doc_b = json.loads((scale_dir / before.format(s=s)).read_text())
            out.setdefault(key, {})[str(s)] = {"before": loop_scores(doc_b), "after": loop_scores(doc_a)}
    return out


#: the fleet-control loop rerun on the code before this change (030fc6a), same seeds and caches: what
#: differs from the rerun after it is the day term alone
BASE_RUN = "day_term_fc_base_seed{s}.json"


def same_code(scale_dir: Path, seeds: list[int]) -> dict[str, Any]:
    """Per seed with a base rerun (`BASE_RUN`) and a rerun after: `loop_scores` of both."""
    out: dict[str, Any] = {}
    for s in seeds:
        b, a = scale_dir / BASE_RUN.format(s=s), scale_dir / RUNS["fc"][2].format(s=s)
        if b.is_file() and a.is_file():
            out[str(s)] = {"before": loop_scores(json.loads(b.read_text())), "after": loop_scores(json.loads(a.read_text()))}
    return out


def pooled(loops: dict[str, Any]) -> dict[str, Any]:
    """Per run, the seeds' `loop_scores` summed (decided, agreeing, covered; Clopper-Pearson 95 %),
    before and after: the at-a-glance table's numbers (``seeds``: which seeds were rerun)."""
    from _closed_loop_scale import rate

    out: dict[str, Any] = {}
    for key, by in loops.items():
        out[key] = {"seeds": sorted(int(s) for s in by)}
        for when in ("before", "after"):
            tot = {m: [sum(r[when][m]["k"] for r in by.values()), sum(r[when][m]["n"] for r in by.values())]
                   for m in ("decided", "agreement", "coverage")}  # fmt: skip
            out[key][when] = {m: rate(*kn) for m, kn in tot.items()}
            out[key][when]["wrong"] = [f"seed {s}: {w}" for s, r in sorted(by.items()) for w in r[when]["wrong"]]
    return out


def bound_before_after(scale_dir: Path, loops: dict[str, Any]) -> dict[str, Any]:
    """`_closed_loop_bound.verdict_bound` (the classes of the open pairs by their distance from the
    margin against the emulator's day spread and the 16-day design) on the seeds each run was
    rerun on, before and after: per class the pairs decided and right, and per KPI the median
    one-day sd of the day term the verdict carried (``twin_day_sd``)."""
    from _closed_loop_bound import verdict_bound

    out: dict[str, Any] = {}
    for key, by in loops.items():
        seeds = sorted(int(s) for s in by)
        days = {s: json.loads((scale_dir / f"day_truth_seed{s}.json").read_text()) for s in seeds}
        got = {}
        for when, stem in (("before", RUNS[key][1]), ("after", RUNS[key][2])):
            res = verdict_bound({key: [json.loads((scale_dir / stem.format(s=s)).read_text()) for s in seeds]}, days)
            r = res["runs"][key]
            got[when] = {"by_class": r["by_class"], "twin_day_sd": {k: v["twin_day_sd"] for k, v in r["by_kpi"].items()},
                         "day_sd": {k: v["day_sd"] for k, v in r["by_kpi"].items()}}  # fmt: skip
        out[key] = {"seeds": seeds, **got}
    return out


def _rate(r: dict[str, Any]) -> str:
    if not r["n"]:
        return "—"
    lo, hi = r["ci"]
    return f"{r['k']}/{r['n']} = {100 * r['rate']:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def section(diag: list[dict[str, Any]], cov: dict[str, Any] | None, loops: dict[str, Any],
            bound: dict[str, Any] | None = None, base: dict[str, Any] | None = None) -> str:
    """The page's section, every number from the JSONs (`write_page`)."""
    seeds = ", ".join(str(d["seed"]) for d in diag)
    parts = [SECTION, "",
             "The verdict is about the fleet-wide change averaged over the days the decision lives with; its interval carries "
             "the day-to-day variance of the change (`edgetwin.loop.verdict.day_to_day_variance`; the plan's expected "
             "interval reads the same term, `edgetwin.loop.ppi.day_term`). Before this change that term was the twin's "
             "replay of 6 recent logged days (member 0, one world seed for every day). Now: each day is replayed on its own "
             "world seed, the twin's variance of the change is scaled by the ratio of the logged days' variance of the "
             "baseline fleet mean to the twin's replayed one when the logs move more (`calibrated_day_variance`; it assumes "
             "the change's day spread scales like the level's; days − 1 degrees of freedom), and once canary rounds ran on "
             ">= 2 days the pooled verdict carries the larger of that and the rounds' own between-day variance "
             "(Paule-Mandel, `edgetwin.loop.ppi.with_day_term`, k − 1 degrees of freedom)." + DAY48_NOTE, "",
             f"### Why the twin's day term was too small (seeds {seeds})", "",
             "Commands: `python benchmarks/closed_loop.py --day-diagnosis --seed S --work /tmp/l48b-fc` (S = "
             f"{seeds}; the cached 1,000-group twins of the reseeded runs; results `scale/day_term_seed<S>.json`). Per KPI, "
             "medians over seeds and the four candidates, in % of the baseline level; the emulator's columns use its 20 "
             "truth days (`scale/day_truth_seed<S>.json`), never seen by the product:", "", table(diag), ""]
    if cov:
        parts += ["### Coverage of the multi-day truth when the effect moves from day to day", "",
                  f"Command: `python benchmarks/closed_loop.py --day-coverage --designs-fleet {cov['fleet']} --days {cov['days']} "
                  f"--runs {cov['runs']} --day-sd {cov['day_sd']:g} --canary-days {' '.join(cov['by_canary_days'])} --seed "
                  f"{cov['seed']}` (`_closed_loop_dayterm.day_coverage`: the coverage experiment's simulated canaries on "
                  f"{cov['fleet']:,} emulated groups, half of a 10 % slice on the candidate, the effect moving by "
                  f"{100 * cov['day_sd']:g} % from day to day, which the simulated twin's replay does not carry). Stated level "
                  "90 %; coverage of the truth over all days, Clopper-Pearson 95 %:", "",
                  "| canary days | candidate | truth | coverage now | coverage, twin's day term alone (before) | median width now | before |",
                  "|---:|---|---:|---|---|---:|---:|"]
        for k, by in cov["by_canary_days"].items():
            for t, r in by.items():
                lo, hi = r["coverage_ci"]
                lo2, hi2 = r["coverage_twin_only_ci"]
                parts.append(f"| {k} | {t} | {100 * r['truth']:+.1f} % | {100 * r['coverage']:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}] | "
                             f"{100 * r['coverage_twin_only']:.1f} % [{100 * lo2:.1f}, {100 * hi2:.1f}] | "
                             f"{100 * r['median_width']:.1f} pp | {100 * r['median_width_twin_only']:.1f} pp |")  # fmt: skip
        parts.append("")
    if loops:
        parts += ["### The 1,000-group extended loop before and after", "",
                  "Commands (per seed S): `python benchmarks/closed_loop.py --scale --seed S --fleet-sizes 1000 --max-candidates 4 "
                  "--truth-days 20 --work /tmp/day48-fc --max-days 16 --reuse docs/benchmarks/closed_loop/scale --fleet-control "
                  "--cuped per_arm` (slice control: the same without `--fleet-control --cuped per_arm`, `--work /tmp/day48-sl`), "
                  "twins linked from the stored runs' caches; then `python benchmarks/closed_loop.py --day-term-page`. Before: "
                  "the stored reseeded runs (`scale/extended_fc_reseeded_seed<S>.json`, `scale/extended_reseeded_seed<S>.json`), "
                  "made on the code of their day (the twin's update and fit have changed since, so not every difference below "
                  "is the day term's). Per seed, of the (candidate, KPI) pairs the twin alone left open: decided by the loop "
                  "(Clopper-Pearson 95 %), of those agreeing with the 20-day truth, the wrong ones, and how often the last "
                  "look's interval covers the 20-day truth (stated 90 % over the looks):", "",
                  "| run | seed | decided before | decided after | agreeing before | agreeing after | wrong after | "
                  "interval covers the truth, before | after |", "|---|---:|---|---|---|---|---|---|---|"]
        for key, by in loops.items():
            for s, r in sorted(by.items()):
                b, a = r["before"], r["after"]
                parts.append(f"| {RUNS[key][0]} | {s} | {_rate(b['decided'])} | {_rate(a['decided'])} | {_rate(b['agreement'])} | "
                             f"{_rate(a['agreement'])} | {'; '.join(a['wrong']) or 'none'} | {_rate(b['coverage'])} | "
                             f"{_rate(a['coverage'])} |")  # fmt: skip
        parts.append("")
    if base:
        parts += ["The same comparison against the fleet-control loop rerun on the code just before this change "
                  "(commit 030fc6a: `git archive 030fc6a`, the same command, caches and seeds; results "
                  "`scale/day_term_fc_base_seed<S>.json`), so that only the day term differs:", "",
                  "| seed | decided before | decided after | agreeing before | agreeing after | wrong before | "
                  "interval covers the truth, before | after |", "|---:|---|---|---|---|---|---|---|"]
        for s, r in sorted(base.items()):
            b, a = r["before"], r["after"]
            parts.append(f"| {s} | {_rate(b['decided'])} | {_rate(a['decided'])} | {_rate(b['agreement'])} | "
                         f"{_rate(a['agreement'])} | {'; '.join(b['wrong']) or 'none'} | {_rate(b['coverage'])} | "
                         f"{_rate(a['coverage'])} |")  # fmt: skip
        parts.append("")
    if bound:
        parts += ["Recomputed `--bound` classes on the rerun seeds (`_closed_loop_bound.verdict_bound` on the same seeds' "
                  "pairs before and after; the classes by the 20-day truth's gap from the margin against the sd of the "
                  "emulator's daily effect and the 16-day design's half-width): pairs decided / in the class (of them right):",
                  "", "| run | seeds | class | before | after |", "|---|---|---|---|---|"]
        for key, r in bound.items():
            for c, b in r["before"]["by_class"].items():
                a = r["after"]["by_class"][c]
                if not b["pairs"] and not a["pairs"]:
                    continue
                parts.append(f"| {RUNS[key][0]} | {', '.join(map(str, r['seeds']))} | {c.replace('_', ' ')} | "
                             f"{b['decided']}/{b['pairs']} ({b['right']} right) | {a['decided']}/{a['pairs']} ({a['right']} right) |")
        parts += ["", "The day term the verdict carried (one day's sd, % of the baseline; medians over the open pairs) "
                  "against the emulator's sd of the daily effect:", "",
                  "| run | KPI | emulator | carried before | carried after |", "|---|---|---:|---:|---:|"]
        for key, r in bound.items():
            for k, v in r["after"]["twin_day_sd"].items():
                parts.append(f"| {RUNS[key][0]} | {k} | {100 * r['after']['day_sd'][k]:.1f} % | "
                             f"{100 * r['before']['twin_day_sd'][k]:.1f} % | {100 * v:.1f} % |")
        parts.append("")
    return "\n".join(parts).rstrip() + "\n"


def write_page(out: Path, seeds: list[int]) -> dict[str, Any]:
    """``--day-term-page``: the loop comparison into results_production.json (``day_term_loop``) and the section."""
    from _docs import write_section

    scale = out / "scale"
    diag = [json.loads((scale / f"day_term_seed{s}.json").read_text()) for s in seeds
            if (scale / f"day_term_seed{s}.json").is_file()]  # fmt: skip
    path = out / "results_production.json"
    cur = json.loads(path.read_text())
    cur["day_term_loop"] = compare_loops(scale, seeds)
    cur["day_term_bound"] = bound_before_after(scale, cur["day_term_loop"])
    cur["day_term_pooled"] = pooled(cur["day_term_loop"])
    cur["day_term_same_code"] = same_code(scale, seeds)
    if cur.get("day_term_coverage"):
        cov = cur["day_term_coverage"]
        cov["lowest"] = {k: min(r["coverage"] for r in by.values()) for k, by in cov["by_canary_days"].items()}
        cov["lowest_twin_only"] = {k: min(r["coverage_twin_only"] for r in by.values()) for k, by in cov["by_canary_days"].items()}
    path.write_text(json.dumps(cur, indent=1, default=float))
    write_section(SECTION, section(diag, cur.get("day_term_coverage"), cur["day_term_loop"], cur["day_term_bound"],
                                   cur["day_term_same_code"]), doc=out / "README.md")
    return cur["day_term_loop"]


def copy_runs(fc: Path | None, sl: Path | None, out: Path, seeds: list[int], base: Path | None = None) -> None:
    """The reruns' ``scale-s<S>.json`` into ``scale/day_term_<run>_seed<S>.json`` (complete ones only;
    ``base``: the fleet-control rerun on the code before the change, into `BASE_RUN`)."""
    for stem, work in ((RUNS["fc"][2], fc), (RUNS["sl"][2], sl), (BASE_RUN, base)):
        for s in seeds:
            src = work / f"scale-s{s}.json" if work is not None else None
            if src is not None and src.is_file() and json.loads(src.read_text())["by_fleet_size"].get("1000", {}).get("complete"):
                (out / "scale" / stem.format(s=s)).write_text(src.read_text())


# ------------------------------------------------------------------ the one-day canary's bound (issue 48)
BOUND_SECTION = "## The one-day canary's day term: what the level's spread cannot reveal"
BOUND_JSON = "day48_bound.json"


def _bound_sd(rho: float, rel: float) -> float:
    """`edgetwin.loop.day_bound.unrevealed_day_bound`'s sd relative to the baseline level, from the
    level's relative day sd ``rho`` and the candidate's relative change ``rel``."""
    from edgetwin.loop.day_bound import unrevealed_day_bound

    return math.sqrt(unrevealed_day_bound(rho * rho, 1.0, rel))


def realistic_terms(scale_dir: Path, seeds: list[int]) -> dict[str, Any]:
    """Per (seed, candidate, KPI) on the emulated cluster at 1,000 groups: the sd of the daily
    fleet-wide change over the 20 recorded truth days (``truth``, `scale/day_truth_seed<S>.json`), the
    calibrated term the twin gives from 6 logged days (``calibrated``, the diagnosis'
    `scale/day_term_seed<S>.json`, a real twin) and the first look's bound (``bound``: the 6 logged
    days' level sd and the 20-day truth's mean change, which the diagnosis did not record for the
    twin), all relative to the baseline level; per KPI their medians and how often the truth exceeds
    each term."""
    rows = []
    for s in seeds:
        truth = json.loads((scale_dir / f"day_truth_seed{s}.json").read_text())["values"]
        diag = json.loads((scale_dir / f"day_term_seed{s}.json").read_text())
        for name, r in diag["candidates"].items():
            for col in diag["columns"]:
                cur, cand = np.asarray(truth["current"][col], float), np.asarray(truth[name][col], float)
                b = abs(float(np.mean(cur)))
                rel = float(np.mean(cand - cur)) * float(np.sign(np.mean(cur))) / b
                rows.append({"seed": s, "candidate": name, "kpi": col, "truth": float(np.std(cand - cur, ddof=1)) / b,
                             "calibrated": float(r["product"][col]["effect_sd"]),
                             "bound": _bound_sd(float(diag["observed_level_sd"][col]), rel)})  # fmt: skip
    by_kpi: dict[str, Any] = {}
    for col in dict.fromkeys(r["kpi"] for r in rows):
        rs = [r for r in rows if r["kpi"] == col]
        by_kpi[col] = {k: float(np.median([r[k] for r in rs])) for k in ("truth", "calibrated", "bound")}
        by_kpi[col].update(n=len(rs), under_calibrated=sum(r["truth"] > r["calibrated"] for r in rs),
                           under_bound=sum(r["truth"] > r["bound"] for r in rs))  # fmt: skip
    return {"seeds": seeds, "rows": rows, "by_kpi": by_kpi, "n": len(rows),
            "under_calibrated": sum(r["truth"] > r["calibrated"] for r in rows),
            "under_bound": sum(r["truth"] > r["bound"] for r in rows),
            "median_ratio_calibrated": float(np.median([r["truth"] / r["calibrated"] for r in rows])),
            "median_ratio_bound": float(np.median([r["truth"] / r["bound"] for r in rows]))}  # fmt: skip


def first_look_coverage(scale_dir: Path, seeds: list[int], level_sd: dict[int, dict[str, float]]) -> dict[str, Any]:
    """The stored 1,000-group loops' first looks (one canary day; `RUNS`' reruns on the calibrated
    term): how often their interval covers the 20-day truth, as recorded and rebuilt from their
    variance terms (``diff ± t·sd / |base|``, the baseline's own error left out) with the day term
    they carried and with the first look's bound in its place (the larger of the two, on 5 degrees
    of freedom; its relative change from the round's estimate), at the look's level (98 %) and at
    90 %. Clopper-Pearson 95 % over the (seed, candidate, KPI) triples (not independent: the 7 KPIs
    of a candidate share its canary day)."""
    from _closed_loop_scale import rate

    from edgetwin.loop.ppi import t_quantile, welch_df

    out: dict[str, Any] = {}
    for key, (_label, _before, after) in RUNS.items():
        hits: dict[str, list[bool]] = {}
        widths: list[float] = []
        for s in seeds:
            e = json.loads((scale_dir / after.format(s=s)).read_text())["by_fleet_size"]["1000"]
            truth = {(p["policy"], p["column"]): p["truth_change"] for p in e["pairs"]}
            for c in e["per_candidate"]:
                for col, w in (c["rounds"][0]["why"] if c["rounds"] else {}).items():
                    t, tr = w.get("terms"), truth.get((c["policy"], col))
                    if not t or tr is None or not w.get("interval") or col not in level_sd[s]:
                        continue
                    base, rest = abs(float(t["base"])), float(t["own"]) + float(t["shared"])
                    u = (_bound_sd(level_sd[s][col], float(w["change"])) * base) ** 2
                    lo, hi = w["interval"]
                    hits.setdefault("recorded", []).append(bool(lo <= tr <= hi))
                    for lvl in (float(t["level"]), 0.9):
                        for when, day, df in (("before", float(t["day"]), float(t["df"])),
                                              ("after", max(float(t["day"]), u),
                                               welch_df([(rest, float(t["df"])), (max(float(t["day"]), u), 5.0)]))):
                            half = t_quantile(lvl, df) * math.sqrt(rest + day) / base
                            hits.setdefault(f"{when}@{lvl:g}", []).append(bool(abs(float(w["change"]) - tr) <= half))
                            if lvl == 0.9:
                                widths.append(half)
        n = len(hits.get("recorded", []))
        out[key] = {k: rate(sum(v), len(v)) for k, v in hits.items()}
        out[key]["n"] = n
        out[key]["median_width_ratio_90"] = float(np.median(np.array(widths[1::2]) / np.array(widths[0::2]))) if widths else None
    return out


def bound_coverage(paths_before: list[Path], paths_after: list[Path]) -> dict[str, Any]:
    """`run_day_coverage` outputs on the same seeds before and after the bound, pooled over seeds per
    (canary days, candidate type): coverage (Clopper-Pearson 95 %), mean over seeds of the median
    width and of the decided share."""
    from _closed_loop_scale import rate

    docs = {w: [json.loads(p.read_text()) for p in ps] for w, ps in (("before", paths_before), ("after", paths_after))}
    out: dict[str, Any] = {"seeds": [d["seed"] for d in docs["after"]], "runs": docs["after"][0]["runs"],
                           "day_sd": docs["after"][0]["day_sd"], "by_canary_days": {}}  # fmt: skip
    for k, by in docs["after"][0]["by_canary_days"].items():
        for t in by:
            cell = {}
            for w, ds in docs.items():
                rs = [d["by_canary_days"][k][t] for d in ds]
                cov = rate(sum(int(round(r["coverage"] * r["runs"])) for r in rs), sum(r["runs"] for r in rs))
                cell[w] = {"coverage": cov, "median_width": float(np.mean([r["median_width"] for r in rs])),
                           "decided": float(np.mean([r["decided"] for r in rs]))}  # fmt: skip
            out["by_canary_days"].setdefault(k, {})[t] = cell
    return out


def _pct(r: dict[str, Any]) -> str:
    lo, hi = r["ci"]
    return f"{r['k']}/{r['n']} = {100 * r['rate']:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def bound_section(doc: dict[str, Any]) -> str:
    """The page's section on the first look's bound, every number from ``doc`` (`write_bound_page`)."""
    real, looks, cov = doc["realistic"], doc["first_look"], doc["coverage"]
    seeds = ", ".join(map(str, real["seeds"]))
    parts = [BOUND_SECTION, "",
             "Command: `python benchmarks/_closed_loop_dayterm.py --before docs/benchmarks/closed_loop/scale/day48_coverage/"
             "before_seed{0,1,2}.json --after docs/benchmarks/closed_loop/scale/day48_coverage/after_seed{0,1,2}.json` (reads the recorded "
             f"`scale/day_truth_seed<S>.json`, `scale/day_term_seed<S>.json` and the reruns `scale/day_term_{{fc,sl}}_seed<S>.json`, "
             f"seeds {seeds}, and the `--day-coverage` outputs named; writes `scale/{BOUND_JSON}`).", "",
             "A one-day canary's interval carries one day's variance of the fleet-wide change. The calibrated term (the twin's "
             "replay scaled by how much more the logged level moves, `calibrated_day_variance`'s ``revealed``) assumes the "
             "change's day spread scales like the level's. On the emulated cluster it does not: the change is steady on most "
             "days and several times larger on the days the fleet congests, which the level's spread does not reveal. So the "
             "first look now carries the larger of the calibrated term and a bound on the change's day variance from the "
             "logged level's spread, `unrevealed_day_bound`: var(level) · (1 + (c̄/b̄)²), true when the candidate's level moves "
             "by the same relative amount as the current policy's and the two do not move against each other. Canaries on "
             "several days count the bound as one day's evidence beside their own between-day spread (`pooled_day_term`).", "",
             f"### The emulated cluster's own days (seeds {seeds})", "",
             f"Per KPI, medians over seeds and the four candidates of the sd of the daily change (% of the baseline level), and "
             f"in how many (candidate, seed) pairs the 20-day truth's sd exceeds the term. Over all {real['n']}: the calibrated "
             f"term is below the truth in {real['under_calibrated']} (median truth/term {real['median_ratio_calibrated']:.2f} in sd), "
             f"the bound in {real['under_bound']} (median {real['median_ratio_bound']:.2f}). The bound's c̄/b̄ is the 20-day "
             "truth's here (the diagnosis did not record the twin's mean change).", "",
             "| KPI | truth (20 days) | calibrated (6 logged days, real twin) | bound | truth above calibrated | truth above bound |",
             "|---|---:|---:|---:|---:|---:|"]
    for col, r in real["by_kpi"].items():
        parts.append(f"| {col} | {100 * r['truth']:.2f} % | {100 * r['calibrated']:.2f} % | {100 * r['bound']:.2f} % | "
                     f"{r['under_calibrated']}/{r['n']} | {r['under_bound']}/{r['n']} |")
    parts += ["", "### One canary day on the emulated cluster: the loops' first looks", "",
              "The stored 1,000-group loops (the reruns on the calibrated term, `scale/day_term_{fc,sl}_seed<S>.json`): each "
              "candidate's first look is one canary day, its interval at the look's level (98 %). Coverage of the 20-day truth "
              "as recorded, and rebuilt from the look's variance terms with the day term it carried and with the bound in its "
              "place (the baseline's own error left out, so the rebuilt intervals are a little narrower than the recorded "
              "ones); triples, not independent (a candidate's 7 KPIs share its day). Clopper-Pearson 95 %:", "",
              "| run | recorded (98 %) | rebuilt, carried term, 98 % | with the bound, 98 % | carried, 90 % | with the bound, 90 % | "
              "median width ratio at 90 % |", "|---|---|---|---|---|---|---:|"]
    for key, r in looks.items():
        parts.append(f"| {RUNS[key][0]} | {_pct(r['recorded'])} | {_pct(r['before@0.98'])} | {_pct(r['after@0.98'])} | "
                     f"{_pct(r['before@0.9'])} | {_pct(r['after@0.9'])} | {r['median_width_ratio_90']:.2f} |")
    parts += ["", "### The simulated stress: the effect's own day shock", "",
              f"Command: `python benchmarks/closed_loop.py --day-coverage --designs-fleet 1000 --days 20 --runs {cov['runs']} "
              f"--seed S --day-sd {cov['day_sd']:g} --canary-days 1 4 8 --no-write`, seeds "
              f"{', '.join(map(str, cov['seeds']))}, on the code before the bound (e0d1bbd, `git archive`) and after it "
              "(ad8dd9d; the same draws; `scale/day48_coverage/`). The effect's "
              "day shock multiplies the candidate alone, independent of the level: the calibrated term cannot see it. Pooled "
              "over the seeds, coverage of the 20-day truth by the 90 % interval (Clopper-Pearson 95 %), the median width "
              "and the decided share (means over seeds):", "",
              "| canary days | candidate | coverage before | after | width before | after | decided before | after |",
              "|---:|---|---|---|---:|---:|---:|---:|"]
    for k, by in cov["by_canary_days"].items():
        for t, c in by.items():
            b, a = c["before"], c["after"]
            parts.append(f"| {k} | {t} | {_pct(b['coverage'])} | {_pct(a['coverage'])} | {100 * b['median_width']:.1f} pp | "
                         f"{100 * a['median_width']:.1f} pp | {100 * b['decided']:.1f} % | {100 * a['decided']:.1f} % |")
    return "\n".join(parts).rstrip() + "\n"


def write_bound_page(out: Path, before: list[Path], after: list[Path], seeds: list[int]) -> dict[str, Any]:
    """Measure (`realistic_terms`, `first_look_coverage`, `bound_coverage`), store `BOUND_JSON` and
    write `BOUND_SECTION` (hand-written subsections starting "### What" are kept)."""
    from _docs import write_section

    scale = out / "scale"
    level_sd = {s: json.loads((scale / f"day_term_seed{s}.json").read_text())["observed_level_sd"] for s in seeds}
    doc = {"realistic": realistic_terms(scale, seeds), "first_look": first_look_coverage(scale, seeds, level_sd),
           "coverage": bound_coverage(before, after)}  # fmt: skip
    (scale / BOUND_JSON).write_text(json.dumps(doc, indent=1, default=float))
    write_section(BOUND_SECTION, bound_section(doc), doc=out / "README.md", keep=["### What"])
    return doc


if __name__ == "__main__":
    import argparse
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    ap = argparse.ArgumentParser(description="the one-day canary's day-term bound: measurements and page section")
    ap.add_argument("--before", type=Path, nargs="+", required=True, help="--day-coverage outputs before the bound")
    ap.add_argument("--after", type=Path, nargs="+", required=True, help="the same commands' outputs after it")
    ns = ap.parse_args()
    got = write_bound_page(ROOT / "docs" / "benchmarks" / "closed_loop", ns.before, ns.after, [0, 1, 2])
    print(json.dumps({k: v for k, v in got.items() if k != "realistic"}, indent=1, default=float))
