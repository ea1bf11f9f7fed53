"""The causal stack's Adam in numpy over one flat buffer (`FlatAdam`, issue 47: the causal fit's
optimiser) is torch's Adam with its cosine schedule up to float rounding, and a dropped net still
changes nothing of the others."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch as th

from edgetwin.imitation.causal import CausalResponseModel, FlatAdam, NetStack

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from scale import _steps_with_torch_adam  # noqa: E402
from test_causal_selection import one_torch_thread, toy  # noqa: E402, F401  (an autouse fixture)


def _arrays(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in ((3, 5, 8), (3, 8, 2), (3, 1, 8), (3, 1, 2))]


def test_flat_adam_is_torchs_adam_and_cosine_schedule() -> None:
    """60 steps of random gradients (scaled over 6 orders of magnitude) on four arrays: every
    parameter within float32 rounding of torch's ``Adam(foreach=True)`` + ``CosineAnnealingLR``,
    and the learning rate the schedule's, step for step, to the bit (the same float64 formula)."""
    start = _arrays(0)
    ours = FlatAdam(start, lr=1e-2, steps=60)
    params = [th.nn.Parameter(th.from_numpy(a.copy())) for a in start]
    opt = th.optim.Adam(params, lr=1e-2, foreach=True)
    sched = th.optim.lr_scheduler.CosineAnnealingLR(opt, 60)
    rng = np.random.default_rng(1)
    for step in range(60):
        grads = [(rng.standard_normal(a.shape) * 10.0 ** rng.integers(-4, 2)).astype(np.float32) for a in start]
        for view, g in zip(ours.views(ours.grad), grads, strict=True):
            view[...] = g
        for p, g in zip(params, grads, strict=True):
            p.grad = th.from_numpy(g)
        ours.step()
        opt.step()
        sched.step()
        assert ours.lr == opt.param_groups[0]["lr"], step
        for mine, theirs in zip(ours.views(ours.theta), params, strict=True):
            np.testing.assert_allclose(mine, theirs.detach().numpy(), rtol=2e-6, atol=2e-6 * (1 + step) * 1e-2)
    assert ours.lr == 0.0 and math.isclose(opt.param_groups[0]["lr"], 0.0, abs_tol=0.0)


def test_flat_adam_keep_is_the_whole_stack_to_the_bit() -> None:
    """Nets 0 and 2 of three, kept after 20 of 40 steps: element-wise arithmetic, so their
    parameters and moments are the whole stack's, exactly."""
    whole, part = FlatAdam(_arrays(2), lr=1e-2, steps=40), FlatAdam(_arrays(2), lr=1e-2, steps=40)
    rng = np.random.default_rng(3)
    for step in range(40):
        g = rng.standard_normal(whole.grad.shape).astype(np.float32)
        whole.grad[...] = g
        if step == 20:
            part.keep([0, 2])
        if step < 20:
            part.grad[...] = g
        else:
            for mine, full in zip(part.views(part.grad), whole.views(g), strict=True):
                mine[...] = full[[0, 2]]
        whole.step()
        part.step()
    for buf in ("theta", "m", "v"):
        for mine, full in zip(part.views(getattr(part, buf)), whole.views(getattr(whole, buf)), strict=True):
            assert mine.tobytes() == np.ascontiguousarray(full[[0, 2]]).tobytes(), buf
    assert part.lr == whole.lr


def _fit_with_torchs_adam(stack: NetStack, steps: int) -> None:
    """The stack's training loop as it was before (torch's Adam and schedule over the stack's
    parameters: benchmarks/scale.py keeps it to time and compare against)."""
    opt = th.optim.Adam([*stack.weights, *stack.biases], lr=stack.model.lr, foreach=True)
    _steps_with_torch_adam(stack, opt, th.optim.lr_scheduler.CosineAnnealingLR(opt, steps), steps)


def test_a_stack_fitted_with_flat_adam_is_the_torch_adam_fit_up_to_rounding() -> None:
    """Three nets (λ 0, 3, 30), 80 steps: the predictions of the two fits agree to ~1e-4 of the
    outputs' scale (float32 rounding, amplified over the steps), far below what λ changes."""
    x, y, codes = toy()
    model = CausalResponseModel((16,), steps=80, batch=256, seed=3)
    ours, theirs = NetStack(model, x, y, codes, (0.0, 3.0, 30.0), 80, 256), NetStack(model, x, y, codes, (0.0, 3.0, 30.0), 80, 256)
    ours.run(80)
    _fit_with_torchs_adam(theirs, 80)
    scale = float(np.abs(y).max())
    for i in range(3):
        gap = float(np.abs(ours.predict(x, i) - theirs.predict(x, i)).max())
        assert gap <= 1e-4 * scale, (i, gap)
    assert float(np.abs(ours.predict(x, 2) - ours.predict(x, 0)).max()) > 1e-2 * scale  # λ matters more than rounding
