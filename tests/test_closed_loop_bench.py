"""The closed-loop benchmark's own rules (benchmarks/closed_loop.py): canary alone's Kayenta-style
verdict, and how canary_steps_ratio finds the agent-steps at which canary alone reaches a verdict rate."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def cl() -> Iterator[Any]:
    sys.path.insert(0, str(BENCH))
    import closed_loop

    yield closed_loop
    sys.path.remove(str(BENCH))


def test_kayenta_verdict_regress_ok_and_inconclusive(cl: Any) -> None:
    rng = np.random.default_rng(0)
    ctrl = 1.0 + rng.normal(0, 0.05, 92)
    # a cost 20 % higher: regresses beyond the 5 % margin; the same cost: within it
    assert cl.kayenta_verdict(1.2 + rng.normal(0, 0.05, 92), ctrl, "lower") == "regress"
    assert cl.kayenta_verdict(1.0 + rng.normal(0, 0.05, 92), ctrl, "lower") == "ok"
    # a higher-is-better KPI 20 % lower regresses; 20 % higher is fine
    assert cl.kayenta_verdict(0.8 + rng.normal(0, 0.05, 92), ctrl, "higher") == "regress"
    assert cl.kayenta_verdict(1.2 + rng.normal(0, 0.05, 92), ctrl, "higher") == "ok"
    # exactly at the margin (+5 %): neither test is significant -> Inconclusive
    assert cl.kayenta_verdict(1.05 + rng.normal(0, 0.05, 92), ctrl, "lower") == "straddle"
    # Kayenta's minimum: fewer than 50 points per arm is Inconclusive however clear the change
    assert cl.kayenta_verdict(1.5 + rng.normal(0, 0.05, 49), ctrl[:49], "lower") == "straddle"
    assert cl.kayenta_verdict(1.5 + rng.normal(0, 0.05, 50), ctrl[:50], "lower") == "regress"


def _pt(label: str, steps: int, rate: float, agree: float | None) -> dict[str, Any]:
    return {"label": label, "canary_agent_steps": steps, "verdict_rate": rate, "confident_agreement": agree}


def test_steps_to_reach_interpolates_in_log_steps_and_says_not_reached(cl: Any) -> None:
    pts = [_pt("a", 100, 0.2, 1.0), _pt("b", 1000, 0.6, 1.0), _pt("c", 10_000, 1.0, 0.9)]
    r = cl.steps_to_reach(pts, 0.4, 1.0)  # half way from a to b in verdict rate: the geometric mean
    assert r["steps"] == pytest.approx(math.sqrt(100 * 1000)) and "a and b" in r["how"]
    assert cl.steps_to_reach(pts, 0.1, 1.0)["steps"] == 100  # the first point already reaches it
    # c reaches the rate but not the agreement: at agreement 1.0, 0.8 is never reached
    r = cl.steps_to_reach(pts, 0.8, 1.0)
    assert r["steps"] is None and r["how"] == "not reached" and r["max_steps"] == 10_000
    # at agreement 0.9 it is, between b and c
    r = cl.steps_to_reach(pts, 0.8, 0.9)
    assert r["steps"] == pytest.approx(math.sqrt(1000 * 10_000))


def test_scores_and_post_update_regression_rate(cl: Any) -> None:
    pairs = [
        {"policy": "p", "day": 0, "kpi": "a", "truth_regress": False, "arm": "ok"},
        {"policy": "p", "day": 0, "kpi": "b", "truth_regress": True, "arm": "ok"},  # promoted, regresses
        {"policy": "q", "day": 0, "kpi": "a", "truth_regress": False, "arm": "ok"},
        {"policy": "q", "day": 0, "kpi": "b", "truth_regress": False, "arm": "straddle"},  # not promoted
    ]
    s = cl.score(pairs, "arm")
    assert s["verdict_rate"] == 0.75 and s["confident_agreement"] == pytest.approx(2 / 3)
    assert cl.promotion_regress_rate(pairs, "arm") == (1.0, 1)


def test_the_coverage_experiment_counts_with_clopper_pearson(cl: Any) -> None:
    """Issue 48 item 5: per candidate type, coverage of the stated level over simulated canaries at
    the loop's arm sizes, and a false-promote upper bound only where the truth regresses."""
    rng = np.random.default_rng(0)
    days = [{"y": rng.gamma(2.0, 0.1, 100), "x": rng.gamma(2.0, 0.1, 100)} for _ in range(8)]
    out = cl.coverage_experiment(days, runs=40, seed=0)
    assert set(out) == {"aa", "at_margin", "regressing", "better"}
    for r in out.values():
        assert r["runs"] == 40 and r["level"] == pytest.approx(0.9) and r["arm_sizes"] == [4, 6]
        assert 0.0 <= r["coverage"] <= 1.0 and r["coverage_ci"][0] <= r["coverage"] <= r["coverage_ci"][1]
        assert (r["false_promote_upper"] is not None) == (r["truth"] > cl.MARGIN)
    assert out["regressing"]["promoted"] == 0.0 and 0.0 < out["regressing"]["false_promote_upper"] < 0.1
    pooled = cl.pool_coverage([out, out])
    assert pooled["aa"]["runs"] == 80 and pooled["regressing"]["false_promote_upper"] < out["regressing"]["false_promote_upper"]


def test_the_page_s_coverage_numbers_are_the_json_s() -> None:
    import json

    root = BENCH.parent / "docs" / "benchmarks" / "closed_loop"
    d = json.loads((root / "results_production.json").read_text())
    if "coverage_experiment" not in d:
        pytest.skip("the coverage experiment has not been run into this JSON")
    page = (root / "README.md").read_text()
    for t, r in d["coverage_experiment"].items():
        assert {"runs", "level", "coverage", "promoted", "false_promote_upper"} <= set(r)
        assert f"| {t} | {r['runs']} |" in page and f"{100 * r['coverage']:.1f} %" in page
