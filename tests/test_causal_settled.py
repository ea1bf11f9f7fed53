"""The cross-fitted choice of λ stops early where it is settled (issue 47: the causal fit's cost):
a band the error cannot bound (the worst policy one held-out group) whose most invariant λ held at
two successive checks ends the selection there, with the full selection's choice; where the band
is bounded nothing changes; a fold that trains on one policy trains one net for every λ."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch as th

from edgetwin.imitation import causal
from edgetwin.imitation.causal import CausalResponseModel, NetStack, _prepared, policy_codes

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_causal_twin import BETA, TOLERANCE, confounded_log, effect, one_torch_thread  # noqa: E402, F401


def one_group_arm() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The confounded closed-form system (hidden load drives the knob and the latency; truth
    ``β = -1``) with its randomized arm as a single group (one agent-day, as log c1's arms), the
    production rows in groups of 10: ``x (4000, 2)``, ``y (4000, 1)``, policy, groups."""
    x, y, policy = confounded_log(4000, share_random=0.1, seed=0)
    return x, y, policy, np.where(policy == "canary", -1, np.arange(len(x)) // 10)


def test_a_settled_unbounded_band_stops_at_half_the_steps_with_the_full_choice(monkeypatch: Any) -> None:
    """The arm is one held-out group: its error has no standard error, every λ is in the band, the
    most invariant λ is the same at a quarter and at half of the steps, so the selection stops at
    half (125 of 250 steps), choosing what training every λ to the end chooses; the final fit at
    that λ gets the known effect, and the same seed gives the same weights. The fold that holds
    the arm out trains one net for every λ."""
    x, y, policy, groups = one_group_arm()
    sizes: list[int] = []

    class Recorded(NetStack):  # the folds' stacks, as `select_invariance` makes them
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            sizes.append(len(self))

    monkeypatch.setattr(causal, "NetStack", Recorded)
    fits = [CausalResponseModel((32, 32), steps=250, seed=0).fit(x, y, policy, groups=groups) for _ in range(2)]
    # the fold that holds the arm out trains on production alone: one net for every λ
    assert sorted(sizes[:3]) == [1, 4, 4]
    monkeypatch.setattr(causal, "SELECTION_SETTLED", False)
    full = CausalResponseModel((32, 32), steps=250, seed=0).fit(x, y, policy, groups=groups)
    assert fits[0].cv_steps == 125 and full.cv_steps == 250
    assert fits[0].chosen == full.chosen >= 30
    assert abs(effect(fits[0], x[:, 0]) - BETA) < TOLERANCE
    assert np.array_equal(fits[0].mean(x), fits[1].mean(x)) and fits[0].cv_errors == fits[1].cv_errors
    # the final fit depends on the selection through λ only: the same net as the full selection's
    assert np.array_equal(fits[0].mean(x), full.mean(x))


def test_where_the_band_is_bounded_the_stop_never_fires(monkeypatch: Any) -> None:
    """The same system with the arm in groups of 10 rows: the worst policy's error has a standard
    error at every check, so the selection is the one without the stop, to the bit."""
    x, y, policy, _ = one_group_arm()
    groups = np.arange(len(x)) // 10
    now = CausalResponseModel((16, 16), steps=120, seed=1).fit(x, y, policy, groups=groups)
    monkeypatch.setattr(causal, "SELECTION_SETTLED", False)
    before = CausalResponseModel((16, 16), steps=120, seed=1).fit(x, y, policy, groups=groups)
    assert now.cv_steps == before.cv_steps and now.cv_errors == before.cv_errors
    assert now.cv_violation == before.cv_violation and np.array_equal(now.mean(x), before.mean(x))


@pytest.mark.parametrize("lams", [(0.0, 3.0, 30.0, 300.0), (0.0, 300.0)])
def test_on_one_policy_every_lambda_trains_the_same_net(lams: tuple[float, ...]) -> None:
    """On rows of a single policy the penalty and its gradient are exactly zero: a stack's nets are
    the same fit whatever their λ, and the same as a stack of one net (what a fold that trains on
    one policy runs in `select_invariance`), up to float rounding (a stack of one net may take
    another GEMM path than a stack of four)."""
    x, y, policy = confounded_log(1500, share_random=0.1, seed=3)
    xs, ys = _prepared(x, y)
    codes = policy_codes(policy, len(x))
    rows = np.flatnonzero(policy == "production")
    model = CausalResponseModel((16, 16), steps=40, batch=256, seed=2)
    many = NetStack(model, xs, ys, codes, lams, 40, 256, rows=rows)
    one = NetStack(model, xs, ys, codes, (lams[-1],), 40, 256, rows=rows)
    many.run(40)
    one.run(40)
    with th.no_grad():
        for i in range(len(lams)):
            np.testing.assert_allclose(many.predict(xs, i), one.predict(xs, 0), rtol=0, atol=1e-5)
        # and it trained: the net is not its initialisation
        start = NetStack(model, xs, ys, codes, (0.0,), 40, 256, rows=rows)
        assert float(np.abs(one.predict(xs, 0) - start.predict(xs, 0)).max()) > 1e-2
