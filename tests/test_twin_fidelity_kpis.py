"""benchmarks/twin_fidelity.py's per-KPI change check (issue 44): coverage, error and findings are
computed from the rows, and the page's at-a-glance numbers are the JSON's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_kpi_change_rows_cover_a_faithful_twin_and_flag_a_wrong_one() -> None:
    tf = pytest.importorskip("twin_fidelity")
    from edgetwin.emulator.cluster import cluster_spec

    better = tf.declared_kpis(cluster_spec())
    assert better["kpi.revenue"] == "higher" and better["kpi.energy_j"] == better["kpi.carbon_g"] == "lower"
    rng = np.random.default_rng(0)

    def days(level: float) -> pd.DataFrame:
        return pd.DataFrame({k: level * (1 + 0.02 * rng.standard_normal(10)) for k in better})

    base, same = days(1.0), days(1.2)
    data = {"random": {"real": base, "twin": base},
            "good": {"real": same, "twin": same},  # a twin that simulates the cluster's days exactly
            "wrong": {"real": days(0.5), "twin": days(1.0)}}  # fmt: skip
    rows = tf.kpi_change_rows(data, "random", better, n_boot=300)
    assert len(rows) == 2 * len(better)
    good = [r for r in rows if r["policy"] == "good"]
    wrong = [r for r in rows if r["policy"] == "wrong"]
    assert all(r["covers"] and r["error_points"] < 1e-9 for r in good)
    assert not any(r["covers"] for r in wrong) and all(r["error_points"] > 40 for r in wrong)
    summary = tf.kpi_change_summary(rows)
    assert summary["n"] == len(rows) and summary["coverage"] <= 0.5
    page = "\n".join(tf.kpi_change_markdown(rows, summary, "random", 10))
    assert "| wrong | kpi.revenue |" in page and "Missed" in page


def test_the_pages_kpi_change_numbers_are_the_jsons() -> None:
    quick = json.loads((ROOT / "docs/benchmarks/twin_fidelity/quick.json").read_text())["kpi_change"]["summary"]
    page = (ROOT / "docs/benchmarks/twin_fidelity/README.md").read_text()
    assert f"Coverage: **{100 * quick['coverage']:.0f} %** of {quick['n']}" in page
    assert f"median absolute change error **{quick['median_abs_error_points']:.1f} points**" in page
    glance = (ROOT / "docs/benchmarks/README.md").read_text()
    # the at-a-glance row shows the interval with the logs' effect-size error (`kpi_change_effect`)
    effect = json.loads((ROOT / "docs/benchmarks/twin_fidelity/quick.json").read_text())["kpi_change_effect"]["summary"]
    assert f"| {100 * effect['coverage']:.1f} % (CP 90 %" in glance
    assert "kpi_change_effect.summary.coverage" in glance
    assert f"| {effect['median_abs_error_points']:.1f} points" in glance


def test_kpi_change_rows_with_logged_day_noise_widen_the_twins_interval_and_keep_the_bootstrap() -> None:
    tf = pytest.importorskip("twin_fidelity")
    rng = np.random.default_rng(1)
    better = {"kpi.revenue": "higher"}

    def days(level: float) -> pd.DataFrame:
        return pd.DataFrame({"kpi.revenue": level * (1 + 0.2 * rng.standard_normal(10))})

    data = {"random": {"real": days(1.0), "twin": days(1.0)}, "cand": {"real": days(1.3), "twin": days(1.3)}}
    logged = 1 + 0.2 * rng.standard_normal(10)
    plain = tf.kpi_change_rows(data, "random", better, n_boot=300)[0]
    cal = tf.kpi_change_rows(data, "random", better, n_boot=300, calibration={"kpi.revenue": (logged, 0.1)})[0]
    assert cal["twin_bootstrap_interval"] == plain["twin_interval"]
    assert cal["twin_interval"][0] < plain["twin_interval"][0] and cal["twin_interval"][1] > plain["twin_interval"][1]
    assert tf.kpi_change_summary([cal])["coverage_bootstrap_only"] == float(cal["covers_bootstrap"])


def test_paired_days_cancel_the_days_shared_swing_and_unequal_days_are_refused() -> None:
    """Every policy on the same days (common random numbers): a twin whose days swing as much as the
    cluster's but whose effect is right has a paired change that is right, covered by its interval."""
    tf = pytest.importorskip("twin_fidelity")
    rng = np.random.default_rng(2)
    better = {"kpi.revenue": "higher"}
    swing_real, swing_twin = 1 + 0.3 * rng.standard_normal(10), 1 + 0.3 * rng.standard_normal(10)

    def days(swing: np.ndarray, effect: float) -> pd.DataFrame:
        return pd.DataFrame({"kpi.revenue": effect * swing * (1 + 0.01 * rng.standard_normal(10))})

    data = {"random": {"real": days(swing_real, 1.0), "twin": days(swing_twin, 1.0)},
            "cand": {"real": days(swing_real, 1.3), "twin": days(swing_twin, 1.3)}}
    logged = 1 + 0.3 * rng.standard_normal(10)
    row = tf.kpi_change_rows(data, "random", better, n_boot=300, calibration={"kpi.revenue": (logged, 0.05)},
                             paired=True)[0]
    assert row["protocol"] == "paired" and row["covers"] and row["error_points"] < 3
    assert row["twin_interval"][1] - row["twin_interval"][0] < 0.2  # the 0.3 swing cancels
    unpaired = tf.kpi_change_rows(data, "random", better, n_boot=300, calibration={"kpi.revenue": (logged, 0.05)})[0]
    assert unpaired["twin_interval"][1] - unpaired["twin_interval"][0] > row["twin_interval"][1] - row["twin_interval"][0]
    data["cand"]["twin"] = data["cand"]["twin"].iloc[:9]
    with pytest.raises(ValueError, match="paired days"):
        tf.kpi_change_rows(data, "random", better, n_boot=10, paired=True)
