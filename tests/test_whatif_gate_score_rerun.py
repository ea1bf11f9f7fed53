"""The what-if gate rerun on the floored calibration score (issue 44): the page's subsection "The calibration
score floored at the KPI's scale (issue 44)" and the What-if gate rows of the at-a-glance table say what the
rerun's JSON files and the kept copies of the runs before it hold.

The rendered text equals what `_whatif_score_rerun` renders from the files, and, independently of that
renderer, the numbers the change was for (the return and reward checks decided) recomputed here from the
runs' rows appear on the page; the rerun is the same experiment (same twins, candidates and cluster days:
the twin's point changes and the cluster's changes are the same numbers, only the intervals moved). Static
reads of committed JSON and a few ``git`` calls: fast."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_benchmark_docs import BENCH_DOCS, table_lines
from test_whatif_gate_noise_rerun import POOLS, _bench, _git
from test_whatif_gate_noise_rerun import SEED_FILES as NOISE_SEED_FILES
from test_whatif_gate_split import _module  # the benchmark script as a module

ROOT = Path(__file__).resolve().parents[1]
OUT = BENCH_DOCS / "whatif_gate"
PAGE = OUT / "README.md"
BEFORE = OUT / "before_score_floor"


def _sr() -> Any:
    return _bench("_whatif_score_rerun")


def _load(rel: str, before: bool = False) -> dict[str, Any]:
    return json.loads(((BEFORE / rel) if before else (OUT / rel)).read_text())


def _subsection() -> str:
    m = re.search(r"^### The calibration score floored at the KPI's scale \(issue 44\)\n.*?(?=^### |^## |\Z)",
                  PAGE.read_text(), re.S | re.M)
    assert m, "the page has no subsection on the floored calibration score"
    return m.group(0)


SEED_FILES = [*NOISE_SEED_FILES, *(f"seeds/held9/random_seed{s}.json" for s in (3, 4, 5))]


def test_the_before_copies_are_the_runs_committed_with_the_score_change() -> None:
    """Each kept copy is byte for byte the file as it was at the score's commit (the runs of the code before it)."""
    commit = _sr().SCORE_COMMIT
    if shutil.which("git") is None or _git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}").returncode:
        pytest.skip(f"git history with {commit} unavailable")
    copies = sorted(p.relative_to(BEFORE).as_posix() for p in BEFORE.rglob("*.json"))
    assert set(SEED_FILES) <= set(copies) and set(POOLS) <= set(copies)
    for rel in copies:
        shown = _git("show", f"{commit}:docs/benchmarks/whatif_gate/{rel}")
        assert shown.returncode == 0, rel
        assert (BEFORE / rel).read_text() == shown.stdout, f"{rel} is not the file at {commit}"


def test_every_pool_is_the_pool_of_its_seed_files() -> None:
    wg = _module()
    for pool, files in POOLS.items():
        stored = _load(pool)
        again = wg.pool_seeds([OUT / f for f in files])
        assert [Path(f).name for f in stored["files"]] == [Path(f).name for f in files], pool
        for k in ("pairs", "confident_pairs", "confident_agreed", "abstention", "coverage_90", "median_interval_width"):
            assert again[k] == pytest.approx(stored[k]), (pool, k)
        assert again["declared_kpis"]["coverage"] == pytest.approx(stored["declared_kpis"]["coverage"]), pool


def test_the_rerun_is_the_same_experiment_with_other_intervals() -> None:
    """Same seeds, twins, candidates and cluster days: the twin's point change and the cluster's change of
    every (candidate, KPI) are the same numbers before and after; only the intervals moved, the return's
    most (its calibrated error no longer divides by a near-zero level)."""
    sr = _sr()
    rerun = [rel for rel in [*SEED_FILES, "results_random.json", "results_production.json"] if sr.rerun(OUT, rel)]
    assert {f"seeds/random_seed{s}.json" for s in range(3)} <= set(rerun), "the first seeds were rerun"
    moved: list[str] = []
    for rel in rerun:
        a, b = _load(rel), _load(rel, True)
        for k in ("logging", "quick", "method", "calibrate_on", "seed", "held_days"):
            assert a.get(k) == b.get(k), (rel, k)
        assert a["calibration"]["score"] == "floored" and "score" not in b["calibration"], rel
        pairs = list(zip(a["rows"], b["rows"], strict=True))
        assert all((x["policy"], x["kpi"]) == (y["policy"], y["kpi"]) for x, y in pairs), rel
        assert all(x["real_change"] == pytest.approx(y["real_change"], rel=1e-9, abs=1e-12) for x, y in pairs), rel
        assert all(x["twin_change"] == pytest.approx(y["twin_change"], rel=1e-9, abs=1e-12) for x, y in pairs), rel
        if any(x["interval"] != y["interval"] for x, y in pairs if x["kpi"] == "return"):
            moved.append(rel)
        # a KPI whose quantile the floor did not move (its twin levels far from 0 against their scale: every KPI
        # but the return and the reward here, and seed 0's return too) kept every interval
        same = [k for k, q in a["calibration"]["quantile"].items() if q == pytest.approx(b["calibration"]["quantile"].get(k))]
        assert len(same) >= 11, rel
        assert all(x["interval"] == pytest.approx(y["interval"]) for x, y in pairs if x["kpi"] in same), rel
    assert "seeds/random_seed1.json" in moved  # the seed whose return quantile read 1,094


def test_the_subsection_is_rendered_from_the_files() -> None:
    assert _subsection().rstrip() == _sr().score_section(OUT).rstrip()


