"""Is the promotion gate right when it is sure? Calibrated intervals and abstention vs the real cluster.

The gate (seed 003 §3.2, §4.3: "a digital-twin replay validates aggregated models against recent
traces before rollout") is only as good as the twin's estimate of how a KPI changes when the policy
changes, and only useful if it knows when it cannot tell. Here the emulated cluster plays the real
system:

1. log 6 days of the cluster under the logging policy (``--logging random``: uniformly random
   actions, the twin-fidelity benchmark's logs; ``--logging production``: the SLO-aware heuristic
   with 10 % Gaussian exploration noise, as Table 2's second block logs) and fit the default twin
   (MAIL-MMSG, 5 members; replay uses logged populations, so the population model is the empirical
   one to save time);
2. calibrate the twin's 90 % intervals on 3 held-out logged days (the twin-fidelity benchmark's
   held-out days): the twin replays their logged actions and is scored against their logged KPIs
   (`edgetwin.twin.intervals`); nothing here touches the cluster under a new policy;
3. log 2 more days ("recent traffic", other seeds) and, for >= 8 candidate policies (heuristics,
   constant actions, the logging clone, uniform random, and a PPO policy trained in the twin),
   predict each guarded KPI's relative change vs the logged actions by counterfactual replay of the
   recent days (`run_whatif`), with its calibrated 90 % interval and out-of-support share;
4. measure the real change by running the same days (same seeds: same populations and noise) on
   the cluster with each candidate, and score the gate's per-(policy, KPI) verdict: *regresses*
   (the whole interval worse than the 5 % margin), *no regression* (the whole interval within it)
   or *abstain* (the interval straddles the margin, or more than 25 % of the agent-steps lie outside
   the logs' support). ``confident_agreement`` = share of non-abstained verdicts that agree with the
   cluster; ``coverage_90`` = share of real changes inside the interval.

The thresholds (5 % margin, 25 % out-of-support) are the gate's defaults, fixed before this
benchmark was run; the interval's width comes from held-out logs only. The risk-coverage plot
(`docs/benchmarks/whatif_gate/risk_coverage_<logging>.png`) shows the error rate of the kept
verdicts as the abstention threshold (interval width multiplier) moves.

    python benchmarks/whatif_gate.py [--logging random|production] [--quick] [--work DIR] [--no-write]
        [--calibrate-on held|recent|both]

``--calibrate-on recent`` calibrates on the replayed days themselves (their logged actions), which is
what `edgetwin.policies.gate.run_gate` and ``edgetwin promote`` do when given a log and no calibration;
``both`` on the held-out and the recent days. Those side runs write
``results_<logging>_cal-<set>.json`` and a row of the section's calibration table; the headline stays
the held-out calibration.

``--quick``: PPO 10k steps instead of 40k, and the replay cut to the first 48 ticks of each day.

Several seeds: ``--seed S --json FILE`` writes one seed's summary (rows included) and leaves the docs;
``--noise-fix-section`` rewrites only the page's before/after subsection of issue 44's noise fix
from the stored runs (`_whatif_noise_rerun`). ``--pool FILE ... [--pool-out FILE]`` pools such files (`pool_seeds`: the headline with Clopper-Pearson
intervals, the declared KPIs, the abstentions by reason) and prints the page's tables of them
(`pooled_tables`). ``--held-days N`` calibrates on N held-out days instead of 3 (9 attain the gate's
90 %; only with ``--json``). Each row records the verdict the product's gate would give
(`gate_verdict`: the benchmark's own verdict reads the interval at the level its days attain).

Choosing the interval construction: the product's default (`edgetwin.twin.intervals.DEFAULT_METHOD`)
was chosen on this benchmark's rows, so its coverage over every row is optimistic. Each run also
splits the candidates in two halves by a seeded shuffle (`split_policies`), chooses the construction
on the first half (`choose_method`: coverage nearest 90 %) and reports it on the second half only
(``method_choice`` in ``results_<logging>.json``, and its own table in the section).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _docs import write_section
from _scale_args import add_scale_args, scale_kwargs
from _whatif_noise_rerun import noise_fix_section, update_rows, write_noise_fix_section
from _whatif_score_rerun import at_a_glance_cells, score_section

from edgetwin.contract.policy import FunctionPolicy, NoisyPolicy, RandomPolicy
from edgetwin.emulator.cluster import ClusterConfig, cluster_spec
from edgetwin.emulator.logs import SLOAwarePolicy, generate_logs
from edgetwin.policies.gate import DEFAULT_MARGIN, MAX_OUT_OF_SUPPORT, check_verdict, evidence_problem
from edgetwin.policies.heuristics import LeastLoaded, SchedulingView, Target
from edgetwin.twin.calibration import calibrate
from edgetwin.twin.intervals import DEFAULT_METHOD, LEVEL, METHODS
from edgetwin.twin.twin import Twin
from edgetwin.twin.whatif import (
    builtin_policy,
    default_kpis,
    fixed_policy,
    load_kpis,
    logged_episode_kpis,
    logged_episodes,
    merge_kpis,
    run_whatif,
)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks" / "whatif_gate"
SECTION = "## What-if replay vs the emulated cluster (promotion gate)"
LOGGING_TEXT = {
    "random": "uniformly random actions (the twin-fidelity benchmark's logs)",
    "production": "the SLO-aware heuristic with 10 % Gaussian exploration noise (production-like)",
}
#: hand-written subsections of the docs section that a rerun keeps
KEEP = (
    "### The calibration score floored at the KPI's scale (issue 44)",
    "### After the members' noise fix (issue 44)",
    "### The replayed effect-size term in the product's change interval",
    "### The replayed effect-size term held out",
    "### The response model's output noise by predicted level",
    "### Where the tail KPIs' errors come from",
    "### Where the energy and carbon KPIs' errors come from",
)
TARGETS = {"confident_agreement": 0.95, "abstention": 0.30, "coverage_90": 0.85}
#: where the intervals are calibrated: 3 held-out days (the headline), the replayed recent days themselves
#: (`edgetwin.policies.gate.check_candidate`'s default when it gets a log and no calibration), or both
CALIBRATION_SETS = ("held", "recent", "both")


def calibration_log(which: str, held: Any, recent: Any, held_days: int = 3) -> tuple[Any, int]:
    """The log to calibrate on and how many of its (last) episodes to replay (``held`` holds
    ``held_days`` days)."""
    import pandas as pd

    if which == "held":
        return held, held_days
    if which == "recent":
        return recent, 2
    h, r = held.copy(), recent.copy()
    h["episode"] = "held-" + h["episode"].astype(str)
    r["episode"] = "recent-" + r["episode"].astype(str)
    return pd.concat([h, r], ignore_index=True), held_days + 2


def held_days_arg(text: str) -> int:
    """``--held-days``: a whole number of days, at least 1 (argparse turns the error into one line, exit 2)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of days, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1 day, got {n}")
    return n


