"""A response model that learns effects, not habits: invariance across the logged policies.

A scheduler decides from what it sees, including what the log does not hold (a hidden load, an
operator's hunch). Fit to its logs, a response model learns its habits as the system's laws: where it
raised a knob *because* the hidden load was high, "the knob goes with high latency". Replayed under
another policy, that is fiction.

The method (the distributional invariance of CausalSim, Alomar et al. NSDI 2023, with moment matching
in place of its adversarial discriminator): when a log holds several policies (regimes over time,
randomized canary arms) and which policy decided is unrelated to the conditions the system was in
(randomized arms: by construction; regimes: when the conditions did not change with the regime),
the part of the outputs that the inputs and the action do not explain — the residual
``r = y - F(x, a)`` — is the trace of those hidden conditions, and must be *distributed the same under
every policy*. A model that credits the action with what the hidden conditions did leaves residuals
whose spread depends on how each policy tied its actions to those conditions. So `CausalResponseModel`
fits an MLP ``F`` minimising

    (1/K) Σ_k mean_k |r|²  +  λ (1/K) Σ_k Σ_j [ (mean_k r_j - m_j)² + (log var_k r_j - log v_j)² ]

over the K logged policies (``m``, ``v``: the policies' average residual mean and variance): each
policy's rows weigh the same in the error (a randomized arm on 1 % of the rows is not drowned by the
production policy), and the penalty asks every policy's residuals to have the same mean and
variance per output. With one policy the penalty is zero and this is plain regression.

Why not importance weighting: the log's propensities reweight rows so that actions look randomized,
but a production policy with 10 % noise never takes most actions in most conditions (no overlap),
so no weight can recover the effect from its rows. On the closed-form system of
``tests/test_causal_twin.py`` (a hidden load drives both the scheduler's knob and the latency),
stabilised inverse-propensity weighting with the logged propensities moved the estimated effect of
the knob from +5.8 (today's regression) only to +3.4, the truth being -1; this model gets -1 ± 0.3.

Federation: the loss depends on the rows only through per-policy sums (count, Σr and Σr² per
output; Σ|r|² is the sum of the latter), so a federated fit can aggregate those per round without
any raw row leaving its site (`group_sums`, `invariance_loss`; `edgetwin.federation.twin.causal`).

Shapes: ``x (N, in)`` client inputs, ``y (N, out)`` standardised outputs (as for
`SupervisedResponseModel`), ``policy (N,)`` any hashable ids. Outputs are clipped to ±`OUTPUT_CLIP`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch as th

from edgetwin.imitation.mail import OUTPUT_CLIP

#: Default weight of the invariance penalty (targets are standardised; 100-1000 pins the residual
#: moments to a few % without slowing the error term down on the closed-form system).
INVARIANCE = 300.0


class CausalResponseModel:
    """MLP regression of client outputs whose residuals are invariant across logged policies.

    Args:
        hidden: hidden layer sizes.
        invariance: λ, the weight of the invariance penalty.
        steps: Adam steps.
        batch: rows drawn per policy per step (all of a policy's rows when it has fewer).
        lr: Adam's learning rate.
        seed: seeds the initialisation and the batches.
    """

    def __init__(
        self,
        hidden: tuple[int, ...] = (64, 64),
        invariance: float = INVARIANCE,
        steps: int = 600,
        batch: int = 4096,
        lr: float = 1e-2,
        seed: int = 0,
    ) -> None:
        if invariance < 0 or steps < 1 or batch < 2:
            raise ValueError(f"need invariance >= 0, steps >= 1, batch >= 2; got {invariance}, {steps}, {batch}")
        self.hidden, self.invariance, self.steps, self.batch, self.lr, self.seed = (
            tuple(hidden), float(invariance), int(steps), int(batch), float(lr), int(seed)
        )
        self.net: th.nn.Sequential | None = None
        self.noise_std: np.ndarray = np.zeros(0)
        self.history: list[tuple[float, float]] = []  # (error, penalty) every 50 steps

    def fit(self, x: np.ndarray, y: np.ndarray, policy: Sequence[object] | np.ndarray | None = None) -> CausalResponseModel:
        """Fit on ``x (N, in)`` -> ``y (N, out)``; ``policy (N,)`` says which policy decided each row.

        Runs on one torch thread (restored after): the net is small, and on a shared 2-core machine
        two threads made a 250-step fit 15 times slower, not faster.
        """
        threads = th.get_num_threads()
        th.set_num_threads(1)
        try:
            return self._fit(x, y, policy)
        finally:
            th.set_num_threads(threads)

    def _fit(self, x: np.ndarray, y: np.ndarray, policy: Sequence[object] | np.ndarray | None) -> CausalResponseModel:
        x = np.asarray(x, np.float32)
        y = np.clip(np.asarray(y, np.float32), -OUTPUT_CLIP, OUTPUT_CLIP)
        if y.ndim == 1:
            y = y[:, None]
        codes = np.zeros(len(x), np.int64) if policy is None else np.unique(np.asarray(policy, dtype=str), return_inverse=True)[1]
        groups = [np.flatnonzero(codes == k) for k in range(int(codes.max()) + 1)]
        groups = [g for g in groups if len(g) >= 2]  # a variance needs two rows
        gen = th.Generator().manual_seed(self.seed)
        self.net = self.init_net(x.shape[1], y.shape[1])
        opt = th.optim.Adam(self.net.parameters(), lr=self.lr)
        sched = th.optim.lr_scheduler.CosineAnnealingLR(opt, self.steps)
        xt, yt = th.from_numpy(x), th.from_numpy(y)
        gt = [th.from_numpy(g) for g in groups]
        for step in range(self.steps):
            idx = [g if len(g) <= self.batch else g[th.randint(len(g), (self.batch,), generator=gen)] for g in gt]
            res = [yt[i] - self.net(xt[i]) for i in idx]
            error = th.stack([(r**2).mean() for r in res]).mean()
            means = th.stack([r.mean(0) for r in res])  # (K, out)
            logvar = th.stack([th.log(r.var(0) + 1e-6) for r in res])
            penalty = ((means - means.mean(0)) ** 2).sum(1).mean() + (
                (logvar - th.log(logvar.exp().mean(0))) ** 2
            ).sum(1).mean()
            loss = error + self.invariance * penalty
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            if step % 50 == 0 or step == self.steps - 1:
                self.history.append((float(error.detach()), float(penalty.detach())))
        resid = y - self.mean(x)
        self.noise_std = resid.std(axis=0)
        return self

    def init_net(self, n_in: int, n_out: int) -> th.nn.Sequential:
        """The untrained MLP ``n_in -> hidden (tanh) -> n_out``, initialised from ``seed`` (torch's
        global generator): `fit` starts from it, and so does a federated fit of the same seed, so
        both start from the same weights."""
        th.manual_seed(self.seed)
        layers: list[th.nn.Module] = []
        width = n_in
        for h in self.hidden:
            layers += [th.nn.Linear(width, h), th.nn.Tanh()]
            width = h
        layers.append(th.nn.Linear(width, n_out))
        return th.nn.Sequential(*layers)

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The fitted model as plain arrays (saved as npz, no pickle); `from_arrays` inverts it.

        ``weight_i (out, in)`` / ``bias_i (out,)`` of the i-th linear layer (tanh between them),
        ``noise_std (out,)`` and the hyper-parameters, so that a loaded model predicts and samples
        exactly as the fitted one.
        """
        if self.net is None:
            raise RuntimeError("CausalResponseModel.to_arrays before fit")
        linears = [m for m in self.net if isinstance(m, th.nn.Linear)]
        out = {f"weight_{i}": m.weight.detach().numpy().copy() for i, m in enumerate(linears)}
        out.update({f"bias_{i}": m.bias.detach().numpy().copy() for i, m in enumerate(linears)})
        out["noise_std"] = np.asarray(self.noise_std)
        out["hyper"] = np.asarray([self.invariance, self.steps, self.batch, self.lr, self.seed], np.float64)
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> CausalResponseModel:
        """The model `to_arrays` wrote: the same weights, so the same predictions.

        Raises:
            KeyError, ValueError: an array is missing, not floating point or of inconsistent shape.
        """
        n = sum(1 for k in arrays if k.startswith("weight_"))
        weights = [np.asarray(arrays[f"weight_{i}"]) for i in range(n)]
        biases = [np.asarray(arrays[f"bias_{i}"]) for i in range(n)]
        if n < 1 or any(a.dtype.kind != "f" for a in (*weights, *biases)):
            raise ValueError("weights must be floating point, at least one layer")
        if any(w.ndim != 2 for w in weights) or any(b.shape != (w.shape[0],) for w, b in zip(weights, biases, strict=True)) \
                or any(a.shape[0] != b.shape[1] for a, b in zip(weights, weights[1:], strict=False)):
            raise ValueError("inconsistent layer shapes")
        invariance, steps, batch, lr, seed = (float(v) for v in np.asarray(arrays["hyper"], np.float64))
        m = cls(tuple(w.shape[0] for w in weights[:-1]), invariance, int(steps), int(batch), lr, int(seed))
        layers: list[th.nn.Module] = []
        for i, (w, b) in enumerate(zip(weights, biases, strict=True)):
            lin = th.nn.Linear(w.shape[1], w.shape[0])
            with th.no_grad():
                lin.weight.copy_(th.from_numpy(w.astype(np.float32)))
                lin.bias.copy_(th.from_numpy(b.astype(np.float32)))
            layers.append(lin)
            if i < n - 1:
                layers.append(th.nn.Tanh())
        m.net = th.nn.Sequential(*layers)
        m.noise_std = np.asarray(arrays["noise_std"], np.float32)
        if m.noise_std.shape != (weights[-1].shape[0],):
            raise ValueError("noise_std does not match the outputs")
        return m

    def mean(self, x: np.ndarray) -> np.ndarray:
        """``(N, out)`` predicted standardised outputs."""
        if self.net is None:
            raise RuntimeError("CausalResponseModel.mean before fit")
        if len(x) == 0:
            return np.zeros((0, len(self.noise_std)), dtype=np.float32)
        with th.no_grad():
            return self.net(th.as_tensor(np.asarray(x, np.float32))).numpy().astype(np.float32)

    @property
    def std(self) -> np.ndarray:
        return self.noise_std

    def sample(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        mu = self.mean(x)
        return np.clip(mu + self.noise_std * rng.standard_normal(mu.shape), -OUTPUT_CLIP, OUTPUT_CLIP).astype(
            np.float32
        )


def group_sums(residuals: Sequence[th.Tensor]) -> th.Tensor:
    """``(K, 1 + 2·out)``: per policy, its row count, Σr and Σr² per output — everything
    `invariance_loss` needs from the rows (differentiable in the residuals ``(n_k, out)``)."""
    out = []
    for r in residuals:
        n = th.full((1,), float(len(r)), dtype=r.dtype)
        out.append(th.cat([n, r.sum(0), (r * r).sum(0)]))
    return th.stack(out)


def invariance_loss(sums: th.Tensor, invariance: float) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
    """`CausalResponseModel`'s loss from per-policy sums ``(K, 1 + 2·out)`` (`group_sums`):
    ``(loss, error, penalty)``.

    The same quantities `fit` computes on a batch's residuals — the per-policy mean squared
    residual, mean and unbiased variance (torch's ``var``) — written as functions of the sums, so
    that sums added up over several sites give the loss of their pooled rows. Policies with fewer
    than two rows are left out (a variance needs two), as `fit` leaves them out.
    """
    n = sums[:, 0]
    keep = n >= 2
    if not bool(keep.any()):
        zero = sums.sum() * 0.0
        return zero, zero, zero
    out = (sums.shape[1] - 1) // 2
    n, s1, s2 = n[keep], sums[keep, 1 : 1 + out], sums[keep, 1 + out :]
    error = (s2.sum(1) / (n * out)).mean()
    means = s1 / n[:, None]
    var = (s2 - n[:, None] * means**2) / (n[:, None] - 1)
    logvar = th.log(var.clamp_min(0.0) + 1e-6)
    penalty = ((means - means.mean(0)) ** 2).sum(1).mean() + (
        (logvar - th.log(logvar.exp().mean(0))) ** 2
    ).sum(1).mean()
    return error + invariance * penalty, error, penalty
