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


def test_a_paired_measurement_gets_the_twins_paired_spread_not_one_policys_day_noise() -> None:
    """Both policies on the same days: the days' large shared swing cancels in the change. An exact
    twin's paired interval widened by its own paired spread covers at about its level and is far
    narrower than the interval built for two independent sets of days."""
    rng = np.random.default_rng(3)
    n, trials, effect, swing, own = 10, 150, 0.2, 0.3, 0.03

    def paired_days() -> tuple[np.ndarray, np.ndarray]:
        day = 1 + swing * rng.standard_normal(n)  # what both policies share on a day
        return day * (1 + own * rng.standard_normal(n)), (1 + effect) * day * (1 + own * rng.standard_normal(n))

    logged = 1 + swing * rng.standard_normal(30)
    hits, widths, widths_unpaired = 0, [], []
    for _ in range(trials):
        rb, rc = paired_days()
        tb, tc = paired_days()
        real = (rc.mean() - rb.mean()) / rb.mean()
        twin = (tc.mean() - tb.mean()) / tb.mean()
        boot = []
        for _ in range(300):
            i = rng.integers(n, size=n)
            boot.append((tc[i].mean() - tb[i].mean()) / tb[i].mean())
        blo, bhi = (float(x) for x in np.percentile(boot, [5, 95]))
        lo, hi = measured_change_interval(twin, (blo, bhi), logged, n, n, paired_twin_days=n)
        ulo, uhi = measured_change_interval(twin, (blo, bhi), logged, n, n)
        assert lo <= blo and hi >= bhi
        hits += lo <= real <= hi
        widths.append(hi - lo)
        widths_unpaired.append(uhi - ulo)
    assert hits / trials >= 0.84
    assert np.median(widths) < 0.5 * np.median(widths_unpaired)


def test_action_contrasts_score_a_twin_that_ignores_an_action_and_widen_the_interval() -> None:
    """Logs of an exploring policy hold effects: rows by action bin against all rows. An exact twin
    has no contrast error; a twin blind to the action misses each bin's effect by exactly that effect."""
    from edgetwin.twin.intervals import action_contrast_errors

    rng = np.random.default_rng(4)
    a = rng.uniform(0, 1, (3000, 1))
    real = (1 + a[:, :1]) * (1 + 0.01 * rng.standard_normal((3000, 1)))  # +50 % at a = 1, -50 % at a = 0 vs mean
    exact = action_contrast_errors(a, real, real.copy())
    assert exact.shape == (1, 3) and np.allclose(exact, 0.0)
    blind = action_contrast_errors(a, real, np.full_like(real, real.mean()))
    assert blind[0, 0] > 0.2 and blind[0, 2] < -0.2  # the low bin's real effect is negative, the twin's 0
    q = float(np.max(np.abs(blind)))
    lo0, hi0 = measured_change_interval(0.1, (0.05, 0.15), np.array([1.0, 1.1, 0.9]), 5, 5)
    lo1, hi1 = measured_change_interval(0.1, (0.05, 0.15), np.array([1.0, 1.1, 0.9]), 5, 5, q_effect=q)
    assert np.isclose(lo0 - lo1, q) and np.isclose(hi1 - hi0, q)
