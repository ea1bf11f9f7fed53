"""The causal model's training step with its arrays kept and its element-wise passes compiled
(`NetStack._gradients`: `_StepBuffers`, `_residuals`, `_output_grad`, `_tanh_backward`) trains the
same nets, to the bit, as the numpy passes it replaced (issue 47: the causal fit made cheaper
without changing what it fits)."""

from __future__ import annotations

import numpy as np
import torch as th

from edgetwin.imitation.causal import CausalResponseModel, NetStack, _stack_loss_grad


class NumpyPassesStack(NetStack):
    """`NetStack` with the training step as it was before (fresh arrays from every GEMM, numpy
    passes between them): the reference the compiled step must reproduce bit for bit."""

    def _gradients(self, xb: th.Tensor, yb: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        n = len(self.lam)
        weights = [w.detach() for w in self.weights]
        biases = [b.detach() for b in self.biases]
        xs = xb.expand(n, -1, -1)
        acts: list[th.Tensor] = []
        for w, bias in zip(weights[:-1], biases[:-1], strict=True):
            z = th.baddbmm(bias, acts[-1] if acts else xs, w)
            np.tanh(z.numpy(), out=z.numpy())
            acts.append(z)
        r = th.baddbmm(biases[-1], acts[-1], weights[-1]).neg_().add_(yb)
        error, penalty, g1, g2 = _stack_loss_grad(th.matmul(self.member, r).numpy(),
                                                  th.matmul(self.member, r * r).numpy(), self.sizes, self.lam_np)
        rn = r.numpy()
        d = np.empty_like(rn)
        for k, (lo, hi) in enumerate(self.blocks):
            np.multiply(rn[:, lo:hi], (-2.0 * g2[:, k, None, :]).astype(np.float32), out=d[:, lo:hi])
            d[:, lo:hi] -= g1[:, k, None, :].astype(np.float32)
        dt = th.from_numpy(d)
        k = len(weights)
        gw, gb = self._grads[:k], self._grads[k:]
        for i in range(k - 1, 0, -1):
            a = acts[i - 1]
            self.weights[i].grad = th.bmm(a.transpose(1, 2), dt, out=gw[i])
            self.biases[i].grad = th.sum(dt, 1, keepdim=True, out=gb[i])
            dt = th.bmm(dt, weights[i].transpose(1, 2))
            an = a.numpy()
            slope = np.multiply(an, an)
            np.subtract(1.0, slope, out=slope)
            dn = dt.numpy()
            dn *= slope
        self.weights[0].grad = th.bmm(xs.transpose(1, 2), dt, out=gw[0])
        self.biases[0].grad = th.sum(dt, 1, keepdim=True, out=gb[0])
        return th.from_numpy(error.astype(np.float32)), th.from_numpy(penalty.astype(np.float32))


def _data(n: int = 900, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Three policies of very different sizes (two small arms drawn whole, one drawn with replacement)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 7)).astype(np.float32)
    y = (np.tanh(x[:, :3] @ rng.standard_normal((3, 3))) + 0.3 * rng.standard_normal((n, 3))).astype(np.float32)
    codes = np.full(n, 2)
    codes[:40], codes[40:70] = 0, 1
    return x, y, codes


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def test_a_stack_trains_the_numpy_passes_nets_to_the_bit() -> None:
    """4 nets (the selection's stack), two hidden layers, 60 steps with one net dropped halfway
    (`keep`: the step's arrays are remade): every weight, bias and Adam moment, and the step's
    error and penalty, equal to the bit; and the nets moved (the comparison is not of the start)."""
    x, y, codes = _data()
    model = CausalResponseModel((16, 8), steps=60, batch=256, seed=3)
    lams = (0.0, 3.0, 30.0, 300.0)
    new, old = NetStack(model, x, y, codes, lams, 60, 256), NumpyPassesStack(model, x, y, codes, lams, 60, 256)
    start = new.adam.theta.copy()
    hist_new: list[tuple[float, float]] = []
    hist_old: list[tuple[float, float]] = []
    new.run(30, hist_new)
    old.run(30, hist_old)
    new.keep([0, 1, 3])
    old.keep([0, 1, 3])
    new.run(60, hist_new)
    old.run(60, hist_old)
    for a, b in ((new.adam.theta, old.adam.theta), (new.adam.m, old.adam.m), (new.adam.v, old.adam.v)):
        np.testing.assert_array_equal(_bits(a), _bits(b))
    assert hist_new == hist_old and len(hist_new) == 3
    assert float(np.abs(new.adam.theta[: start.size // 4] - start[: start.size // 4]).max()) > 1e-3


def test_a_model_fit_is_the_numpy_passes_fit_to_the_bit(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`CausalResponseModel.fit` with λ chosen by cross-fitting (successive halving drops nets from
    the folds' stacks) and its final fit: the same λ, held-out errors and predictions to the bit."""
    x, y, codes = _data(600, seed=1)
    groups = np.arange(600) // 20
    fits = []
    for cls in (NetStack, NumpyPassesStack):
        monkeypatch.setattr("edgetwin.imitation.causal.NetStack", cls)
        m = CausalResponseModel((12, 12), steps=40, batch=128, seed=5).fit(x, y, codes, groups=groups)
        fits.append((m.chosen, m.cv_errors, m.mean(x)))
    assert fits[0][0] == fits[1][0] and fits[0][1] == fits[1][1]
    np.testing.assert_array_equal(_bits(fits[0][2]), _bits(fits[1][2]))
