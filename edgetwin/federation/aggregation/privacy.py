"""Differential privacy for federated rounds: clip + Gaussian noise, with the budget accounted.

`GaussianDP` is DP-FedAvg (McMahan et al. 2018) at the user level: every client update is clipped
to L2 norm ``C``, the clipped updates are summed, Gaussian noise ``N(0, (z C)^2 I)`` is added to the
sum and the result is divided by the number of clients. One round is a (sub)sampled Gaussian
mechanism with noise multiplier ``z`` and sampling rate ``q`` (the participation share).

`RDPAccountant` composes rounds in Renyi DP (Mironov 2017) and converts to ``(epsilon, delta)``:

- RDP of the sampled Gaussian mechanism at integer orders ``a`` (Mironov, Talwar & Zhang 2019):
  ``log A_a = logsumexp_i [log C(a, i) + i log q + (a - i) log(1 - q) + (i^2 - i) / (2 z^2)]``,
  ``RDP(a) = log A_a / (a - 1)``; for ``q = 1`` it is ``a / (2 z^2)`` at any order.
- Conversion (Balle et al. 2020, as in TF-Privacy / Opacus):
  ``epsilon = min_a RDP(a) + log1p(-1/a) - log(delta * a) / (a - 1)``.

`gaussian_epsilon_exact` is the exact epsilon of ``T`` full-participation Gaussian rounds (the
analytic Gaussian mechanism of Balle & Wang 2018; T rounds of noise z compose to one of noise
``z / sqrt(T)``): a reference the RDP bound must never undercut.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.optimize import brentq
from scipy.special import gammaln, logsumexp
from scipy.stats import norm

from edgetwin.contract.errors import InputError
from edgetwin.federation.aggregation.base import (
    AggregateResult,
    ClientUpdate,
    LinearAggregator,
    check_updates,
    stack,
)
from edgetwin.federation.aggregation.robust import clip_by_norm

__all__ = ["DEFAULT_ORDERS", "GaussianDP", "RDPAccountant", "gaussian_epsilon_exact", "rdp_sampled_gaussian"]

DEFAULT_ORDERS = tuple([1.25, 1.5, 1.75] + list(range(2, 64)) + [80, 96, 128, 192, 256, 512])


def rdp_sampled_gaussian(q: float, noise_multiplier: float, orders: Sequence[float] = DEFAULT_ORDERS) -> np.ndarray:
    """RDP of one sampled Gaussian mechanism at each order (inf where it is not computed).

    Args:
        q: sampling rate in (0, 1].
        noise_multiplier: z, noise std over the clipping norm.
        orders: Renyi orders a > 1; for q < 1 only integer orders are evaluated.
    """
    if not 0.0 < q <= 1.0:
        raise InputError(f"sampling rate must be in (0, 1], got {q}", where="sampling_rate")
    if not noise_multiplier > 0:
        raise InputError(f"noise multiplier must be > 0, got {noise_multiplier}", where="noise_multiplier")
    z2 = noise_multiplier**2
    out = np.full(len(orders), np.inf)
    for j, a in enumerate(orders):
        if q == 1.0:
            out[j] = a / (2.0 * z2)
        elif float(a).is_integer() and a >= 2:
            a = int(a)
            i = np.arange(a + 1)
            log_binom = gammaln(a + 1) - gammaln(i + 1) - gammaln(a - i + 1)
            terms = log_binom + i * math.log(q) + (a - i) * math.log1p(-q) + (i * i - i) / (2.0 * z2)
            out[j] = logsumexp(terms) / (a - 1)
    return out


def _rdp_to_eps(rdp: np.ndarray, orders: Sequence[float], delta: float) -> tuple[float, float]:
    best, best_order = math.inf, float("nan")
    for a, r in zip(orders, rdp, strict=True):
        if not np.isfinite(r) or a <= 1.0:
            continue
        if delta**2 + math.expm1(-r) >= 0:
            return 0.0, a
        eps = r + math.log1p(-1.0 / a) - math.log(delta * a) / (a - 1.0)
        if eps < best:
            best, best_order = eps, a
    return max(0.0, best), best_order


class RDPAccountant:
    """Composes Gaussian rounds in RDP and reports ``(epsilon, delta)``.

    Args:
        orders: Renyi orders to track.
    """

    def __init__(self, orders: Sequence[float] = DEFAULT_ORDERS) -> None:
        self.orders = tuple(float(a) for a in orders)
        self.rdp = np.zeros(len(self.orders))
        self.steps = 0

    def step(self, noise_multiplier: float, sampling_rate: float = 1.0, num_steps: int = 1) -> None:
        """Account for ``num_steps`` rounds of the sampled Gaussian mechanism."""
        self.rdp = self.rdp + num_steps * rdp_sampled_gaussian(sampling_rate, noise_multiplier, self.orders)
        self.steps += num_steps

    def epsilon(self, delta: float) -> float:
        """The epsilon spent so far at ``delta`` (0 before any step)."""
        if not 0.0 < delta < 1.0:
            raise InputError(f"delta must be in (0, 1), got {delta}", where="delta")
        if self.steps == 0:
            return 0.0
        return _rdp_to_eps(self.rdp, self.orders, delta)[0]


def gaussian_epsilon_exact(noise_multiplier: float, rounds: int, delta: float) -> float:
    """Exact epsilon of ``rounds`` full-participation Gaussian rounds (analytic Gaussian mechanism).

    ``delta(eps) = Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s)`` with ``s = z / sqrt(rounds)``.
    """
    s = noise_multiplier / math.sqrt(rounds)

    def delta_of(eps: float) -> float:
        return float(norm.cdf(0.5 / s - eps * s) - math.exp(eps) * norm.cdf(-0.5 / s - eps * s))

    if delta_of(0.0) <= delta:
        return 0.0
    hi = 1.0
    while delta_of(hi) > delta:
        hi *= 2.0
    return float(brentq(lambda e: delta_of(e) - delta, 0.0, hi, xtol=1e-10))


class GaussianDP(LinearAggregator):
    """DP-FedAvg: clip each update to ``clip_norm``, sum, add ``N(0, (z C)^2)``, divide by n.

    Args:
        clip_norm: C, L2 bound of a client update.
        noise_multiplier: z.
        delta: the delta the budget is reported at.
        sampling_rate: q, the share of clients taking part per round (for the accountant).
        expected_clients: divide by this fixed number instead of the actual count (keeps the
            sensitivity independent of who showed up); None: the actual count.
        seed: of the noise; round r uses ``(seed, r)``.

    Under secure aggregation the clients clip (`clip`) and the server only adds noise to the sum
    (`aggregate_sum`). ``info`` reports ``epsilon`` after every round.

    The accountant's amplification by sampling assumes each client joins a round independently
    with probability ``sampling_rate`` (Poisson sampling). `ClientSampler` draws a fixed-size
    subset instead; for that the reported epsilon is the usual approximation, not a proof. Pass
    ``sampling_rate=1.0`` for a bound that holds whatever the sampling.
    """

    name = "dp_gaussian"

    def __init__(
        self,
        clip_norm: float = 1.0,
        noise_multiplier: float = 1.0,
        delta: float = 1e-5,
        sampling_rate: float = 1.0,
        expected_clients: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(weighting="uniform")
        if not clip_norm > 0:
            raise InputError(f"clip_norm must be > 0, got {clip_norm}", where="clip_norm")
        if not noise_multiplier > 0:
            raise InputError(f"noise_multiplier must be > 0, got {noise_multiplier}", where="noise_multiplier")
        if not 0.0 < delta < 1.0:
            raise InputError(f"delta must be in (0, 1), got {delta}", where="delta")
        if not 0.0 < sampling_rate <= 1.0:
            raise InputError(f"sampling_rate must be in (0, 1], got {sampling_rate}", where="sampling_rate")
        if expected_clients is not None and expected_clients < 1:
            raise InputError(f"expected_clients must be >= 1, got {expected_clients}", where="expected_clients")
        self.clip_norm, self.noise_multiplier, self.delta = float(clip_norm), float(noise_multiplier), float(delta)
        self.sampling_rate, self.expected_clients, self.seed = float(sampling_rate), expected_clients, int(seed)
        self.accountant = RDPAccountant()

    @property
    def noise_std(self) -> float:
        """Std of the noise added to the *sum* of clipped updates: ``z * C``."""
        return self.noise_multiplier * self.clip_norm

    def clip(self, delta: np.ndarray) -> np.ndarray:
        """A client's update clipped to ``clip_norm`` (what a client does before secure aggregation)."""
        return clip_by_norm(np.asarray(delta, np.float64)[None], self.clip_norm)[0][0]

    def aggregate(self, updates: Sequence[ClientUpdate], global_params: np.ndarray, round: int = 0) -> AggregateResult:
        g = np.asarray(global_params, dtype=np.float32)
        check_updates(updates, g.size)
        clipped, norms = clip_by_norm(stack(updates) * np.array([u.mix for u in updates])[:, None], self.clip_norm)
        res = self.aggregate_sum(clipped.sum(axis=0), float(len(updates)), len(updates), g, round)
        res.info["clipped"] = int((norms > self.clip_norm).sum())
        res.info["clients"] = [u.client_id for u in updates]
        return res

    def aggregate_sum(self, weighted_sum, total_weight, count, global_params, round=0):  # type: ignore[override]
        rng = np.random.default_rng([self.seed, int(round)])
        noisy = weighted_sum + rng.normal(0.0, self.noise_std, size=weighted_sum.shape)
        denom = self.expected_clients or count
        params = (np.asarray(global_params, np.float64) + noisy / denom).astype(np.float32)
        self.accountant.step(self.noise_multiplier, self.sampling_rate)
        info = {
            "strategy": self.name,
            "n": count,
            "noise_std_of_mean": self.noise_std / denom,
            "epsilon": self.accountant.epsilon(self.delta),
            "delta": self.delta,
            "rounds_accounted": self.accountant.steps,
        }
        return AggregateResult(params, info=info)

    def epsilon(self) -> float:
        """Privacy spent so far, at ``delta``."""
        return self.accountant.epsilon(self.delta)