def results_name(logging: str, calibrate_on: str) -> str:
    return f"results_{logging}.json" if calibrate_on == "held" else f"results_{logging}_cal-{calibrate_on}.json"


def logging_policy(name: str, spec: Any, seed: int) -> Any:
    if name == "production":
        return NoisyPolicy(SLOAwarePolicy(spec), spec, 0.1, seed)
    return RandomPolicy(spec, seed=seed)


def constant(edge: float, cap: float, price: float) -> FunctionPolicy:
    return FunctionPolicy(lambda o: np.tile([edge, cap, price], (len(o), 1)), name=f"const({edge},{cap},{price})")


def candidates(spec: Any, twin: Twin, logging: str, seed: int) -> dict[str, Any]:
    """The candidate policies (the PPO one is added by `main`)."""
    good = SchedulingView(
        "action.edge_share", (Target(1.0, "state.site_util"), Target(0.0, "state.cloud_util")),
        defaults={"action.capacity": 1.2, "action.price": 0.1},
    )  # fmt: skip
    bad = SchedulingView("action.edge_share", (Target(0.0, 0.5),), defaults={"action.capacity": 0.0, "action.price": 1.0})
    pricey = SchedulingView(
        "action.edge_share", (Target(1.0, "state.site_util"), Target(0.0, "state.cloud_util")),
        defaults={"action.capacity": 1.0, "action.price": 0.9},
    )  # fmt: skip
    pols: dict[str, Any] = {
        "slo-aware heuristic": SLOAwarePolicy(spec),
        "least-loaded, cheap": LeastLoaded(spec, good),
        "least-loaded, pricey": LeastLoaded(spec, pricey),
        "cloud-only, no capacity": LeastLoaded(spec, bad),
        "constant (0.5, 1.0, 0.5)": constant(0.5, 1.0, 0.5),
        "constant (0.9, 1.2, 0.2)": constant(0.9, 1.2, 0.2),
        "logging clone": twin.logging_policy(seed=seed, stochastic=False),
        "uniform random": RandomPolicy(spec, seed=seed + 99),
    }
    return pols


def fit_or_load(
    work: Path, logging: str, members: int, train: Any, spec: Any, scale: dict[str, Any] | None = None
) -> Twin:
    """The benchmark's twin, cached in ``work``; ``scale``: `scale_kwargs` (where the members are fitted)."""
    path = work / f"twin-{logging}-m{members}"
    if (path / "meta.json").is_file():
        return with_output_noise(Twin.load(path), train, spec)
    twin = Twin.fit(train, spec, seed=0, members=members, progress=True, population_model="empirical", rounds=10,
                    bc_epochs=10, checkpoint_dir=str(path) + "-ckpt", **(scale or {}))  # fmt: skip
    twin.save(path)
    return twin


def with_output_noise(twin: Twin, train: Any, spec: Any) -> Twin:
    """``twin`` with every member's output noise model (issue 44): a twin cached by an edgetwin
    from before it has none, and gets each member's fitted here as `Twin.fit` fits it (the same
    sorted log, the same bootstrap draws and seeds, `Member.fit_output_noise`), so that a cached
    fit of the members is not redone to measure it. A twin that has them is returned as it is."""
    if all(m.noise is not None for m in twin.members):
        return twin
    from edgetwin.twin.logdata import load_log
    from edgetwin.twin.twin import _plan_members

    df, _ = load_log(train, spec)
    df = df.sort_values(["episode", "t", "agent"], kind="stable").reset_index(drop=True)
    episodes = df["episode"].unique()
    seed = int(twin.meta.get("seed", 0))
    _, tasks = _plan_members(twin.n_members, seed, len(episodes), None, len(twin.layout.scenarios))
    for m, pick, member_seed in tasks:
        twin.members[m].fit_output_noise(df, episodes, pick, twin.layout, member_seed + 700)
    print(f"output noise fitted on the cached twin's members ({twin.members[0].noise_source})", flush=True)
    return twin


def train_ppo(twin: Twin, work: Path, steps: int, seed: int) -> Any:
    from edgetwin.policies.export import load_policy
    from edgetwin.policies.train import train_policy

    out = work / f"ppo-{str(twin.meta.get('data_sha256', 'x'))[:10]}-{steps}-{seed}"
    try:
        return load_policy(out)
    except Exception:  # not trained yet (or a half-written export): train
        res = train_policy(twin, "ppo", steps=steps, seed=seed, out=out, checkpoint_every=0, resume=False,
                           twin_opts={"n_agents": 64}, progress=True)  # fmt: skip
        return load_policy(res.path)


def gate_verdict(verdict: str, note: str | None, attained: float, level: float = LEVEL) -> str:
    """The verdict the product's gate (`edgetwin.policies.gate.decide`) gives a check whose interval
    verdict is ``verdict``: ``no_evidence`` when the twin's number cannot back one (``note``,
    `evidence_problem`) and the interval did not refuse, ``below_level`` when the interval would decide
    but the calibration days support only ``attained`` < ``level``. The benchmark's own verdict
    (``verdict``) reads the interval at the level its days attain; this one says why the product would
    abstain (issue 44: the abstentions by reason)."""
    if note and verdict in ("ok", "straddle"):
        return "no_evidence"
    if verdict in ("ok", "regress") and attained < level - 1e-12:
        return "below_level"
    return verdict


def score_rows(res: Any, kpis: list[Any], pols: dict[str, Any], real_base: dict[str, np.ndarray],
               real_pol: dict[str, dict[str, np.ndarray]]) -> list[dict[str, Any]]:
    """Every (policy, KPI): the twin's change and interval (with ``res``'s calibration), the real change,
    the gate's verdict and whether it agrees with the cluster; and the product gate's verdict of the
    check (`gate_verdict`: with the evidence and level checks the benchmark's verdict leaves out)."""
    rows = []
    cal = res.calibration
    for name in pols:
        for k in kpis:
            c = res.compare("nominal", k.name, candidate=name)
            note = evidence_problem(res, k.name, c)
            attained = LEVEL if cal is None else min(cal.level, cal.attained(k.name))
            rb, rc = float(np.mean(real_base[k.name])), float(np.mean(real_pol[name][k.name]))
            real_change = (rc - rb) / abs(rb) if rb else float("nan")
            sign = -1.0 if k.better == "higher" else 1.0
            lo, hi = c["change_interval"]
            w_int = sorted([sign * lo, sign * hi])
            verdict = check_verdict(w_int, DEFAULT_MARGIN, c["out_of_support"], MAX_OUT_OF_SUPPORT)
            real_regress = bool(sign * real_change > DEFAULT_MARGIN)
            rows.append({
                "policy": name, "kpi": k.name, "better": k.better, "twin_change": c["change"],
                "twin_change_w": sign * c["change"], "interval": [lo, hi], "w_interval": w_int,
                "real_change": real_change, "out_of_support": c["out_of_support"], "verdict": verdict,
                "action_shift": c.get("action_shift"),
                "real_regress": real_regress, "covered": bool(lo <= real_change <= hi),
                "agree": None if verdict in ("straddle", "unsupported") else (verdict == "regress") == real_regress,
                "attained_level": attained, "evidence_note": note,
                "gate_verdict": gate_verdict(verdict, note, attained),
            })  # fmt: skip
    return rows