def _signed(rels: list[str], before: bool) -> tuple[int, int, int]:
    """(checks, decided, right among the decided) of the return and reward, recomputed from the rows."""
    rows = [r for rel in rels for r in _load(rel, before)["rows"] if r["kpi"] in ("return", "reward")]
    dec = [r for r in rows if r["verdict"] in ("ok", "regress")]
    return len(rows), len(dec), sum(r["agree"] is True for r in dec)


def test_the_return_and_reward_checks_on_the_page_are_the_rows() -> None:
    sub = " ".join(_subsection().split())
    for label, rels in (("random logs, seeds 0-5", [f"seeds/random_seed{s}.json" for s in range(6)]),
                        ("production-like logs, seeds 3-5", [f"seeds/production_seed{s}.json" for s in (3, 4, 5)])):
        n, db, kb = _signed(rels, True)
        n2, da, ka = _signed(rels, False)
        assert n == n2
        right_b = f"{kb} of {db} right" if db else "none decided"
        right_a = f"{ka} of {da} right" if da else "none decided"
        assert f"- {label}: decided {db} → **{da}** of {n} ({right_b} → {right_a})" in sub, label
    # the floor alone (kept runs): its return and reward coverage, recomputed from the rows
    floor = OUT / "score_floor_only"
    for label, rels in (("random logs, seeds 0-5", [f"seeds/random_seed{s}.json" for s in range(6)]),
                        ("production-like logs, seeds 3-5", [f"seeds/production_seed{s}.json" for s in (3, 4, 5)])):
        cov, n = [], _signed(rels, False)[0]
        for rows in ([r for rel in rels for r in _load(rel, True)["rows"]],
                     [r for rel in rels for r in json.loads((floor / rel).read_text())["rows"]],
                     [r for rel in rels for r in _load(rel)["rows"]]):
            cov.append(sum(bool(r["covered"]) for r in rows if r["kpi"] in ("return", "reward")))
        assert f"- {label}: {cov[0]} → {cov[1]} → **{cov[2]}** of {n}" in sub, label
    # seed 1's return: the relative score read 1,094 (a day the twin put near 0); floored, finite and small
    cal, was = _load("seeds/random_seed1.json")["calibration"], _load("seeds/random_seed1.json", True)["calibration"]
    assert was["quantile"]["return"] > 1000.0 and cal["quantile"]["return"] < 10.0
    assert (f"seed 1 {100 * was['quantile']['return']:.0f} % → {100 * cal['quantile']['return']:.0f} % "
            f"(s = {cal['scale']['return']:.2f})") in sub


ROWS = [r for r in table_lines() if r[0].startswith("[What-if gate]")]


def _source(row: list[str]) -> str:
    m = re.search(r"`([^`]+)`", row[6])
    assert m
    return re.sub(r"\s*[×÷]\s*[\d.]+$", "", m.group(1))


def test_the_rows_are_rendered_from_the_files() -> None:
    """Each What-if gate row that cites a rerun file carries the renderer's numbers and verdict, and
    every file the renderer covers is cited by a row."""
    cells = _sr().at_a_glance_cells(OUT)
    cited = {_source(r) for r in ROWS}
    assert set(cells) <= cited, sorted(set(cells) - cited)
    for row in ROWS:
        src = _source(row)
        if src in cells:
            assert (row[3], row[4]) == cells[src], f"{src}: the row says {row[3]!r} / {row[4]!r}"


def test_the_rows_numbers_and_verdicts_follow_the_files() -> None:
    """Independently of the renderer: the first number of each row is its file's field (after the
    rerun), the "before" clause names the copy's value, and the verdict follows the target."""
    sr = _sr()
    targets = {"confident_agreement": (0.95, False), "abstention": (0.30, True), "declared_kpis.coverage": (0.90, False),
               "method_choice.held_out.coverage_90": (0.85, False)}
    for row in ROWS:
        src = _source(row)
        if src not in sr.nr.ROW_SOURCES:
            continue
        file, _, path = src.partition(":")
        rel = file.removeprefix("whatif_gate/")
        now, was = _load(rel), _load(rel, True)
        for part in path.split("."):
            now, was = now[part], was[part]
        assert row[3].startswith(f"{100 * now:.1f} %"), (src, row[3][:20])
        tail = row[3].split(f"{sr.FIX} ", 1)[1]
        if path == "confident_agreement":  # before: k of n
            n = _load(rel, True)["confident_pairs"]
            assert f"{round(was * n)} of {n}" in tail.split(";")[0].split(")")[0], (src, tail)
        else:
            assert tail.startswith(f"{100 * was:.1f} %"), (src, tail)
        if sr.rerun(OUT, rel):
            target, at_most = targets[path]
            assert row[4] == ("met" if (now <= target if at_most else now >= target) else "missed"), src
        else:
            assert row[4] == sr.NOT_RERUN, src


def test_a_changed_number_is_caught() -> None:
    """The renderer reads the files: a different rate in a file changes the row and the subsection."""
    import copy as _copy
    import tempfile

    sr = _sr()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shutil.copytree(OUT, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.png"))
        d = _copy.deepcopy(_load("seeds/pooled_random_all.json"))
        d["abstention"] = 0.5
        (root / "seeds" / "pooled_random_all.json").write_text(json.dumps(d))
        assert sr.score_section(root) != sr.score_section(OUT)
        d = _copy.deepcopy(_load("seeds/pooled_random_heldout.json"))
        d["abstention"] = 0.5
        (root / "seeds" / "pooled_random_heldout.json").write_text(json.dumps(d))
        cells = sr.at_a_glance_cells(root)
        assert cells["whatif_gate/seeds/pooled_random_heldout.json:abstention"][0].startswith("50.0 %")
        assert cells != sr.at_a_glance_cells(OUT)
