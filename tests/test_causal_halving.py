"""The cross-fitted choice of the invariance weight stops the λ that are out of the running early
(issue 47: the causal fit's cost): a net dropped from a stack changes nothing of the others' fits,
and the choice with the drops is the choice without them."""

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
from test_causal_selection import one_torch_thread, toy  # noqa: E402, F401  (an autouse fixture)
from test_causal_twin import confounded_log, unconfounded_log  # noqa: E402


def test_a_dropped_net_changes_nothing_of_the_others() -> None:
    """Three nets trained 30 steps, the middle one dropped, 30 more: the survivors are the nets of
    the whole stack trained 60 steps (to float rounding), Adam's state and the schedule included."""
    x, y, codes = toy()
    model = CausalResponseModel((16,), steps=60, batch=256, seed=3)
    whole = NetStack(model, x, y, codes, (0.0, 3.0, 30.0), 60, 256)
    whole.run(60)
    halved = NetStack(model, x, y, codes, (0.0, 3.0, 30.0), 60, 256)
    halved.run(30)
    halved.keep([0, 2])
    halved.run(60)
    assert len(halved) == 2 and halved.lam.tolist() == [0.0, 30.0]
    with th.no_grad():
        for i, j in ((0, 0), (2, 1)):
            np.testing.assert_allclose(whole.predict(x, i), halved.predict(x, j), atol=2e-4)
        # the dropped net mattered: it differs from its neighbours
        assert float(np.abs(whole.predict(x, 1) - whole.predict(x, 0)).max()) > 1e-3


def test_a_stack_over_some_rows_is_the_stack_of_those_rows() -> None:
    """``rows``: the same draws and fits as a stack of the rows' own copy (no copy is made)."""
    x, y, codes = toy(700, seed=2)
    rows = np.flatnonzero(np.arange(700) % 3 != 1)
    model = CausalResponseModel((8,), steps=20, batch=128, seed=1)
    a = NetStack(model, x, y, codes, (0.0, 30.0), 20, 128, rows=rows)
    b = NetStack(model, np.ascontiguousarray(x[rows]), np.ascontiguousarray(y[rows]), codes[rows], (0.0, 30.0), 20, 128)
    a.run(20)
    b.run(20)
    for i in range(2):
        np.testing.assert_allclose(a.predict(x, i), b.predict(x, i), atol=1e-5)


@pytest.mark.parametrize(("log", "seed"), [
    (unconfounded_log, 0),  # the near tie (~15 s: two cross-fittings)
    pytest.param(unconfounded_log, 2, marks=pytest.mark.slow),
    pytest.param(confounded_log, 0, marks=pytest.mark.slow),
])
def test_the_choice_with_drops_is_the_choice_without(log: Any, seed: int, monkeypatch: Any) -> None:
    """On the closed-form systems (the unconfounded one's λ = 0 / 3 is a near tie), stopping the λ
    that are out of the running at a quarter and half of the steps chooses what training every λ
    to the end chooses, with the same held-out errors for the λ that ran to the end."""
    x, y, policy = log(4000, share_random=0.1, seed=seed)
    xs, ys = _prepared(x, y)
    codes = policy_codes(policy, len(x))
    halving = CausalResponseModel((32, 32), steps=250, seed=seed)
    chosen = causal.select_invariance(halving, xs, ys, codes, None)
    monkeypatch.setattr(causal, "SELECTION_CHECKS", ())
    full = CausalResponseModel((32, 32), steps=250, seed=seed)
    assert causal.select_invariance(full, xs, ys, codes, None) == chosen
    ran = [lam for lam in causal.GRID if halving.cv_errors[lam] == pytest.approx(full.cv_errors[lam], rel=1e-3)]
    assert chosen in ran and len(halving.cv_errors) == len(causal.GRID)
