"""The at-a-glance table does not pass off numbers measured under the emulated cluster's old reward.

Commit bd3f855 made the emulated cluster's reward (`edgetwin.emulator.cluster.REWARD_WEIGHTS`, what
`EdgeCluster` pays per agent-step, what its logs' ``reward`` column holds, what a twin's spec scores
and what PPO trained on either maximises) the operator's multi-objective over revenue, offload, SLO
violations, task time, energy and carbon; before it the reward was the offload ratio minus half the
SLO violations. A benchmark JSON file written before that commit whose number is a return, a rank
correlation of returns, or a KPI of a policy trained on that reward no longer says what the code
does (rerun under the new reward, the causal twin's quick mode gave c3's ρ 0.39 where its old JSON said 0.946).

`STALE` lists those files; every table line citing one must say "unverified". Where git history is
available, each listed file's last commit must still predate the change (rerunning the benchmark and
committing its JSON forces removing it from the list, and the line its verdict back), and every other
cited file written before the change whose benchmark imports the emulator and speaks of a reward or
return must be argued independent of the reward in `INDEPENDENT`. The same holds field by field
(`STALE_FIELDS`, `INDEPENDENT_FIELDS`) for a file rewritten after the change that still carries,
unchanged, a run from before it. Static checks and a few ``git`` calls: fast.
"""

from __future__ import annotations

import ast
import functools
import io
import json
import re
import shlex
import shutil
import subprocess
import tokenize
from collections.abc import Iterable
from pathlib import Path

import pytest
from test_benchmark_docs import BENCH_DOCS, ROOT, code, field, table_lines

#: the commit that made the emulated cluster's reward the operator's multi-objective
REWARD_CHANGE = "bd3f855"

#: JSON files (under docs/benchmarks/) measured before `REWARD_CHANGE` whose cited numbers depend on
#: the emulated cluster's reward; the file and function that decide it
STALE: dict[str, str] = {
    "causal_twin/results.json": "causal_twin.py policy_rows: the policies' mean `reward` on the cluster vs the "
    "causal twin's, whose spec is cluster_spec (REWARD_WEIGHTS)",
}

#: JSON files written before `REWARD_CHANGE`, cited by a line whose benchmark imports the emulator and
#: mentions a reward or return, whose cited number does not depend on the emulated cluster's reward
INDEPENDENT: dict[str, str] = {
    "emulated_cluster/results.json": "emulator_throughput.py time_batch: wall time of EdgeCluster.step; the reward "
    "is a weighted sum of columns already computed (6 terms instead of 2), not the value timed",
    "table1/cluster.json": "table1_population.py: KL of generated vs real agent profiles; profiles come from "
    "generate_logs' population, not from any reward",
    "edge_runtime/results.json": "edge_latency.py: decision latency of an exported, untrained PPO (no learn()); "
    "the reward only exists in the env it was built on",
    "prometheus_import/results.json": "prometheus_import.py: import time over Parquet read time of the same "
    "rows; the reward is one more column",
    "twin_update/results.json": "twin_update.py: Twin.update time over a refit's on the same rows; the canary "
    "guards kpi.slo_violation, the logging policy is the SLO-aware heuristic, neither reads the reward",
    "erlfc/results.json": "erlfc.py: its own DAG federation (emulator.dag) and reward (dag.logs.erlfc_reward), "
    "not EdgeCluster's",
    "mafl/mafl_scale.json": "mafl_scale.py: ForecastLearner, whose 'reward' is forecast R² on site_series "
    "(SLO-aware heuristic's telemetry); no cluster reward",
    "heuristics_vs_rl/results.json": "heuristics_vs_rl.py: the cited PPO trains on its own wa3c_reward "
    "(MultiObjectiveReward replaces the twin's reward fn) and every policy is scored with it; the twin is fit "
    "on random-policy logs, whose columns do not depend on the reward",
    "energy_carbon/results.json": "energy_carbon.py: the carbon-aware PPO trains on its own energy-saver "
    "MultiObjectiveReward; the number is an energy ratio on the cluster",
    "causal_twin/results_second_system.json": "causal_twin_second_system.py: its own admission-control system "
    "(emulator.admission, reward goodput - 0.4 x premium cost); no EdgeCluster",
}