def headline(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    confident = [r for r in rows if r["agree"] is not None]
    return {
        "pairs": n,
        "confident_agreement": (sum(r["agree"] for r in confident) / len(confident)) if confident else float("nan"),
        "confident_pairs": len(confident),
        "abstention": 1.0 - len(confident) / n,
        "abstention_support": sum(r["verdict"] == "unsupported" for r in rows) / n,
        "abstention_straddle": sum(r["verdict"] == "straddle" for r in rows) / n,
        "coverage_90": sum(r["covered"] for r in rows) / n,
        "median_interval_width": float(np.median([r["interval"][1] - r["interval"][0] for r in rows])),
        "agreement_if_never_abstaining": sum((r["twin_change_w"] > DEFAULT_MARGIN) == r["real_regress"] for r in rows) / n,
    }


def abstention_reasons(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Why the gate abstains on ``rows`` (issue 44), as counts of (candidate, KPI) checks: the interval's
    verdict (``decided``: ok or regress; ``straddle``, split by where the twin's point estimate lies,
    within the margin or beyond it; ``unsupported``: more than the out-of-support budget), and what
    the product's gate adds (`gate_verdict`): ``no_evidence`` (the twin's number cannot back a verdict)
    and ``below_level`` (the interval decides, but the calibration days support less than the level
    asked). Per KPI, the share of its checks the interval leaves undecided. Rows of runs before
    ``gate_verdict`` was recorded count no product verdicts (``product_recorded`` says how many did)."""
    n = len(rows)
    straddle = [r for r in rows if r["verdict"] == "straddle"]
    recorded = [r for r in rows if "gate_verdict" in r]
    by_kpi: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_kpi.setdefault(r["kpi"], []).append(r)
    return {
        "pairs": n,
        "decided": sum(r["verdict"] in ("ok", "regress") for r in rows),
        "straddle": len(straddle),
        "straddle_point_within_margin": sum(r["twin_change_w"] <= DEFAULT_MARGIN for r in straddle),
        "straddle_point_beyond_margin": sum(r["twin_change_w"] > DEFAULT_MARGIN for r in straddle),
        "unsupported": sum(r["verdict"] == "unsupported" for r in rows),
        "product_recorded": len(recorded),
        "no_evidence": sum(r["gate_verdict"] == "no_evidence" for r in recorded),
        "below_level": sum(r["gate_verdict"] == "below_level" for r in recorded),
        "product_abstention": (sum(r["gate_verdict"] not in ("ok", "regress") for r in recorded) / len(recorded)
                               if recorded else float("nan")),
        "attained_levels": sorted({float(r["attained_level"]) for r in recorded}),
        "undecided_by_kpi": {k: sum(r["verdict"] not in ("ok", "regress") for r in rs) / len(rs)
                             for k, rs in by_kpi.items()},
    }


def pool_seeds(paths: list[Path]) -> dict[str, Any]:
    """`headline` of several ``--json`` runs' rows together (one per seed: every (seed, candidate, KPI)
    a row), with the confident agreement's Clopper-Pearson 90 % interval (the rows of one candidate are
    not independent, so it is optimistic) and each seed's own headline."""
    from scipy.stats import binomtest

    runs = [json.loads(p.read_text()) for p in paths]
    rows = [{**r, "seed": d.get("seed")} for d in runs for r in d["rows"]]
    out: dict[str, Any] = {"files": [str(p) for p in paths], "seeds": [d.get("seed") for d in runs],
                           "logging": runs[0].get("logging") if runs else None,
                           "quick": all(d.get("quick", True) for d in runs), **headline(rows)}
    k = sum(bool(r["agree"]) for r in rows if r["agree"] is not None)
    n = out["confident_pairs"]
    ci = binomtest(k, n).proportion_ci(0.90, method="exact") if n else None
    out["confident_agreed"] = k
    out["confident_agreement_interval"] = [ci.low, ci.high] if ci else None
    out["per_seed"] = [{"seed": d.get("seed"), **headline(d["rows"]), "abstention_reasons": abstention_reasons(d["rows"]),
                        "by_method": d.get("by_method"),
                        "declared": {k: v for k, v in (d.get("declared_kpis") or {}).items() if k in ("n", "coverage")}}
                       for d in runs]
    out["abstention_reasons"] = abstention_reasons(rows)
    out["risk_coverage"] = risk_coverage(rows, MAX_OUT_OF_SUPPORT)
    declared = list(dict.fromkeys(k for d in runs for k in (d.get("declared_kpis") or {}).get("per_kpi", {})))
    if declared:  # the declared KPIs' changes over every seed (issue 44), with their findings
        out["declared_kpis"] = declared_kpi_summary(rows, declared)
        out["per_seed_declared_coverage"] = [d["declared_kpis"]["coverage"] for d in runs]
    return out


def _cp(k: int, n: int) -> str:
    """``"a-b %"``: the Clopper-Pearson 90 % interval of ``k`` of ``n``, in whole percent."""
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(0.90, method="exact")
    return f"{100 * ci.low:.0f}-{100 * ci.high:.0f} %"


def widest_scaling(rc: dict[str, list[float]], kept_at_least: float) -> tuple[float, float, float]:
    """``(κ, kept, risk)`` of the largest interval scaling κ of a `risk_coverage` curve that keeps at
    least ``kept_at_least`` of the checks decided (κ = 0, the point estimates alone, when none wider does)."""
    best = (rc["kappa"][0], rc["kept"][0], rc["risk"][0])
    for k, kept, risk in zip(rc["kappa"], rc["kept"], rc["risk"], strict=True):
        if kept >= kept_at_least - 1e-12 and k > best[0]:
            best = (k, kept, risk)
    return best


