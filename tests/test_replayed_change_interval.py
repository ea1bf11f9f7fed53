"""The product's change interval carries the effect-size term calibrated on replayed held-out logged
days (issue 44): `edgetwin.twin.whatif.effects`, method ``"replayed"`` of
`edgetwin.twin.intervals.change_interval`, and the gate's level bookkeeping for it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from scipy.stats import wasserstein_distance

from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs
from edgetwin.policies.candidates import ConstantPolicy
from edgetwin.policies.gate import Guard, decide, run_gate
from edgetwin.policies.gate import resolve_policy as resolve
from edgetwin.twin.intervals import (
    MIN_CONTRAST_SHIFT,
    Calibration,
    action_shift,
    action_sketch,
    calibration_from_arrays,
    change_interval,
    sketch_shift,
)
from edgetwin.twin.twin import Twin
from edgetwin.twin.whatif import KpiDef, fixed_policy
from edgetwin.twin.whatif.effects import ReplayedEffects, contrast_effects

torch.set_num_threads(1)


def _day(rng: np.random.Generator, slope: float, t: int = 6, n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """A day of ``(T, N, 1)`` uniform actions and ``(T, N)`` outputs ``10 + slope · a`` (+ small noise)."""
    a = rng.uniform(0.0, 1.0, size=(t, n, 1))
    return a, 10.0 + slope * a[..., 0] + rng.normal(0.0, 0.01, size=(t, n))


def test_an_exact_twin_scores_near_zero_and_a_wrong_slope_scores_its_effect_error() -> None:
    rng = np.random.default_rng(0)
    kpi = KpiDef("y", "y")
    a, real = _day(rng, 4.0)
    span = np.array([1.0])
    exact = contrast_effects(kpi, a, (real, None), [(10.0 + 4.0 * a[..., 0], None)], span)[0]
    half = contrast_effects(kpi, a, (real, None), [(10.0 + 2.0 * a[..., 0], None)], span)[0]
    assert exact < 0.05
    # the bottom third of a uniform action sits 1/3 of the range below the whole (W1 = 1/3); there the
    # real output is 4/3 below its mean, the half-slope twin's 2/3 below: an error of 2/3 of the
    # output's unit per 1/3 of the range moved, 2 per unit of range (the bottom and top bins agree)
    assert half == pytest.approx(2.0, rel=0.15)


def test_each_action_column_gets_its_own_score() -> None:
    # the KPI responds to column 0 only and the twin gets that slope wrong: column 0 scores the error,
    # column 1 (no effect, the twin right about it) scores near 0 and would not widen a move of it much
    rng = np.random.default_rng(3)
    a = rng.uniform(0.0, 1.0, size=(6, 60, 2))
    real = 10.0 + 4.0 * a[..., 0] + rng.normal(0.0, 0.01, size=(6, 60))
    twin = 10.0 + 2.0 * a[..., 0]
    scores = contrast_effects(KpiDef("y", "y"), a, (real, None), [(twin, None)], np.array([1.0, 1.0]))
    assert scores[0] > 1.5 and scores[1] < 0.25 * scores[0]


def test_a_contrast_that_barely_moves_its_action_is_not_scored() -> None:
    # an action logged at one value but for one outlier: every bin's rows sit where the whole day does,
    # so no contrast moves the actions by MIN_CONTRAST_SHIFT of the explored range, and dividing an
    # error by that near-zero move would explode; the day has nothing to score instead
    a = np.full((5, 40, 1), 0.5)
    a[0, 0, 0] = 1.0
    real = np.random.default_rng(1).normal(10.0, 1.0, size=(5, 40))
    score = contrast_effects(KpiDef("y", "y"), a, (real, None), [(real * 1.5, None)], np.array([0.5]))
    assert score.shape == (1,) and math.isnan(score[0])


def test_sketch_shift_is_the_wasserstein_action_shift() -> None:
    rng = np.random.default_rng(2)
    logged = rng.uniform(0.0, 2.0, size=(4000, 2))
    cand = np.column_stack([np.full(3000, 1.8), rng.uniform(0.0, 1.0, 3000)])
    ref, sk = action_sketch(logged, ["a", "b"]), action_sketch(cand, ["a", "b"])
    span = {"a": float(np.ptp(logged[:, 0])), "b": float(np.ptp(logged[:, 1]))}
    assert sketch_shift(sk, ref, span) == pytest.approx(action_shift(cand, logged), abs=0.02)
    direct = wasserstein_distance(cand[:, 0], logged[:, 0]) / span["a"]
    assert direct > 0.3  # the constant at 90 % of the range moved the actions
    assert sketch_shift(ref, ref, span) == 0.0
    assert math.isnan(sketch_shift({"a": sk["a"]}, ref, span))  # a moved column missing: unknown


def _collapsed_calibration() -> Calibration:
    """The failure the term fixes: 2 members that replay the logged day 0.0001 apart, 49 % off the log."""
    values = {"k": np.array([[100.0, 100.0], [100.0001, 100.0001]])}
    cal = calibration_from_arrays(values, {"k": np.array([51.0, 51.0])})
    cal.method = "replayed"
    return cal


def test_replayed_interval_is_the_level_error_on_the_change_plus_lambda_times_shift() -> None:
    cal = _collapsed_calibration()
    assert cal.width_norm("k") > 1e4  # the normalised multiple the hybrid would use exploded
    va = np.array([[110.0, 110.0], [110.3, 110.3]])  # members 0.3 points apart on the candidate's change
    vb = np.full((2, 2), 100.0)
    hybrid = change_interval((0.09, 0.11), va, vb, Calibration(**{**cal.__dict__, "method": "hybrid"}), "k")
    assert hybrid[1] - hybrid[0] > 10.0  # +-1000 %: the hybrid cannot decide anything
    # the effect term: lambda from the days' scores, shift of the two policies from the logged actions
    ReplayedEffects(scores={"k": [0.2, 0.1, float("nan")]}, action_quantiles={"a": [0.0, 1.0]},
                    action_span={"a": 1.0}).apply(cal)  # fmt: skip
    assert cal.effect_multiple["k"] == pytest.approx(0.2) and cal.effect_days("k") == 2
    lo, hi = change_interval((0.09, 0.11), va, vb, cal, "k", shift=0.5)
    mid = (float(va.mean()) - 100.0) / 100.0
    w = cal.width("k") * abs(mid) + 0.2 * 0.5 / 100.0  # lambda in the KPI's units, over the baseline's level
    assert (lo, hi) == pytest.approx((0.09 - w, 0.11 + w))
    assert hi - lo < 1.2  # bounded by the level error and the effect term, not by a collapsed spread
    # no shift known: the hybrid answers (and the report says the term is missing only when it is)
    assert change_interval((0.09, 0.11), va, vb, cal, "k") == pytest.approx(hybrid)
    assert "2 replayed held-out day(s)" in cal.effect_note() and "supports at most 67 %" in cal.effect_note()
    back = Calibration.from_dict(cal.to_dict())
    assert back.effect_multiple == cal.effect_multiple and back.action_span == {"a": 1.0}
    assert back.shift({"a": [0.5, 1.5]}) == pytest.approx(0.5)


def test_the_effect_term_bounds_the_level_and_an_unmeasured_effect_is_no_evidence() -> None:
    cal = Calibration(quantile={"k": 0.1}, n_independent={"k": 9}, method="replayed")
    assert cal.attained("k") == pytest.approx(0.9)
    ReplayedEffects(scores={"k": [0.1] * 4}).apply(cal)
    assert cal.n_support("k") == 4 and cal.attained("k") == pytest.approx(0.8)  # 4 effect days support 80 %
    cal.method = "hybrid"  # the hybrid does not rest on the effect days
    assert cal.attained("k") == pytest.approx(0.9)
    cal.method = "replayed"
    ReplayedEffects(scores={"k": [float("nan")] * 3}).apply(cal)
    problem = cal.problem("k")
    assert problem is not None and "none of the 3 calibration day(s)" in problem
    assert f"{100 * MIN_CONTRAST_SHIFT:g} %" in problem


@pytest.fixture(scope="module")
def gate() -> dict[str, Any]:
    cfg = ClusterConfig(n_agents=24, steps=10)
    log, spec = generate_logs(cfg, episodes=3, policy="random", seed=31)
    twin = Twin.fit(log, spec, members=2, seed=0, progress=False, population_model="empirical", response_model="bc",
                    bc_epochs=4)  # fmt: skip
    recent, _ = generate_logs(cfg, episodes=4, policy="random", seed=32)
    cand = fixed_policy("edge-heavy constant", ConstantPolicy(spec, [0.9, 1.0, 0.4]))
    base = resolve("logging", twin)
    dec = run_gate(twin, cand, base, log=recent, episodes=4, seeds=2, guards=[Guard("return", 1000.0)], steps=8,
                   max_out_of_support=1.0, level=0.8)  # fmt: skip
    return {"decision": dec}


def test_the_gate_calibrates_the_effect_term_on_the_replayed_days_and_uses_it(gate: dict[str, Any]) -> None:
    res = gate["decision"].result
    cal = res.calibration
    assert cal.method == "replayed" and cal.uses_effect("return")
    assert cal.effect_days("return") == 4 and len(cal.effect_scores["return"]) == 4
    assert math.isfinite(cal.effect_multiple["return"]) and cal.action_span and cal.action_quantiles
    c = res.compare("nominal", "return")
    cand, base = res.cell(res.candidate, "nominal"), res.cell(res.baseline, "nominal")
    assert c["action_shift"] == pytest.approx(cal.shift(cand.action_quantiles) + cal.shift(base.action_quantiles))
    assert cal.shift(cand.action_quantiles) > 0.2  # a constant far from the uniform logged actions
    sa, sb = cal.shifts(cand.action_quantiles), cal.shifts(base.action_quantiles)
    shift = {col: sa[col] + sb[col] for col in sa}
    assert set(shift) == set(cal.effect_by_column["return"]) and sum(shift.values()) == pytest.approx(c["action_shift"])
    # each column's shift times its own multiple, never more than the largest multiple times the total
    lam = cal.effect_by_column["return"]
    effect = sum(lam[col] * shift[col] for col in shift)
    assert cal.effect_width("return", shift) == pytest.approx(effect)
    assert effect <= cal.effect_multiple["return"] * c["action_shift"] + 1e-12
    assert max(lam.values()) == pytest.approx(cal.effect_multiple["return"])  # < 9 days: both the largest score
    # the interval is the paired bootstrap widened by q |change| + sum_j lambda_j shift_j
    wide = change_interval((0.0, 0.0), cand.values["return"], base.values["return"], cal, "return", shift)
    w = cal.width("return") * abs(c["change"]) + effect / abs(c["baseline"])
    assert wide[1] - wide[0] == pytest.approx(2 * w)
    lo, hi = c["change_interval"]  # return has no declared range: nothing clips it
    assert 2 * w - 1e-9 <= hi - lo <= 2 * w + (c["change_ci"][1] - c["change_ci"][0]) + 1e-9
    assert lo <= c["change"] - w + 1e-9 and hi >= c["change"] + w - 1e-9
    assert "replayed held-out day(s)" in res.interval_method
    assert "error relative to max(|level|, the KPI's spread)" in res.interval_method  # the floored score (issue 44)
    # 4 days support 80 %: at 90 % a decisive check is below the level, naming the 4 days
    d = decide(res, [Guard("return", 1000.0)], level=0.9)
    below = [ch for ch in d.checks if ch.verdict == "below_level"]
    assert below and "4 independent calibration episode(s) support at most 80%" in below[0].note


def test_the_vectorised_kpi_on_rows_is_kpidef_compute() -> None:
    from edgetwin.twin.whatif.effects import _on_rows

    rng = np.random.default_rng(4)
    x = rng.gamma(2.0, 1.0, size=(3, 8, 12))
    x[0, 0, 0] = np.nan
    w = rng.uniform(0.0, 2.0, size=(3, 8, 12))
    rows = rng.uniform(size=(8, 12)) < 0.4
    for kpi in (KpiDef("m", "x"), KpiDef("wm", "x", "mean", weight="w"), KpiDef("r", "x", "ratio", weight="w"),
                KpiDef("p", "x", "p95"), KpiDef("mx", "x", "max")):
        got = _on_rows(kpi, x, None if kpi.weight is None else w, rows)
        want = [kpi.compute(np.where(rows, x[r], np.nan), None if kpi.weight is None else w[r]) for r in range(3)]
        assert got == pytest.approx(want, rel=1e-9), kpi.name


def test_fewer_effect_days_than_level_days_are_what_the_gate_names(gate: dict[str, Any]) -> None:
    import copy

    res = copy.copy(gate["decision"].result)
    cal = copy.deepcopy(res.calibration)
    for k, scores in cal.effect_scores.items():  # one of the 4 days measured no effect of any KPI
        cal.effect_scores[k] = [float("nan"), *scores[1:]]
    res.calibrate(cal)
    assert cal.n_independent["return"] == 4 and cal.n_support("return") == 3
    d = decide(res, [Guard("return", 1000.0)], level=0.8)  # 3 days support 75 %, not the 80 % asked
    below = [ch for ch in d.checks if ch.verdict == "below_level"]
    assert below and "3 independent calibration episode(s) support at most 75%" in below[0].note


def test_a_bad_interval_method_is_a_one_line_error(tmp_path: Any, gate: dict[str, Any]) -> None:
    from edgetwin.cli.policy import GateConfig
    from edgetwin.contract.errors import InputError

    bad = tmp_path / "gate.toml"
    bad.write_text('interval_method = "widest"\n')
    with pytest.raises(InputError) as e:
        GateConfig.load(bad)
    assert "interval_method" in str(e.value) and "replayed" in str(e.value) and str(bad) in str(e.value)
    ok = tmp_path / "ok.toml"
    ok.write_text('interval_method = "hybrid"\n')
    assert GateConfig.load(ok).interval_method == "hybrid" and GateConfig().interval_method is None
    res = gate["decision"].result
    with pytest.raises(InputError, match="unknown interval method 'widest'"):
        run_gate(None, None, None, log=None, method="widest")  # type: ignore[arg-type]  # refused before anything runs
    assert res.calibration.method == "replayed"
