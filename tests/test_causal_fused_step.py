"""The causal model's training step with backpropagation written out (`NetStack._gradients`,
`_stack_loss_grad`) computes autograd's gradient of the same loss (issue 47: the causal fit made
cheaper without changing what it fits)."""

from __future__ import annotations

import numpy as np
import torch as th

from edgetwin.imitation.causal import CausalResponseModel, NetStack, _stack_loss, _stack_loss_grad


def test_the_loss_gradient_in_the_policy_sums_is_autograds() -> None:
    """Closed form against autograd on float64 sums of 4 nets x 3 policies x 2 outputs; λ = 0
    (error only) and large λ (the penalty dominates); one policy's variance clamped (var < 0)."""
    gen = th.Generator().manual_seed(0)
    count = th.tensor([[4.0], [11.0], [60.0]], dtype=th.float64)
    s1 = th.randn(4, 3, 2, dtype=th.float64, generator=gen) * 3
    s2 = s1**2 / count + th.rand(4, 3, 2, dtype=th.float64, generator=gen) * 5
    s2[1, 0, 1] = s1[1, 0, 1] ** 2 / count[0, 0] - 0.5  # a negative variance: clamped, no gradient through it
    lam = th.tensor([0.0, 3.0, 30.0, 300.0], dtype=th.float64)
    a, b = s1.clone().requires_grad_(), s2.clone().requires_grad_()
    error, penalty = _stack_loss(a, b, count)
    ga, gb = th.autograd.grad((error + lam * penalty).sum(), (a, b))
    e2, p2, g1, g2 = _stack_loss_grad(s1.numpy(), s2.numpy(), count[:, 0].numpy(), lam.numpy())
    np.testing.assert_allclose(e2, error.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(p2, penalty.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(g1, ga.numpy(), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(g2, gb.numpy(), rtol=1e-9, atol=1e-9)
    assert np.abs(g1[0]).max() == 0.0 and np.abs(g1[3]).max() > 1.0  # λ = 0: the error does not involve Σr


def test_the_written_out_step_is_autograds_gradient() -> None:
    """Every weight and bias gradient of a stack of 3 nets (two hidden layers) on one batch equals
    autograd's through the plain forward pass (float32: to a relative 1e-4 of the largest entry)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((300, 5)).astype(np.float32)
    y = (np.tanh(x[:, :3]) + 0.3 * rng.standard_normal((300, 3))).astype(np.float32)
    codes = np.where(rng.random(300) < 0.25, 1, 0)
    model = CausalResponseModel((16, 8), steps=20, batch=1000, seed=2)
    stack = NetStack(model, x, y, codes, (0.0, 3.0, 300.0), 20, 1000)
    stack.run(5)  # away from the initial weights
    # a batch of 1000 per policy holds every row: the draw is each policy's rows in turn
    idx = th.from_numpy(np.concatenate([np.flatnonzero(codes == k) for k in (0, 1)]))
    xb, yb = stack.xt[idx], stack.yt[idx]
    error, penalty = stack._gradients(xb, yb)
    grads = [p.grad for p in (*stack.weights, *stack.biases)]
    assert all(g is not None for g in grads)
    written = [g.clone() for g in grads if g is not None]
    h = th.einsum("bi,lih->lbh", xb, stack.weights[0]) + stack.biases[0]
    for w, b in zip(stack.weights[1:], stack.biases[1:], strict=True):
        h = th.tanh(h) @ w + b
    r = yb[None] - h
    e2, p2 = _stack_loss(stack.member @ r, stack.member @ (r * r), stack.count)
    ref = th.autograd.grad((e2 + stack.lam * p2).sum(), [*stack.weights, *stack.biases])
    th.testing.assert_close(error, e2.detach(), rtol=1e-4, atol=1e-6)
    th.testing.assert_close(penalty, p2.detach(), rtol=1e-4, atol=1e-6)
    for mine, theirs in zip(written, ref, strict=True):
        assert mine.shape == theirs.shape
        assert float((mine - theirs).abs().max()) <= 1e-4 * float(theirs.abs().max())
