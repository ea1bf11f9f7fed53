"""The what-if gate rerun after issue 44's noise fix (27a9416): the page's subsection "After the members'
noise fix (issue 44)" and the What-if gate rows of the at-a-glance table say what the rerun's JSON files
and the kept copies of the runs before the fix hold.

Two kinds of check: the page and the rows equal what `_whatif_noise_rerun` renders from the files
(so no number can drift from its file), and, independently of that renderer, the headline numbers
recomputed here from the runs' rows (confident verdicts, abstentions, coverage, declared-KPI findings)
appear on the page, and the verdicts follow the targets. Static reads of committed
JSON and a few ``git`` calls: fast. The runs after the fix are kept under ``before_score_floor/`` since
the floored calibration score's rerun overwrote them (the What-if gate rows now carry that rerun:
tests/test_whatif_gate_score_rerun.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_benchmark_docs import BENCH_DOCS
from test_whatif_gate_split import _module  # the benchmark script as a module

ROOT = Path(__file__).resolve().parents[1]
OUT = BENCH_DOCS / "whatif_gate"
#: the runs after the fix (kept as they were when the floored score's rerun overwrote them)
AFTER = OUT / "before_score_floor"
PAGE = OUT / "README.md"
#: the commit this work started from, where the files under before_noise_fix/ were the committed runs
BASE = "51e038e"


def _bench(name: str) -> Any:
    """The module ``benchmarks/<name>.py`` (the benchmarks' helpers import each other by bare name)."""
    import importlib
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def _nr() -> Any:
    return _bench("_whatif_noise_rerun")


def _load(rel: str, before: bool = False) -> dict[str, Any]:
    return json.loads(((OUT / "before_noise_fix" / rel) if before else (AFTER / rel)).read_text())


def _subsection() -> str:
    m = re.search(r"^### After the members' noise fix \(issue 44\)\n.*?(?=^### |^## |\Z)", PAGE.read_text(), re.S | re.M)
    assert m, "the page has no subsection 'After the members' noise fix (issue 44)'"
    return m.group(0)


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)


def _history() -> None:
    if shutil.which("git") is None or _git("rev-parse", "--verify", "--quiet", f"{BASE}^{{commit}}").returncode:
        pytest.skip(f"git history with {BASE} unavailable")
    if _git("rev-parse", "--verify", "--quiet", f"{_nr().FIX_COMMIT}^{{commit}}").returncode:
        pytest.skip("the fix's commit is not in this history")


SEED_FILES = [f"seeds/random_seed{s}.json" for s in range(6)] + [f"seeds/production_seed{s}.json" for s in (3, 4, 5)]
POOLS = {
    "seeds/pooled_random.json": [f"seeds/random_seed{s}.json" for s in (0, 1, 2)],
    "seeds/pooled_random_heldout.json": [f"seeds/random_seed{s}.json" for s in (3, 4, 5)],
    "seeds/pooled_random_all.json": [f"seeds/random_seed{s}.json" for s in range(6)],
    "seeds/pooled_production_heldout.json": [f"seeds/production_seed{s}.json" for s in (3, 4, 5)],
    "seeds/held9/pooled_random.json": [f"seeds/held9/random_seed{s}.json" for s in (3, 4, 5)],
}


def test_the_before_copies_are_the_committed_runs_of_the_code_before_the_fix() -> None:
    """Each kept copy is byte for byte the file committed at `BASE`, last written by a commit that does
    not contain the fix (the seeds 0-5 pool of them is new: checked as a pool below)."""
    _history()
    fix = _nr().FIX_COMMIT
    copies = sorted(p.relative_to(OUT / "before_noise_fix").as_posix() for p in (OUT / "before_noise_fix").rglob("*.json"))
    assert "seeds/random_seed0.json" in copies and "seeds/held9/pooled_random.json" in copies
    for rel in copies:
        if rel == "seeds/pooled_random_all.json":
            continue
        shown = _git("show", f"{BASE}:docs/benchmarks/whatif_gate/{rel}")
        assert shown.returncode == 0, rel
        assert (OUT / "before_noise_fix" / rel).read_text() == shown.stdout, f"{rel} is not the file at {BASE}"
        last = _git("log", "-1", "--format=%H", BASE, "--", f"docs/benchmarks/whatif_gate/{rel}").stdout.strip()
        assert last and _git("merge-base", "--is-ancestor", fix, last).returncode != 0, f"{rel}: written after {fix}"