def pooled_by_method(pooled: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per interval construction, its abstention and coverage over every seed of a `pool_seeds` result
    (each seed's ``by_method`` headline weighted by its pairs) and its confident verdicts that agreed
    with the cluster, of how many; empty when a seed lacks one."""
    runs = [ps.get("by_method") or {} for ps in pooled["per_seed"]]
    methods = [m for m in (runs[0] if runs else {}) if all(m in r for r in runs)]
    out = {}
    for m in methods:
        tot = sum(r[m]["pairs"] for r in runs)
        out[m] = {k: sum(r[m][k] * r[m]["pairs"] for r in runs) / tot for k in ("abstention", "coverage_90")}
        conf = sum(r[m]["confident_pairs"] for r in runs)
        out[m]["confident_pairs"] = conf
        out[m]["confident_agreed"] = sum(round(r[m]["confident_agreement"] * r[m]["confident_pairs"])
                                         for r in runs if r[m]["confident_pairs"])
    return out


def pool_label(seeds: list[Any]) -> str:
    """``"seeds 3-5 pooled"`` for consecutive seeds, ``"seeds 0, 2 pooled"`` otherwise."""
    ints = [int(x) for x in seeds if x is not None]
    if len(ints) == len(seeds) and len(ints) > 1 and ints == list(range(ints[0], ints[0] + len(ints))):
        return f"seeds {ints[0]}-{ints[-1]} pooled"
    return "seeds " + ", ".join(str(x) for x in seeds) + " pooled"


def pooled_tables(pooled: dict[str, Any], label: str) -> str:
    """The Markdown tables of a `pool_seeds` result (``label`` names the pooled row, e.g. ``"seeds 3-5
    pooled"``): per seed and pooled, the declared KPIs' coverage of the 90 % interval, abstention,
    confident agreement, coverage over every KPI, median width and the `hybrid` construction's coverage /
    abstention on the same rows; per declared KPI pooled; and the abstentions by reason
    (`abstention_reasons`). Every number is read from ``pooled``, so a test can compare the page with it."""
    def pct(x: float) -> str:
        return f"{100 * x:.1f} %"

    def head(h: dict[str, Any], declared: dict[str, Any] | None, hybrid: dict[str, Any] | None) -> list[str]:
        n, k = h["pairs"], h["confident_pairs"]
        agreed = round(h["confident_agreement"] * k) if k else 0
        cov = "n/a" if declared is None else (
            f"{pct(declared['coverage'])} of {declared['n']} (CP 90 %: {_cp(round(declared['coverage'] * declared['n']), declared['n'])})")
        hyb = "n/a" if hybrid is None else f"{pct(hybrid['coverage_90'])} / {pct(hybrid['abstention'])}"
        return [cov, f"{pct(h['abstention'])} (CP 90 %: {_cp(n - k, n)})",
                f"{pct(h['confident_agreement'])} ({agreed} of {k})" if k else "n/a",
                pct(h["coverage_90"]), f"{100 * h['median_interval_width']:.0f} pp", hyb]

    logs = f"{pooled.get('logging') or 'random'} logs{', quick' if pooled.get('quick', True) else ''}"
    lines = [f"| {logs} | declared-KPI coverage (target ≥ 90 %) | abstention (≤ 30 %) | confident agreement "
             "(≥ 95 %) | coverage, all KPIs | median width | `hybrid` on the same rows: coverage / abstention |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for ps in pooled["per_seed"]:
        dec = ps.get("declared") or None
        hyb = (ps.get("by_method") or {}).get("hybrid")
        lines.append("| " + " | ".join([f"seed {ps['seed']}", *head(ps, dec, hyb)]) + " |")
    by_method = pooled_by_method(pooled)
    lines.append("| " + " | ".join([f"**{label}**", *head(pooled, pooled.get("declared_kpis"), by_method.get("hybrid"))])
                 + " |")
    dk = pooled.get("declared_kpis")
    if dk:
        lines += ["", f"Per declared KPI, {label}:", "",
                  "| KPI | coverage | CP 90 % | median abs. error (points) | mean signed error, twin minus cluster (points) |",
                  "|---|---:|---:|---:|---:|"]
        for kpi, v in dk["per_kpi"].items():
            lines.append(f"| {kpi} | {pct(v['coverage'])} of {v['n']} | {_cp(round(v['coverage'] * v['n']), v['n'])} | "
                         f"{v['median_abs_error_points']:.1f} | {v['mean_signed_error_points']:+.1f} |")
    lines += ["", f"The abstentions by reason, (candidate, KPI) checks, {label}:", "",
              "| | checks | decided by the interval | straddles the margin, twin's point within it | straddles, "
              "point beyond it | out of support | no evidence (product) | decided but below the 90 % level "
              "(product) | the product gate's abstention |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, ar in [*((f"seed {ps['seed']}", ps["abstention_reasons"]) for ps in pooled["per_seed"]),
                     (f"**{label}**", pooled["abstention_reasons"])]:
        prod = "n/a" if not ar["product_recorded"] else pct(ar["product_abstention"])
        lines.append(f"| {name} | {ar['pairs']} | {ar['decided']} | {ar['straddle_point_within_margin']} | "
                     f"{ar['straddle_point_beyond_margin']} | {ar['unsupported']} | {ar['no_evidence']} | "
                     f"{ar['below_level']} | {prod} |")
    by_kpi = pooled["abstention_reasons"]["undecided_by_kpi"]
    lines += ["", f"Share of each KPI's checks the interval leaves undecided, {label}: "
              + ", ".join(f"{k} {100 * v:.0f} %" for k, v in sorted(by_kpi.items(), key=lambda kv: -kv[1])) + "."]
    if dk and dk["findings"]:
        lines += ["", f"The declared-KPI changes outside the twin's 90 % interval, {label}:", "",
                  "| seed | candidate | KPI | cluster change | twin change [90 % interval] | out of support | verdict |",
                  "|---|---|---|---:|---:|---:|---|"]
        for f in dk["findings"]:
            lines.append(f"| {f.get('seed', 'n/a')} | {f['policy']} | {f['kpi']} | {100 * f['real_change']:+.1f} % | {100 * f['twin_change']:+.1f} % "
                         f"[{100 * f['interval'][0]:+.1f}, {100 * f['interval'][1]:+.1f}] | "
                         f"{100 * f['out_of_support']:.0f} % | {f['verdict']} |")
    if "risk_coverage" in pooled:
        want = 1.0 - TARGETS["abstention"]
        kappa, kept, risk = widest_scaling(pooled["risk_coverage"], want)
        said = (f"the widest that decides at least {100 * want:.0f} % of the checks is κ = {kappa:.2f}: it decides "
                f"{pct(kept)}, {pct(risk)} of them wrong." if kept >= want - 1e-12 else
                f"none decides {100 * want:.0f} % of the checks: the point estimates alone (κ = 0) decide {pct(kept)} "
                f"(the rest are out of support), {pct(risk)} of them wrong.")
        lines += ["", "Scaling every interval about its point estimate by κ (the risk-coverage curve of these rows, "
                  "a diagnostic: the gate's level and margin stay), " + said]
    if by_method:
        lines += ["", "Abstention / coverage of the 90 % interval / confident verdicts that agree with the cluster, by "
                  f"interval construction on the same rows, {label}: "
                  + ", ".join(f"{m} {pct(h['abstention'])} / {pct(h['coverage_90'])} / "
                              f"{h['confident_agreed']:.0f} of {h['confident_pairs']:.0f}" for m, h in by_method.items())
                  + "."]
    return "\n".join(lines)


def declared_kpi_summary(rows: list[dict[str, Any]], declared: list[str]) -> dict[str, Any]:
    """Per KPI the spec declares a direction for (issue 44): over the candidates, the coverage of the
    cluster's change by the twin's 90 % interval (with its Clopper-Pearson 90 % interval), the median
    absolute and the mean signed change error in points (twin minus cluster: a shared sign is a bias),
    and the findings, every (candidate, KPI) whose change the twin gets wrong by more than its interval."""
    from scipy.stats import binomtest

    def one(rs: list[dict[str, Any]]) -> dict[str, Any]:
        rs = [r for r in rs if math.isfinite(r["real_change"]) and math.isfinite(r["twin_change"])]
        k, n = sum(r["covered"] for r in rs), len(rs)
        ci = binomtest(k, n).proportion_ci(0.90, method="exact") if n else None
        err = [100 * (r["twin_change"] - r["real_change"]) for r in rs]
        return {"n": n, "coverage": k / n if n else float("nan"),
                "coverage_interval": [ci.low, ci.high] if ci else None,
                "median_abs_error_points": float(np.median(np.abs(err))) if n else float("nan"),
                "mean_signed_error_points": float(np.mean(err)) if n else float("nan")}

    mine = [r for r in rows if r["kpi"] in declared]
    findings = sorted((r for r in mine if not r["covered"]),
                      key=lambda r: -abs(r["twin_change"] - r["real_change"]))
    return {**one(mine), "per_kpi": {k: one([r for r in mine if r["kpi"] == k]) for k in declared},
            "findings": [{k: r[k] for k in ("seed", "policy", "kpi", "twin_change", "interval", "real_change",
                                            "out_of_support", "verdict") if k in r} for r in findings]}


def split_policies(names: list[str], seed: int) -> tuple[list[str], list[str]]:
    """The candidates in two disjoint halves, by a seeded shuffle: ``(choose on, report on)``.

    The interval construction is chosen on the first half's rows and its coverage reported on the
    second's: choosing it on the rows whose coverage is then reported would report the best of
    several constructions on the same rows, an optimistic number."""
    order = list(np.random.default_rng(seed).permutation(sorted(names)))
    half = len(order) // 2
    return [str(n) for n in order[:half]], [str(n) for n in order[half:]]


def choose_method(by_method: dict[str, list[dict[str, Any]]], choose_on: list[str], report_on: list[str],
                  nominal: float = 0.90) -> dict[str, Any]:
    """The construction whose coverage on ``choose_on``'s rows is nearest ``nominal`` (ties: the
    narrower median interval; "bootstrap" is the uncalibrated baseline, not a candidate), and every
    construction's headline on ``report_on``'s rows, which the choice never saw."""
    def rows_of(method: str, names: list[str]) -> list[dict[str, Any]]:
        return [r for r in by_method[method] if r["policy"] in names]

    chosen_on = {m: headline(rows_of(m, choose_on)) for m in by_method if m != "bootstrap"}
    chosen = min(chosen_on, key=lambda m: (abs(chosen_on[m]["coverage_90"] - nominal),
                                           chosen_on[m]["median_interval_width"]))
    return {"choose_on": choose_on, "report_on": report_on, "chosen": chosen,
            "choice_coverage": {m: h["coverage_90"] for m, h in chosen_on.items()},
            "held_out": headline(rows_of(chosen, report_on)),
            "held_out_by_method": {m: headline(rows_of(m, report_on)) for m in by_method}}


def risk_coverage(rows: list[dict[str, Any]], max_oos: float) -> dict[str, list[float]]:
    """Error rate of kept verdicts vs share kept, as the interval-width multiplier κ moves (κ = 1: the gate).
    κ = 0 is the point estimate, also for an interval unbounded on a side (a relative change over a baseline
    that may be 0, `edgetwin.twin.intervals.change_interval`), whose side stays unbounded for any κ > 0."""
    out: dict[str, list[float]] = {"kappa": [], "kept": [], "risk": []}
    for kappa in np.linspace(0.0, 4.0, 81):
        kept = errs = 0
        for r in rows:
            mid = r["twin_change_w"]
            lo = mid - (kappa * (mid - r["w_interval"][0]) if kappa else 0.0)
            hi = mid + (kappa * (r["w_interval"][1] - mid) if kappa else 0.0)
            v = check_verdict([lo, hi], DEFAULT_MARGIN, r["out_of_support"], max_oos)
            if v in ("ok", "regress"):
                kept += 1
                errs += int((v == "regress") != r["real_regress"])
        out["kappa"].append(float(kappa))
        out["kept"].append(kept / len(rows))
        out["risk"].append(errs / kept if kept else 0.0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--logging", choices=sorted(LOGGING_TEXT), default="random")
    ap.add_argument("--members", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="PPO 10k steps, replay the first 48 ticks of each day")
    ap.add_argument("--work", type=Path, default=Path("/tmp/edgetwin-whatif-gate"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks/whatif_gate/README.md")
    ap.add_argument("--calibrate-on", choices=CALIBRATION_SETS, default="held",
                    help="the logged days the intervals are calibrated on: held (3 held-out days, the headline), "
                         "recent (the replayed days themselves: what `check_candidate` does by default), or both")
    ap.add_argument("--held-days", type=held_days_arg, default=3,
                    help="held-out logged days to calibrate on (default 3, the page's runs: they attain 75 %%; the "
                         "gate's 90 %% needs 9); a run with another number writes only with --json")
    ap.add_argument("--json", type=Path, default=None,
                    help="write this run's summary (with its seed) to this file instead of the docs' results file "
                         "and page: one seed of a rate over several (use a --work directory per seed: the twin and "
                         "PPO are cached there)")
    ap.add_argument("--docs-only", action="store_true",
                    help="only rewrite the docs section from the results_<logging>.json files of earlier runs")
    ap.add_argument("--pool", nargs="+", type=Path, default=None, metavar="JSON",
                    help="pool the rows of several --json runs (one per seed), print their headline with the confident "
                         "agreement's Clopper-Pearson 90 %% interval and write it to --pool-out")
    ap.add_argument("--pool-out", type=Path, default=None, metavar="JSON",
                    help="where --pool writes (default whatif_gate/seeds/pooled_<logging>.json; give another file for "
                         "another set of seeds, e.g. the held-out ones, so the pooled seeds the page cites stay)")
    ap.add_argument("--noise-fix-section", action="store_true",
                    help="only (re)write the page's subsection 'After the members' noise fix (issue 44)' from the stored "
                         "runs: whatif_gate/before_score_floor/ and the before_noise_fix/ copies (_whatif_noise_rerun.py)")
    ap.add_argument("--score-section", action="store_true",
                    help="only (re)write the page's subsection on the floored calibration score (issue 44) and the "
                         "numbers and verdicts of the What-if gate rows of docs/benchmarks/README.md from the stored "
                         "runs: whatif_gate/ and its before_score_floor/ copies (_whatif_score_rerun.py)")
    add_scale_args(ap)
    args = ap.parse_args()
    if args.noise_fix_section:
        text = noise_fix_section(OUT)
        write_noise_fix_section(OUT / "README.md", text, before_heading=KEEP[2])
        print(text)
        return
    if args.score_section:
        text = score_section(OUT)
        write_noise_fix_section(OUT / "README.md", text, before_heading=KEEP[1])
        print(text)
        missing = update_rows(ROOT / "docs" / "benchmarks" / "README.md", at_a_glance_cells(OUT))
        if missing:
            print("no at-a-glance row cites:", ", ".join(missing))
        return
    if args.held_days != 3 and args.json is None:
        ap.error("--held-days other than 3 needs --json FILE: the page's results are of 3 held-out days")
    if args.pool:
        pooled = pool_seeds(args.pool)
        out = args.pool_out or OUT / "seeds" / f"pooled_{args.logging}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(pooled, indent=1, default=float))
        print(json.dumps({k: v for k, v in pooled.items() if k not in ("per_seed", "risk_coverage")}, indent=1,
                         default=float))
        print(pooled_tables(pooled, pool_label(pooled["seeds"])))  # the page's tables of these seeds
        return
    scale = scale_kwargs(args)
    torch.set_num_threads(1)
    if args.docs_only:
        _rewrite_docs(args)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    cfg = ClusterConfig(n_agents=100, steps=96)
    spec = cluster_spec(cfg)
    steps = 48 if args.quick else None
    ppo_steps = 10_000 if args.quick else 40_000
    train, _ = generate_logs(cfg, episodes=6, policy=logging_policy(args.logging, spec, args.seed), seed=args.seed)
    held, _ = generate_logs(cfg, episodes=args.held_days, policy=logging_policy(args.logging, spec, args.seed + 1000),
                            seed=args.seed + 1000)  # fmt: skip
    recent_seed = args.seed + 7
    recent_pol = logging_policy(args.logging, spec, recent_seed)
    recent, _ = generate_logs(cfg, episodes=2, policy=recent_pol, seed=recent_seed)
    t0 = time.perf_counter()
    twin = fit_or_load(args.work, args.logging, args.members, train, spec, scale)
    fit_s = time.perf_counter() - t0
    kpis = merge_kpis(default_kpis(spec, twin.layout.outputs), load_kpis(ROOT / "edgetwin" / "data" / "whatif" / "emulated_kpis.toml"))
    kpis = [k for k in kpis if k.better is not None]

    t0 = time.perf_counter()
    cal_log, cal_episodes = calibration_log(args.calibrate_on, held, recent, args.held_days)
    cal = calibrate(twin, cal_log, kpis, episodes=cal_episodes, seeds=3, seed=args.seed, steps=steps, progress=True,
                    **scale)  # fmt: skip
    cal_s = time.perf_counter() - t0
    print("calibration:", json.dumps(cal.to_dict(), indent=1), flush=True)

    pols = candidates(spec, twin, args.logging, args.seed)
    t0 = time.perf_counter()
    pols["PPO trained in the twin"] = train_ppo(twin, args.work, ppo_steps, args.seed)
    train_s = time.perf_counter() - t0

    # the cluster runs get their own copies: a policy with a generator (uniform random) must act the
    # same on the cluster whether the replay drew from it in this process or in a worker's copy
    fresh = copy.deepcopy(pols)
    specs = [builtin_policy("logged", twin)] + [fixed_policy(n, p) for n, p in pols.items()]
    t0 = time.perf_counter()
    res = run_whatif(twin, specs, [], baseline="logged", kpis=kpis, episodes=2, seeds=1, seed=args.seed, log=recent,
                     steps=steps, calibration=cal, progress=True, **scale)  # fmt: skip
    replay_s = time.perf_counter() - t0

    # the truth: the same days on the cluster (same seeds: same populations and noise) per policy
    real_base = logged_episode_kpis(logged_episodes(recent, twin, steps=steps), kpis, spec)
    real_pol: dict[str, dict[str, np.ndarray]] = {}
    for name, pol in fresh.items():
        real_log, _ = generate_logs(cfg, episodes=2, policy=pol, seed=recent_seed)
        real_pol[name] = logged_episode_kpis(logged_episodes(real_log, twin, steps=steps), kpis, spec)

    # every cell's (members x replicates) values and the truth, for analyses without a rerun
    import pickle

    (args.work / f"cells-{args.logging}{'-quick' if args.quick else ''}.pkl").write_bytes(pickle.dumps({
        "values": {(p, k.name): res.cell(p, "nominal").values[k.name] for p in res.policies for k in kpis},
        "oos": {p: res.cell(p, "nominal").oos for p in res.policies},
        "real_base": real_base, "real_pol": real_pol, "calibration": cal.to_dict(),
        "kpis": [(k.name, k.better) for k in kpis]}))  # fmt: skip
    by_method = {}
    for method in ("bootstrap", *METHODS):
        cal.method = method if method != "bootstrap" else "relative"
        res.calibrate(None if method == "bootstrap" else cal)
        by_method[method] = score_rows(res, kpis, pols, real_base, real_pol)
    cal.method = DEFAULT_METHOD
    res.calibrate(cal)
    rows = by_method[DEFAULT_METHOD]

    summary: dict[str, Any] = {
        "logging": args.logging,
        "calibrate_on": args.calibrate_on,
        "quick": bool(args.quick),
        "method": DEFAULT_METHOD,
        **headline(rows),
        "by_method": {m: headline(r) for m, r in by_method.items()},
        "policies": len(pols),
        "margin": DEFAULT_MARGIN,
        "max_out_of_support": MAX_OUT_OF_SUPPORT,
        "calibration": cal.to_dict(),
        "seconds": {"fit": fit_s, "calibrate": cal_s, "train_ppo": train_s, "replay": replay_s,
                    "total": time.perf_counter() - t_all},
        "members": args.members,
        "held_days": args.held_days,
    }  # fmt: skip
    # the policy the gate would pick: among the candidates it promotes (no KPI regresses, none abstained),
    # the best by the lower bound of the return; never worse on the cluster than the logging policy?
    per_policy = {}
    for name in pols:
        vs = [r["verdict"] for r in rows if r["policy"] == name]
        gate = "refuse" if "regress" in vs else ("abstain" if any(v in ("straddle", "unsupported") for v in vs) else "promote")
        ret = next(r for r in rows if r["policy"] == name and r["kpi"] == "return")
        per_policy[name] = {"gate": gate, "return_change_interval": ret["interval"], "real_return_change": ret["real_change"],
                            "out_of_support": ret["out_of_support"]}  # fmt: skip
    promoted = {p: v for p, v in per_policy.items() if v["gate"] == "promote"}
    pick = max(promoted, key=lambda p: promoted[p]["return_change_interval"][0]) if promoted else None
    # the construction chosen on half of the candidates, its coverage reported on the other half
    summary["method_choice"] = choose_method(by_method, *split_policies(list(pols), args.seed))
    summary["per_policy"] = per_policy
    summary["gate_pick"] = pick
    summary["gate_pick_real_return_change"] = None if pick is None else per_policy[pick]["real_return_change"]
    summary["gate_pick_not_worse_than_logging"] = None if pick is None else bool(per_policy[pick]["real_return_change"] >= 0)
    rc = risk_coverage(rows, MAX_OUT_OF_SUPPORT)
    summary["risk_coverage"] = rc
    summary["rows"] = rows
    summary["declared_kpis"] = declared_kpi_summary(rows, [f.name for f in spec.features if f.better is not None])

    if args.json is not None:  # one seed of several: its summary only, the docs untouched
        args.json.write_text(json.dumps({**summary, "seed": args.seed}, indent=1, default=float))
        print(json.dumps({k: summary[k] for k in ("logging", "confident_agreement", "confident_pairs", "abstention",
                                                  "coverage_90", "median_interval_width")}, default=float))
        return
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / results_name(args.logging, args.calibrate_on)).write_text(json.dumps(summary, indent=1, default=float))
    if args.calibrate_on != "held":  # a side run: its headline only; the section shows it beside the held-out one
        print(json.dumps({k: summary[k] for k in ("logging", "calibrate_on", *TARGETS, "median_interval_width")}))
        if not args.no_write:
            _rewrite_docs(args)
        return
    _plot(rc, OUT / f"risk_coverage_{args.logging}.png", args.logging)
    # results.json: the headline numbers, the random-logging run at the top level, every logging beside
    by_logging = {}
    for name in LOGGING_TEXT:
        f = OUT / f"results_{name}.json"
        if f.is_file():
            d = json.loads(f.read_text())
            by_logging[name] = {k: d[k] for k in ("confident_agreement", "abstention", "coverage_90",
                                                   "median_interval_width", "agreement_if_never_abstaining", "pairs",
                                                   "policies", "quick", "method", "by_method", "gate_pick",
                                                   "gate_pick_not_worse_than_logging")}  # fmt: skip
            if "method_choice" in d:
                by_logging[name]["method_choice"] = d["method_choice"]
    top = by_logging.get("random", by_logging.get(args.logging, {}))
    (OUT / "results.json").write_text(json.dumps({**top, "targets": TARGETS, "by_logging": by_logging}, indent=1))
    text = section(by_logging, summary, args, fit_s)
    print(text)
    if not args.no_write:
        write_section(SECTION, text, keep=KEEP)


def _rewrite_docs(args: argparse.Namespace) -> None:
    """Rewrite the docs section from the results files of earlier runs."""
    path = OUT / f"results_{args.logging}.json"
    last = json.loads(path.read_text())
    if "declared_kpis" not in last:  # a results file written before the per-declared-KPI summary: add it
        declared = [f.name for f in cluster_spec(ClusterConfig(n_agents=1, steps=1)).features if f.better is not None]
        last["declared_kpis"] = declared_kpi_summary(last["rows"], declared)
        path.write_text(json.dumps(last, indent=1, default=float))
    by_logging = {n: json.loads((OUT / f"results_{n}.json").read_text()) for n in LOGGING_TEXT
                  if (OUT / f"results_{n}.json").is_file()}  # fmt: skip
    args.quick = bool(last["quick"])
    write_section(SECTION, section(by_logging, last, args, last["seconds"]["fit"]), keep=KEEP)


def _calibration_rows(by_logging: dict[str, Any]) -> list[str]:
    """One row per (logs, calibration set) that has a results file: the headline beside the side runs."""
    rows = []
    for name, head in by_logging.items():
        for which in CALIBRATION_SETS:
            f = OUT / results_name(name, which)
            if which != "held" and not f.is_file():
                continue
            d = head if which == "held" else json.loads(f.read_text())
            q = d.get("calibration", {}).get("quantile", {})
            rows.append(
                f"| {name} | {which} | {100 * d['confident_agreement']:.0f} % | {100 * d['abstention']:.0f} % | "
                f"{100 * d['coverage_90']:.0f} % | {100 * d['median_interval_width']:.0f} pp | "
                + ", ".join(f"{k} {100 * q[k]:.0f} %" for k in ("return", "task_time_p95") if k in q) + " |"
            )
    return rows


def section(by_logging: dict[str, Any], last: dict[str, Any], args: argparse.Namespace, fit_s: float) -> str:
    def pct(x: Any) -> str:
        return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f} %"

    lines = [
        SECTION, "",
        f"Command: `python benchmarks/whatif_gate.py --logging {{random,production}}{' --quick' if args.quick else ''}` "
        f"(machine: {os.cpu_count()} CPU cores shared with other jobs, torch threads 1). Cluster: 100 service groups, "
        "96 ticks a day. Twin: MAIL-MMSG, "
        f"{args.members} members, fitted on the twin-fidelity benchmark's 6 training days (last run: {fit_s:.0f} s to fit or to load from the work directory) "
        "with the twin-fidelity benchmark's settings, which differ from `Twin.fit`'s defaults in two places: the empirical "
        "population (the logged profiles; default GAN-SMMSG) and 10 behaviour-cloning epochs (default 20; with 20 the "
        "random row reads 100 % / 63 % / 81 %, see the energy subsection below); "
        "intervals calibrated on its 3 held-out days (logged actions replayed with every member, 3 days x 3 noise "
        "seeds; the ensemble's answer per day scored against the logged KPIs, |y − ŷ| / max(|ŷ|, s) with s the KPI's "
        "scale (the floored score, issue 44): split-conformal quantile per KPI, "
        f"`edgetwin/twin/intervals.py`; headline construction: `{DEFAULT_METHOD}`). Recent traffic: 2 other days; candidates replayed on them and run on the "
        f"cluster on the same days. Margin {100 * DEFAULT_MARGIN:g} %, abstain above "
        f"{100 * MAX_OUT_OF_SUPPORT:g} % out-of-support agent-steps (the gate's defaults, fixed beforehand)."
        + (" Quick mode: PPO 10k steps, first 48 ticks of each day replayed." if args.quick else ""),
        "",
        "| logs | pairs | confident agreement (target ≥ 95 %) | abstention (≤ 30 %) | coverage of the 90 % interval "
        "(≥ 85 %) | median width | agreement if it never abstained | gate's pick | pick ≥ logging on the cluster |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]  # fmt: skip
    for name, d in by_logging.items():
        lines.append(
            f"| {name}{' (quick)' if d['quick'] else ''} | {d['pairs']} ({d['policies']} policies) | "
            f"{pct(d['confident_agreement'])} | {pct(d['abstention'])} | {pct(d['coverage_90'])} | "
            f"{100 * d['median_interval_width']:.0f} pp | "
            f"{pct(d['agreement_if_never_abstaining'])} | {d['gate_pick'] or 'none promoted'} | "
            f"{'n/a' if d['gate_pick_not_worse_than_logging'] is None else ('yes' if d['gate_pick_not_worse_than_logging'] else 'NO')} |"
        )
    lines += [
        "",
        "The interval constructions side by side (coverage / confident agreement / abstention / median width):",
        "",
        "| logs | " + " | ".join(("bootstrap only", *METHODS)) + " |",
        "|---|" + "---|" * (1 + len(METHODS)),
    ]
    for name, d in by_logging.items():  # a results file from before a construction existed: n/a there
        lines.append(f"| {name} | " + " | ".join(
            f"{pct(m['coverage_90'])} / {pct(m['confident_agreement'])} / {pct(m['abstention'])} / "
            f"{100 * m['median_interval_width']:.0f} pp" if m else "n/a"
            for m in (d["by_method"].get(k) for k in ("bootstrap", *METHODS))) + " |")
    split = {n: d["method_choice"] for n, d in by_logging.items() if "method_choice" in d}
    if split:
        lines += [
            "",
            "The construction chosen on half of the candidates, its numbers reported on the other half (`split_policies`, "
            "`choose_method`: nearest 90 % coverage on the choice half; the headline rows above use every candidate and "
            f"the product's default `{DEFAULT_METHOD}`, which was chosen on them, so their coverage is optimistic):",
            "",
            "| logs | chosen on (policies) | chosen | coverage on the held-out half (pairs) | confident agreement | abstention "
            "| every construction's coverage on the held-out half |",
            "|---|---|---|---:|---:|---:|---|",
        ]
        for name, c in split.items():
            h = c["held_out"]
            lines.append(
                f"| {name} | {len(c['choose_on'])} | `{c['chosen']}` | {pct(h['coverage_90'])} ({h['pairs']}) | "
                f"{pct(h['confident_agreement'])} | {pct(h['abstention'])} | "
                + ", ".join(f"{m} {pct(v['coverage_90'])}" for m, v in c["held_out_by_method"].items()) + " |"
            )
    cal_rows = _calibration_rows(by_logging)
    if len(cal_rows) > len(by_logging):
        lines += [
            "",
            "Where the intervals are calibrated (`--calibrate-on`): *held*, 3 held-out days (the headline above); "
            "*recent*, the 2 replayed days themselves under their logged actions (what `check_candidate` and "
            "`edgetwin promote` do when given a log and no calibration: the recent log is traffic the twin was not "
            "fitted on); *both*. Same twin, candidates and cluster runs; only the calibration set differs:",
            "",
            "| logs | calibrated on | confident agreement | abstention | coverage | median width | calibrated error (90 %; relative, floored at the KPI's scale since issue 44's score) |",
            "|---|---|---:|---:|---:|---:|---|",
            *cal_rows,
        ]
    lines += _declared_lines(last)
    lines += [
        "",
        f"Per (policy, KPI), logs: {LOGGING_TEXT[last['logging']]} (the last run; every run's rows are in "
        f"`docs/benchmarks/whatif_gate/results_<logging>.json`):",
        "",
        "| policy | KPI | twin change [90 % interval] | out of support | cluster change | verdict | right? |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for r in last["rows"]:
        v = {"ok": "no regression", "regress": "regresses", "straddle": "abstain (straddles)",
             "unsupported": "abstain (support)"}[r["verdict"]]  # fmt: skip
        right = "—" if r["agree"] is None else ("yes" if r["agree"] else "**NO**")
        lines.append(
            f"| {r['policy']} | {r['kpi']} | {100 * r['twin_change']:+.1f}% [{100 * r['interval'][0]:+.1f}, "
            f"{100 * r['interval'][1]:+.1f}]{'' if r['covered'] else ' ✗'} | {100 * r['out_of_support']:.0f} % | "
            f"{100 * r['real_change']:+.1f}% | {v} | {right} |"
        )
    lines += [
        "",
        "✗: the real change lies outside the interval. The paper (seed 003) names twin-gated promotion and the "
        "post-update regression rate but reports no number for it, and no public twin reports coverage or abstains.",
        "",
        *[f"![risk vs coverage, {n}](benchmarks/whatif_gate/risk_coverage_{n}.png)" for n in by_logging],
        "",
    ]
    return "\n".join(lines)


def _declared_lines(last: dict[str, Any]) -> list[str]:
    """The section's per-declared-KPI block (issue 44) of the last run: coverage and error per KPI
    the spec gives a direction, and the findings (empty without ``declared_kpis`` in the results)."""
    d = last.get("declared_kpis")
    if not d or not d["n"]:
        return []
    ci = d["coverage_interval"]
    lines = [
        "",
        f"Per KPI the cluster's spec declares a direction for (issue 44; logs: {last['logging']}, the last run): the "
        "twin's predicted change vs the cluster's over the candidates, each on the same days on both sides. Coverage "
        f"{100 * d['coverage']:.0f} % of {d['n']} (90 % CP interval {100 * ci[0]:.0f}-{100 * ci[1]:.0f} %, optimistic: "
        f"KPIs of one candidate are correlated), median absolute change error {d['median_abs_error_points']:.1f} points.",
        "",
        "| KPI | coverage | median abs. error (points) | mean signed error, twin minus cluster (points) |",
        "|---|---:|---:|---:|",
    ]
    for k, v in d["per_kpi"].items():
        lines.append(f"| {k} | {100 * v['coverage']:.0f} % of {v['n']} | {v['median_abs_error_points']:.1f} | "
                     f"{v['mean_signed_error_points']:+.1f} |")
    lines += ["", f"Findings: the twin gets {len(d['findings'])} declared-KPI change(s) wrong by more than its interval"
              + (":" if d["findings"] else "."), ""]
    if d["findings"]:
        lines += ["| candidate | KPI | cluster change | twin change [90 % interval] | out of support | gate's verdict |",
                  "|---|---|---:|---:|---:|---|"]
        for r in d["findings"]:
            lines.append(f"| {r['policy']} | {r['kpi']} | {100 * r['real_change']:+.1f} % | "
                         f"{100 * r['twin_change']:+.1f} % [{100 * r['interval'][0]:+.1f}, {100 * r['interval'][1]:+.1f}] | "
                         f"{100 * r['out_of_support']:.0f} % | {r['verdict']} |")
    return lines


def _plot(rc: dict[str, list[float]], path: Path, logging: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.6))
    ax.plot(rc["kept"], rc["risk"], "-o", ms=2)
    k1 = int(np.argmin(np.abs(np.asarray(rc["kappa"]) - 1.0)))
    ax.plot([rc["kept"][k1]], [rc["risk"][k1]], "r*", ms=12, label="the gate (κ = 1)")
    ax.plot([rc["kept"][0]], [rc["risk"][0]], "ks", ms=6, label="point estimate only (κ = 0)")
    ax.set_xlabel("share of (policy, KPI) verdicts kept (1 - abstention)")
    ax.set_ylabel("error rate of kept verdicts")
    ax.set_title(f"what-if gate: risk vs coverage (logs: {logging})", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
