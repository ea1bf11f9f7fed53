"""The verdict's per-arm CUPED slope (Lin 2013) against the pooled one, with the rest of the fleet as
control (issue 48: a larger control arm within the same candidate share): 50 candidate groups against
950 control groups, where the candidate changes how a group's canary mean follows its pre-period."""

from __future__ import annotations

import numpy as np
import pytest

from edgetwin.loop.ppi import ppi_mean_difference


def _canary(rng: np.random.Generator, n_c: int, n_b: int, slope_c: float, slope_b: float,
            effect: float) -> tuple[np.ndarray, ...]:
    """One canary's residuals against a twin that predicts 0 everywhere (fleet term: 1,000 groups of 0),
    and the fleet's effect: a group's effect is ``effect + (slope_c − slope_b)·(x − 10)``, so the
    fleet's (the mean over its groups, what the verdict is about) depends on the fleet's ``x``."""
    x = rng.normal(10.0, 2.0, n_c + n_b)
    xc, xb = x[:n_c], x[n_c:]
    yc = effect + slope_c * (xc - 10.0) + rng.normal(0, 0.5, n_c)
    yb = slope_b * (xb - 10.0) + rng.normal(0, 0.5, n_b)
    return xc, yc, xb, yb, effect + (slope_c - slope_b) * (float(np.mean(x)) - 10.0)


def _run(cuped: str, slope_c: float, reps: int = 150, n_c: int = 50, n_b: int = 950) -> tuple[float, float]:
    """Coverage of the 90 % interval of the difference and its median half-width over ``reps`` canaries."""
    rng = np.random.default_rng(7)
    zero = np.zeros(1000)
    cover, half = 0, []
    for _ in range(reps):
        xc, yc, xb, yb, truth = _canary(rng, n_c, n_b, slope_c, 1.0, effect=0.3)
        out = ppi_mean_difference(zero, zero, yc, np.zeros(n_c), yb, np.zeros(n_b), 0.90, x_cand=xc, x_ctrl=xb,
                                  cuped=cuped)  # fmt: skip
        from edgetwin.loop.ppi import t_quantile

        h = t_quantile(0.90, out["df"]) * out["diff_se"]
        cover += abs(out["diff"] - truth) <= h
        half.append(h)
    return cover / reps, float(np.median(half))


def test_per_arm_slope_is_narrower_when_the_candidate_changes_the_slope_and_still_covers() -> None:
    cov_pooled, h_pooled = _run("pooled", slope_c=-1.0)
    cov_arm, h_arm = _run("per_arm", slope_c=-1.0)
    # the pooled slope is the 950 control groups' (+1): applied to the candidate arm (slope -1) it
    # doubles that arm's spread instead of removing it
    assert h_arm < 0.5 * h_pooled
    assert cov_arm >= 0.82 and cov_pooled >= 0.82  # 90 % asked; 150 canaries (binomial sd 2.4 points)


def test_per_arm_slope_costs_little_when_the_slopes_agree() -> None:
    _, h_pooled = _run("pooled", slope_c=1.0, reps=40)
    _, h_arm = _run("per_arm", slope_c=1.0, reps=40)
    assert h_arm <= 1.05 * h_pooled


def test_unknown_slope_refused() -> None:
    z = np.zeros(4)
    with pytest.raises(ValueError, match="per_arm"):
        ppi_mean_difference(z, z, z[:2] + 1, z[:2], z[:2], z[:2], x_cand=z[:2], x_ctrl=z[:2], cuped="both")


def test_small_arms_keep_the_pooled_slope() -> None:
    """With 4 candidate groups a per-arm slope under-covers (the coverage section's 100-group table):
    below MIN_PER_ARM groups an arm's slope is the pooled one, so both options agree."""
    from edgetwin.loop.ppi import MIN_PER_ARM

    rng = np.random.default_rng(3)
    xc, yc, xb, yb, _ = _canary(rng, 4, MIN_PER_ARM + 10, -1.0, 1.0, 0.3)
    zero = np.zeros(100)
    a = ppi_mean_difference(zero, zero, yc, np.zeros(4), yb, np.zeros(len(yb)), x_cand=xc, x_ctrl=xb, cuped="per_arm")
    b = ppi_mean_difference(zero, zero, yc, np.zeros(4), yb, np.zeros(len(yb)), x_cand=xc, x_ctrl=xb, cuped="pooled")
    assert a["diff"] == b["diff"] and a["diff_se"] == b["diff_se"]
