"""The README's sentence on the calibrated level score is what `edgetwin.twin.intervals` does.

The behaviour is tests/test_calibration_score.py's (a sign-changing KPI's finite interval, the far-from-0
KPI's unchanged one, the unbounded change over a near-zero baseline); this checks that the README says
it and that the gate abstains on the unbounded interval the README promises it abstains on.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from edgetwin.policies.gate_checks import check_verdict
from edgetwin.twin.intervals import SCORE, Calibration, calibration_from_arrays, change_interval

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_states_the_floored_score() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert SCORE == "floored"
    assert "for a level, its error relative to max(|level|, s), s the KPI's own spread over the calibration days" in readme
    assert "a relative change whose baseline the calibration places within its error of 0 is unbounded" in readme
    assert "and the gate decides it only where its other side clears the margin, else abstains" in readme


def test_a_change_over_a_near_zero_baseline_is_unbounded_and_the_gate_abstains() -> None:
    """A KPI whose twin level straddles 0 across days: its scale floors the score, and a change
    against a baseline inside the calibrated error of 0 is unbounded, which the gate calls a straddle."""
    rng = np.random.default_rng(0)
    answers = rng.normal(0.0, 1.0, size=(3, 12))  # (M, E): a signed KPI around 0
    truth = answers.mean(axis=0) + rng.normal(0.0, 0.5, size=12)
    cal = calibration_from_arrays({"return": answers}, {"return": truth})
    cal.method = "hybrid"
    assert cal.scale["return"] > 0 and math.isfinite(cal.quantile["return"])
    base = np.full((3, 4), 0.05) + rng.normal(0.0, 1e-3, size=(3, 4))
    cand = base + 0.5
    mid = float((cand.mean() - base.mean()) / abs(base.mean()))
    lo, hi = change_interval((0.9 * mid, 1.1 * mid), cand, base, cal, "return")
    assert isinstance(cal, Calibration) and cal.baseline_error("return", float(base.mean())) > abs(float(base.mean()))
    assert math.isinf(hi)  # the side the effect may take: its size over a baseline that may be 0 is unknown
    bounded = change_interval((0.9 * mid, 1.1 * mid), cand + 10.0, base + 10.0, cal, "return")
    assert all(math.isfinite(x) for x in bounded)  # the same effect over a baseline far above the scale
    assert check_verdict((-hi, -lo), 0.05, 0.0, 0.25) == "straddle"  # worsening interval of a higher-is-better KPI
    assert check_verdict((-math.inf, -0.2), 0.05, 0.0, 0.25) == "ok"  # its other side clears the margin: decided


def test_the_gate_says_why_an_unbounded_interval_straddles() -> None:
    from edgetwin.policies.gate_checks import GuardCheck

    kw = {"scenario": "nominal", "kpi": "return", "better": "higher", "baseline": 0.01, "candidate": 0.5, "change": 49.0,
          "change_ci": [-math.inf, math.inf], "worsening": -0.49, "allowed": 0.0005, "max_regression": 0.05,
          "min_delta": 0.0, "out_of_support": 0.0, "flagged": False, "breached": False, "verdict": "straddle"}  # fmt: skip
    reason = GuardCheck(**kw).abstain_reason(0.25)  # type: ignore[arg-type]
    assert "[-inf%, +inf%] (unbounded: the twin's calibrated error does not bound the change's size" in reason
    assert "straddles the margin 5%" in reason
    assert "unbounded" not in GuardCheck(**{**kw, "change_ci": [-0.2, 0.3]}).abstain_reason(0.25)  # type: ignore[arg-type]