#: Fields of files rewritten after `REWARD_CHANGE` that still hold a run from before it (a later run
#: merged other keys into the file): "file:field" -> (the field's path before the change, reason).
#: A line citing the field or a field under it must be unverified.
STALE_FIELDS: dict[str, tuple[str, str]] = {}

#: Fields cited by a line whose benchmark imports the emulator and speaks of a reward, in files rewritten
#: after `REWARD_CHANGE`, whose value equals the last one before it, yet that do not depend on the reward
INDEPENDENT_FIELDS: dict[str, str] = {
    "whatif_gate/results_production.json:confident_agreement": "rerun after bd3f855 (abstention 90.1 % -> 94.9 %) and "
    "after issue 44's noise fix 27a9416 (94.9 % -> 95.7 %, 5 confident verdicts) and on its floored calibration score "
    "6e30163 (95.7 %, the same 5); all confident verdicts right, 100 % every time",
    "scale/results.json:extra_runs": "scale.py --append: wall time and memory of a 1M-row Twin.fit, which learns the "
    "outputs and computes the reward from the spec's weights, not from the logs' reward",
    "closed_loop/results_production.json:coverage_experiment": "closed_loop.py coverage_experiment: canaries simulated "
    "on the emulator's per-group SLO-violation rates (one KPIMargin on kpi.slo_violation); no reward, no twin",
    "closed_loop/results_production.json:twin_canary.rounds_over_budget": "rerun on cap48 (24 rounds, 0b73985's run "
    "had 18) and on judge48 (27 rounds, the stopped-day rule): 0 every time because the edge's loss-budget stop ends "
    "a round before one more tick would pass the cap",
}

ROWS = table_lines()
VERDICT = re.compile(r"unverified: measured at ([0-9a-f]{7,40}) \((\d{4}-\d{2}-\d{2})\), before the emulated "
                     r"cluster's reward became the operator's multi-objective \(" + REWARD_CHANGE + r"\); not rerun since")  # fmt: skip


def source_file(row: list[str]) -> str:
    """The JSON file (relative to docs/benchmarks/) a table line's source cell names."""
    return code(row[6]).partition(":")[0]


def source_field(row: list[str]) -> str:
    """``file:field`` of a line's source (the first field of a ratio, without a scale factor)."""
    file, _, expr = re.sub(r"\s*[×÷]\s*[\d.]+$", "", code(row[6])).partition(":")
    return f"{file}:{expr.split(' / ')[0].strip()}"


def listed_under(key: str, listed: Iterable[str]) -> str | None:
    """The entry of ``listed`` (``file:field``) that ``key`` is or lies under, or None."""
    for entry in listed:
        if key == entry or key.startswith(entry + ".") or key.startswith(entry + "["):
            return entry
    return None


def script_of(row: list[str]) -> Path:
    return ROOT / shlex.split(code(row[5]))[1]


@functools.cache
def emulator_and_reward(script: Path) -> tuple[bool, bool]:
    """Whether ``script`` or a benchmarks/ helper it imports imports ``edgetwin.emulator``, and whether
    one mentions a reward or return in a name, string or comment (the keyword ``return`` is not one),
    or trains a policy (``train_policy``, PPO, A2C: trained on the spec's reward unless told otherwise;
    table2_generalisation.py names no reward at all)."""
    return _scan(script, set())


def _scan(script: Path, seen: set[Path]) -> tuple[bool, bool]:
    seen.add(script)
    text = script.read_text()
    emulator = False
    words = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.STRING, tokenize.COMMENT) or (
            tok.type == tokenize.NAME and tok.string != "return"
        ):
            words.append(tok.string)
    mentions = bool(re.search(r"reward|return|train_policy|\bPPO\b|\bA2C\b", " ".join(words), re.I))
    for node in ast.walk(ast.parse(text)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])  # fmt: skip
        for name in names:
            emulator |= name == "edgetwin.emulator" or name.startswith("edgetwin.emulator.")
            helper = script.parent / f"{name}.py"
            if helper.is_file() and helper not in seen:
                e, m = _scan(helper, seen)
                emulator, mentions = emulator or e, mentions or m
    return emulator, mentions


