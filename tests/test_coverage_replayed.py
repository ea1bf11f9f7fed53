"""The effect-size term calibrated on replayed held-out logged days (issue 44).

`replayed_effect_scores` scores a day's action contrasts (the twin free-running the day with its logged
actions against the logged KPIs) per unit of action moved; `action_shift` measures how far a policy
moves the actions from the log's; `replayed_effect_calibration` is their conformal multiple over days.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgetwin.twin.intervals import (
    action_contrast_errors,
    action_contrast_shifts,
    action_shift,
    effect_multiple,
    replayed_effect_scores,
)


def _day(seed: int, n: int = 3000) -> tuple[np.ndarray, np.ndarray]:
    """Uniform logged actions in [0, 1]^2 and an output whose mean rises with the first action."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.0, 1.0, (n, 2))
    y = (1.0 + 0.8 * a[:, 0] + 0.05 * rng.standard_normal(n))[:, None]
    return a, y


def test_contrast_shifts_line_up_with_the_contrasts_and_measure_the_action_moved() -> None:
    a, y = _day(0)
    shifts = action_contrast_shifts(a)
    assert shifts.shape == (action_contrast_errors(a, y, y).shape[1],) == (6,)
    # the top third of a uniform column sits 1/3 of its range above the whole column's distribution
    assert shifts[2] == pytest.approx(1.0 / 3.0, abs=0.02)
    assert shifts[1] < shifts[2]  # the middle third moves less


def test_action_shift_is_zero_for_the_log_and_grows_with_a_constant_away_from_it() -> None:
    a, _ = _day(1)
    b, _ = _day(2)
    assert action_shift(b, a) < 0.03  # another draw of the logging policy
    mid = action_shift(np.full((100, 2), 0.5), a)
    end = action_shift(np.tile([1.0, 0.5], (100, 1)), a)
    assert mid == pytest.approx(0.5, abs=0.02)  # 0.25 per column
    assert end == pytest.approx(0.75, abs=0.02)  # 0.5 + 0.25


def test_a_twin_blind_to_an_action_scores_its_effect_error_per_unit_of_action_moved() -> None:
    a, y = _day(3)
    assert replayed_effect_scores(a, y, y.copy())[0] == pytest.approx(0.0)
    blind = np.full_like(y, y.mean())
    s = replayed_effect_scores(a, y, blind)[0]
    # the real effect of the top third: +0.8 * 1/3 over a mean of 1.4 -> 0.19 of a change per 1/3 of the range
    assert s == pytest.approx(0.8 / 1.4, rel=0.1)
    lam, exact = effect_multiple([s] * 19 + [2 * s])
    assert exact and lam == pytest.approx(s)  # the 19th smallest of 20 days at 90 % (ceil(21 x 0.9))


@pytest.mark.slow
def test_replayed_calibration_on_a_small_twin_is_deterministic_and_says_how_many_days() -> None:
    import torch

    from edgetwin.contract.errors import InputError
    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.twin.policy_calibration import replayed_effect_calibration
    from edgetwin.twin.twin import Twin

    torch.set_num_threads(1)
    cluster = ClusterConfig(n_agents=20, steps=12)
    log, spec = generate_logs(cluster, 2, "random", seed=0)
    twin = Twin.fit(log, spec, seed=0, members=1, progress=False, rounds=0, bc_epochs=1, population_model="empirical")
    held, _ = generate_logs(cluster, 3, "random", seed=7)
    kpis = ["response.offload_ratio", "kpi.revenue"]
    one = replayed_effect_calibration(twin, held, kpis, seed=1)
    assert one == replayed_effect_calibration(twin, held, kpis, seed=1)
    for k in kpis:
        assert one[k]["days"] == 3 and not one[k]["exact"]  # 3 days cannot support 90 %
        assert one[k]["multiple"] == max(one[k]["day_scores"]) > 0
    with pytest.raises(InputError, match="kpi.nope"):
        replayed_effect_calibration(twin, held, ["kpi.nope"], seed=1)


def test_the_pages_pooled_replayed_coverage_is_the_committed_seed_runs() -> None:
    """docs/benchmarks/twin_fidelity's replayed-term subsection and seeds/pooled.json are `--pool` of the
    committed seed runs (`twin_fidelity.py --quick --json`), each of which holds both interval terms."""
    import json
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "benchmarks"))
    tf = pytest.importorskip("twin_fidelity")
    d = root / "docs/benchmarks/twin_fidelity"
    files = [str(d / f"seeds/replayed_seed{s}.json") for s in (0, 1, 2)]
    pooled = tf.pool_kpi_changes(files, "kpi_change_replayed")
    one_step = tf.pool_kpi_changes(files, "kpi_change_effect")
    stored = json.loads((d / "seeds/pooled.json").read_text())
    assert stored["kpi_change_replayed"]["coverage"] == pytest.approx(pooled["coverage"])
    k = round(pooled["coverage"] * pooled["n"])
    page = (d / "README.md").read_text()
    assert f"**{k} / {pooled['n']} = {100 * pooled['coverage']:.1f} %" in page
    assert f"{100 * one_step['coverage']:.1f} %" in page
    assert f"**{pooled['median_width_points']:.0f}** |" in page
