"""The what-if gate rerun on the floored calibration score (issue 44): before -> after, from the stored runs only.

The score (`edgetwin.twin.intervals`, ``SCORE = "floored"``): a held-out day's level error is divided by
``max(|ŷ|, s_k)`` instead of ``|ŷ|``, ``s_k`` the KPI's scale (the normal MAD of the twin's
(member, day) answers on the calibration days), so a KPI whose level is near 0 or changes sign (the
return, the reward) no longer gets a quantile in the thousands. The benchmark's stored runs were rerun
with their own commands; the twins and PPO policies were loaded from the runs' work directories (the
fit does not depend on the score: a rerun of the code before the change from those directories gave the
stored runs' rows). The runs before the change are kept byte for byte under
``docs/benchmarks/whatif_gate/before_score_floor/`` (`BEFORE`, the same relative paths), so every
"before" number here is read from a file, as every "after" one is.

`score_section` renders the page's subsection from those files alone (a test re-renders it and compares);
`at_a_glance_cells` the What-if gate rows of docs/benchmarks/README.md (`_whatif_noise_rerun.at_a_glance_cells`
over this pair of directories). Nothing here runs the twin or the cluster, and nothing is chosen here:
the rows are scored by `whatif_gate.score_rows` in the runs themselves.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import _whatif_noise_rerun as nr

#: the page's subsection heading (kept by a rerun: `whatif_gate.KEEP`)
HEADING = f"### {nr.SCORE_HEADING}"
#: where the runs of the code before the floored score are kept, relative to docs/benchmarks/whatif_gate/
BEFORE = "before_score_floor"
#: the commit of the floored score
SCORE_COMMIT = "6b89599"
#: how the at-a-glance cells name the runs before
FIX = "before the floored score"
NOT_RERUN = f"unverified: measured before the floored calibration score ({SCORE_COMMIT}); not rerun since"
SIGNED = ("return", "reward")
#: the same seed runs on the floor alone (`FLOOR_ONLY_COMMIT`: the floored score, its change intervals not yet read
#: over the baseline's calibrated error), kept to show what the denominator term is for
FLOOR_ONLY = "score_floor_only"
FLOOR_ONLY_COMMIT = "6b89599"
#: the commit that reads a relative change over the real baselines the floored calibration allows
DENOMINATOR_COMMIT = "6e30163"
#: the side runs (`--calibrate-on recent|both`), rerun if time allowed: the page says which are not
SIDE_RUNS = tuple(f"results_{lg}_cal-{c}.json" for lg in ("random", "production") for c in ("recent", "both"))


def load(root: Path, rel: str, before: bool = False) -> dict[str, Any]:
    """The JSON file ``rel`` under ``root`` (docs/benchmarks/whatif_gate/), or its copy from before the score."""
    return json.loads(((root / BEFORE / rel) if before else (root / rel)).read_text())


def rerun(root: Path, rel: str) -> bool:
    """Whether ``rel`` holds a run other than its copy from before the score."""
    return nr.rerun(root, rel, BEFORE, "")


def _stale(root: Path, rel: str) -> str:
    return "" if rerun(root, rel) else " (**not rerun**: both columns before the floored score)"


def signed_checks(rows: list[dict[str, Any]]) -> dict[str, int]:
    """The return and reward checks of ``rows``: how many, decided (not abstained), agreeing with the
    cluster among the decided, and inside the 90 % interval."""
    r = [x for x in rows if x["kpi"] in SIGNED]
    dec = [x for x in r if x["agree"] is not None]
    return {"n": len(r), "decided": len(dec), "agreed": sum(bool(x["agree"]) for x in dec),
            "covered": sum(bool(x["covered"]) for x in r),
            "unbounded": sum(not all(math.isfinite(v) for v in x["interval"]) for x in r if x["agree"] is None)}


def _signed_text(b: dict[str, int], a: dict[str, int]) -> str:
    def agreed(c: dict[str, int]) -> str:
        return f"{c['agreed']} of {c['decided']} right" if c["decided"] else "none decided"

    return (f"decided {b['decided']} → **{a['decided']}** of {a['n']} ({agreed(b)} → {agreed(a)}); inside the 90 % "
            f"interval {b['covered']} → {a['covered']}; of the undecided after, {a['unbounded']} unbounded on a side (the "
            "twin's baseline within its calibrated error of 0: the size of the relative change unidentified), "
            f"{a['n'] - a['decided'] - a['unbounded']} bounded and straddling the margin or out of support")


def _rows(root: Path, rels: list[str], before: bool) -> list[dict[str, Any]]:
    return [r for rel in rels for r in load(root, rel, before)["rows"]]


def score_section(root: Path) -> str:
    """The page's subsection, every number read from the files under ``root`` and ``root/before_score_floor``."""
    random_seeds = [f"seeds/random_seed{s}.json" for s in nr.RANDOM_SEEDS]
    prod = [f"seeds/production_seed{s}.json" for s in nr.PRODUCTION_SEEDS]
    held9 = [f"seeds/held9/random_seed{s}.json" for s in (3, 4, 5)]
    heads = [f"{logs} logs' ({rel}) is the rerun" if rerun(root, rel) else
             f"{logs} logs' ({rel}) is **not rerun**: still the score before"
             for logs, rel in (("random", "results_random.json"), ("production-like", "results_production.json"))]
    side = [rel for rel in SIDE_RUNS if (root / rel).is_file() and not rerun(root, rel)]
    lines = [
        HEADING, "",
        f"The twin's level error on a held-out day is now scored `|y − ŷ| / max(|ŷ|, s_k)` ({SCORE_COMMIT}, "
        "`edgetwin/twin/intervals.py`, its module doc derives it), `s_k` the KPI's own scale: the normal median "
        "absolute deviation of the twin's (member, day) answers on the 3 calibration days, in the KPI's units, "
        "frozen in the calibration and inverted by every interval. Where a KPI's level is far from 0 against that "
        "spread the score is the relative one it was; the return and the reward, the operator's signed objective, "
        "had days the twin put near 0, where `|y − ŷ| / |ŷ|` read in the thousands and no return or reward check "
        "was decided. The runs were repeated with their own commands (`python benchmarks/whatif_gate.py --logging L "
        "--quick --seed S --work DIR --json docs/benchmarks/whatif_gate/seeds/L_seedS.json`, `--held-days 9 --json "
        "docs/benchmarks/whatif_gate/seeds/held9/random_seedS.json`, pooled by `--pool ... --pool-out` into the same "
        "files, then `--logging {random,production} --quick` for the page's runs); the twins and PPO policies were "
        "loaded from the runs' work directories: fitting does not read the score, and the code before the change, "
        "run from the same directories, gave the stored rows again. Before: the stored runs, kept as they were under "
        f"`docs/benchmarks/whatif_gate/{BEFORE}/` (same file names). Candidates, cluster days, calibration days, "
        "level (90 %), margin (5 %) and out-of-support budget (25 %) unchanged. Clopper-Pearson intervals count every "
        "(seed, candidate, KPI) check as independent; a candidate's KPIs are correlated, so they are optimistic. "
        "The headline run at the top of this section, per log: " + "; ".join(heads) + "."
        + (" Still the score before (not rerun): " + ", ".join(f"`{s}`" for s in side)
           + " (the calibration-set table above)." if side else ""),
        "",
        nr.HEAD.format(logs="random logs, quick: before → after"), nr.RULE,
    ]
    for rel in random_seeds:
        seed = load(root, rel)["seed"]
        lines.append("| " + " | ".join([f"seed {seed}{_stale(root, rel)}",
                                         *nr._before_after(load(root, rel, True), load(root, rel), False)]) + " |")
    for label, rel in nr.POOLS.items():
        lines.append("| " + " | ".join([f"{label}, pooled{_stale(root, rel)}",
                                         *nr._before_after(load(root, rel, True), load(root, rel), True)]) + " |")
    lines += ["", nr.HEAD.format(logs="production-like logs, quick: before → after"), nr.RULE]
    for rel in [*prod, nr.PRODUCTION_POOL]:
        label = f"seed {load(root, rel)['seed']}" if "seed" in load(root, rel) else "seeds 3-5, pooled"
        lines.append("| " + " | ".join([f"{label}{_stale(root, rel)}",
                                         *nr._before_after(load(root, rel, True), load(root, rel), False)]) + " |")
    lines += ["", nr.HEAD.format(logs="random logs, 9 calibration days (the 90 % level's): before → after"), nr.RULE,
              "| " + " | ".join([f"seeds 3-5, pooled{_stale(root, nr.HELD9_POOL)}",
                                 *nr._before_after(load(root, nr.HELD9_POOL, True), load(root, nr.HELD9_POOL), True)])
              + " |"]

    # the return and reward checks: what the score was for
    lines += ["", "The return and reward checks (candidate vs logging, the 5 % margin), before → after:", ""]
    for label, rels in (("random logs, seeds 0-5", random_seeds), ("production-like logs, seeds 3-5", prod),
                        ("random logs, 9 calibration days, seeds 3-5", held9)):
        b, a = signed_checks(_rows(root, rels, True)), signed_checks(_rows(root, rels, False))
        lines.append(f"- {label}: {_signed_text(b, a)}.")
    if (root / FLOOR_ONLY).is_dir():
        lines += ["", f"Why the change intervals also read the baseline's error ({DENOMINATOR_COMMIT}): with the floor alone "
                  f"({FLOOR_ONLY_COMMIT}; the same runs, kept under `docs/benchmarks/whatif_gate/{FLOOR_ONLY}/`) the return's "
                  "intervals shrank around a twin baseline that was itself within its calibrated error of 0, and missed "
                  "the cluster's change: return and reward changes inside the 90 % interval, before → floor alone → "
                  "after:"]
        for label, rels in (("random logs, seeds 0-5", random_seeds), ("production-like logs, seeds 3-5", prod),
                            ("random logs, 9 calibration days, seeds 3-5", held9)):
            mid = [r for rel in rels for r in json.loads((root / FLOOR_ONLY / rel).read_text())["rows"]]
            b, m, a = (signed_checks(_rows(root, rels, True)), signed_checks(mid), signed_checks(_rows(root, rels, False)))
            every = [sum(bool(r["covered"]) for r in rows) for rows in (_rows(root, rels, True), mid, _rows(root, rels, False))]
            lines.append(f"- {label}: {b['covered']} → {m['covered']} → **{a['covered']}** of {a['n']} (every (candidate, "
                         f"KPI) change: {every[0]} → {every[1]} → **{every[2]}** of {len(mid)}).")
    q = [(load(root, rel)["seed"], load(root, rel, True)["calibration"]["quantile"].get("return"),
          load(root, rel)["calibration"]["quantile"].get("return"),
          load(root, rel)["calibration"].get("scale", {}).get("return")) for rel in random_seeds]
    lines += ["", "The return's calibrated error (the 90 % split-conformal quantile over the 3 held-out days, "
              "`calibration.quantile.return`), relative to the twin's level before, to `max(|ŷ|, s)` after, random "
              "logs, per seed, before → after (the scale `s`, `calibration.scale.return`): "
              + ", ".join(f"seed {s} {100 * b:.0f} % → {100 * a:.0f} % (s = {sc:.2f})" for s, b, a, sc in q
                          if a is not None and b is not None and sc is not None) + "."]

    # against the targets, seeds 0-5 pooled
    allb, alla = load(root, nr.POOLS["seeds 0-5"], True), load(root, nr.POOLS["seeds 0-5"])
    ca, cb = nr.counts(alla), nr.counts(allb)
    dka, dkb = nr._declared(alla), nr._declared(allb)
    lines += [
        "",
        "Against the targets, random logs, seeds 0-5 pooled, after: confident agreement "
        f"{nr._pct(ca['agreed'] / ca['confident'])} ({ca['agreed']} of {ca['confident']}, "
        f"{nr._ci(ca['agreed'], ca['confident'])}; before {nr._pct(cb['agreed'] / cb['confident'])}, {cb['agreed']} of "
        f"{cb['confident']}) **{nr.verdict(ca['agreed'] / ca['confident'], 'confident_agreement')}**; abstention "
        f"{nr._pct(alla['abstention'])} (before {nr._pct(allb['abstention'])}) **{nr.verdict(alla['abstention'], 'abstention')}**; "
        f"declared-KPI change coverage {nr._pct(dka['coverage'])} of {dka['n']} (before {nr._pct(dkb['coverage'])}) "
        f"**{nr.verdict(dka['coverage'], 'declared_coverage')}**; coverage of every (candidate, KPI) change "
        f"{nr._pct(alla['coverage_90'])} (before {nr._pct(allb['coverage_90'])}) **{nr.verdict(alla['coverage_90'], 'coverage_90')}**.",
    ]
    same = [k for k in dka["per_kpi"] if dka["per_kpi"][k]["coverage"] == dkb["per_kpi"][k]["coverage"]]
    moved = [f"{k} {nr._pct(dkb['per_kpi'][k]['coverage'])} → {nr._pct(v['coverage'])}"
             for k, v in dka["per_kpi"].items() if k not in same]
    lines += ["", f"The declared KPIs' pooled coverage (seeds 0-5): {len(same)} of {len(dka['per_kpi'])} unchanged"
              + (f" ({', '.join(same)})" if same else "") + (f"; moved: {', '.join(moved)}." if moved else ".")]

    # the confident verdicts the cluster contradicts, after
    errs_a = nr.confident_errors(root, nr.RANDOM_SEEDS)
    errs_b = [{**r, "seed": s} for s in nr.RANDOM_SEEDS for r in load(root, f"seeds/random_seed{s}.json", True)["rows"]
              if r["agree"] is False]
    lines += ["", f"Confident verdicts the cluster contradicts, random logs, seeds 0-5: {len(errs_a)} after "
              f"({len(errs_b)} before)" + (":" if errs_a else ".")]
    if errs_a:
        lines += ["", *nr.confident_error_table(errs_a, errs_b, "wrong before?")]
    # what it comes to, for the checks the score was for
    rb, ra = signed_checks(_rows(root, random_seeds, True)), signed_checks(_rows(root, random_seeds, False))
    q1 = next(((b, a) for s, b, a, _ in q if s == 1 and a is not None and b is not None), None)
    lines += ["", "What it comes to: the return's calibration is finite"
              + (f" (seed 1: {q1[0]:,.1f} → {q1[1]:.2f})" if q1 else "")
              + f" and its and the reward's changes are inside their intervals ({rb['covered']} → {ra['covered']} of "
              f"{ra['n']}, random logs, seeds 0-5), and {ra['decided']} of them {'is' if ra['decided'] == 1 else 'are'} "
              f"decided ({rb['decided']} before). {ra['unbounded']} of the {ra['n']} are relative changes over a twin "
              "baseline within its calibrated error of 0 (the return of these logs sums signed rewards to near 0 on "
              "some days): no interval of a relative change is honest there, and the gate abstains; the rest straddle the "
              "5 % margin because the twin's return is off by about its own level on held-out days (the quantiles "
              "above). A decision on a signed KPI needs its change in the KPI's units against a margin in those units, "
              "which this gate does not have."]
    return "\n".join(lines)


def at_a_glance_cells(root: Path) -> dict[str, tuple[str, str]]:
    """The What-if gate rows' "edgetwin" cells and verdicts: the runs under ``root`` against their copies
    from before the floored score (`_whatif_noise_rerun.at_a_glance_cells` over this pair)."""
    return nr.at_a_glance_cells(root, before=BEFORE, after="", fix=FIX, not_rerun=NOT_RERUN)