def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)


@functools.cache
def history_unavailable() -> str | None:
    """Why the git checks cannot run here, or None (a source tarball, a shallow clone)."""
    if shutil.which("git") is None:
        return "no git executable"
    if git("rev-parse", "--is-inside-work-tree").stdout.strip() != "true":
        return "not a git checkout"
    if git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        return "a shallow clone: the last commit of a file may lie beyond its boundary"
    if git("rev-parse", "--verify", "--quiet", f"{REWARD_CHANGE}^{{commit}}").returncode != 0:
        return f"{REWARD_CHANGE} is not in this history"
    return None


@functools.cache
def last_written(file: str) -> tuple[str, str, bool] | None:
    """(full hash, date YYYY-MM-DD, after `REWARD_CHANGE`) of the last commit of docs/benchmarks/<file>;
    an uncommitted rewrite counts as after; None if git has never seen the file."""
    path = f"docs/benchmarks/{file}"
    if git("status", "--porcelain", "--", path).stdout.strip():
        return "", "", True
    out = git("log", "-1", "--format=%H %cs", "--", path).stdout.split()
    if not out:
        return None
    commit, date = out
    after = git("merge-base", "--is-ancestor", REWARD_CHANGE, commit).returncode == 0
    return commit, date, after


def value_at(commit: str, key: str) -> object:
    """The value of ``file:field`` in the file as committed at ``commit`` (None if absent there)."""
    file, _, path = key.partition(":")
    shown = git("show", f"{commit}:docs/benchmarks/{file}")
    if shown.returncode != 0:
        return None
    try:
        return field(json.loads(shown.stdout), path)
    except AssertionError:
        return None


def need_history() -> None:
    why = history_unavailable()
    if why is not None:
        pytest.skip(f"git history unavailable: {why}")


def test_the_lists_name_cited_files_once() -> None:
    cited = {source_file(r) for r in ROWS}
    assert not set(STALE) & set(INDEPENDENT), sorted(set(STALE) & set(INDEPENDENT))
    for file in [*STALE, *INDEPENDENT]:
        assert (BENCH_DOCS / file).is_file(), f"no file docs/benchmarks/{file}"
        assert file in cited, f"{file} is listed but no at-a-glance line cites it: drop it from the list"
    keys = [source_field(r) for r in ROWS]
    for entry in [*STALE_FIELDS, *INDEPENDENT_FIELDS]:
        assert any(listed_under(k, [entry]) for k in keys), f"no at-a-glance line cites {entry}: drop it"


def stale_reason(row: list[str]) -> str | None:
    """Why the line's number predates the reward change (`STALE` or `STALE_FIELDS`), or None."""
    if source_file(row) in STALE:
        return STALE[source_file(row)]
    entry = listed_under(source_field(row), STALE_FIELDS)
    return None if entry is None else STALE_FIELDS[entry][1]


@pytest.mark.parametrize("row", [r for r in ROWS if stale_reason(r)], ids=lambda r: r[0][:50])
def test_a_line_citing_a_stale_file_is_unverified(row: list[str]) -> None:
    verdict = row[4]
    assert verdict.startswith("unverified"), (
        f"{row[0][:60]}: cites {source_field(row)}, measured before {REWARD_CHANGE} changed the cluster's reward "
        f"({stale_reason(row)}), yet its verdict is {verdict[:40]!r}"
    )
    assert VERDICT.match(verdict), (
        f"{row[0][:60]}: the verdict should read {VERDICT.pattern!r}, not {verdict!r}"
    )


def test_only_stale_files_carry_the_stale_verdict() -> None:
    """A file rerun and dropped from `STALE` must get its met / missed verdict back."""
    for row in ROWS:
        if VERDICT.match(row[4]):
            assert stale_reason(row), (
                f"{row[0][:60]}: says measured before {REWARD_CHANGE}, but {source_field(row)} is in neither "
                f"STALE nor STALE_FIELDS"
            )