@pytest.mark.parametrize("before", [False, True], ids=["after", "before"])
def test_every_pool_is_the_pool_of_its_seed_files(before: bool) -> None:
    wg = _module()
    base = OUT / "before_noise_fix" if before else AFTER
    for pool, files in POOLS.items():
        stored = _load(pool, before)
        again = wg.pool_seeds([base / f for f in files])
        assert [Path(f).name for f in stored["files"]] == [Path(f).name for f in files], pool
        for k in ("pairs", "confident_pairs", "confident_agreed", "abstention", "coverage_90", "median_interval_width"):
            assert again[k] == pytest.approx(stored[k]), (pool, k)
        assert again["declared_kpis"]["coverage"] == pytest.approx(stored["declared_kpis"]["coverage"]), pool
        if "seed" in (stored["declared_kpis"]["findings"] or [{"seed": 0}])[0]:  # pools written since findings name their seed
            assert [(f["seed"], f["policy"], f["kpi"]) for f in again["declared_kpis"]["findings"]] == [
                (f["seed"], f["policy"], f["kpi"]) for f in stored["declared_kpis"]["findings"]], pool


def _rerun_files() -> list[str]:
    nr = _nr()
    return [rel for rel in [*SEED_FILES, "results_random.json", "results_production.json",
                            *(f"seeds/held9/random_seed{s}.json" for s in (3, 4, 5))] if nr.rerun(OUT, rel)]


def test_a_rerun_is_the_same_experiment_with_another_twin() -> None:
    """Same seed, logs, candidates and cluster days: the cluster's change of every fixed candidate is the
    same number before and after; the twin's changes moved (the members' noise tables differ). The PPO
    policy is retrained in the new twin, so its cluster change may move."""
    rerun = _rerun_files()
    assert {f"seeds/random_seed{s}.json" for s in range(6)} <= set(rerun), "the headline seeds were rerun"
    for rel in rerun:
        a, b = _load(rel), _load(rel, True)
        for k in ("logging", "quick", "method", "calibrate_on", "seed"):
            assert a.get(k) == b.get(k), (rel, k)
        assert a.get("held_days", 3) == b.get("held_days", 3), rel  # runs before --held-days had 3
        assert [(r["policy"], r["kpi"]) for r in a["rows"]] == [(r["policy"], r["kpi"]) for r in b["rows"]], rel
        fixed = [(x, y) for x, y in zip(a["rows"], b["rows"], strict=True) if x["policy"] != "PPO trained in the twin"]
        assert all(x["real_change"] == pytest.approx(y["real_change"], rel=1e-9, abs=1e-12) for x, y in fixed), rel
        assert any(x["twin_change"] != y["twin_change"] for x, y in fixed), f"{rel}: the twin did not change"


def test_the_pages_run_is_seed_0() -> None:
    """The page's headline row (`results_random.json`) is the seeds table's seed 0: the same rows."""
    before = not _nr().rerun(OUT, "results_random.json")  # not rerun: the runs before the fix, the same pair
    a, s0 = _load("results_random.json"), _load("seeds/random_seed0.json", before)
    assert [(r["policy"], r["kpi"], r["interval"], r["real_change"]) for r in a["rows"]] == [
        (r["policy"], r["kpi"], r["interval"], r["real_change"]) for r in s0["rows"]]


def test_the_subsection_is_rendered_from_the_files() -> None:
    assert _subsection().rstrip() == _nr().noise_fix_section(OUT).rstrip()


