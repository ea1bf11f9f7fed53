"""The what-if gate rerun after issue 44's noise fix: before -> after, from the stored runs only.

Issue 44's fix (`edgetwin.twin.member.Member.fit_output_noise`, ``source="training"``, merged at
27a9416): each ensemble member's output-noise table is read on the days of its own bootstrap draw,
not on the days it left out. The what-if gate's stored runs were rerun on the fixed code with the
same commands (same seeds, logs, candidates, cluster days and calibration days; only the members'
noise tables differ). The runs of the code before the fix are kept byte for byte under
``docs/benchmarks/whatif_gate/before_noise_fix/`` (the same relative paths as the files the rerun
overwrote), so every "before" number here is read from a file, as every "after" one is. The runs
after the fix were in turn rerun on the floored calibration score (`_whatif_score_rerun`); they are
kept byte for byte under ``before_score_floor/`` (`AFTER`), which is where this subsection reads them.
`at_a_glance_cells` renders the at-a-glance rows for any such pair of directories (the score's
rerun writes them now).

`noise_fix_section` renders the page's subsection "After the members' noise fix (issue 44)" from
those files alone (a test re-renders it and compares, so a number on the page cannot drift from
its JSON); `write_noise_fix_section` puts it into the page. Nothing here runs the twin or the
cluster, and no estimator, level, margin or threshold is chosen here: the rows are scored by
`whatif_gate.score_rows` in the runs themselves.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

#: the page's subsection heading (also the first of `whatif_gate.KEEP`, so a rerun keeps it)
HEADING = "### After the members' noise fix (issue 44)"
#: the heading of the floored score's rerun subsection (`_whatif_score_rerun`), named here for the cross-reference
SCORE_HEADING = "The calibration score floored at the KPI's scale (issue 44)"
#: where the runs of the code before the fix are kept, relative to docs/benchmarks/whatif_gate/
BEFORE = "before_noise_fix"
#: where the runs after the fix are kept since the score's rerun overwrote them (relative to whatif_gate/)
AFTER = "before_score_floor"
#: the merge that made `Member.fit_output_noise` read the member's own bootstrap days
FIX_COMMIT = "27a9416"
RANDOM_SEEDS = (0, 1, 2, 3, 4, 5)
PRODUCTION_SEEDS = (3, 4, 5)
#: the pooled files the subsection reads (relative to whatif_gate/ and to its before_noise_fix/)
POOLS = {
    "seeds 0-2 (the replayed term was chosen on them)": "seeds/pooled_random.json",
    "seeds 3-5 (held out)": "seeds/pooled_random_heldout.json",
    "seeds 0-5": "seeds/pooled_random_all.json",
}
PRODUCTION_POOL = "seeds/pooled_production_heldout.json"
HELD9_POOL = "seeds/held9/pooled_random.json"
#: issue 44's and the gate benchmark's targets (fixed before any of these runs)
TARGETS = {"confident_agreement": 0.95, "abstention": 0.30, "declared_coverage": 0.90, "coverage_90": 0.85,
           "median_abs_error_points": 10.0}


def load(root: Path, rel: str, before: bool = False) -> dict[str, Any]:
    """The JSON file ``rel`` of the runs after the fix (``root/AFTER``, root docs/benchmarks/whatif_gate/),
    or its copy from before the fix (``root/BEFORE``)."""
    return json.loads((root / (BEFORE if before else AFTER) / rel).read_text())


def cp(k: int, n: int) -> tuple[float, float]:
    """The Clopper-Pearson 90 % interval of ``k`` of ``n`` (scipy's exact binomial interval)."""
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(0.90, method="exact")
    return float(ci.low), float(ci.high)


def counts(d: dict[str, Any]) -> dict[str, int]:
    """Whole counts behind a run's or a pool's rates: confident verdicts that agreed (of how many),
    abstained checks, changes inside the interval (of every KPI, and of the declared KPIs)."""
    n, k = d["pairs"], d["confident_pairs"]
    dk = d.get("declared_kpis") or d.get("declared") or {}
    return {"pairs": n, "confident": k, "agreed": round(d["confident_agreement"] * k) if k else 0,
            "abstained": n - k, "covered": round(d["coverage_90"] * n),
            "declared": int(dk.get("n", 0)), "declared_covered": round(dk.get("coverage", 0.0) * dk.get("n", 0))}


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _ci(k: int, n: int) -> str:
    lo, hi = cp(k, n)
    return f"CP 90 %: {100 * lo:.0f}-{100 * hi:.0f} %"


def _agree(d: dict[str, Any], with_ci: bool = False) -> str:
    c = counts(d)
    if not c["confident"]:
        return "n/a (none confident)"
    ci = f", {_ci(c['agreed'], c['confident'])}" if with_ci else ""
    return f"{c['agreed']} of {c['confident']} ({_pct(c['agreed'] / c['confident'])}{ci})"


def _rate(k: int, n: int, with_ci: bool) -> str:
    return f"{_pct(k / n)}" + (f" ({_ci(k, n)})" if with_ci else "")


def _declared(d: dict[str, Any]) -> dict[str, Any]:
    return d.get("declared_kpis") or {}


def _cells(d: dict[str, Any], with_ci: bool) -> list[str]:
    """Confident agreement, abstention, coverage of every (candidate, KPI) change, of the declared
    KPIs' changes, median abs. declared-KPI change error, median width."""
    c = counts(d)
    dk = _declared(d)
    return [_agree(d, with_ci), _rate(c["abstained"], c["pairs"], with_ci),
            f"{_rate(c['covered'], c['pairs'], with_ci)} of {c['pairs']}",
            f"{_rate(c['declared_covered'], c['declared'], with_ci)} of {c['declared']}",
            f"{dk['median_abs_error_points']:.1f}", f"{100 * d['median_interval_width']:.0f} pp"]


def _before_after(b: dict[str, Any], a: dict[str, Any], with_ci: bool) -> list[str]:
    return [f"{x} → **{y}**" for x, y in zip(_cells(b, with_ci), _cells(a, with_ci), strict=True)]


HEAD = ("| {logs} | confident agreement (target ≥ 95 %) | abstention (≤ 30 %) | coverage of every (candidate, KPI) "
        "change (≥ 85 %) | coverage of the declared KPIs' changes (≥ 90 %) | median abs. declared-KPI change error, "
        "points (≤ 10) | median width |")
RULE = "|---|---:|---:|---:|---:|---:|---:|"


def _headline_status(root: Path) -> str:
    """Which of the section's headline files (its top tables, seed 0 of each log) the rerun reached."""
    said = []
    for logs, rel in (("random", "results_random.json"), ("production-like", "results_production.json")):
        said.append(f"{logs} logs' ({rel}) is the rerun" if rerun(root, rel) else
                    f"{logs} logs' ({rel}) is **not rerun**: still the code before the fix")
    return "The headline run at the top of this section, per log: " + "; ".join(said) + "."


def _stale(root: Path, rel: str) -> str:
    """A row label's mark for a file the rerun did not reach (its numbers are still the code's before the fix)."""
    return "" if rerun(root, rel) else " (**not rerun**: both columns before the fix)"


def _outside_by(f: dict[str, Any]) -> float:
    """How far (points) the cluster's change lies outside the twin's interval."""
    lo, hi = f["interval"]
    return 100 * (f["real_change"] - hi if f["real_change"] > hi else lo - f["real_change"])


def _by(f: dict[str, Any]) -> str:
    """`_outside_by` at one decimal; a miss smaller than that is said as such, not as 0.0."""
    x = _outside_by(f)
    return f"{x:.1f}" if x >= 0.05 else "< 0.1"


def _key(r: dict[str, Any]) -> tuple[Any, str, str]:
    return (r.get("seed"), r["policy"], r["kpi"])


def confident_errors(root: Path, seeds: tuple[int, ...], logging: str = "random",
                     before: bool = False) -> list[dict[str, Any]]:
    """The confident verdicts (not abstained) that the cluster contradicts, over the seed files."""
    out = []
    for s in seeds:
        for r in load(root, f"seeds/{logging}_seed{s}.json", before)["rows"]:
            if r["agree"] is False:
                out.append({**r, "seed": s})
    return out


def confident_error_table(errs: list[dict[str, Any]], errs_before: list[dict[str, Any]], was: str) -> list[str]:
    """The lines of a table of confident verdicts the cluster contradicts (`confident_errors`), each marked
    by whether it was wrong in ``errs_before`` too (column ``was``)."""
    before = {_key(r) for r in errs_before}
    out = ["| seed | candidate | KPI | gate's verdict | cluster change | twin change [90 % interval] | " + was + " |",
           "|---|---|---|---|---:|---:|---|"]
    for r in errs:
        out.append(f"| {r['seed']} | {r['policy']} | {r['kpi']} | "
                   f"{'regresses' if r['verdict'] == 'regress' else 'no regression'} | {100 * r['real_change']:+.1f} % | "
                   f"{100 * r['twin_change']:+.1f} % [{100 * r['interval'][0]:+.1f}, {100 * r['interval'][1]:+.1f}] | "
                   f"{'yes' if _key(r) in before else 'no'} |")
    return out


def verdict(x: float, target: str) -> str:
    """met / missed against `TARGETS` (abstention and error: at most; the others: at least)."""
    at_most = target in ("abstention", "median_abs_error_points")
    ok = x <= TARGETS[target] if at_most else x >= TARGETS[target]
    return "met" if ok else "missed"


def noise_fix_section(root: Path) -> str:
    """The page's subsection, every number read from the files under ``root`` and ``root/before_noise_fix``."""
    lines = [
        HEADING, "",
        f"Issue 44's fix ({FIX_COMMIT}: each member's output-noise table read on the days of its own bootstrap draw, "
        "not the days it left out; docs/benchmarks/twin_fidelity/README.md, \"The offset diagnosed\") changes the "
        "twin every run of this benchmark uses. The runs were repeated on the fixed code with their own commands "
        "(the same seeds, training and held-out days, candidates, PPO steps and cluster days; a fresh work "
        "directory, so the members and PPO were refitted): `python benchmarks/whatif_gate.py --logging L --quick "
        "--seed S --work DIR --json docs/benchmarks/whatif_gate/seeds/L_seedS.json`, pooled by `--pool ... "
        "--pool-out` as before, seeds 0-5 together by `python benchmarks/whatif_gate.py --logging random --pool "
        + " ".join(f"docs/benchmarks/whatif_gate/seeds/random_seed{s}.json" for s in RANDOM_SEEDS)
        + " --pool-out docs/benchmarks/whatif_gate/seeds/pooled_random_all.json`. Before: the runs of the code "
        f"before the fix, kept as they were under `docs/benchmarks/whatif_gate/{BEFORE}/` (same file names; the "
        "seeds 0-5 pool of them by the same `--pool` command). The subsections below this one describe those runs "
        "and say so. Estimators, level (90 %), margin (5 %), out-of-support budget (25 %) and the 3 calibration days "
        "are unchanged. Clopper-Pearson intervals count every (seed, candidate, KPI) check as independent; a "
        "candidate's KPIs are correlated, so they are optimistic. "
        + _headline_status(root)
        + f" The runs after the fix were rerun on the floored calibration score (\"{SCORE_HEADING}\", above); "
        f"the files this subsection reads as after the fix are kept as they were under "
        f"`docs/benchmarks/whatif_gate/{AFTER}/` (same file names).",
        "",
        HEAD.format(logs="random logs, quick: before → after"), RULE,
    ]
    for s in RANDOM_SEEDS:
        rel = f"seeds/random_seed{s}.json"
        lines.append("| " + " | ".join([f"seed {s}{_stale(root, rel)}", *_before_after(load(root, rel, True),
                                                                                     load(root, rel), False)]) + " |")
    for label, rel in POOLS.items():
        lines.append("| " + " | ".join([f"{label}, pooled{_stale(root, rel)}", *_before_after(
            load(root, rel, True), load(root, rel), True)]) + " |")
    prod = [f"seeds/production_seed{s}.json" for s in PRODUCTION_SEEDS]
    lines += ["", HEAD.format(logs="production-like logs, quick: before → after"), RULE]
    for s, rel in zip(PRODUCTION_SEEDS, prod, strict=True):
        lines.append("| " + " | ".join([f"seed {s}{_stale(root, rel)}", *_before_after(load(root, rel, True),
                                                                                     load(root, rel), False)]) + " |")
    lines.append("| " + " | ".join([f"seeds 3-5, pooled{_stale(root, PRODUCTION_POOL)}", *_before_after(load(root, PRODUCTION_POOL, True),
                                                                      load(root, PRODUCTION_POOL), True)]) + " |")
    if (root / AFTER / HELD9_POOL).is_file() and (root / BEFORE / HELD9_POOL).is_file():
        lines += ["", HEAD.format(logs="random logs, 9 calibration days (the 90 % level's): before → after"), RULE]
        lines.append("| " + " | ".join([f"seeds 3-5, pooled{_stale(root, HELD9_POOL)}", *_before_after(load(root, HELD9_POOL, True),
                                                                          load(root, HELD9_POOL), True)]) + " |")

    # against the targets, seeds 0-5 pooled
    allb, alla = load(root, POOLS["seeds 0-5"], True), load(root, POOLS["seeds 0-5"])
    ca, cb = counts(alla), counts(allb)
    dka, dkb = _declared(alla), _declared(allb)
    lines += [
        "",
        "Against the targets, random logs, seeds 0-5 pooled, after the fix: confident agreement "
        f"{_pct(ca['agreed'] / ca['confident'])} ({ca['agreed']} of {ca['confident']}, {_ci(ca['agreed'], ca['confident'])}; "
        f"before {_pct(cb['agreed'] / cb['confident'])}) **{verdict(ca['agreed'] / ca['confident'], 'confident_agreement')}**; "
        f"abstention {_pct(alla['abstention'])} (before {_pct(allb['abstention'])}) **{verdict(alla['abstention'], 'abstention')}**; "
        f"declared-KPI change coverage {_pct(dka['coverage'])} of {dka['n']} (before {_pct(dkb['coverage'])}) "
        f"**{verdict(dka['coverage'], 'declared_coverage')}**; median absolute declared-KPI change error "
        f"{dka['median_abs_error_points']:.1f} points (before {dkb['median_abs_error_points']:.1f}) "
        f"**{verdict(dka['median_abs_error_points'], 'median_abs_error_points')}**; coverage of every (candidate, KPI) "
        f"change {_pct(alla['coverage_90'])} (before {_pct(allb['coverage_90'])}) "
        f"**{verdict(alla['coverage_90'], 'coverage_90')}**.",
        "",
        "Per declared KPI, random logs, seeds 0-5 pooled, before → after:",
        "",
        "| KPI | coverage | CP 90 % after | median abs. error (points) | mean signed error, twin minus cluster (points) |",
        "|---|---:|---:|---:|---:|",
    ]
    for kpi, va in dka["per_kpi"].items():
        vb = dkb["per_kpi"][kpi]
        k = round(va["coverage"] * va["n"])
        lo, hi = cp(k, va["n"])
        lines.append(f"| {kpi} | {_pct(vb['coverage'])} → **{_pct(va['coverage'])}** of {va['n']} | "
                     f"{100 * lo:.0f}-{100 * hi:.0f} % | {vb['median_abs_error_points']:.1f} → "
                     f"**{va['median_abs_error_points']:.1f}** | {vb['mean_signed_error_points']:+.1f} → "
                     f"**{va['mean_signed_error_points']:+.1f}** |")

    # which way each headline moved (higher is better except abstention, error and width)
    moves = [("confident agreement", cb["agreed"] / cb["confident"], ca["agreed"] / ca["confident"], True, _pct),
             ("declared-KPI change coverage", dkb["coverage"], dka["coverage"], True, _pct),
             ("coverage of every change", allb["coverage_90"], alla["coverage_90"], True, _pct),
             ("abstention", allb["abstention"], alla["abstention"], False, _pct),
             ("median abs. declared-KPI change error", dkb["median_abs_error_points"], dka["median_abs_error_points"],
              False, lambda x: f"{x:.1f} points")]
    worse = [f"{n} {f(b)} → {f(a)}" for n, b, a, up, f in moves if f(a) != f(b) and (a < b) == up]
    better = [f"{n} {f(b)} → {f(a)}" for n, b, a, up, f in moves if f(a) != f(b) and (a < b) != up]
    same = [n for n, b, a, _, f in moves if f(a) == f(b)]
    lines += ["", "Which way the fix moved the pooled headline (seeds 0-5): worse: " + (", ".join(worse) or "none")
              + "; better: " + (", ".join(better) or "none") + ("; unchanged: " + ", ".join(same) if same else "") + "."]
    moved = max(dka["per_kpi"], key=lambda k: abs(dka["per_kpi"][k]["coverage"] - dkb["per_kpi"][k]["coverage"]))
    va, vb = dka["per_kpi"][moved], dkb["per_kpi"][moved]
    lines += ["", f"The declared KPI whose coverage moved most: {moved}, {_pct(vb['coverage'])} → {_pct(va['coverage'])} "
              f"of {va['n']}; the median interval width over every KPI, seeds 0-5, {100 * allb['median_interval_width']:.0f} → "
              f"{100 * alla['median_interval_width']:.0f} pp."]
    # the return's calibrated relative error: |log - twin| / |twin| on the held-out days, per seed
    rr = [r for s in RANDOM_SEEDS for r in load(root, f"seeds/random_seed{s}.json")["rows"] if r["kpi"] in ("return", "reward")]
    q = [(s, load(root, f"seeds/random_seed{s}.json", True)["calibration"]["quantile"].get("return"),
          load(root, f"seeds/random_seed{s}.json")["calibration"]["quantile"].get("return")) for s in RANDOM_SEEDS]
    lines += ["", "The return's calibrated relative error (the 90 % split-conformal quantile of |logged − twin| / |twin| "
              "over the 3 held-out days, `calibration.quantile.return`), per seed, before → after: "
              + ", ".join(f"seed {s} {100 * b:.0f} % → {100 * a:.0f} %" for s, b, a in q if a is not None and b is not None)
              + f". The score divides by the twin's level, so a held-out day whose return is near 0 makes it large; "
              f"of the {len(rr)} return and reward checks of seeds 0-5, {sum(r['verdict'] in ('ok', 'regress') for r in rr)} "
              "are decided."]
    # the findings: every declared change the twin gets wrong by more than its interval, after the fix
    was = {_key(f) for f in dkb["findings"]}
    now = {_key(f) for f in dka["findings"]}
    lines += [
        "",
        f"The findings, after the fix: the {len(dka['findings'])} declared-KPI changes (of {dka['n']}, seeds 0-5) the "
        f"twin gets wrong by more than its 90 % interval ({len(dkb['findings'])} before; {len(now & was)} missed both "
        f"times, {len(now - was)} new, {len(was - now)} no longer missed), largest |twin − cluster| first:",
        "",
        "| seed | candidate | KPI | cluster change | twin change [90 % interval] | outside by (points) | out of support "
        "| gate's verdict | missed before the fix? |",
        "|---|---|---|---:|---:|---:|---:|---|---|",
    ]
    for f in dka["findings"]:
        lines.append(f"| {f['seed']} | {f['policy']} | {f['kpi']} | {100 * f['real_change']:+.1f} % | "
                     f"{100 * f['twin_change']:+.1f} % [{100 * f['interval'][0]:+.1f}, {100 * f['interval'][1]:+.1f}] | "
                     f"{_by(f)} | {100 * f['out_of_support']:.0f} % | {f['verdict']} | "
                     f"{'yes' if _key(f) in was else 'no'} |")
    gone = [f for f in dkb["findings"] if _key(f) not in now]
    if gone:
        lines += ["", "No longer missed (before the fix: cluster change, twin change [interval]): " + "; ".join(
            f"seed {f['seed']} {f['policy']} {f['kpi']} ({100 * f['real_change']:+.1f} %, {100 * f['twin_change']:+.1f} % "
            f"[{100 * f['interval'][0]:+.1f}, {100 * f['interval'][1]:+.1f}])" for f in gone) + "."]
    # the confident verdicts the cluster contradicts (every KPI, not only the declared ones)
    errs_a, errs_b = confident_errors(root, RANDOM_SEEDS), confident_errors(root, RANDOM_SEEDS, before=True)
    lines += ["", f"Confident verdicts the cluster contradicts, random logs, seeds 0-5: {len(errs_a)} after the fix "
              f"({len(errs_b)} before)" + (":" if errs_a else ".")]
    if errs_a:
        lines += ["", *confident_error_table(errs_a, errs_b, "wrong before the fix?")]
    pa, pb = load(root, PRODUCTION_POOL), load(root, PRODUCTION_POOL, True)
    fp = _declared(pa)["findings"]
    lines += ["", f"Production-like logs, seeds 3-5: {len(fp)} declared-KPI change(s) outside the interval after the fix "
              f"({len(_declared(pb)['findings'])} before)" + (":" if fp else ".")]
    if fp:
        was_p = {_key(f) for f in _declared(pb)["findings"]}
        lines += ["", "| seed | candidate | KPI | cluster change | twin change [90 % interval] | outside by (points) | "
                  "out of support | gate's verdict | missed before the fix? |", "|---|---|---|---:|---:|---:|---:|---|---|"]
        for f in fp:
            lines.append(f"| {f['seed']} | {f['policy']} | {f['kpi']} | {100 * f['real_change']:+.1f} % | "
                         f"{100 * f['twin_change']:+.1f} % [{100 * f['interval'][0]:+.1f}, {100 * f['interval'][1]:+.1f}] | "
                         f"{_by(f)} | {100 * f['out_of_support']:.0f} % | {f['verdict']} | "
                         f"{'yes' if _key(f) in was_p else 'no'} |")
    return "\n".join(lines)


def write_noise_fix_section(page: Path, text: str, before_heading: str) -> None:
    """Put ``text`` (a ``### `` subsection) into ``page``: replace the subsection of the same heading (its
    first line) up to the next ``### `` or ``## ``, or insert it before ``before_heading``'s line (the
    page's first kept hand-written subsection)."""
    current = page.read_text()
    heading = text.split("\n", 1)[0]
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^### |^## |\Z)", re.S | re.M)
    block = text.rstrip() + "\n\n"
    if pattern.search(current):
        new = pattern.sub(lambda _: block, current)
    else:
        at = current.find("\n" + before_heading)
        if at < 0:
            raise ValueError(f"{page}: no line starting {before_heading!r} to insert the subsection before")
        new = current[: at + 1] + block + current[at + 1:]
    page.write_text(new)


#: the at-a-glance table's source cells of the What-if gate rows this module writes (file:field under docs/benchmarks/)
ROW_SOURCES = (
    "whatif_gate/results_random.json:confident_agreement",
    "whatif_gate/seeds/pooled_random.json:confident_agreement",
    "whatif_gate/seeds/pooled_random_all.json:confident_agreement",
    "whatif_gate/results_production.json:confident_agreement",
    "whatif_gate/results_random.json:abstention",
    "whatif_gate/results_production.json:abstention",
    "whatif_gate/results_random.json:method_choice.held_out.coverage_90",
    "whatif_gate/results_random.json:declared_kpis.coverage",
    "whatif_gate/seeds/pooled_random.json:declared_kpis.coverage",
    "whatif_gate/seeds/pooled_random_all.json:declared_kpis.coverage",
    "whatif_gate/seeds/pooled_random_heldout.json:declared_kpis.coverage",
    "whatif_gate/seeds/pooled_random_heldout.json:confident_agreement",
    "whatif_gate/seeds/pooled_random_heldout.json:abstention",
    "whatif_gate/seeds/held9/pooled_random.json:abstention",
    "whatif_gate/seeds/pooled_production_heldout.json:declared_kpis.coverage",
    "whatif_gate/seeds/pooled_production_heldout.json:abstention",
)
#: the verdict of a row whose file the rerun did not reach (it still equals its copy from before the fix)
NOT_RERUN = f"unverified: measured before issue 44's noise fix ({FIX_COMMIT}); not rerun since"


def rerun(root: Path, rel: str, before: str = BEFORE, after: str = AFTER) -> bool:
    """Whether ``root/after/rel`` holds a run other than its copy ``root/before/rel`` (a file with no
    copy, such as the seeds 0-5 pool, is new with the rerun when its seed files are). ``after`` ``""``:
    the files under ``root`` themselves."""
    old = root / before / rel
    return not old.is_file() or old.read_bytes() != (root / after / rel).read_bytes()


def _seed_list(d: dict[str, Any], what: str) -> str:
    """Per seed of a pool: ``"seeds 3, 4, 5: a, b, c"`` of ``what`` (agreement, abstention, declared)."""
    seeds = ", ".join(str(ps["seed"]) for ps in d["per_seed"])

    def one(ps: dict[str, Any]) -> str:
        if what == "agreement":
            c = counts(ps)
            return f"{c['agreed']} of {c['confident']}"
        if what == "abstention":
            return _pct(ps["abstention"])
        return _pct(ps["declared"]["coverage"])

    return f"seeds {seeds}: " + ", ".join(one(ps) for ps in d["per_seed"])


def _cp_text(k: int, n: int) -> str:
    lo, hi = cp(k, n)
    return f"CP 90 %: {100 * lo:.0f}-{100 * hi:.0f} %"


def at_a_glance_cells(root: Path, before: str = BEFORE, after: str = AFTER, fix: str = "before issue 44's noise fix",
                      not_rerun: str = NOT_RERUN) -> dict[str, tuple[str, str]]:
    """Per source cell of `ROW_SOURCES`: the row's "edgetwin" cell and its verdict, every number read
    from the files under ``root/after`` (``""``: ``root`` itself) and their copies under ``root/before``;
    ``fix`` names the before runs in the cells. A row whose file was not rerun keeps the before numbers
    and says so (``not_rerun``)."""
    opt = "optimistic: the KPIs of one candidate are correlated"
    out: dict[str, tuple[str, str]] = {}

    def load(root: Path, rel: str, was: bool = False) -> dict[str, Any]:
        return json.loads((root / (before if was else after) / rel).read_text())

    def put(src: str, cell: str, value: float, target: str) -> None:
        rel = src.split(":")[0].removeprefix("whatif_gate/")
        out[src] = (cell, verdict(value, target) if rerun(root, rel, before, after) else not_rerun)

    r, rb = load(root, "results_random.json"), load(root, "results_random.json", True)
    p, pb = load(root, "results_production.json"), load(root, "results_production.json", True)
    c, cb = counts(r), counts(rb)
    put("whatif_gate/results_random.json:confident_agreement",
        f"{_pct(r['confident_agreement'])} ({c['agreed']} of {c['confident']}, {_cp_text(c['agreed'], c['confident'])}; "
        f"one seed; {fix} {_pct(rb['confident_agreement'])}, {cb['agreed']} of {cb['confident']})",
        r["confident_agreement"], "confident_agreement")
    for rel, label in (("seeds/pooled_random.json", "seeds/pooled_random.json"),
                       ("seeds/pooled_random_all.json", "seeds/pooled_random_all.json")):
        d, db = load(root, rel), load(root, rel, True)
        c, cb = counts(d), counts(db)
        put(f"whatif_gate/{label}:confident_agreement",
            f"{_pct(d['confident_agreement'])} ({c['agreed']} of {c['confident']}, {_cp_text(c['agreed'], c['confident'])}, "
            f"{opt}; {_seed_list(d, 'agreement')}; abstention {_pct(d['abstention'])}, coverage of the 90 % interval "
            f"{_pct(d['coverage_90'])}; {fix} {_pct(db['confident_agreement'])}, {cb['agreed']} of {cb['confident']}, "
            f"abstention {_pct(db['abstention'])}, coverage {_pct(db['coverage_90'])})",
            d["confident_agreement"], "confident_agreement")
        dk, dkb = d["declared_kpis"], db["declared_kpis"]
        k = round(dk["coverage"] * dk["n"])
        put(f"whatif_gate/{label}:declared_kpis.coverage",
            f"{_pct(dk['coverage'])} ({k} of {dk['n']}, {_cp_text(k, dk['n'])}, {opt}; {_seed_list(d, 'declared')}; "
            f"median abs. change error {dk['median_abs_error_points']:.1f} points; {fix} {_pct(dkb['coverage'])}, "
            f"error {dkb['median_abs_error_points']:.1f} points)",
            dk["coverage"], "declared_coverage")
    c, cb = counts(p), counts(pb)
    put("whatif_gate/results_production.json:confident_agreement",
        f"{_pct(p['confident_agreement'])} ({c['agreed']} of {c['confident']}; one seed; {fix} {cb['agreed']} of "
        f"{cb['confident']})", p["confident_agreement"], "confident_agreement")
    allr, allb = load(root, POOLS["seeds 0-5"]), load(root, POOLS["seeds 0-5"], True)
    put("whatif_gate/results_random.json:abstention",
        f"{_pct(r['abstention'])} ({fix} {_pct(rb['abstention'])}; seeds 0-5 pooled {_pct(allr['abstention'])}, "
        f"before {_pct(allb['abstention'])})", r["abstention"], "abstention")
    put("whatif_gate/results_production.json:abstention",
        f"{_pct(p['abstention'])} ({fix} {_pct(pb['abstention'])})", p["abstention"], "abstention")
    mc, mcb = r["method_choice"], rb["method_choice"]
    put("whatif_gate/results_random.json:method_choice.held_out.coverage_90",
        f"{_pct(mc['held_out']['coverage_90'])} ("
        + ("the split-half choice picks the product's default `replayed` on seed 0; " if mc["chosen"] == "replayed" else
           f"the split-half choice picks `{mc['chosen']}` on seed 0; the product's default `replayed` covers "
           f"{_pct(mc['held_out_by_method']['replayed']['coverage_90'])} of the same half; ")
        + f"{fix} "
        f"{_pct(mcb['held_out']['coverage_90'])}, `{mcb['chosen']}`)", mc["held_out"]["coverage_90"], "coverage_90")
    dk, dkb = r["declared_kpis"], rb["declared_kpis"]
    lo, hi = dk["coverage_interval"]
    tt, ttb = dk["per_kpi"]["kpi.task_time_ms"], dkb["per_kpi"]["kpi.task_time_ms"]
    put("whatif_gate/results_random.json:declared_kpis.coverage",
        f"{_pct(dk['coverage'])} (CP 90 %: {100 * lo:.0f}-{100 * hi:.0f} %; task time {100 * tt['coverage']:.0f} %; "
        f"median abs. change error {dk['median_abs_error_points']:.1f} points; {fix} {_pct(dkb['coverage'])}, task time "
        f"{100 * ttb['coverage']:.0f} %, error {dkb['median_abs_error_points']:.1f} points)", dk["coverage"],
        "declared_coverage")
    h, hb = load(root, "seeds/pooled_random_heldout.json"), load(root, "seeds/pooled_random_heldout.json", True)
    dk, dkb = h["declared_kpis"], hb["declared_kpis"]
    k = round(dk["coverage"] * dk["n"])
    put("whatif_gate/seeds/pooled_random_heldout.json:declared_kpis.coverage",
        f"{_pct(dk['coverage'])} ({k} of {dk['n']}, {_cp_text(k, dk['n'])}, {opt}; {_seed_list(h, 'declared')}; {fix} "
        f"{_pct(dkb['coverage'])})", dk["coverage"], "declared_coverage")
    c, cb = counts(h), counts(hb)
    put("whatif_gate/seeds/pooled_random_heldout.json:confident_agreement",
        f"{_pct(h['confident_agreement'])} ({c['agreed']} of {c['confident']}, {_cp_text(c['agreed'], c['confident'])}, "
        f"{opt}; {_seed_list(h, 'agreement')}; {fix} {cb['agreed']} of {cb['confident']})",
        h["confident_agreement"], "confident_agreement")
    ar = h["abstention_reasons"]
    product = ("; at the product gate's 90 % level every decided check is below the level its 3 calibration days "
               "attain, so the product abstains on all" if ar["product_abstention"] == 1.0 else
               f"; the product gate at its 90 % level abstains on {_pct(ar['product_abstention'])}")
    put("whatif_gate/seeds/pooled_random_heldout.json:abstention",
        f"{_pct(h['abstention'])} ({_cp_text(c['abstained'], c['pairs'])}; {_seed_list(h, 'abstention')}; "
        f"{ar['straddle']} of {ar['pairs']} checks straddle the margin, {ar['unsupported']} out of support{product}; "
        f"{fix} {_pct(hb['abstention'])})", h["abstention"], "abstention")
    n9, n9b = load(root, HELD9_POOL), load(root, HELD9_POOL, True)
    c = counts(n9)
    ar = n9["abstention_reasons"]
    below = ("no check below the level: every abstention is an interval straddling the 5 % margin or out of support"
             if ar["below_level"] == 0 else f"{ar['below_level']} decided checks below the level")
    put("whatif_gate/seeds/held9/pooled_random.json:abstention",
        f"{_pct(n9['abstention'])} ({_cp_text(c['abstained'], c['pairs'])}; {_seed_list(n9, 'abstention')}; {below}; "
        f"declared-KPI coverage {_pct(n9['declared_kpis']['coverage'])}, confident agreement {c['agreed']} of "
        f"{c['confident']}, median width {100 * n9['median_interval_width']:.0f} pp; {fix} {_pct(n9b['abstention'])})",
        n9["abstention"], "abstention")
    pr, prb = load(root, PRODUCTION_POOL), load(root, PRODUCTION_POOL, True)
    dk, dkb = pr["declared_kpis"], prb["declared_kpis"]
    k = round(dk["coverage"] * dk["n"])
    misses = dk["findings"]
    where = ("" if not misses else f"; the {len(misses)} misses all on candidates out of support"
             if all(f["verdict"] == "unsupported" for f in misses) else
             f"; {sum(f['verdict'] == 'unsupported' for f in misses)} of the {len(misses)} misses on candidates out of support")
    put("whatif_gate/seeds/pooled_production_heldout.json:declared_kpis.coverage",
        f"{_pct(dk['coverage'])} ({k} of {dk['n']}, {_cp_text(k, dk['n'])}, {opt}; {_seed_list(pr, 'declared')}{where}; "
        f"{fix} {_pct(dkb['coverage'])})", dk["coverage"], "declared_coverage")
    c, ar = counts(pr), pr["abstention_reasons"]
    put("whatif_gate/seeds/pooled_production_heldout.json:abstention",
        f"{_pct(pr['abstention'])} ({_cp_text(c['abstained'], c['pairs'])}; {ar['unsupported']} of {ar['pairs']} checks "
        f"out of support; confident agreement {c['agreed']} of {c['confident']}; {fix} {_pct(prb['abstention'])})",
        pr["abstention"], "abstention")
    return out


def update_rows(readme: Path, cells: dict[str, tuple[str, str]]) -> list[str]:
    """Replace the "edgetwin" and verdict cells of the at-a-glance rows whose source cell is one of
    ``cells`` (the rows themselves, capability, command and source, are written by hand); returns the
    sources it found no row for."""
    lines = readme.read_text().split("\n")
    found = set()
    for i, line in enumerate(lines):
        if not line.startswith("| [What-if gate]"):
            continue
        cols = line.split(" | ")
        m = re.search(r"`([^`]+)`", cols[-1])
        src = re.sub(r"\s*[×÷]\s*[\d.]+$", "", m.group(1)) if m else ""
        if src in cells:
            cols[3], cols[4] = cells[src]
            lines[i] = " | ".join(cols)
            found.add(src)
    readme.write_text("\n".join(lines))
    return [s for s in cells if s not in found]
