"""`measured_change_interval`: a change the real system measures over a few days carries their noise;
an exact twin's interval must carry it too to cover at its level (issue 44)."""

from __future__ import annotations

import numpy as np

from edgetwin.twin.intervals import measured_change_interval


def _bootstrap_change(c: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    boot = [(rng.choice(c, len(c)).mean() - (bb := rng.choice(b, len(b)).mean())) / abs(bb) for _ in range(300)]
    lo, hi = np.percentile(boot, [5, 95])
    return float(lo), float(hi)


def test_an_exact_twin_covers_a_measured_change_at_its_level_only_with_the_day_noise() -> None:
    rng = np.random.default_rng(0)
    n, trials, cv, effect = 10, 150, 0.15, 0.2
    logged = 1.0 + cv * rng.standard_normal(30)  # held-out logged days of the logging policy
    hit_boot = hit_measured = 0
    for _ in range(trials):
        real_b, real_c = 1 + cv * rng.standard_normal(n), (1 + effect) * (1 + cv * rng.standard_normal(n))
        twin_b, twin_c = 1 + cv * rng.standard_normal(n), (1 + effect) * (1 + cv * rng.standard_normal(n))
        real = (real_c.mean() - real_b.mean()) / real_b.mean()
        twin = (twin_c.mean() - twin_b.mean()) / twin_b.mean()
        blo, bhi = _bootstrap_change(twin_c, twin_b, rng)
        lo, hi = measured_change_interval(twin, (blo, bhi), logged, n, n, q_rel=0.0)
        assert lo <= blo and hi >= bhi
        hit_boot += blo <= real <= bhi
        hit_measured += lo <= real <= hi
    assert hit_boot / trials < 0.82  # the twin's own bootstrap misses the cluster's day noise
    assert hit_measured / trials >= 0.84


def test_the_models_error_widens_by_the_size_of_the_change_and_degenerate_input_falls_back() -> None:
    days = np.array([1.0, 1.1, 0.9, 1.05])
    lo0, hi0 = measured_change_interval(0.5, (0.4, 0.6), days, 5, 5, q_rel=0.0)
    lo1, hi1 = measured_change_interval(0.5, (0.4, 0.6), days, 5, 5, q_rel=0.2)
    assert np.isclose(lo0 - lo1, 0.1) and np.isclose(hi1 - hi0, 0.1)
    assert measured_change_interval(0.5, (0.4, 0.6), np.array([1.0]), 5, 5) == (0.4, 0.6)
