"""The closed-loop page's headline JSON (issue 48, "What it must show"): the fields a script reads
exist, every rate lies in its Clopper-Pearson interval, and the intervals are Clopper-Pearson's for
the counts stored beside them; plus the scale run's counting rules on a small example."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scipy.stats import binomtest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "benchmarks" / "closed_loop" / "results_production.json"


@pytest.fixture(scope="module")
def res() -> dict[str, Any]:
    return json.loads(RESULTS.read_text())


@pytest.fixture(scope="module")
def scale() -> Iterator[Any]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _closed_loop_scale

    yield _closed_loop_scale
    sys.path.remove(str(ROOT / "benchmarks"))


def _cp(k: int, n: int) -> list[float]:
    ci = binomtest(k, n).proportion_ci(0.95, "exact")
    return [float(ci.low), float(ci.high)]


def _within(rate: float | None, ci: list[float] | None) -> None:
    if rate is None:
        assert ci is None
        return
    assert ci is not None and ci[0] - 1e-9 <= rate <= ci[1] + 1e-9


def test_by_fleet_size_fields_and_clopper_pearson(res: dict[str, Any]) -> None:
    assert isinstance(res["seeds"], list) and res["seeds"]
    by = res["by_fleet_size"]
    assert {"100", "1000"} <= set(by)
    for n, v in by.items():
        assert set(v["seeds"]) <= set(res["seeds"]) and v["seeds"]
        for key in ("canary_verdict_rate", "confident_agreement", "agreement_ci", "canary_verdict_rate_ci"):
            assert key in v, (n, key)
        k, m = v["canary_decided"], v["open_after_twin"]
        assert 0 <= k <= m <= v["pairs"]
        if m:
            assert v["canary_verdict_rate"] == pytest.approx(k / m)
            assert v["canary_verdict_rate_ci"] == pytest.approx(_cp(k, m))
        _within(v["canary_verdict_rate"], v["canary_verdict_rate_ci"])
        if k:
            assert v["confident_agreement"] == pytest.approx(v["canary_agreeing"] / k)
            assert v["agreement_ci"] == pytest.approx(_cp(v["canary_agreeing"], k))
        _within(v["confident_agreement"], v["agreement_ci"])
        for arm in ("twin_alone", "loop", "canary_alone"):
            for r in v[arm].values():
                _within(r["rate"], r["ci"])
        # the twin alone's verdicts are not the canaries': the two split the pairs
        assert v["twin_alone"]["verdict_rate"]["k"] + v["open_after_twin"] == v["pairs"]
        # reward and return are one pair: their truths never differ
        assert v["max_merged_truth_gap"] < 1e-6


def test_canary_steps_ratio_is_stated_or_says_why_not(res: dict[str, Any]) -> None:
    assert "canary_steps_ratio" in res
    head = res["by_fleet_size"][str(res["canary_steps_ratio_fleet_size"])]["steps"]
    if res["canary_steps_ratio"] is None:
        assert head["how"]  # not reached (with its lower bound) or nothing to match
    else:
        assert res["canary_steps_ratio"] == pytest.approx(head["canary_alone_steps"] / head["twin_canary_steps"])


def test_coverage_experiment_fields(res: dict[str, Any]) -> None:
    ce = res["coverage_experiment"]
    assert set(ce) == {"aa", "at_margin", "regressing", "better"}
    for t, r in ce.items():
        for key in ("runs", "level", "coverage", "promoted", "false_promote_upper"):
            assert key in r, (t, key)
        assert r["runs"] >= 200
        _within(r["coverage"], r["coverage_ci"])
    reg = ce["regressing"]
    assert reg["false_promote_upper"] is not None and reg["false_promote_upper"] >= reg["promoted"]


def test_distinct_pairs_merge_columns_and_keep_the_named_one(scale: Any) -> None:
    class K:
        def __init__(self, col: str | None) -> None:
            self.col = col

    kd = {"return": K("reward"), "reward": K("reward"), "kpi.slo": K("kpi.slo"), "p95": K(None)}
    got = scale.distinct_pairs(kd, lambda k: k.col)
    assert got == {"reward": ["return", "reward"], "kpi.slo": ["kpi.slo"], "p95": ["p95"]}


def test_score_size_splits_twin_alone_from_canary_verdicts(scale: Any) -> None:
    def pair(ta: str, tc: str, regress: bool) -> dict[str, Any]:
        return {"policy": "a", "twin_alone": ta, "twin_canary": tc, "canary_alone": "straddle", "truth_regress": regress,
                "sweep": {}}  # fmt: skip

    pairs = [pair("ok", "ok", False), pair("straddle", "regress", True), pair("below_level", "ok", True),
             pair("unsupported", "straddle", False)]  # fmt: skip
    per = [{"policy": "a", "twin_canary": "refuse", "twin_canary_agent_steps": 10, "canary_alone_agent_steps": 10,
            "rounds": [1]}]  # fmt: skip
    s = scale.score_size(pairs, per)
    assert s["open_after_twin"] == 3 and s["canary_decided"] == 2 and s["canary_agreeing"] == 1
    assert s["canary_verdict_rate"] == pytest.approx(2 / 3) and s["confident_agreement"] == pytest.approx(0.5)
    assert s["twin_alone"]["verdict_rate"]["k"] == 1 and s["loop"]["verdict_rate"]["k"] == 3
    assert s["agreement_ci"] == pytest.approx(_cp(1, 2))
    assert s["candidate_verdicts"]["agreement"]["k"] == 1  # refused, and it truly regresses on two KPIs


def test_candidate_level_counts_the_operator_s_decision(scale: Any) -> None:
    pairs = [{"seed": 0, "policy": "a", "truth_regress": False}, {"seed": 0, "policy": "a", "truth_regress": True},
             {"seed": 1, "policy": "a", "truth_regress": False}, {"seed": 0, "policy": "b", "truth_regress": False}]  # fmt: skip
    per = [{"seed": 0, "policy": "a", "twin_canary": "refuse"}, {"seed": 1, "policy": "a", "twin_canary": "refuse"},
           {"seed": 0, "policy": "b", "twin_canary": "abstain"}]  # fmt: skip
    c = scale.candidate_level(pairs, per)
    # seed 0's a regresses on one KPI: refusing it is right; seed 1's a does not: refusing it is wrong
    assert c["verdict_rate"]["k"] == 2 and c["verdict_rate"]["n"] == 3
    assert c["agreement"]["k"] == 1 and c["truly_regressing"] == 1
