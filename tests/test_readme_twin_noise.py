"""The README's sentence on the output noise model says what the benchmarks' JSON and page say."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the what-if gate runs the README quotes: the reruns on the code after issue 44's noise fix (27a9416); the
#: runs before it are kept in docs/benchmarks/whatif_gate/before_noise_fix/ (the page's "After the members' noise fix")
GATE_RUNS = ROOT / "docs/benchmarks/whatif_gate"
BEFORE_FIX = GATE_RUNS / "before_noise_fix"


def test_the_readme_noise_model_numbers_are_the_benchmarks() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    gate = json.loads((GATE_RUNS / "results_random.json").read_text())
    assert f"agree with the cluster {100 * gate['confident_agreement']:.1f} % of the time (90.6 % with one std;" in readme
    before = "| confident agreement (target ≥ 95 %) | 29 / 32 = 90.6 % (CP 90 %: 77.5-97.4) |"
    assert before in (ROOT / "docs/benchmarks/whatif_gate/README.md").read_text()
    page = (ROOT / "docs/benchmarks/twin_fidelity/README.md").read_text()
    row = "| 3 seeds pooled | 153 / 198 = 77.3 % (CP 90 % 72-82) | **144 / 198 = 72.7 % (CP 90 % 67-78)** |"
    assert row in page
    assert "cover 72.7 % of 198 (candidate, KPI) changes over 3 seeds (77.3 % with one std)" in readme
    assert (ROOT / "edgetwin/imitation/noise.py").is_file()


def test_the_pooled_coverages_are_the_committed_seeds_runs() -> None:
    """The README's and the page's pooled coverages are `twin_fidelity.py --pool` of the committed runs
    (seed 0 with the noise model is quick.json; the one-std runs are the code before it, fe80514)."""
    import sys

    import pytest

    sys.path.insert(0, str(ROOT / "benchmarks"))
    tf = pytest.importorskip("twin_fidelity")
    d = ROOT / "docs/benchmarks/twin_fidelity"
    noise = tf.pool_kpi_changes([str(d / "quick.json"), *(str(d / f"seeds/noise_seed{s}.json") for s in (1, 2))])
    one_std = tf.pool_kpi_changes([str(d / f"seeds/onestd_seed{s}.json") for s in (0, 1, 2)])
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert (f"cover {100 * noise['coverage']:.1f} % of {noise['n']} (candidate, KPI) changes over 3 seeds "
            f"({100 * one_std['coverage']:.1f} % with one std)") in readme  # fmt: skip
    assert f"8.1 -> **{noise['median_abs_error_points']:.1f}** |" in (d / "README.md").read_text()


def test_the_readme_replayed_coverage_and_gate_seeds_are_the_pooled_runs() -> None:
    """The README's replayed effect-term coverage and the gate's 3-seed agreement are the committed pooled JSONs."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    pooled = json.loads((ROOT / "docs/benchmarks/twin_fidelity/seeds/pooled.json").read_text())
    rep, one = pooled["kpi_change_replayed"], pooled["kpi_change_effect"]
    lo, hi = (round(100 * x) for x in rep["coverage_interval"])
    assert (f"covers {100 * rep['coverage']:.1f} % of {rep['n']} changes over 3 seeds (CP 90 % {lo}-{hi} %; "
            f"{100 * one['coverage']:.1f} % with the one-step term in the same runs), at a price in width: median "
            f"{rep['median_width_points']:.0f} points against {one['median_width_points']:.0f}") in readme  # fmt: skip
    gate = json.loads((GATE_RUNS / "seeds/pooled_random.json").read_text())
    glo, ghi = (round(100 * x) for x in gate["confident_agreement_interval"])
    assert (f"over 3 seeds {100 * gate['confident_agreement']:.1f} %, {gate['confident_agreed']} of "
            f"{gate['confident_pairs']}, CP 90 % {glo}-{ghi} %") in readme  # fmt: skip
    assert gate["seeds"] == [0, 1, 2]
    dec = gate["declared_kpis"]
    dlo, dhi = (round(100 * x) for x in dec["coverage_interval"])
    assert (f"covers {100 * dec['coverage']:.1f} % of {dec['n']} declared-KPI changes over 3 seeds (CP 90 % {dlo}-{dhi} %; "
            f"83.7 % before, on the code before issue 44's fix) at the price of more abstention, "
            f"{100 * gate['abstention']:.1f} % against 77.2 % (idem)") in readme
    assert 'interval_method = "hybrid"' in readme and (ROOT / "edgetwin/twin/whatif/effects.py").is_file()


def test_the_readme_held_out_replayed_term_is_the_held_out_seeds() -> None:
    """The README's held-out sentence is seeds 3-5's pooled JSONs (random, random with 9 calibration days,
    production-like), run with the term fixed before them (the page says so; here: the seeds are not 0-2)."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    seeds = GATE_RUNS / "seeds"
    held = json.loads((seeds / "pooled_random_heldout.json").read_text())
    held9 = json.loads((seeds / "held9/pooled_random.json").read_text())
    prod = json.loads((seeds / "pooled_production_heldout.json").read_text())
    assert held["seeds"] == [3, 4, 5] and not set(held["seeds"]) & {0, 1, 2}
    for s in held["seeds"]:  # "the 9 calibration days": each run of the held9 pool calibrated on 9 held-out days
        assert json.loads((seeds / f"held9/random_seed{s}.json").read_text())["held_days"] == 9
    dec = held["declared_kpis"]
    lo, hi = (round(100 * x) for x in dec["coverage_interval"])
    assert (f"changes (CP 90 % {lo}-{hi} %) and {held['confident_agreed']} of {held['confident_pairs']} confident "
            "verdicts agree with the cluster") in readme
    assert f"it covers {100 * dec['coverage']:.1f} % of {dec['n']} declared-KPI" in readme
    assert (f"the gate still abstains on {100 * held['abstention']:.1f} % of checks ({100 * held9['abstention']:.1f} % "
            f"with the 9 calibration days its 90 % level needs; {100 * prod['abstention']:.1f} % on production-like "
            "logs, mostly off the logs' support)") in readme
    reasons = prod["abstention_reasons"]
    assert reasons["unsupported"] > (reasons["pairs"] - reasons["decided"]) / 2  # "mostly off the logs' support"


def test_the_readme_task_time_coverage_move_is_the_rerun() -> None:
    """"task time's coverage over seeds 0-5 fell from X to Y": the seeds 0-5 pools before and after the noise fix."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    after, before = (json.loads((d / "seeds/pooled_random_all.json").read_text()) for d in (GATE_RUNS, BEFORE_FIX))
    assert after["seeds"] == before["seeds"] == [0, 1, 2, 3, 4, 5]
    a, b = (p["declared_kpis"]["per_kpi"]["kpi.task_time_ms"]["coverage"] for p in (after, before))
    assert a < b  # "fell"
    assert f"task time's coverage over seeds 0-5 fell from {100 * b:.1f} % to {100 * a:.1f} %" in readme
