"""Calibrated 90 % intervals for what the twin says about a policy.

A twin's number about a policy has two kinds of uncertainty. What varies anyway (populations,
days, response noise) and what the twin does not know (its ensemble members disagree) are both
in the two-level bootstrap over members x replicate worlds (`edgetwin.twin.whatif.bootstrap_ci`).
What the bootstrap cannot see is the twin's *bias*: every member can be wrong the same way. A
bootstrap interval of a twin's mean therefore covers the twin's own mean, not the real value, and
on the emulated cluster it excluded the real change of a KPI in most (policy, KPI) pairs
(docs/benchmarks.md, "What-if replay vs the emulated cluster").

The construction used everywhere (`interval`, `change_interval`), chosen by measured coverage
(`benchmarks/whatif_gate.py` reports the coverage of the plain bootstrap beside it):

1. the 90 % two-level bootstrap interval ``[lo, hi]`` of the twin's mean (members x replicates);
2. widened on both sides by ``q_k · |value|``, where ``q_k`` is a split-conformal quantile
   (finite-sample ``⌈(n+1)·0.9⌉``-th smallest score) of the twin's relative error on KPI ``k``
   measured on **held-out logged episodes**: the twin replays each recorded episode with its
   logged actions (`run_whatif` with the built-in ``"logged"`` policy), and each (member,
   replicate)'s KPI is compared with the KPI the real system logged for that episode,
   ``|y - ŷ| / |ŷ|``. This needs no access to the real system: the logging policy's own KPIs in
   logs the twin was not fitted on are ground truth;
3. for a relative change ``(c - b)/|b|`` of a candidate against a baseline, the paired bootstrap
   interval of the change is widened by ``q_k · sqrt(c² + b²) / |b|`` (both numbers carry the
   twin's error; the pairing removes the shared noise but not an error that differs between them).

The conformal step is valid for the logging policy (exchangeable held-out episodes); for another
policy it is only as good as the twin's error there resembles its error on logged behaviour,
which holds where the candidate stays within the logs' support. Hence every number also carries
its out-of-support share, and the promotion gate abstains when that share is high
(`edgetwin.policies.gate`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the what-if package uses this module: import it lazily
    import pandas as pd

    from edgetwin.twin.whatif import KpiDef, WhatIfResult

__all__ = [
    "LEVEL",
    "METHODS",
    "Calibration",
    "calibrate",
    "calibration_from_result",
    "change_interval",
    "conformal_quantile",
    "held_out_coverage",
    "interval",
]

#: The nominal level of every interval the twin reports.
LEVEL = 0.90
#: Interval constructions: ``"relative"`` (bootstrap widened by the conformal relative error of the
#: ensemble's mean) and ``"normalized"`` (ensemble mean ± conformal multiple of the members' spread).
METHODS = ("relative", "normalized")


def conformal_quantile(scores: Sequence[float] | np.ndarray, level: float = LEVEL) -> tuple[float, bool]:
    """Split-conformal quantile of nonconformity ``scores``: the ``⌈(n+1)·level⌉``-th smallest.

    Returns ``(q, exact)``; with too few scores for the finite-sample rank (``n < level/(1-level)``,
    9 at 90 %) the largest score is returned and ``exact`` is False (the guarantee then does not hold,
    and reports say so).
    """
    s = np.sort(np.asarray([x for x in scores if math.isfinite(x)], dtype=np.float64))
    n = len(s)
    if n == 0:
        return float("nan"), False
    k = int(math.ceil((n + 1) * level))
    if k > n:
        return float(s[-1]), False
    return float(s[k - 1]), True


@dataclass
class Calibration:
    """The twin's relative error per KPI on held-out logged episodes, and its conformal quantile.

    Attributes:
        level: nominal coverage (0.9).
        quantile: KPI name -> ``q_k`` (a fraction of the value; 0.12 = the twin was within 12 %
            on 90 % of held-out (member, episode) pairs).
        exact: KPI name -> whether there were enough scores for the finite-sample guarantee.
        scores: KPI name -> the relative errors it was computed from.
        source: what it was calibrated on (for reports).
    """

    level: float = LEVEL
    quantile: dict[str, float] = field(default_factory=dict)
    exact: dict[str, bool] = field(default_factory=dict)
    scores: dict[str, list[float]] = field(default_factory=dict)
    source: str = ""
    #: the members-normalised score's quantile per KPI (``|y - ŷ| / sd over members``)
    quantile_norm: dict[str, float] = field(default_factory=dict)
    #: which construction the intervals use: one of `METHODS`
    method: str = "relative"

    def width(self, kpi: str) -> float:
        """``q_k`` of ``kpi`` (0 when it was not calibrated: the plain bootstrap then)."""
        q = self.quantile.get(kpi, 0.0)
        return q if math.isfinite(q) else 0.0

    def width_norm(self, kpi: str) -> float:
        """The members-normalised quantile of ``kpi`` (0 when not calibrated)."""
        q = self.quantile_norm.get(kpi, 0.0)
        return q if math.isfinite(q) else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "method": self.method,
            "quantile": dict(self.quantile),
            "quantile_norm": dict(self.quantile_norm),
            "exact": dict(self.exact),
            "n": {k: len(v) for k, v in self.scores.items()},
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Calibration:
        return cls(
            level=float(d.get("level", LEVEL)),
            quantile={str(k): float(v) for k, v in dict(d.get("quantile", {})).items()},
            exact={str(k): bool(v) for k, v in dict(d.get("exact", {})).items()},
            source=str(d.get("source", "")),
            quantile_norm={str(k): float(v) for k, v in dict(d.get("quantile_norm", {})).items()},
            method=str(d.get("method", "relative")),
        )


def calibration_from_result(
    result: WhatIfResult, policy: str = "logged", level: float = LEVEL, scenario: str = "nominal"
) -> Calibration:
    """A `Calibration` from a replay-mode what-if run that replayed the log's own actions.

    ``result`` must be a counterfactual replay (``log=``) with ``policy`` (the built-in
    ``"logged"``) among its policies; each (member, replicate) KPI is scored against the KPI the
    log itself recorded for that episode.
    """
    if not result.logged_kpis:
        raise ValueError("calibration needs a replay of a log (run_whatif(..., log=...))")
    cell = result.cell(policy, scenario)
    n_eps = len(result.settings.get("recorded_episodes") or [])
    out = Calibration(level=level, source=f"{n_eps} held-out logged episode(s) x {cell.oos.shape[0]} member(s)")
    for k in result.kpis:
        y = result.logged_kpis.get(k.name)
        if y is None or not len(y):
            continue
        v = cell.values[k.name]  # (M, R): replicates cycle over the recorded episodes, seed-major
        truth = np.resize(np.asarray(y, dtype=np.float64), v.shape[1])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            centre = np.nanmean(v, axis=0)  # the ensemble's answer per replicate
            spread = np.nanstd(v, axis=0, ddof=1) if v.shape[0] > 1 else np.zeros(v.shape[1])
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.abs(truth - centre) / np.abs(centre)
            norm = np.abs(truth - centre) / np.maximum(spread, 1e-9 * np.abs(centre) + 1e-12)
        scores = [float(x) for x in rel if math.isfinite(x)]
        q, exact = conformal_quantile(scores, level)
        out.quantile[k.name], out.exact[k.name], out.scores[k.name] = q, exact, scores
        out.quantile_norm[k.name] = conformal_quantile([float(x) for x in norm if math.isfinite(x)], level)[0]
    return out


def calibrate(
    twin: Any,
    log: pd.DataFrame,
    kpis: Sequence[KpiDef] | None = None,
    *,
    episodes: int = 3,
    seeds: int = 3,
    seed: int = 0,
    members: Sequence[int] | None = None,
    steps: int | None = None,
    level: float = LEVEL,
    method: str = "relative",
    progress: bool = False,
) -> Calibration:
    """Calibrate ``twin``'s intervals on held-out ``log`` (episodes it was not fitted on).

    Replays the last ``episodes`` recorded episodes with their logged actions, ``seeds`` noise
    seeds each, with every member, and scores each against the logged KPIs
    (`calibration_from_result`).
    """
    from edgetwin.twin.whatif import builtin_policy, run_whatif

    res = run_whatif(
        twin, [builtin_policy("logged", twin)], [], kpis=kpis, episodes=episodes, seeds=seeds, seed=seed,
        members=members, steps=steps, log=log, progress=progress,
    )  # fmt: skip
    cal = calibration_from_result(res, "logged", level)
    cal.method = method
    return cal


def interval(
    values: np.ndarray, calibration: Calibration | None, kpi: str, seed: int = 0, level: float = LEVEL
) -> tuple[float, float]:
    """The calibrated interval of the mean of ``(M, R)`` ``values`` of one KPI (see module doc)."""
    from edgetwin.twin.whatif.results import bootstrap_ci

    v = np.asarray(values, dtype=np.float64)
    lo, hi = bootstrap_ci(v, seed=seed, level=level)
    if calibration is None or not np.isfinite(v).any():
        return lo, hi
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = float(np.nanmean(v))
        members = np.nanmean(v, axis=1) if v.ndim == 2 else v
    if calibration.method == "normalized":
        sd = float(np.nanstd(members, ddof=1)) if len(members) > 1 else 0.0
        w = calibration.width_norm(kpi) * sd
        return min(lo, mean - w), max(hi, mean + w)
    w = calibration.width(kpi) * abs(mean)
    return lo - w, hi + w


def change_interval(
    change_ci: Sequence[float],
    candidate: np.ndarray | float,
    baseline: np.ndarray | float,
    calibration: Calibration | None,
    kpi: str,
) -> tuple[float, float]:
    """Widen the paired bootstrap interval of a relative change by the twin's calibrated error.

    ``candidate`` and ``baseline`` are the ``(M, R)`` values (or their means, for ``"relative"``).
    ``"relative"``: ± ``q_k · sqrt(c² + b²) / |b|``; ``"normalized"``: the change's point estimate ±
    ``q_norm · sd`` over members of each member's own paired change (at least the bootstrap).
    """
    lo, hi = float(change_ci[0]), float(change_ci[1])
    if calibration is None:
        return lo, hi
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        va, vb = np.atleast_2d(np.asarray(candidate, np.float64)), np.atleast_2d(np.asarray(baseline, np.float64))
        c, b = float(np.nanmean(va)), float(np.nanmean(vb))
        if not (math.isfinite(c) and math.isfinite(b)) or b == 0.0:
            return lo, hi
        if calibration.method == "normalized":
            per_member = (np.nanmean(va, axis=1) - np.nanmean(vb, axis=1)) / abs(b)
            sd = float(np.nanstd(per_member, ddof=1)) if len(per_member) > 1 else 0.0
            w = calibration.width_norm(kpi) * sd
            mid = (c - b) / abs(b)
            return min(lo, mid - w), max(hi, mid + w)
    w = calibration.width(kpi) * math.hypot(c, b) / abs(b)
    return lo - w, hi + w


def held_out_coverage(
    twin: Any,
    log: pd.DataFrame,
    kpis: Sequence[KpiDef] | None = None,
    *,
    episodes: int = 6,
    seeds: int = 2,
    seed: int = 0,
    level: float = LEVEL,
    method: str = "relative",
) -> dict[str, Any]:
    """How often a logged KPI falls inside the twin's calibrated interval, on held-out logs.

    The last ``episodes`` recorded episodes of ``log`` are replayed with their logged actions
    (every member, ``seeds`` noise seeds). Cross-fitted in two folds: the intervals of one half of
    the episodes are calibrated on the other half, so no episode's truth widens its own interval.

    Returns:
        ``{"level", "coverage": share of (episode, KPI) pairs covered, "coverage_plain":
        the same for the plain bootstrap, "per_kpi": {kpi: {"coverage", "coverage_plain",
        "q"}}, "episodes", "calibration": the calibration on all episodes}``; coverage is NaN
        with fewer than 2 episodes.
    """
    from edgetwin.twin.whatif import builtin_policy, run_whatif

    res = run_whatif(
        twin, [builtin_policy("logged", twin)], [], kpis=kpis, episodes=episodes, seeds=seeds, seed=seed,
        log=log, progress=False,
    )  # fmt: skip
    names = list(res.settings.get("recorded_episodes") or [])
    n_eps = len(names)
    full = calibration_from_result(res, "logged", level)
    full.method = method
    out: dict[str, Any] = {"level": level, "episodes": n_eps, "calibration": full.to_dict(), "per_kpi": {}}
    if n_eps < 2:
        out.update(coverage=float("nan"), coverage_plain=float("nan"))
        return out
    cell = res.cell("logged", "nominal")
    reps = cell.oos.shape[1]
    ep_of_rep = np.arange(reps) % n_eps
    folds = [np.arange(n_eps) % 2 == f for f in (0, 1)]
    hits: list[bool] = []
    plain: list[bool] = []
    for k in res.kpis:
        y = res.logged_kpis.get(k.name)
        if y is None or len(y) != n_eps:
            continue
        v = cell.values[k.name]
        kh: list[bool] = []
        kp: list[bool] = []
        for f in (0, 1):
            cal_eps, test_eps = np.flatnonzero(~folds[f]), np.flatnonzero(folds[f])
            cal_cols = np.isin(ep_of_rep, cal_eps)
            truth = np.asarray(y, dtype=np.float64)[ep_of_rep[cal_cols]]
            with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
                warnings.simplefilter("ignore", RuntimeWarning)
                centre = np.nanmean(v[:, cal_cols], axis=0)
                spread = np.nanstd(v[:, cal_cols], axis=0, ddof=1) if v.shape[0] > 1 else np.zeros(len(centre))
                rel = np.abs(truth - centre) / np.abs(centre)
                norm = np.abs(truth - centre) / np.maximum(spread, 1e-9 * np.abs(centre) + 1e-12)
            cal = Calibration(
                level=level,
                quantile={k.name: conformal_quantile(rel, level)[0]},
                quantile_norm={k.name: conformal_quantile(norm, level)[0]},
                method=method,
            )
            for e in test_eps:
                ve = v[:, ep_of_rep == e]
                lo, hi = interval(ve, cal, k.name, seed=seed, level=level)
                lo0, hi0 = interval(ve, None, k.name, seed=seed, level=level)
                kh.append(bool(lo <= y[e] <= hi))
                kp.append(bool(lo0 <= y[e] <= hi0))
        out["per_kpi"][k.name] = {
            "coverage": float(np.mean(kh)),
            "coverage_plain": float(np.mean(kp)),
            "q": full.quantile.get(k.name, float("nan")),
        }
        hits += kh
        plain += kp
    out["coverage"] = float(np.mean(hits)) if hits else float("nan")
    out["coverage_plain"] = float(np.mean(plain)) if plain else float("nan")
    return out