@pytest.mark.parametrize("file", sorted(STALE))
def test_a_stale_file_still_predates_the_reward_change(file: str) -> None:
    need_history()
    seen = last_written(file)
    assert seen is not None, f"git has no commit of docs/benchmarks/{file}"
    commit, date, after = seen
    assert not after, (f"docs/benchmarks/{file} was rewritten after {REWARD_CHANGE} ({commit[:7] or 'uncommitted'}): "
                       f"remove it from STALE and give its lines a met / missed verdict")  # fmt: skip
    for row in ROWS:
        if source_file(row) == file:
            m = VERDICT.match(row[4])
            assert m and commit.startswith(m.group(1)) and m.group(2) == date, (
                f"{row[0][:60]}: the verdict should name {commit[:7]} ({date}), the last commit of {file}"
            )


def test_every_file_measured_before_the_change_on_the_emulator_reward_is_listed() -> None:
    need_history()
    unexplained = []
    for row in ROWS:
        file = source_file(row)
        if file in STALE or file in INDEPENDENT:
            continue
        seen = last_written(file)
        if seen is None or seen[2]:
            continue
        emulator, mentions = emulator_and_reward(script_of(row))
        if emulator and mentions:
            unexplained.append(f"{file} ({seen[0][:7]}, {seen[1]}; {script_of(row).name})")
    assert not unexplained, (
        f"written before {REWARD_CHANGE}, cited by a line whose benchmark imports edgetwin.emulator and speaks of a "
        f"reward or return: put each in STALE (and mark its lines unverified) or argue it in INDEPENDENT: "
        f"{sorted(set(unexplained))}"
    )


def test_a_stale_field_still_holds_its_run_from_before_the_reward_change() -> None:
    """Rerunning a listed run changes the value: then drop it from `STALE_FIELDS` (one test over the entries, so
    an empty list is a passing check, not a skipped parametrisation)."""
    if STALE_FIELDS:
        need_history()
    for key in sorted(STALE_FIELDS):
        old_path = STALE_FIELDS[key][0]
        file, _, path = key.partition(":")
        for row in ROWS:
            here = source_field(row)
            if listed_under(here, [key]) is None:
                continue
            m = VERDICT.match(row[4])
            assert m, f"{row[0][:60]}: not unverified"
            commit = git("rev-parse", "--verify", "--quiet", f"{m.group(1)}^{{commit}}").stdout.strip()
            assert commit, f"{row[0][:60]}: names {m.group(1)}, which is not a commit here"
            assert git("merge-base", "--is-ancestor", REWARD_CHANGE, commit).returncode != 0, (
                f"{row[0][:60]}: names {m.group(1)}, which comes after {REWARD_CHANGE}")
            before = value_at(commit, file + ":" + old_path + here.partition(":")[2][len(path):])
            now = field(json.loads((BENCH_DOCS / file).read_text()), here.partition(":")[2])
            assert before is not None and before == now, (
                f"{here} is {now!r}, not the {before!r} it held at {m.group(1)}: it was rerun; remove {key} from "
                f"STALE_FIELDS and give its lines a met / missed verdict")


def test_every_field_unchanged_across_the_change_on_the_emulator_reward_is_listed() -> None:
    """A file rewritten after the change may still carry, unchanged, a field of a run from before it."""
    need_history()
    unexplained = []
    for row in ROWS:
        file, key = source_file(row), source_field(row)
        seen = last_written(file)
        if file in STALE or file in INDEPENDENT or seen is None or not seen[2]:
            continue
        if listed_under(key, STALE_FIELDS) or listed_under(key, INDEPENDENT_FIELDS):
            continue
        if not all(emulator_and_reward(script_of(row))):
            continue
        before = git("log", "-1", "--format=%H", REWARD_CHANGE, "--", f"docs/benchmarks/{file}").stdout.strip()
        old = value_at(before, key) if before else None
        if old is not None and old == field(json.loads((BENCH_DOCS / file).read_text()), key.partition(":")[2]):
            unexplained.append(f"{key} (as at {before[:7]})")
    assert not unexplained, (
        f"cited fields of files rewritten after {REWARD_CHANGE} that hold the value they had before it, from "
        f"benchmarks on the emulator's reward: put each in STALE_FIELDS (and mark its lines unverified) or argue "
        f"it in INDEPENDENT_FIELDS: {sorted(set(unexplained))}"
    )