def _declared(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = {"kpi.task_time_ms", "kpi.slo_violation", "kpi.energy_j", "kpi.carbon_g", "kpi.revenue"}
    return [r for r in rows if r["kpi"] in names]


def _from_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The headline recomputed from the rows, without the benchmark's functions."""
    import numpy as np

    conf = [r for r in rows if r["agree"] is not None]
    dec = _declared(rows)
    return {"agreed": sum(bool(r["agree"]) for r in conf), "confident": len(conf), "pairs": len(rows),
            "abstention": 1 - len(conf) / len(rows), "coverage": sum(r["covered"] for r in rows) / len(rows),
            "declared_n": len(dec), "declared_coverage": sum(r["covered"] for r in dec) / len(dec),
            "error": float(np.median([abs(100 * (r["twin_change"] - r["real_change"])) for r in dec]))}


def _cells(h: dict[str, Any]) -> str:
    return (f"{h['agreed']} of {h['confident']} ({100 * h['agreed'] / h['confident']:.1f} %) | {100 * h['abstention']:.1f} % | "
            f"{100 * h['coverage']:.1f} % of {h['pairs']} | {100 * h['declared_coverage']:.1f} % of {h['declared_n']} | "
            f"{h['error']:.1f}")


def _block(sub: str, head: str) -> list[str]:
    """The table of ``sub`` whose header line starts with ``| {head}``."""
    lines = sub.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {head}"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def test_the_per_seed_lines_are_the_rows() -> None:
    sub = _subsection()
    blocks = {"random": _block(sub, "random logs, quick: before → after"),
              "production": _block(sub, "production-like logs, quick: before → after")}
    for rel in SEED_FILES:
        d = _load(rel)
        before, after = _from_rows(_load(rel, True)["rows"]), _from_rows(d["rows"])
        line = next(ln for ln in blocks[d["logging"]] if re.match(rf"\| seed {d['seed']}[ |]", ln))
        want = " | ".join(f"{x} → **{y}**" for x, y in zip(_cells(before).split(" | "), _cells(after).split(" | "),
                                                           strict=True))
        assert want in line, (rel, line, want)


def test_the_pooled_lines_and_the_targets_are_the_rows() -> None:
    """Seeds 0-5 pooled, from the six files' rows: the counts, their Clopper-Pearson intervals and the
    met / missed the page gives each target."""
    from scipy.stats import binomtest

    sub = " ".join(_subsection().split())
    rows = {b: [r for s in range(6) for r in _load(f"seeds/random_seed{s}.json", b)["rows"]] for b in (False, True)}
    h, hb = _from_rows(rows[False]), _from_rows(rows[True])
    ci = binomtest(h["agreed"], h["confident"]).proportion_ci(0.90, method="exact")
    agreement = h["agreed"] / h["confident"]
    said = "met" if agreement >= 0.95 else "missed"
    assert (f"confident agreement {100 * agreement:.1f} % ({h['agreed']} of {h['confident']}, CP 90 %: "
            f"{100 * ci.low:.0f}-{100 * ci.high:.0f} %; before {100 * hb['agreed'] / hb['confident']:.1f} %) **{said}**") in sub
    said = "met" if h["abstention"] <= 0.30 else "missed"
    assert f"abstention {100 * h['abstention']:.1f} % (before {100 * hb['abstention']:.1f} %) **{said}**" in sub
    said = "met" if h["declared_coverage"] >= 0.90 else "missed"
    assert (f"declared-KPI change coverage {100 * h['declared_coverage']:.1f} % of {h['declared_n']} (before "
            f"{100 * hb['declared_coverage']:.1f} %) **{said}**") in sub
    said = "met" if h["error"] <= 10 else "missed"
    assert f"change error {h['error']:.1f} points (before {hb['error']:.1f}) **{said}**" in sub
    # the direction sentence: a pooled rate that fell is listed as worse (agreement and coverage: higher is better)
    m = re.search(r"Which way the fix moved the pooled headline \(seeds 0-5\): worse: (.*?); better:", sub)
    assert m, "no direction sentence"
    worse = moved = m.group(1)
    for name, b, a in (("confident agreement", hb["agreed"] / hb["confident"], agreement),
                       ("declared-KPI change coverage", hb["declared_coverage"], h["declared_coverage"])):
        said = f"{name} {100 * b:.1f} % → {100 * a:.1f} %"
        assert (said in worse) == (round(100 * a, 1) < round(100 * b, 1)), (name, moved)
    k = round(h["declared_coverage"] * h["declared_n"])
    ci = binomtest(k, h["declared_n"]).proportion_ci(0.90, method="exact")
    assert (f"**{100 * h['declared_coverage']:.1f} % (CP 90 %: {100 * ci.low:.0f}-{100 * ci.high:.0f} %) of "
            f"{h['declared_n']}**") in sub


def test_every_declared_miss_is_a_finding() -> None:
    """Every declared (seed, candidate, KPI) change outside the twin's interval after the fix is listed,
    with the cluster's and the twin's change, and whether it was missed before; none more."""
    sub = _subsection()
    misses, before = [], set()
    for s in range(6):
        misses += [(s, r) for r in _declared(_load(f"seeds/random_seed{s}.json")["rows"]) if not r["covered"]]
        before |= {(s, r["policy"], r["kpi"]) for r in _declared(_load(f"seeds/random_seed{s}.json", True)["rows"])
                   if not r["covered"]}
    start = sub.index("The findings, after the fix")
    table = sub[start:sub.index("\n\n", sub.index("|---", start))]
    listed = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| seed")]
    assert len(listed) == len(misses) and f"the {len(misses)} declared-KPI changes" in sub
    for s, r in misses:
        lo, hi = r["interval"]
        cell = (f"| {s} | {r['policy']} | {r['kpi']} | {100 * r['real_change']:+.1f} % | {100 * r['twin_change']:+.1f} % "
                f"[{100 * lo:+.1f}, {100 * hi:+.1f}] |")
        line = next((ln for ln in listed if ln.startswith(cell)), None)
        assert line, cell
        assert line.endswith(f"| {'yes' if (s, r['policy'], r['kpi']) in before else 'no'} |"), line
    now = {(s, r["policy"], r["kpi"]) for s, r in misses}
    assert f"({len(before)} before; {len(now & before)} missed both times, {len(now - before)} new" in sub


def test_the_confident_errors_are_listed() -> None:
    sub = _subsection()
    wrong = [(s, r) for s in range(6) for r in _load(f"seeds/random_seed{s}.json")["rows"] if r["agree"] is False]
    wrong_b = [r for s in range(6) for r in _load(f"seeds/random_seed{s}.json", True)["rows"] if r["agree"] is False]
    assert f"seeds 0-5: {len(wrong)} after the fix ({len(wrong_b)} before)" in sub
    for s, r in wrong:
        assert f"| {s} | {r['policy']} | {r['kpi']} |" in sub


def test_a_changed_number_is_caught() -> None:
    """The renderer reads the files: a different rate in a file (after the fix: under before_score_floor/)
    changes the cells and the subsection (so the equality checks above would fail on a stale page)."""
    import copy as _copy
    import tempfile

    nr = _nr()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shutil.copytree(OUT, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.png"))
        d = _copy.deepcopy(_load("seeds/pooled_random_heldout.json"))
        d["abstention"] = 0.5
        (root / "before_score_floor" / "seeds" / "pooled_random_heldout.json").write_text(json.dumps(d))
        cells = nr.at_a_glance_cells(root)
        assert cells["whatif_gate/seeds/pooled_random_heldout.json:abstention"][0].startswith("50.0 %")
        assert cells != nr.at_a_glance_cells(OUT)
        d = _copy.deepcopy(_load("seeds/pooled_random_all.json"))
        d["abstention"] = 0.5
        (root / "before_score_floor" / "seeds" / "pooled_random_all.json").write_text(json.dumps(d))
        assert nr.noise_fix_section(root) != nr.noise_fix_section(OUT)
