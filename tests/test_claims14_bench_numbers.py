"""Numbers the README and docs/log-format.md quote from benchmarks are the recorded JSON's.

Each test reads the sentence from the doc (a changed sentence fails as a changed JSON does) and
recomputes every number it states from the committed results under docs/benchmarks/: the log
validator's and the Prometheus importer's speed (docs/log-format.md) and the causal twin's paragraph
of the README (its quick run under today's reward, the mid run before it, and the second system).
Static checks only: no benchmark runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from test_benchmark_docs import script_flags

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "docs" / "benchmarks"


def _flat(path: Path) -> str:
    return " ".join(path.read_text().split())


def _json(rel: str) -> Any:
    return json.loads((BENCH / rel).read_text())


def _said(pattern: str, text: str) -> re.Match[str]:
    m = re.search(pattern, text)
    assert m, f"the sentence is gone or reworded: {pattern}"
    return m


def test_the_validators_speed_is_the_recorded_run() -> None:
    """docs/log-format.md: "a million rows validate in about 2 s from Parquet and 3 s from CSV, reading
    included (1.9 s and 3.0 s in the recorded run ...)" (`validate_s` is read + checks + quarantine)."""
    doc = _flat(ROOT / "docs/log-format.md")
    m = _said(r"a million rows validate in about (\d+) s from Parquet and (\d+) s from CSV, reading included "
              r"\(([\d.]+) s and ([\d.]+) s in the recorded run: `benchmarks/bench_validate.py`", doc)  # fmt: skip
    rows = {r["format"]: r for r in _json("validate/results.json")["rows"]}
    for fmt, about, exact in (("parquet", m.group(1), m.group(3)), ("csv", m.group(2), m.group(4))):
        assert rows[fmt]["rows"] == 1_000_000, fmt
        assert f"{rows[fmt]['validate_s']:.1f}" == exact, (fmt, rows[fmt]["validate_s"], exact)
        assert round(rows[fmt]["validate_s"]) == int(about), (fmt, rows[fmt]["validate_s"], about)


def test_the_prometheus_imports_speed_is_the_recorded_run() -> None:
    """docs/log-format.md's "How fast" paragraph: every number of the HTTP import is results.json's."""
    doc = _flat(ROOT / "docs/log-format.md")
    res = _json("prometheus_import/results.json")
    m = _said(r"a day of ([\d,]+) service groups at (\d+)-minute steps \(([\d.]+) million rows x (\d+) columns\) "
              r"imported from a real Prometheus in (\d+) s .*?\(load average (\d+)-(\d+)\): about ([\d,]+) rows/s, "
              r"(\d+)x the time of reading the same rows from Parquet and (\d+)x that of reading and validating them", doc)  # fmt: skip
    agents, minutes, mrows, cols, secs, load_lo, load_hi, rate, vs_read, vs_val = m.groups()
    assert int(agents.replace(",", "")) == res["agents"] and int(minutes) * 60 == res["step_seconds"]
    assert f"{res['rows'] / 1e6:.2f}" == mrows and int(cols) == res["value_columns"]
    assert round(res["seconds"]["import_http"]) == int(secs)
    assert (round(res["load_before"][0]), round(res["load_after"][0])) == (int(load_lo), int(load_hi))
    assert round(res["rows_per_s"]["import_http"], -2) == int(rate.replace(",", ""))
    assert round(res["import_vs_parquet_read"]) == int(vs_read)
    assert round(res["import_vs_parquet_read_validate"]) == int(vs_val)