def test_the_scan_sees_the_emulator_and_the_reward(tmp_path: Path) -> None:
    """The scan behind the last check: through a helper module, and not fooled by the ``return`` keyword."""
    bench = ROOT / "benchmarks"
    # the emulator through _policy_bench; no reward named, but train_policy
    assert emulator_and_reward(bench / "table2_generalisation.py") == (True, True)
    assert emulator_and_reward(bench / "bench_validate.py")[0] is False
    assert emulator_and_reward(bench / "causal_twin_second_system.py")[0] is True  # via causal_twin
    (tmp_path / "_helper.py").write_text("from edgetwin.emulator.cluster import EdgeCluster\n")
    (tmp_path / "bench.py").write_text("import _helper\n\n\ndef f() -> int:\n    return 1\n")
    assert _scan(tmp_path / "bench.py", set()) == (True, False)
    (tmp_path / "bench.py").write_text(
        "import _helper\n\n\ndef f() -> int:\n    return 1  # the mean reward\n"
    )
    assert _scan(tmp_path / "bench.py", set()) == (True, True)


def test_no_code_text_describes_the_old_reward_as_the_clusters() -> None:
    """Benchmark scripts write their pages from their own text: a script still calling the cluster's
    reward "offload ratio − 0.5 SLO violations" would print the old reward beside a new run."""
    old = re.compile(r"offload ratio\s*[-−]\s*(?:0\.5|half)|plain reward \(offload", re.I)
    said = [f"{p.relative_to(ROOT)}:{i}" for p in sorted([*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "edgetwin").rglob("*.py")])
            for i, line in enumerate(p.read_text().splitlines(), 1) if old.search(line)]  # fmt: skip
    assert not said, f"the cluster's reward is REWARD_WEIGHTS since {REWARD_CHANGE}; old description at {said}"


def test_the_readme_says_its_causal_twin_numbers_predate_the_reward_change() -> None:
    """While the causal-twin mid run's JSON is stale, the README's sentence quoting it says when it was measured;
    the quick run (rerun under today's reward) is quoted from its JSON: the three twins' rho, the truth's own
    floor, the day-to-day sd ratio, and the calibrated interval's coverage and width."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    caveat = "measured on 2026-11-27 before the emulated cluster's reward became the operator's multi-objective (bd3f855)"
    assert (caveat in readme) == ("causal_twin/results.json" in STALE)
    assert "causal_twin/quick/results.json" not in STALE
    quick = json.loads((ROOT / "docs/benchmarks/causal_twin/quick/results.json").read_text())
    c3, nf = quick["results"]["c3"], quick["noise_floor"]
    rho = {m: c3[m]["generated"]["spearman"] for m in ("causal", "today", "supervised")}
    assert (f"causal twin gets ρ {rho['causal']:.2f}, the MAIL twin {rho['today']:.2f} and the supervised baseline "
            f"{rho['supervised']:.2f}, while the truth ranks them at ρ {nf['spearman_median']:.2f} against itself") in readme
    assert f"a policy's day-to-day sd is {nf['day_sd_over_policy_spread']:.1f}x the spread" in readme
    g = c3["causal"]["generated"]
    assert g["coverage_90"] == 1.0 and "they cover all 12 real values" in readme
    assert f"the bare bootstrap covers {100 * g['coverage_90_plain']:.0f} %" in readme
    reals = [p["real"] for p in quick["policies"]["c3/causal"]]
    span = max(reals) - min(reals)
    assert f"(median {g['median_width']:.2f}, {g['median_width'] / span:.1f}x the policies' spread" in readme
