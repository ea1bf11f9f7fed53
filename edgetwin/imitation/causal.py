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

How strongly to ask for the invariance is chosen from the data, not fixed: with several policies
(`fit` with ``invariance="cv"``, the default) the model is cross-fitted on folds of whole groups
(agent-days: rows of one agent's day are not independent) for each λ of `GRID` (0 included: then it
is each-policy-weighed-alike regression), and the λ with the lowest held-out *per-policy* error —
each policy's held-out mean squared error, averaged over the policies with equal weight, so a small
randomized arm counts as much as the production policy — is refit on all rows. The cross-fitting's fits draw a quarter of the model's rows per policy per
step (`SELECTION_BATCH`), the four λ of a fold train side by side as one stack (`NetStack`), and the
λ that are out of the running are stopped early (`SELECTION_CHECKS`), the selection stops where its choice is settled in a
band the held-out error cannot bound (`SELECTION_SETTLED`), and a fold that trains on one policy trains one net for every λ
(`SELECTION_SHARED_FOLDS`); a twin chooses λ once per scenario on its whole log and fits
every ensemble member at it (`choose_invariance`, `edgetwin.twin.twin.Twin.fit`). Why: the invariance
is an assumption (the hidden conditions are distributed the same under every policy, and the
residual spread does not depend on the action); where it holds, a confounded fit predicts the
other policies' rows badly and a large λ wins; where it does not — on the emulated cluster the
scheduler decides from logged state only, and the residual spread grows with load, so the
randomized arms' residuals are legitimately wider — a large λ distorts the fit (its replay ρ fell
from 0.91 at λ = 0 to 0.57 at λ = 300 on a quick log with two randomized rounds) and the held-out
per-policy error says so. The held-out rows never include the evaluation's truth: only the log.

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

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numba
import numpy as np
import torch as th

from edgetwin.imitation.mail import OUTPUT_CLIP

#: Weight of the invariance penalty when it is fixed (targets are standardised; 100-1000 pins the
#: residual moments to a few % without slowing the error term down on the closed-form system).
INVARIANCE = 300.0
#: The λ tried by the cross-fitted selection (``invariance="cv"``): none, weak, medium, strong.
GRID = (0.0, 3.0, 30.0, 300.0)
#: Folds of the cross-fitted selection.
FOLDS = 3
#: The cross-fitted selection's fits draw this share of the model's rows per policy per step
#: (`select_invariance`; the same Adam steps): they only rank the λ of `GRID`, the final fit at the
#: chosen λ draws the model's own. Why a quarter: on the scale benchmark's multi-policy log (48,000
#: rows; docs/benchmarks/scale/README.md, "The fit") and on the closed-form systems of
#: tests/test_causal_twin.py it chose the same λ as full batches, at ~a quarter of the cost; a
#: third of the steps did not (on the unconfounded system it chose λ = 0 over 3).
SELECTION_BATCH = 1 / 4
#: Shares of the selection's steps at which `select_invariance` drops the λ that are out of the
#: running (successive halving; the survivors' fits continue unchanged), and how far out: a λ whose
#: held-out worst-policy error is more than `SELECTION_DROP_SE` standard errors above the best λ's
#: there. Why these: on the unconfounded and confounded systems of tests/test_causal_twin.py
#: (3 seeds each) and the scale benchmark's log c1, traced every 1/12 of the steps, a λ's excess
#: over the best shrank to 60-70 % of its value at a quarter of the steps by the end, and the
#: near-tie λ = 0 / 3 of the unconfounded system stood at 2.0 standard errors there; with 3 a
#: dropped λ ends above the one-standard-error band the final rule keeps.
SELECTION_CHECKS: tuple[float, ...] = (1 / 4, 1 / 2)
SELECTION_DROP_SE = 3.0
#: Stop the selection at a check of `SELECTION_CHECKS` when the rule's band was unbounded there and
#: at the check before (the worst policy at the best λ one held-out group both times: its error
#: has no standard error, so every λ is in the band and the error cannot choose) and the most
#: invariant λ — the rule's choice in an unbounded band — is the same λ at both: that λ is the
#: choice. Why: in an unbounded band the choice is the held-out invariance's ranking alone, and
#: training the λ further only re-measured a ranking that had held since a quarter of the steps.
#: Traced every 1/12 of the steps (benchmarks/scale.py's log c1 and its kin c2, c3 at 100 agents):
#: wherever the band was unbounded at a quarter and at half of the steps with the same most
#: invariant λ there, it was the choice at the end (docs/benchmarks/scale/README.md, "Choosing λ:
#: a settled unbounded band"). The closed-form systems of tests/test_causal_twin.py (every row its
#: own group) never have an unbounded band: the rule does not fire there, and where it does not
#: fire the selection is the one before it, to the bit. False: the selection without this stop.
SELECTION_SETTLED = True
#: A fold whose training rows hold a single policy trains one net for every λ (`select_invariance`);
#: False: one per λ, as before (the same fits up to float rounding, four times the work).
SELECTION_SHARED_FOLDS = True


@dataclass(frozen=True)
class InvarianceChoice:
    """A cross-fitted choice of λ (`choose_invariance`): the λ, and per λ of the grid its held-out
    worst-policy error and invariance violation (`select_invariance`), and the step it decided at."""

    invariance: float
    errors: Mapping[float, float]
    violation: Mapping[float, float]
    #: the selection's Adam steps when it decided (of the model's ``steps``; 0: nothing cross-fitted)
    steps: int = 0