def test_the_offline_parsers_speed_says_it_is_not_recorded() -> None:
    """The offline parser's number is from a run the JSON does not hold: the page says so while the
    JSON's ``import_offline`` is null, its command's flags are the script's, and its rate is its own
    samples over seconds."""
    doc = _flat(ROOT / "docs/log-format.md")
    res = _json("prometheus_import/results.json")
    not_recorded = "is not in the recorded run (its `import_offline` is null)" in doc
    assert not_recorded == (res["seconds"]["import_offline"] is None), "record the offline run, then quote it"
    m = _said(r"a run of `(python benchmarks/prometheus_import.py[^`]*)` on \d{4}-\d\d-\d\d, not recorded, took "
              r"(\d+) s for ([\d.]+) million samples, about ([\d,]+) samples/s", doc)  # fmt: skip
    flags = {w for w in m.group(1).split() if w.startswith("--")}
    assert "--offline" in flags and flags <= script_flags(ROOT / "benchmarks/prometheus_import.py")
    rate = float(m.group(3)) * 1e6 / float(m.group(2))
    assert abs(rate - int(m.group(4).replace(",", ""))) <= 0.05 * rate, rate


def test_the_readmes_causal_twin_numbers_are_the_benchmarks() -> None:
    """README: the causal twin's quick rerun under today's reward (log c3: three randomized rounds), the
    mid run before it (two regimes) and the second system, number by number from their JSON files."""
    readme = _flat(ROOT / "README.md")
    quick = _json("causal_twin/quick/results.json")
    c3 = quick["results"]["c3"]
    gen = {m: c3[m]["generated"] for m in ("causal", "today", "supervised")}
    m = _said(r"the causal twin gets ρ ([-\d.]+), the MAIL twin ([-\d.]+) and the supervised baseline ([-\d.]+), "
              r"while the truth ranks them at ρ ([-\d.]+) against itself \(under the multi-objective reward a "
              r"policy's day-to-day sd is ([\d.]+)x the spread of the 12 policies' means; before the change the "
              r"causal twin got ρ ([\d.]+)\)", readme)  # fmt: skip
    assert [f"{gen[k]['spearman']:.2f}" for k in ("causal", "today", "supervised")] == list(m.groups()[:3])
    assert f"{quick['noise_floor']['spearman_median']:.2f}" == m.group(4)
    assert f"{quick['noise_floor']['day_sd_over_policy_spread']:.1f}" == m.group(5)
    assert f"c3's causal twin rho {m.group(6)}" in quick["reading"]  # the run before, at 133122e

    real = np.array([p["real"] for p in quick["policies"]["c3/causal"]])
    cal, causal = c3["causal"]["calibration"], gen["causal"]
    m = _said(r"they cover all (\d+) real values where the bare bootstrap covers (\d+) %, by being as wide as the "
              r"twin's error \(median ([\d.]+), ([\d.]+)x the policies' spread; (\d+) calibration days support an "
              r"(\d+) % claim, not 90 %\)", readme)  # fmt: skip
    assert int(m.group(1)) == len(real) == 12 and causal["coverage_90"] == 1.0
    assert round(100 * causal["coverage_90_plain"]) == int(m.group(2))
    assert f"{causal['median_width']:.2f}" == m.group(3)
    assert f"{causal['median_width'] / np.ptp(real):.1f}" == m.group(4)
    assert cal["n_independent"] == int(m.group(5)) and round(100 * cal["attained_level"]) == int(m.group(6))

    mid = _json("causal_twin/results.json")["results"]["b"]
    assert "it cut the error on two logged regimes by half" in readme
    cut = mid["causal"]["generated"]["mean_rel_error"] / mid["today"]["generated"]["mean_rel_error"]
    assert 0.45 <= cut <= 0.55, cut
    second = _json("causal_twin/results_second_system.json")["results"]["b"]
    m = _said(r"the causal twin ranks better than today's \(ρ ([\d.]+) against ([\d.]+) on two regimes\) with a "
              r"larger error \((\d+) % against (\d+) %\)", readme)  # fmt: skip
    s, t = second["causal"]["generated"], second["today"]["generated"]
    assert (f"{s['spearman']:.2f}", f"{t['spearman']:.2f}") == m.groups()[:2]
    assert (round(100 * s["mean_rel_error"]), round(100 * t["mean_rel_error"])) == tuple(map(int, m.groups()[2:]))
