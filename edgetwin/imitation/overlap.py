"""How much a log says about the effect of actions: overlap, and the weights that measure it.

A log can only show what an action does where actions varied independently of the conditions the
deciding policy saw. One deterministic scheduler's log says nothing about it (every action is a
function of the context: a twin fit to it reads the scheduler's habits as the system's laws);
noise, several regimes and randomized canary arms say more. `overlap_report` measures it two ways:

* **unexplained share** per action feature: the share of its variance that the logged context
  (``[profile.*, state.*]``) does not explain, cross-validated (a gradient-boosted regression of the
  action on the context, predicted out of fold, 3 shuffled folds): 0 = a function of the context.
* **effective sample size** of the stabilised propensity weights ``f(a) / π(a | ·)``
  (`balancing_weights`: ``π`` the logged propensity, or an estimate where it is unknown; ``f`` the
  actions' marginal, `MarginalActionDensity`): the share of rows that a reweighting to "actions
  independent of the context" keeps; near 0 = a few rows carry everything.

and says plainly when the logs say nothing. Units: actions and densities in the log's raw action
units (propensities as logged); a coordinate exactly on a bound is a point mass (clipping piles
probability there; `NoisyPolicy` logs that mass for a clipped coordinate), for both ``f`` and ``π``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import norm
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.model_selection import KFold, cross_val_predict
from threadpoolctl import threadpool_limits

from edgetwin.contract.spec import POLICY_COLUMN, PROPENSITY_COLUMN, TwinSpec

#: Below this mean unexplained share, actions are a function of the context: the logs say nothing.
NOTHING = 0.005
#: Below this effective-sample share with one logged policy, too: a deterministic policy's actions, explained by the context
#: up to the regression's own error (a few % on the emulated cluster's heuristic), still leave the
#: weights nothing to work with (0.0 % there, against 10-12 % with 10 % noise).
NOTHING_ESS = 0.01
#: Below this mean unexplained share (or ESS share below `WEAK_ESS`), they say little.
WEAK = 0.05
WEAK_ESS = 0.02


#: A coordinate within this share of its bound width of a bound counts as on the bound (clipped).
ON_BOUND = 1e-9
#: Bandwidth floor of an estimated propensity, a share of the action's bound width: a deterministic
#: policy's Dirac becomes a narrow kernel, so its rows keep a small, finite weight.
MIN_BANDWIDTH = 0.02


@dataclass
class MarginalActionDensity:
    """``f(a)``: the product over action features of each one's marginal, from the log's own actions.

    Per feature: a point mass at each bound (the share of rows exactly there) plus a histogram
    density inside (``bins`` equal bins over the bounds). A product of marginals is the target
    design: every feature drawn independently of the context *and* of the others.

    Attributes:
        low, high: ``(A,)`` finite bounds (unbounded sides: the logged min / max).
        mass_low, mass_high: ``(A,)`` share of rows on each bound.
        hist: ``(A, bins)`` density inside, integrating to ``1 - mass_low - mass_high``.
    """

    low: np.ndarray
    high: np.ndarray
    mass_low: np.ndarray
    mass_high: np.ndarray
    hist: np.ndarray

    @classmethod
    def fit(
        cls, actions: np.ndarray, low: np.ndarray, high: np.ndarray, bins: int = 30, weight: np.ndarray | None = None
    ) -> MarginalActionDensity:
        """From ``actions (N, A)``; ``weight (N,)`` (default 1) lets sites sum weighted histograms."""
        a = np.asarray(actions, np.float64)
        w = np.ones(len(a)) if weight is None else np.asarray(weight, np.float64)
        low = np.where(np.isfinite(low), low, a.min(axis=0))
        high = np.where(np.isfinite(high), high, a.max(axis=0))
        width = np.maximum(high - low, 1e-12)
        on_low, on_high = _on_bounds(a, low, high)
        total = w.sum()
        mass_low = (w[:, None] * on_low).sum(axis=0) / total
        mass_high = (w[:, None] * on_high).sum(axis=0) / total
        hist = np.zeros((a.shape[1], bins))
        for j in range(a.shape[1]):
            inside = ~(on_low[:, j] | on_high[:, j])
            h, _ = np.histogram(a[inside, j], bins=bins, range=(low[j], high[j]), weights=w[inside])
            hist[j] = (h + 0.5) / (h + 0.5).sum() * (1.0 - mass_low[j] - mass_high[j]) * bins / width[j]
        return cls(low, high, mass_low, mass_high, hist)

    def __call__(self, actions: np.ndarray) -> np.ndarray:
        """``(N,)`` density (mass on bounds) of each row's action."""
        a = np.asarray(actions, np.float64)
        bins = self.hist.shape[1]
        on_low, on_high = _on_bounds(a, self.low, self.high)
        frac = (a - self.low) / np.maximum(self.high - self.low, 1e-12)
        k = np.clip((frac * bins).astype(np.int64), 0, bins - 1)
        inside = self.hist[np.arange(a.shape[1])[None, :], k]
        per = np.where(on_low, self.mass_low, np.where(on_high, self.mass_high, inside))
        return np.prod(np.maximum(per, 1e-300), axis=1)