def _prepared(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``x (N, in)`` and ``y (N, out)`` clipped to ±`OUTPUT_CLIP` (a 1-d ``y``: one output)."""
    y = np.clip(np.asarray(y, np.float32), -OUTPUT_CLIP, OUTPUT_CLIP)
    return np.asarray(x, np.float32), y[:, None] if y.ndim == 1 else y


def policy_codes(policy: Sequence[object] | np.ndarray | None, n: int) -> np.ndarray:
    """``(n,)`` int codes of the rows' policy ids (all 0 without ids)."""
    if policy is None:
        return np.zeros(n, np.int64)
    return np.unique(np.asarray(policy, dtype=str), return_inverse=True)[1].astype(np.int64)


class CausalResponseModel:
    """MLP regression of client outputs whose residuals are invariant across logged policies.

    Args:
        hidden: hidden layer sizes.
        invariance: λ, the weight of the invariance penalty, or ``"cv"``: choose it from `GRID` by
            cross-fitted held-out per-policy error (`select_invariance`; with one policy λ is moot
            and no cross-fitting runs). The chosen λ is in ``self.chosen`` and the held-out errors
            per λ in ``self.cv_errors``.
        steps: Adam steps.
        batch: rows drawn per policy per step (all of a policy's rows when it has fewer).
        lr: Adam's learning rate.
        seed: seeds the initialisation and the batches.
    """

    def __init__(
        self,
        hidden: tuple[int, ...] = (64, 64),
        invariance: float | str = "cv",
        steps: int = 600,
        batch: int = 4096,
        lr: float = 1e-2,
        seed: int = 0,
    ) -> None:
        if (invariance != "cv" and (isinstance(invariance, str) or invariance < 0)) or steps < 1 or batch < 2:
            raise ValueError(f"need invariance >= 0 or 'cv', steps >= 1, batch >= 2; got {invariance}, {steps}, {batch}")
        self.hidden, self.steps, self.batch, self.lr, self.seed = (tuple(hidden), int(steps), int(batch), float(lr), int(seed))
        self.invariance: float | str = invariance if isinstance(invariance, str) else float(invariance)
        self.chosen: float = float("nan")
        self.cv_errors: dict[float, float] = {}  # λ -> held-out worst-policy error
        self.cv_violation: dict[float, float] = {}  # λ -> held-out invariance violation
        self.cv_steps = 0  # the selection's Adam steps when it decided (`select_invariance`)
        self.net: th.nn.Sequential | None = None
        self.noise_std: np.ndarray = np.zeros(0)
        self.history: list[tuple[float, float]] = []  # (error, penalty) every 50 steps

    def fit(
        self,
        x: np.ndarray,
        y: np.ndarray,
        policy: Sequence[object] | np.ndarray | None = None,
        groups: Sequence[object] | np.ndarray | None = None,
        chosen: InvarianceChoice | None = None,
    ) -> CausalResponseModel:
        """Fit on ``x (N, in)`` -> ``y (N, out)``; ``policy (N,)`` says which policy decided each row.

        ``groups (N,)``: ids of rows that are not independent of each other (e.g. one agent's day),
        kept together in one fold of the cross-fitted choice of λ (default: every row its own group).

        ``chosen``: with ``invariance="cv"``, a choice of λ already made (`choose_invariance`, e.g.
        once per scenario on the whole log for every bootstrap member of a twin, `Twin.fit`), used
        instead of cross-fitting again on these rows. Why: the cross-fitting is 12 fits, a member's
        own fit one; the members of one twin share the log, so one choice serves them all.

        Runs on one torch thread (restored after): the net is small, and on a shared 2-core machine
        two threads made a 250-step fit 15 times slower, not faster.
        """
        threads = th.get_num_threads()
        th.set_num_threads(1)
        try:
            x, y = _prepared(x, y)
            codes = policy_codes(policy, len(x))
            if self.invariance != "cv":
                self.chosen = float(self.invariance)
            elif chosen is not None:
                self.chosen, self.cv_errors, self.cv_violation = chosen.invariance, dict(chosen.errors), dict(chosen.violation)
                self.cv_steps = chosen.steps
            else:
                self.chosen = select_invariance(self, x, y, codes, groups) if len(np.unique(codes)) >= 2 else 0.0
            self.history = []
            self.net = self._train(x, y, codes, self.chosen)
            self.noise_std = (y - self.mean(x)).std(axis=0)
            return self
        finally:
            th.set_num_threads(threads)

    def _train(self, x: np.ndarray, y: np.ndarray, codes: np.ndarray, invariance: float) -> th.nn.Sequential:
        """One fit of the net at a given λ on float32 ``x``, clipped ``y (N, out)``, policy ``codes``."""
        return self._train_stack(x, y, codes, (invariance,), self.steps, self.batch, history=True)[0]

    def _train_stack(self, x: np.ndarray, y: np.ndarray, codes: np.ndarray, invariances: Sequence[float], steps: int,
                     batch: int, history: bool = False) -> list[th.nn.Sequential]:
        """One fit of the net per λ of ``invariances`` on float32 ``x``, clipped ``y (N, out)``, policy
        ``codes``, trained side by side as one stack (`NetStack`): the same fits as one at a time
        (up to float rounding), at a fraction of the per-step overhead."""
        stack = NetStack(self, x, y, codes, invariances, steps, batch)
        stack.run(steps, self.history if history else None)
        return stack.nets()

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
        out["hyper"] = np.asarray([self.chosen, self.steps, self.batch, self.lr, self.seed], np.float64)
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
        if not invariance >= 0:
            raise ValueError(f"invariance must be >= 0, got {invariance}")
        m = cls(tuple(w.shape[0] for w in weights[:-1]), invariance, int(steps), int(batch), lr, int(seed))
        m.chosen = invariance
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


#: the training step's element-wise kernels: IEEE float32 arithmetic as written (no fast-math
#: reassociation or FMA contraction), so they give the numpy passes' bits; cached on disk
_kernel = numba.njit(fastmath=False, cache=True, nogil=True, boundscheck=False)


@_kernel
def _residuals(y: np.ndarray, r: np.ndarray, r2: np.ndarray) -> None:  # pragma: no cover - compiled
    """In place: ``r (L, B, out)`` holds the nets' outputs and becomes ``y (B, out) - r``; ``r2``
    its square. The numpy passes' float32 bits (``(-out) + y``, then ``r * r``)."""
    for net in range(r.shape[0]):
        for b in range(r.shape[1]):
            for j in range(r.shape[2]):
                v = y[b, j] - r[net, b, j]
                r[net, b, j] = v
                r2[net, b, j] = v * v


@_kernel
def _output_grad(r: np.ndarray, c2: np.ndarray, c1: np.ndarray, ends: np.ndarray,
                 d: np.ndarray) -> None:  # pragma: no cover - compiled
    """``d (L, B, out) = r * c2[net, k] - c1[net, k]`` for the rows of policy block ``k`` (block k ends
    at row ``ends[k]``; ``c1``, ``c2`` float32 ``(L, K, out)``): ``∂loss/∂output`` with
    ``c2 = -2 g2``, ``c1 = g1``. The numpy passes' float32 bits (a product, then a difference)."""
    for net in range(r.shape[0]):
        lo = 0
        for k in range(ends.shape[0]):
            hi = ends[k]
            for b in range(lo, hi):
                for j in range(r.shape[2]):
                    v = r[net, b, j] * c2[net, k, j]
                    d[net, b, j] = v - c1[net, k, j]
            lo = hi


@_kernel
def _tanh_backward(d: np.ndarray, a: np.ndarray) -> None:  # pragma: no cover - compiled
    """In place ``d *= 1 - a * a`` on float32 ``(L, B, h)`` arrays (``a``: the layer's tanh kept):
    tanh's derivative, with the numpy passes' float32 bits (``a * a``, ``1 - ``, the product)."""
    one = np.float32(1.0)
    for net in range(d.shape[0]):
        for b in range(d.shape[1]):
            for j in range(d.shape[2]):
                s = a[net, b, j] * a[net, b, j]
                d[net, b, j] = d[net, b, j] * (one - s)


class _StepBuffers:
    """The arrays a `NetStack` training step writes, for ``nets`` nets on a batch of ``rows`` rows
    with layers of output ``width`` (hidden ones, then the outputs) and policy blocks ending at ``ends``:
    kept from step to step instead of made fresh by every GEMM and pass (a (64, 64) net's step
    on ~4,300 rows made ~8 arrays of ~1 MB a step)."""

    def __init__(self, nets: int, rows: int, width: Sequence[int], ends: Sequence[int]) -> None:
        self.shape = (nets, rows)
        self.acts = [th.empty(nets, rows, h) for h in width[:-1]]  # each hidden layer's tanh
        self.r = th.empty(nets, rows, width[-1])  # the outputs, then the residuals
        self.r2 = th.empty(nets, rows, width[-1])  # the residuals' squares
        self.r_np, self.r2_np = self.r.numpy(), self.r2.numpy()
        self.d = [th.empty(nets, rows, h) for h in width]  # ∂loss/∂(each layer's pre-activation / output)
        self.ends = np.asarray(ends, np.int64)  # each policy block's end row (blocks in turn from row 0)



class NetStack:
    """L fits of a `CausalResponseModel`'s net, one per λ of ``invariances``, trained side by side
    as one stack on the rows ``rows`` of float32 ``x (N, in)``, clipped ``y (N, out)`` with policy
    ``codes (N,)`` (None: all rows), for ``steps`` Adam steps with a cosine schedule, and resumable:
    `run` trains up to a step, `keep` drops nets from the stack, `nets` reads them out.

    The nets (L of them) are ``(L, in, out)`` weight tensors; each step draws one batch (every
    λ's own fit drew the same one: the draws are seeded alike), gathers it once and runs every net
    on it with batched matrix products; the loss is the sum of the λ's losses. The nets share no
    parameter, so each gets its own gradient, and Adam and the cosine schedule act element by
    element: the same fits as one at a time (up to float rounding), at a fraction of the per-step
    overhead — and a net dropped by `keep` changes nothing of the others' fits (up to float
    rounding), which is what lets `select_invariance` stop the λ that are out of the running
    early. A policy's rows are drawn with replacement, ``batch`` per step (all of them when it has
    fewer).

    A step's gradient is backpropagation written out (`_gradients`): the same gradient as autograd's
    (up to float rounding) at about two thirds of the step's time.
    """

    def __init__(
        self,
        model: CausalResponseModel,
        x: np.ndarray,
        y: np.ndarray,
        codes: np.ndarray,
        invariances: Sequence[float],
        steps: int,
        batch: int,
        rows: np.ndarray | None = None,
    ) -> None:
        rows = np.arange(len(x)) if rows is None else np.asarray(rows, np.int64)
        sub = codes[rows]
        groups = [rows[np.flatnonzero(sub == k)] for k in np.unique(sub)]
        groups = [g for g in groups if len(g) >= 2]  # a variance needs two rows
        self.model, self.batch, self.step = model, int(batch), 0
        self.gen = th.Generator().manual_seed(model.seed)
        self.shape = (x.shape[1], y.shape[1])
        start = [m for m in model.init_net(*self.shape) if isinstance(m, th.nn.Linear)]
        n = len(invariances)
        parts = [m.weight.detach().t().expand(n, -1, -1) for m in start]  # (L, in, out)
        parts += [m.bias.detach().expand(n, 1, -1) for m in start]  # (L, 1, out)
        #: Adam over every weight and bias of the stack at once, with the cosine schedule (`FlatAdam`)
        self.adam = FlatAdam([p.numpy() for p in parts], lr=model.lr, steps=steps)
        self.weights: list[th.nn.Parameter] = []
        self.biases: list[th.nn.Parameter] = []
        self._grads: list[th.Tensor] = []
        self._tensors()
        self.lam = th.tensor([float(v) for v in invariances], dtype=th.float32)
        self.lam_np = np.asarray([float(v) for v in invariances], np.float64)
        self.xt, self.yt = th.from_numpy(x), th.from_numpy(y)
        self.gt = [th.from_numpy(g) for g in groups]
        sizes = [min(len(g), self.batch) for g in self.gt]
        # a batch is each policy's draw in turn: its rows' policy as a (K, B) indicator, so that
        # the per-policy sums of every net are two matrix products (`_stack_loss`)
        self.member = th.zeros(len(sizes), sum(sizes))
        for k, (a, b) in enumerate(zip(np.cumsum([0, *sizes[:-1]]), np.cumsum(sizes), strict=True)):
            self.member[k, a:b] = 1.0
        self.count = th.tensor(sizes, dtype=th.float32)[:, None]  # (K, 1)
        self.sizes = np.asarray(sizes, np.float64)  # (K,) rows of each policy's draw
        self.blocks = list(zip(np.cumsum([0, *sizes[:-1]]).tolist(), np.cumsum(sizes).tolist(), strict=True))
        self._buf: _StepBuffers | None = None  # the step's arrays, made at the first step (`_buffers`)

    def __len__(self) -> int:
        return len(self.lam)

    def _tensors(self) -> None:
        """The stack's weights and biases as torch parameters over `adam`'s flat buffer (a step of
        `adam` moves them in place), and their gradients' tensors over its gradient buffer."""
        params = [th.nn.Parameter(th.from_numpy(v)) for v in self.adam.views(self.adam.theta)]
        k = len(params) // 2
        self.weights, self.biases = params[:k], params[k:]
        self._grads = [th.from_numpy(v) for v in self.adam.views(self.adam.grad)]

    def run(self, until: int, history: list[tuple[float, float]] | None = None) -> None:
        """Train every net of the stack up to step ``until`` (of the schedule's ``steps``);
        ``history``: append the first net's (error, penalty) every 50 steps and at the last."""
        last = self.adam.steps - 1
        for step in range(self.step, until):
            b = self.batch
            idx = th.cat([g if len(g) <= b else g[th.randint(len(g), (b,), generator=self.gen)] for g in self.gt])
            error, penalty = self._gradients(th.index_select(self.xt, 0, idx), th.index_select(self.yt, 0, idx))
            self.adam.step()
            if history is not None and (step % 50 == 0 or step == last):
                history.append((float(error[0].detach()), float(penalty[0].detach())))
        self.step = max(self.step, until)

    def _buffers(self, rows: int) -> _StepBuffers:
        """The step's arrays for a batch of ``rows`` rows and this stack's nets, made once and kept
        (remade when `keep` changes the stack)."""
        n, width = len(self.lam), [w.shape[2] for w in self.weights]
        buf = self._buf
        if buf is None or buf.shape != (n, rows):
            buf = self._buf = _StepBuffers(n, rows, width, [hi for _, hi in self.blocks])
        return buf

    def _gradients(self, xb: th.Tensor, yb: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        """Set every net's gradient of the stack's loss on the batch ``xb (B, in)``, ``yb (B, out)``
        (each policy's draw in turn, `member`'s order); return ``(error (L,), penalty (L,))``.

        Backpropagation written out (the chain rule layer by layer, the same GEMMs autograd runs)
        instead of autograd over the step. Why: a step's matrix products are a fixed cost (on this
        machine ~3.7 ms of a (64, 64) net's step on ~4,600 rows, at the core's measured GEMM rate),
        and with autograd the rest of the step cost as much again: autograd and torch's per-operation
        overhead on the few (L, K, out) numbers of the loss (~0.9 ms a step), the per-policy sums'
        backward as (L, B, out) products, torch's CPU tanh (4-15x slower than numpy's here), and a
        fresh (L, B, h) array per element-wise operation. Here: every layer of every net is one
        batched GEMM (the batch seen by all L nets without a copy) into arrays kept from step to
        step (`_StepBuffers`), tanh by numpy in place, the loss's gradient in the per-policy sums in
        closed form in numpy (`_stack_loss_grad`), ``∂loss/∂r = g1[k(row)] + 2 r g2[k(row)]`` policy
        block by policy block, and tanh's derivative ``1 - tanh²`` from the activations kept; the
        element-wise passes between the GEMMs (the residuals and their squares, ``∂loss/∂output``,
        the derivative times tanh's slope) are compiled loops (`_residuals`, `_output_grad`,
        `_tanh_backward`) doing numpy's float32 operations in numpy's order. The same gradient as
        autograd's up to float rounding (tests/test_causal_fused_step.py), and the same bits as the
        numpy passes they replace (tests/test_causal_step_bits.py).
        """
        n = len(self.lam)
        buf = self._buffers(len(xb))
        weights = [w.detach() for w in self.weights]
        biases = [b.detach() for b in self.biases]
        xs = xb.expand(n, -1, -1)  # every net sees the batch: (L, B, in) without a copy
        acts = buf.acts  # (L, B, h) per hidden layer
        for i, (w, bias) in enumerate(zip(weights[:-1], biases[:-1], strict=True)):
            z = th.baddbmm(bias, acts[i - 1] if i else xs, w, out=acts[i])
            np.tanh(z.numpy(), out=z.numpy())
        r = th.baddbmm(biases[-1], acts[-1], weights[-1], out=buf.r)  # the outputs, then the residuals:
        _residuals(yb.numpy(), buf.r_np, buf.r2_np)  # r = y - output, in place, and r * r
        error, penalty, g1, g2 = _stack_loss_grad(th.matmul(self.member, r).numpy(),
                                                  th.matmul(self.member, buf.r2).numpy(), self.sizes, self.lam_np)
        # ∂loss/∂output = -∂loss/∂r = -(g1[k(row)] + 2 r g2[k(row)]), policy block by policy block
        _output_grad(buf.r_np, (-2.0 * g2).astype(np.float32), g1.astype(np.float32), buf.ends, buf.d[-1].numpy())
        dt = buf.d[-1]
        k = len(weights)
        gw, gb = self._grads[:k], self._grads[k:]  # written in place: `adam`'s gradient buffer
        for i in range(k - 1, 0, -1):
            a = acts[i - 1]
            self.weights[i].grad = th.bmm(a.transpose(1, 2), dt, out=gw[i])
            self.biases[i].grad = th.sum(dt, 1, keepdim=True, out=gb[i])
            dt = th.bmm(dt, weights[i].transpose(1, 2), out=buf.d[i - 1])
            _tanh_backward(dt.numpy(), a.numpy())  # tanh's derivative, from the activation kept
        self.weights[0].grad = th.bmm(xs.transpose(1, 2), dt, out=gw[0])
        self.biases[0].grad = th.sum(dt, 1, keepdim=True, out=gb[0])
        return th.from_numpy(error.astype(np.float32)), th.from_numpy(penalty.astype(np.float32))

    def keep(self, which: Sequence[int]) -> None:
        """Keep only the nets ``which`` (indices into the stack), with their Adam state: the kept
        nets' further steps are the ones they would have taken in the whole stack."""
        ix = th.as_tensor(list(which), dtype=th.int64)
        self.adam.keep(list(which))
        self._tensors()
        self._buf = None  # fewer nets: the step's arrays are remade
        self.lam = self.lam.index_select(0, ix)
        self.lam_np = self.lam_np[list(which)]

    def nets(self) -> list[th.nn.Sequential]:
        """The stack's nets as plain MLPs (`CausalResponseModel.init_net`'s layout)."""
        out = []
        for i in range(len(self.lam)):
            net = self.model.init_net(*self.shape)
            with th.no_grad():
                for m, w, b in zip([m for m in net if isinstance(m, th.nn.Linear)], self.weights, self.biases, strict=True):
                    m.weight.copy_(w[i].t())
                    m.bias.copy_(b[i, 0])
            out.append(net)
        return out

    def predict(self, x: np.ndarray, i: int) -> np.ndarray:
        """``(n, out)`` net ``i``'s prediction at ``x (n, in)`` float32."""
        with th.no_grad():
            h = th.from_numpy(x) @ self.weights[0][i] + self.biases[0][i]
            for w, b in zip(self.weights[1:], self.biases[1:], strict=True):
                h = th.tanh(h) @ w[i] + b[i]
            return h.numpy()


class FlatAdam:
    """Adam (torch's defaults: betas 0.9 and 0.999, eps 1e-8, no weight decay) with torch's cosine
    schedule (`CosineAnnealingLR` to 0 over ``steps``) on float32 arrays of any shapes, all kept in
    one flat buffer: ``theta`` (the parameters), ``grad`` (written by the caller before a `step`),
    and Adam's two moments. Every array's leading axis is the stack's net (`keep` drops nets).

    Why not ``torch.optim.Adam(foreach=True)``: on a causal stack's ~30,000 numbers its step took
    ~0.3 ms, ~10 foreach kernels over the stack's six tensors with torch's per-call overhead and
    the optimizer's Python around them; here the same update is ~10 numpy passes over one buffer
    (~0.05 ms; a training step of log c1's shapes: benchmarks/scale.py --causal-adam). Element by element it is torch's arithmetic in float32 (``m += (1 - β1)(g - m)``,
    ``v = β2 v + (1 - β2) g²``, ``θ += -(lr / (1 - β1^t)) · m / (√v / √(1 - β2^t) + eps)``, the
    scalars computed in float64 and rounded to float32 as torch rounds them), but not its order of
    rounding in every operation (torch's vectorised ``lerp`` and ``addcmul`` may fuse a multiply
    and an add): the fits move by float rounding (tests/test_causal_adam.py). The schedule is
    torch's recursive formula, in float64, step for step.
    """

    def __init__(self, arrays: Sequence[np.ndarray], lr: float, steps: int,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.shapes = [tuple(a.shape) for a in arrays]
        self.theta = np.concatenate([np.asarray(a, np.float32).ravel() for a in arrays])
        self.grad = np.zeros_like(self.theta)
        self.m = np.zeros_like(self.theta)
        self.v = np.zeros_like(self.theta)
        self._tmp = np.empty_like(self.theta)
        self.base_lr = self.lr = float(lr)
        self.steps = int(steps)
        self.betas, self.eps = (float(betas[0]), float(betas[1])), float(eps)
        self.t = 0  # steps taken

    def views(self, flat: np.ndarray) -> list[np.ndarray]:
        """``flat`` (one of the buffers) as the arrays' shapes, in their order (views, not copies)."""
        out, off = [], 0
        for shape in self.shapes:
            n = int(np.prod(shape))
            out.append(flat[off : off + n].reshape(shape))
            off += n
        return out

    def step(self) -> None:
        """One Adam step of ``theta`` by ``grad`` at the schedule's learning rate, then the schedule's step."""
        b1, b2 = self.betas
        self.t += 1
        g, m, v, tmp = self.grad, self.m, self.v, self._tmp
        np.subtract(g, m, out=tmp)
        tmp *= np.float32(1.0 - b1)
        m += tmp
        v *= np.float32(b2)
        np.multiply(g, g, out=tmp)
        tmp *= np.float32(1.0 - b2)
        v += tmp
        np.sqrt(v, out=tmp)
        tmp /= np.float32((1.0 - b2**self.t) ** 0.5)
        tmp += np.float32(self.eps)
        np.divide(m, tmp, out=tmp)
        tmp *= np.float32(-(self.lr / (1.0 - b1**self.t)))
        self.theta += tmp
        # CosineAnnealingLR (eta_min 0): its recursive form, as torch computes it step by step
        e = self.t
        if (e - 1 - self.steps) % (2 * self.steps) == 0:
            self.lr = self.lr + self.base_lr * (1.0 - math.cos(math.pi / self.steps)) / 2
        else:
            self.lr = (1.0 + math.cos(math.pi * e / self.steps)) / (1.0 + math.cos(math.pi * (e - 1) / self.steps)) * self.lr

    def keep(self, which: Sequence[int]) -> None:
        """Keep only the nets ``which`` (the leading axis of every array), with their moments; the
        step count and the learning rate go on: the kept nets' next steps are the ones they would
        have taken beside the others (element by element, the same numbers)."""
        shapes = [(len(which), *s[1:]) for s in self.shapes]
        bufs = []
        for flat in (self.theta, self.m, self.v):
            bufs.append(np.concatenate([a[list(which)].ravel() for a in self.views(flat)]))
        self.theta, self.m, self.v = bufs
        self.shapes = shapes
        self.grad = np.zeros_like(self.theta)
        self._tmp = np.empty_like(self.theta)


def group_sums(residuals: Sequence[th.Tensor]) -> th.Tensor:
    """``(K, 1 + 2·out)``: per policy, its row count, Σr and Σr² per output — everything
    `invariance_loss` needs from the rows (differentiable in the residuals ``(n_k, out)``)."""
    out = []
    for r in residuals:
        n = th.full((1,), float(len(r)), dtype=r.dtype)
        out.append(th.cat([n, r.sum(0), (r * r).sum(0)]))
    return th.stack(out)


def _stack_loss(s1: th.Tensor, s2: th.Tensor, count: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    """``(error (L,), penalty (L,))`` of L nets from their residuals' per-policy sums ``s1 = Σr``,
    ``s2 = Σr²`` ``(L, K, out)`` over ``count (K, 1)`` rows each: the per-policy mean squared
    residual averaged over the policies, and the invariance penalty on the per-policy means and
    unbiased variances — `invariance_loss`'s formulas, net by net. Why sums: two matrix products
    per step instead of a mean, a variance (torch's ``var`` was 8 % of a step on CPU) and a square
    per policy. Training uses `_stack_loss_grad` (these values and their gradient in closed form);
    this differentiable definition is what tests/test_causal_fused_step.py checks it against."""
    out = s1.shape[2]
    error = (s2.sum(2) / (count[:, 0] * out)).mean(1)
    means = s1 / count
    var = (s2 - count * means**2) / (count - 1)
    logvar = th.log(var.clamp_min(0.0) + 1e-6)
    penalty = ((means - means.mean(1, keepdim=True)) ** 2).sum(2).mean(1) + (
        (logvar - th.log(logvar.exp().mean(1, keepdim=True))) ** 2
    ).sum(2).mean(1)
    return error, penalty


def _stack_loss_grad(
    s1: np.ndarray, s2: np.ndarray, count: np.ndarray, lam: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(error (L,), penalty (L,), g1, g2)``: `_stack_loss` of the per-policy sums ``s1 = Σr``,
    ``s2 = Σr²`` ``(L, K, out)`` over ``count (K,)`` rows each, and the gradient of
    ``Σ_l error_l + lam_l · penalty_l`` in ``s1`` and ``s2``, in closed form, in float64 numpy.

    Why not autograd: these are a few (L, K, out) numbers, and autograd's graph over them (or torch's
    per-operation overhead) cost as much per training step as a hidden layer's matrix product
    (`NetStack._gradients`). With ``m = s1 / n`` and ``var = (s2 - n m²) / (n - 1)`` per policy
    (``n``: its rows), ``v = max(var, 0) + 1e-6``, ``e = log v - log mean_k v``: the error's
    derivative in ``s2`` is ``1 / (K n out)``; the mean term's in ``m`` is ``2 (m - mean_k m) / K``
    (the centring's own derivative sums to zero); the log-variance term's in ``log v`` is
    ``2 (e - w Σ_k e) / K`` with ``w = v / Σ_k v`` (the derivative of ``log mean_k v``), in ``var``
    that over ``v`` where ``var > 0`` (the clamp's), and ``∂var/∂s2 = 1 / (n - 1)``,
    ``∂var/∂s1 = -2 m / (n - 1)``. The same as autograd's to float rounding
    (tests/test_causal_fused_step.py).
    """
    s1, s2 = np.asarray(s1, np.float64), np.asarray(s2, np.float64)
    k, out = s1.shape[1], s1.shape[2]
    n = np.asarray(count, np.float64).reshape(1, -1, 1)  # (1, K, 1)
    lam3 = np.asarray(lam, np.float64)[:, None, None]
    error = (s2.sum(2) / (n[:, :, 0] * out)).mean(1)
    means = s1 / n
    centred = means - means.mean(1, keepdims=True)
    var = (s2 - n * means**2) / (n - 1)
    v = np.maximum(var, 0.0) + 1e-6
    e = np.log(v) - np.log(v.mean(1, keepdims=True))
    penalty = (centred**2).sum(2).mean(1) + (e**2).sum(2).mean(1)
    d_logv = (2.0 / k) * (e - v / v.sum(1, keepdims=True) * e.sum(1, keepdims=True))
    d_var = np.where(var > 0, d_logv / v, 0.0) * lam3 / (n - 1)
    g1 = lam3 * (2.0 / k) * centred / n - 2.0 * means * d_var
    g2 = 1.0 / (k * n * out) + d_var
    return error, penalty, g1, g2


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


def select_invariance(
    model: CausalResponseModel,
    x: np.ndarray,
    y: np.ndarray,
    codes: np.ndarray,
    groups: Sequence[object] | np.ndarray | None,
    grid: Sequence[float] = GRID,
    folds: int = FOLDS,
) -> float:
    """λ from ``grid`` by cross-fitting (see the module doc); fills ``model.cv_errors`` and
    ``model.cv_violation``.

    Folds are of whole ``groups`` (shuffled with the model's seed), stratified by policy: each
    policy's groups are spread over the folds, so a small randomized arm is in every fold. Each λ is
    fitted on the other folds and judged on the held-out rows by

    * its **worst-policy error**: the largest over the policies of a policy's held-out mean squared
      error (mean over outputs). A model that credits the action with what hidden conditions did
      predicts the policies that did not share the habit badly, whatever it gains on the one that
      did; where there is no hidden confounding, the unpenalised fit is as good on every policy and
      a large λ only distorts it. The worst policy, not the average: the production policy's gain
      from learning its own habit must not pay for the error on a randomized arm;
    * its **held-out invariance violation**: the penalty of the model doc on held-out residuals.

    The rule (the one-standard-error rule of cross-validation): among the λ whose worst-policy error
    is within one standard error (over held-out groups of the best λ's worst policy) of the best,
    the one whose held-out residuals are the most invariant. Why not the lowest error alone: an
    effect moves the prediction error only by its square times the action's variance (on the
    closed-form test's randomized arm, 1 % of the error for an effect 40 % off), so held-out error
    cannot tell λ = 30 from λ = 300 there, while the held-out invariance can.

    Successive halving: the folds' stacks (`NetStack`) are trained side by side, and at
    `SELECTION_CHECKS` of the steps the rule's numbers are taken on the held-out rows; a λ more
    than `SELECTION_DROP_SE` standard errors above the best there is dropped from every fold's
    stack (the others' fits continue unchanged), and when one λ is left it is the choice. Why: on
    a log where one λ is far ahead (the scale benchmark's log c1, its first scenario: λ = 3's
    held-out error 27 standard errors above λ = 0's at a quarter of the steps) training the others
    to the end only confirmed it; on a near tie every candidate runs to the end, so the choice is
    the full cross-fitting's (tests/test_causal_halving.py). ``cv_errors`` / ``cv_violation`` of a
    dropped λ are its numbers where it was dropped.

    A fold whose training rows hold a single policy (a randomized arm of one agent-day held out
    with the fold) trains one net for every λ: with one policy the penalty and its gradient are zero
    (exactly: the policy's moments are their own average), so the λ's fits there are the same fit
    (up to float rounding: a stack of one net may take another GEMM path than a stack of four; on log
    c1 the choice's held-out numbers came out the same to the bit), and training four copies of one
    fit was a quarter of the cross-fitting of one of log c1's scenarios.

    A settled unbounded band (`SELECTION_SETTLED`): when the worst policy at the best λ is a single
    held-out group (a randomized arm of one agent-day) at two successive checks, every λ is in the
    band, the rule's choice there is the most invariant λ, and if that is the same λ at both checks
    the selection stops and takes it (``cv_errors`` / ``cv_violation`` are the numbers there, and
    ``model.cv_steps`` the step). Why: the error cannot choose in an unbounded band, and the
    invariance's ranking had held for a quarter of the steps; on the scale benchmark's log c1 this
    band was unbounded on two of the three scenarios (the costliest part of choosing λ, as no λ
    could be dropped there), each of whose choices the stop keeps (tests/test_causal_settled.py).
    """
    gid = np.arange(len(x)) if groups is None else np.unique(np.asarray(groups, dtype=str), return_inverse=True)[1]
    rng = np.random.default_rng(model.seed)
    fold = np.zeros(len(x), np.int64)
    for k in np.unique(codes):
        g = np.unique(gid[codes == k])
        assign = dict(zip(rng.permutation(g).tolist(), np.arange(len(g)) % folds, strict=True))
        rows = np.flatnonzero(codes == k)
        fold[rows] = [assign[v] for v in gid[rows].tolist()]
    lams = [float(v) for v in grid]
    batch = max(2, round(model.batch * SELECTION_BATCH))
    parts = []  # (the fold's stack, its held-out rows, whether one net stands for every λ)
    for f in range(folds):
        train, test = np.flatnonzero(fold != f), np.flatnonzero(fold == f)
        if len(test) == 0 or len(train) < 2:
            continue
        # a fold whose training rows hold fewer than two policies (of two rows or more, as `NetStack`
        # counts them) has no invariance penalty: every λ's net is the same fit, so one net serves all
        shared = SELECTION_SHARED_FOLDS and int((np.bincount(codes[train]) >= 2).sum()) < 2
        parts.append((NetStack(model, x, y, codes, lams[:1] if shared else lams, model.steps, batch, rows=train), test, shared))
    pols = [np.flatnonzero(codes == k) for k in np.unique(codes)]
    alive = list(range(len(lams)))
    errors: dict[float, float] = {}
    violation: dict[float, float] = {}
    stops = sorted({min(model.steps, max(1, round(model.steps * c))) for c in SELECTION_CHECKS} | {model.steps})
    settled: float | None = None  # the most invariant λ at the last check, when its band was unbounded
    for until in stops:
        resid = {i: np.zeros_like(y) for i in alive}
        for stack, test, shared in parts:
            stack.run(until)
            for j, i in enumerate(alive):
                resid[i][test] = y[test] - stack.predict(x[test], 0 if shared else j)
        per_policy = {i: [float((r[rows] ** 2).mean()) for rows in pols] for i, r in resid.items()}
        for i, r in resid.items():
            errors[lams[i]], violation[lams[i]] = max(per_policy[i]), _violation(r, pols)
        best = min(alive, key=lambda i: (errors[lams[i]], lams[i]))
        worst = pols[int(np.argmax(per_policy[best]))]
        sq = (resid[best][worst] ** 2).mean(1)
        _, g_of = np.unique(gid[worst], return_inverse=True)
        g_means = np.bincount(g_of, weights=sq) / np.bincount(g_of)
        se = float(g_means.std(ddof=1) / np.sqrt(len(g_means))) if len(g_means) > 1 else float("inf")
        bound = errors[lams[best]] + (se if until == model.steps else SELECTION_DROP_SE * se)
        near = [i for i in alive if errors[lams[i]] <= bound]
        invariant = lams[min(near, key=lambda i: (violation[lams[i]], lams[i]))]
        if until == model.steps or len(near) == 1 or (SELECTION_SETTLED and math.isinf(se) and settled == invariant):
            model.cv_errors, model.cv_violation, model.cv_steps = errors, violation, until
            return invariant
        settled = invariant if math.isinf(se) else None
        if len(near) < len(alive):
            for stack, _, shared in parts:
                if not shared:
                    stack.keep([alive.index(i) for i in near])
            alive = near
    raise AssertionError("unreachable: the last check decides")


def choose_invariance(
    x: np.ndarray,
    y: np.ndarray,
    policy: Sequence[object] | np.ndarray | None,
    groups: Sequence[object] | np.ndarray | None,
    hidden: tuple[int, ...] = (64, 64),
    steps: int = 600,
    batch: int = 4096,
    lr: float = 1e-2,
    seed: int = 0,
) -> InvarianceChoice:
    """`select_invariance` on ``x (N, in)``, ``y (N, out)`` (standardised; clipped here as `fit`
    clips them) for a model of these hyper-parameters, as a value that `CausalResponseModel.fit`
    takes (``chosen``). With fewer than two policies λ is moot: 0, nothing cross-fitted."""
    threads = th.get_num_threads()
    th.set_num_threads(1)  # as `CausalResponseModel.fit`
    try:
        x, y = _prepared(x, y)
        codes = policy_codes(policy, len(x))
        if len(np.unique(codes)) < 2:
            return InvarianceChoice(0.0, {}, {})
        model = CausalResponseModel(hidden, "cv", steps, batch, lr, seed)
        lam = select_invariance(model, x, y, codes, groups)
        return InvarianceChoice(lam, dict(model.cv_errors), dict(model.cv_violation), model.cv_steps)
    finally:
        th.set_num_threads(threads)


def _violation(resid: np.ndarray, pols: Sequence[np.ndarray]) -> float:
    """The invariance penalty (module doc) of residuals ``(N, out)`` over the policies' rows."""
    means = np.stack([resid[rows].mean(0) for rows in pols])
    var = np.stack([resid[rows].var(0) + 1e-6 for rows in pols])
    return float(((means - means.mean(0)) ** 2).sum(1).mean() + ((np.log(var) - np.log(var.mean(0))) ** 2).sum(1).mean())