def _on_bounds(a: np.ndarray, low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    tol = ON_BOUND * np.maximum(high - low, 1e-12)
    return a <= low + tol, a >= high - tol


def estimated_propensity(
    context: np.ndarray,
    actions: np.ndarray,
    policy: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    seed: int = 0,
    max_rows: int = 20_000,
) -> np.ndarray:
    """``(N,)`` an estimate of ``π(a | context, policy)`` for rows whose propensity is not logged.

    Per policy and action feature: a gradient-boosted regression of the action on the context
    (its mean) and a Gaussian of the residual spread, floored at `MIN_BANDWIDTH` of the bound width
    (a deterministic policy's action becomes a narrow kernel); a coordinate on a bound gets the
    Gaussian's tail mass there. Only the context the log holds: a policy that also saw something
    unlogged is mis-estimated, which is why logged propensities are preferred.
    """
    x = np.asarray(context, np.float64)
    a = np.asarray(actions, np.float64)
    low = np.where(np.isfinite(low), low, a.min(axis=0))
    high = np.where(np.isfinite(high), high, a.max(axis=0))
    floor = MIN_BANDWIDTH * np.maximum(high - low, 1e-12)
    on_low, on_high = _on_bounds(a, low, high)
    out = np.ones(len(a))
    rng = np.random.default_rng(seed)
    for pid in np.unique(policy):
        rows = np.flatnonzero(policy == pid)
        fit_rows = rows if len(rows) <= max_rows else rng.choice(rows, max_rows, replace=False)
        for j in range(a.shape[1]):
            if len(fit_rows) >= 20:
                reg = HistGradientBoostingRegressor(max_iter=40, random_state=seed)
                reg.fit(x[fit_rows], a[fit_rows, j])
                mu = reg.predict(x[rows])
            else:  # too few rows to regress on: the policy's mean action
                mu = np.full(len(rows), a[rows, j].mean())
            sd = max(float(np.std(a[rows, j] - mu)), float(floor[j]))
            dens = norm.pdf(a[rows, j], mu, sd)
            dens = np.where(on_low[rows, j], norm.cdf((low[j] - mu) / sd), dens)
            dens = np.where(on_high[rows, j], norm.sf((high[j] - mu) / sd), dens)
            out[rows] *= dens
    return out


@dataclass(frozen=True)
class Weights:
    """Balancing weights of a log's rows and what they cost.

    Attributes:
        w: ``(N,)`` weights, mean 1.
        ess_share: effective sample size over N, ``(Σw)² / (N Σw²)``: 1 = no reweighting needed
            (a uniformly randomized log), near 0 = a few rows carry everything.
        clipped_share: share of rows whose weight was clipped.
        estimated_share: share of rows whose propensity was estimated (not logged).
    """

    w: np.ndarray
    ess_share: float
    clipped_share: float
    estimated_share: float


def balancing_weights(
    context: np.ndarray,
    actions: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    policy: Sequence[str] | np.ndarray | None = None,
    propensity: np.ndarray | None = None,
    clip: float = 20.0,
    seed: int = 0,
) -> Weights:
    """Stabilised weights ``f(a) / π(a | ·)`` that make the actions independent of the context.

    Args:
        context: ``(N, C)`` what the policies saw, as logged (e.g. standardised profile and state).
        actions: ``(N, A)`` logged actions, raw units.
        low, high: ``(A,)`` the spec's action bounds (inf: none).
        policy: ``(N,)`` policy ids (None: one policy).
        propensity: ``(N,)`` logged propensities, NaN where unknown (None: all unknown, estimated).
        clip: weights are clipped at ``clip`` times their mean before the final normalisation.
        seed: seeds the propensity estimate's subsample.
    """
    a = np.asarray(actions, np.float64)
    n = len(a)
    pol = np.zeros(n, dtype=object) if policy is None else np.asarray(policy, dtype=object)
    prop = np.full(n, np.nan) if propensity is None else np.asarray(propensity, np.float64).copy()
    unknown = ~(np.isfinite(prop) & (prop > 0))
    if unknown.any():
        prop[unknown] = estimated_propensity(
            np.asarray(context)[unknown], a[unknown], pol[unknown], low, high, seed=seed
        )
    f = MarginalActionDensity.fit(a, low, high)
    w = f(a) / np.maximum(prop, 1e-300)
    w = w / w.mean()
    clipped = w > clip
    w = np.minimum(w, clip)
    w = w / w.mean()
    ess = float(w.sum() ** 2 / (n * (w**2).sum()))
    return Weights(w, ess, float(clipped.mean()), float(unknown.mean()))


@dataclass(frozen=True)
class Overlap:
    """What a log says about the effect of actions (`overlap_report`).

    Attributes:
        n_rows: rows of the log; ``n_used``: rows the measures were computed on (a sample).
        policies: rows per ``policy`` id (``{"(unnamed)": n}`` without a policy column).
        unexplained: per action column, the cross-validated share of its variance that the context
            does not explain, in [0, 1].
        ess_share: effective sample size of the balancing weights over the rows used, in (0, 1].
        propensity_known: share of rows with a logged propensity.
        verdict: ``"none"`` (actions are a function of the context), ``"weak"`` or ``"some"``.
    """

    n_rows: int
    n_used: int
    policies: dict[str, int]
    unexplained: dict[str, float]
    ess_share: float
    propensity_known: float
    verdict: str

    @property
    def says_nothing(self) -> bool:
        return self.verdict == "none"

    @property
    def n_policies(self) -> int:
        return len(self.policies)

    def summary(self) -> str:
        """Two or three lines for people."""
        share = ", ".join(f"{c.partition('.')[2] or c} {v:.1%}" for c, v in self.unexplained.items())
        pols = ", ".join(f"{k} ({v:,} rows)" for k, v in self.policies.items())
        lines = [
            f"overlap: {self.n_policies} logged polic{'y' if self.n_policies == 1 else 'ies'}: {pols}",
            f"  action variance the context does not explain: {share}; propensity-weight effective sample "
            f"{self.ess_share:.1%} (propensities logged on {self.propensity_known:.0%} of rows)",
        ]
        if self.verdict == "none":
            lines.append(
                "  the logs say NOTHING about the effect of actions: every action is a function of the context "
                "(one deterministic policy); a twin fit to them learns that policy's habits, not the system's "
                "response. Log with exploration noise, several policies or a randomized canary."
            )
        elif self.verdict == "weak":
            lines.append(
                "  the logs say LITTLE about the effect of actions: they vary little independently of the "
                "context; the twin's answers about other policies rest on few rows."
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_rows": self.n_rows,
            "n_used": self.n_used,
            "policies": dict(self.policies),
            "unexplained": dict(self.unexplained),
            "ess_share": self.ess_share,
            "propensity_known": self.propensity_known,
            "verdict": self.verdict,
        }


def overlap_report(table: pd.DataFrame, spec: TwinSpec, seed: int = 0, max_rows: int = 4_000) -> Overlap:
    """How far a log's actions vary independently of their context (see the module docstring).

    Args:
        table: a validated log (`edgetwin.contract.validate.load_valid_log`), with ``policy`` and
            ``propensity`` columns if it has them.
        spec: its spec (context = ``spec.observation_columns``, actions = ``spec.action_columns``).
        seed: seeds the row sample and the models; the same seed gives the same report.
        max_rows: rows sampled for the measures (the cost is a few gradient-boosted fits on them).
    """
    with threadpool_limits(1):  # small fits: threads only contend on a shared machine
        return _overlap_report(table, spec, seed, max_rows)


def _overlap_report(table: pd.DataFrame, spec: TwinSpec, seed: int, max_rows: int) -> Overlap:
    n = len(table)
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(n, max_rows, replace=False)) if n > max_rows else np.arange(n)
    sub = table.iloc[rows]
    ctx_cols, act_cols = spec.observation_columns, spec.action_columns
    x = sub[ctx_cols].to_numpy(np.float64) if ctx_cols else np.zeros((len(sub), 1))
    x = (x - x.mean(axis=0)) / np.where(x.std(axis=0) > 0, x.std(axis=0), 1.0)
    a = sub[act_cols].to_numpy(np.float64)
    # folds over rows, not episodes: with regimes by day, a held-out day of another policy would be
    # an extrapolation and count the whole of its actions as "unexplained" (1.0 on log b of the benchmark)
    folds = KFold(3, shuffle=True, random_state=seed)
    unexplained: dict[str, float] = {}
    for j, c in enumerate(act_cols):
        var = float(a[:, j].var())
        if var <= 1e-12 * max(1.0, float(np.abs(a[:, j]).max())) or len(sub) < 6:
            unexplained[c] = 0.0
            continue
        pred = cross_val_predict(
            HistGradientBoostingRegressor(max_iter=40, random_state=seed), x, a[:, j], cv=folds
        )
        unexplained[c] = float(np.clip(np.mean((a[:, j] - pred) ** 2) / var, 0.0, 1.0))
    if POLICY_COLUMN in table:
        counts = table[POLICY_COLUMN].astype(str).value_counts().sort_index()
        policies = {str(k): int(v) for k, v in counts.items()}
        pol = sub[POLICY_COLUMN].astype(str).to_numpy()
    else:
        policies, pol = {"(unnamed)": n}, None
    prop = sub[PROPENSITY_COLUMN].to_numpy(np.float64) if PROPENSITY_COLUMN in sub else None
    low, high = spec.bounds("action")
    w = balancing_weights(x, a, low, high, pol, prop, seed=seed)
    known = float(np.isfinite(table[PROPENSITY_COLUMN]).mean()) if PROPENSITY_COLUMN in table else 0.0
    mean_unexplained = float(np.mean(list(unexplained.values()))) if unexplained else 0.0
    if mean_unexplained < NOTHING or (w.ess_share < NOTHING_ESS and len(policies) < 2):
        verdict = "none"
    elif mean_unexplained < WEAK or w.ess_share < WEAK_ESS:
        verdict = "weak"
    else:
        verdict = "some"
    return Overlap(n, len(sub), policies, unexplained, w.ess_share, known, verdict)
