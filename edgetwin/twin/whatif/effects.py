"""The twin's error on the *size of an effect*, calibrated on replayed held-out logged days, for the
change intervals the what-if and the promotion gate report (`edgetwin.twin.intervals.change_interval`,
method ``"replayed"``).

Why: a change between two policies is an effect, and a log of one policy has no second policy to
score the twin's effects against. A log of an exploring policy still holds effects: on one day, a
KPI computed over the agent-steps whose action ``j`` fell in one of its quantile bins, against the
same KPI over all the day's agent-steps, is a relative change the real system produced. The twin
replaying the day with its logged actions (the built-in ``"logged"`` policy, free-running from the
day's first states: its states are its own) gives its own; their difference is an effect-size error
measured without running any policy on the real system. Divided by how far the contrast moves the
actions (1-Wasserstein distance in units of the range the days explored), it is an error per unit of
action moved, which a candidate that moves the actions further carries linearly (a first-order,
Lipschitz reading: the only one a log of one exploring policy supports).

Calibrated at decision time from the replay the gate runs anyway (no cost in `Twin.fit`): the
replay's per-agent KPI series of every member and noise seed and the recorded days' logged values.
One score per day and action column (its largest contrast's: the contrasts of one day share its
world, so they are one sample), and the multiple ``λ`` (``λ_j`` per column) is their split-conformal quantile (`effect_multiple`); fewer than 9
days support less than 90 %, which the gate reports (`Calibration.attained`). Only contrasts that
move their column by `MIN_CONTRAST_SHIFT` of the explored range or more are scored, and in the KPI's
own units, so ``λ`` stays in the units of the days' effect errors and cannot explode on a near-zero
move or a near-zero level (not a multiple of a members' spread that can collapse).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgetwin.twin.intervals import (
    LEVEL,
    MIN_CONTRAST_SHIFT,
    Calibration,
    action_sketch,
    effect_multiple,
    sketch_points,
)
from edgetwin.twin.whatif.kpis import KpiDef
from edgetwin.twin.whatif.replay import LoggedEpisode

__all__ = ["ReplayedEffects", "contrast_effects", "replayed_effects"]

#: quantile bins per action column: each bin against the whole day is one contrast
BINS = 3
#: agent resamples of the paired bootstrap that measures a contrast's own sampling noise
N_BOOT = 40


@dataclass
class ReplayedEffects:
    """What the replayed logged days say about the twin's effect sizes.

    Attributes:
        scores: KPI name -> one score per replayed day (NaN: no contrast measurable that day).
        action_quantiles: action column -> `action_sketch` of the days' logged actions.
        action_span: action column -> the range the days explored (the unit of a shift).
    """

    scores: dict[str, list[float]] = field(default_factory=dict)
    #: KPI name -> per day, per action column its contrasts' largest score (`contrast_effects`)
    column_scores: dict[str, list[list[float]]] = field(default_factory=dict)
    action_quantiles: dict[str, list[float]] = field(default_factory=dict)
    action_span: dict[str, float] = field(default_factory=dict)
    #: the action columns, in the order of `column_scores`' entries
    columns: list[str] = field(default_factory=list)

    def apply(self, calibration: Calibration, level: float = LEVEL) -> Calibration:
        """Put the effect-size term into ``calibration`` (in place; returned): per KPI ``λ`` =
        `effect_multiple` of its day scores (NaN when none was measurable), the days' scores, and the
        reference the candidates' shifts are measured from."""
        for k, sc in self.scores.items():
            calibration.effect_multiple[k] = _multiple(sc, level)
            calibration.effect_scores[k] = list(sc)
            days = self.column_scores.get(k, [])
            if days:
                calibration.effect_by_column[k] = {
                    c: _multiple([d[j] for d in days], level) for j, c in enumerate(self.columns)}
        calibration.action_quantiles = dict(self.action_quantiles)
        calibration.action_span = dict(self.action_span)
        return calibration


def _multiple(scores: Sequence[float], level: float) -> float:
    """`effect_multiple` of the finite ``scores``; NaN when none is."""
    finite = [x for x in scores if not math.isnan(x)]
    return effect_multiple(finite, level)[0] if finite else float("nan")


def _on_rows(kpi: KpiDef, x: np.ndarray, w: np.ndarray | None, rows: np.ndarray) -> np.ndarray:
    """``kpi`` over the agent-steps ``rows`` of each run: ``x`` / ``w`` are ``(R, T, N)``, ``rows``
    ``(T, N)`` or ``(R, T, N)`` bool; returns ``(R,)``. Means and ratios are taken for every run at
    once (what `KpiDef.compute` does, vectorised: a day has ~10 contrasts per KPI, each over every
    member, noise seed and bootstrap resample, and the gate pays for them); quantiles and maxima run
    per run through `KpiDef.compute`."""
    m = np.broadcast_to(rows, x.shape)
    if kpi.stat in ("mean", "ratio"):
        ok = np.isfinite(x) & m
        xs = np.where(ok, x, 0.0)
        n = ok.sum(axis=(1, 2))
        plain = np.where(n > 0, xs.sum(axis=(1, 2)) / np.maximum(n, 1), np.nan)
        if kpi.weight is None or w is None:
            return plain if kpi.stat == "mean" else np.full(len(x), np.nan)
        ws = np.where(ok, np.maximum(np.nan_to_num(w), 0.0), 0.0)
        den = ws.sum(axis=(1, 2))
        num = (xs * ws if kpi.stat == "mean" else xs).sum(axis=(1, 2))
        # a weighted mean with no weight falls back to the plain mean, as `KpiDef.compute` does
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), plain if kpi.stat == "mean" else np.nan)
    return np.array([kpi.compute(np.where(m[r], x[r], np.nan), None if w is None else w[r]) for r in range(len(x))])


def day_contrasts(actions: np.ndarray, span: np.ndarray, bins: int = BINS) -> list[tuple[int, np.ndarray, float]]:
    """A day's contrasts that move their column enough to measure: ``[(column, rows (T, N) bool,
    shift)]``, each bin of a column's quantile bins (over the agent-steps with every action logged)
    whose 1-Wasserstein distance to the column over the day, in units of ``span``, is at least
    `MIN_CONTRAST_SHIFT`. ``actions``: ``(T, N, A)`` (NaN: absent)."""
    a = np.asarray(actions, np.float64)
    valid = np.isfinite(a).all(axis=-1)
    out: list[tuple[int, np.ndarray, float]] = []
    if not valid.any():
        return out
    for j in range(a.shape[-1]):
        if not span[j] > 0:
            continue
        col = a[..., j]
        values = col[valid]
        whole = np.quantile(values, _U)
        edges = np.quantile(values, np.linspace(0.0, 1.0, bins + 1)[1:-1])
        b = np.searchsorted(edges, col, side="right")
        for q in range(bins):
            rows = valid & (b == q)
            if rows.any():
                shift = float(np.mean(np.abs(np.quantile(col[rows], _U) - whole))) / float(span[j])
                if shift >= MIN_CONTRAST_SHIFT:
                    out.append((j, rows, shift))
    return out


def contrast_effects(
    kpi: KpiDef,
    actions: np.ndarray,
    real: tuple[np.ndarray, np.ndarray | None],
    twin: Sequence[tuple[np.ndarray, np.ndarray | None]],
    span: np.ndarray,
    bins: int = BINS,
    contrasts: list[tuple[int, np.ndarray, float]] | None = None,
    seed: int = 0,
) -> np.ndarray:
    """One day's effect-size scores of ``kpi``, ``(A,)`` per action column: the largest over the
    column's contrasts of the twin's error on the contrast beyond the contrast's own sampling noise,
    ``sqrt(max((twin - real)² - se², 0)) / shift``, in the KPI's units per unit of action moved; NaN
    where no contrast moved the column by `MIN_CONTRAST_SHIFT` with a measurable KPI. The day's
    score is their largest.

    A contrast is ``KPI(bin's agent-steps) - KPI(all the day's)``: a change in the KPI's own units,
    not relative to the day's level (a KPI whose level is near 0, the reward, would make a relative
    contrast explode). Its sampling noise: a bin holds a third of one day's agent-steps, and its noise
    divided by the bin's shift (a third of the range or less) and carried to a candidate's shift
    would be counted as the twin's error; ``se`` is the standard deviation of ``twin - real``
    contrast over a paired bootstrap of the day's agents (`N_BOOT` resamples, the same agents on
    both sides, the twin's runs averaged), removed by the method of moments.

    Args:
        kpi: the KPI (a per-agent total, ``stat="sum"``, is contrasted as its mean per agent-step:
            a bin's total depends on how many rows it has, not on the effect).
        actions: ``(T, N, A)`` the day's logged actions (NaN: the agent was absent).
        real: ``(x, w)`` ``(T, N)`` the KPI's column and weight the real system logged.
        twin: ``(x, w)`` of each replay of the day (members x noise seeds), same ``(t, agent)`` rows.
        span: ``(A,)`` the range each action column explored (the unit of a shift).
        bins: quantile bins per action column.
        contrasts: `day_contrasts` of ``actions`` (computed here when None; the same for every KPI).
        seed: the seed of the agent resamples (`replayed_effects` passes the what-if's seed): the same
            seed gives the same resamples, hence the same score; 0, the what-if's default seed, is
            the resampling every score used before the seed was threaded through.
    """
    k = dataclasses.replace(kpi, stat="mean") if kpi.stat == "sum" else kpi
    a = np.asarray(actions, np.float64)
    valid = np.isfinite(a).all(axis=-1) & np.isfinite(real[0])
    out = np.full(a.shape[-1], np.nan)
    if not valid.any() or not twin:
        return out
    rx = np.asarray(real[0], np.float64)[None]
    rw = None if real[1] is None else np.asarray(real[1], np.float64)[None]
    tx = np.stack([np.asarray(x, np.float64) for x, _ in twin])
    tw = None if any(w is None for _, w in twin) else np.stack([np.asarray(w, np.float64) for _, w in twin])
    # the paired agent bootstrap: the same resampled agents on both sides, the twin's runs averaged
    idx = np.random.default_rng(seed).integers(rx.shape[2], size=(N_BOOT, rx.shape[2]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mx = np.nanmean(tx, axis=0)
        mw = None if tw is None else np.nanmean(tw, axis=0)
        bx, brx = mx[:, idx].transpose(1, 0, 2), rx[0][:, idx].transpose(1, 0, 2)
        bw = None if mw is None else mw[:, idx].transpose(1, 0, 2)
        brw = None if rw is None else rw[0][:, idx].transpose(1, 0, 2)
        bvalid = valid[:, idx].transpose(1, 0, 2)
        r_all = float(_on_rows(k, rx, rw, valid)[0])
        t_all = _on_rows(k, tx, tw, valid)
        b_all = _on_rows(k, bx, bw, bvalid) - _on_rows(k, brx, brw, bvalid)
    for j, in_bin, shift in day_contrasts(a, span, bins) if contrasts is None else contrasts:
        rows = in_bin & valid
        if not rows.any():
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            rc = float(_on_rows(k, rx, rw, rows)[0]) - r_all
            tc = float(np.nanmean(_on_rows(k, tx, tw, rows) - t_all))
            brows = rows[:, idx].transpose(1, 0, 2)
            boot = _on_rows(k, bx, bw, brows) - _on_rows(k, brx, brw, brows) - b_all  # (B,) twin - real contrast
            se = float(np.nanstd(boot, ddof=1)) if np.isfinite(boot).sum() > 1 else 0.0
        if math.isfinite(rc) and math.isfinite(tc):
            # the error of the effect beyond the noise of the contrast's own rows (method of moments:
            # E e^2 = bias^2 + se^2), per unit of action moved
            bias = math.sqrt(max((tc - rc) ** 2 - se**2, 0.0))
            out[j] = np.fmax(out[j], bias / shift)
    return out


#: mid-points of the quantile function a contrast's shift is read on (`action_sketch`'s grid)
_U = sketch_points()


def replayed_effects(
    outcomes: Sequence[Any],
    reps: Sequence[tuple[int, LoggedEpisode | None]],
    kpis: Sequence[KpiDef],
    action_columns: Sequence[str],
    seed: int = 0,
) -> ReplayedEffects | None:
    """The effect-size scores of a replay of the log's own actions: ``outcomes`` are the
    `EpisodeOutcome` s of the ``"logged"`` policy's nominal cell in (member, replicate) order,
    ``reps`` the replicates' (world seed, recorded episode); replicates of one recorded episode (its
    noise seeds) and the members are the twin's replays of that day, scored together; ``seed`` (the
    what-if's) seeds each day's agent bootstrap (`contrast_effects`). None when the replicates are not
    recorded days or the outcomes lack per-agent series."""
    eps: dict[str, LoggedEpisode] = {}
    for _, ep in reps:
        if ep is None:
            return None
        eps.setdefault(ep.name, ep)
    runs: dict[str, list[Any]] = {name: [] for name in eps}
    for i, out in enumerate(outcomes):
        ep = reps[i % len(reps)][1]
        assert ep is not None
        if out.source is not None and not np.array_equal(out.source, np.arange(len(ep.agents))):
            return None  # a population shift duplicated rows: not the logged day's agents
        runs[ep.name].append(out)
    steps = {name: min(out.series[next(iter(out.series))].shape[0] for out in rs) if rs and rs[0].series else 0
             for name, rs in runs.items()}
    if not all(steps.values()):
        return None
    logged = np.concatenate([eps[n].action[: steps[n]].reshape(-1, len(action_columns)) for n in eps])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        span = np.nanmax(logged, axis=0) - np.nanmin(logged, axis=0)
    span = np.where(np.isfinite(span), span, 0.0)
    out = ReplayedEffects(action_quantiles=action_sketch(logged, action_columns),
                          action_span={c: float(s) for c, s in zip(action_columns, span, strict=True)},
                          columns=list(action_columns))
    contrasts = {name: day_contrasts(eps[name].action[: steps[name]], span) for name in eps}
    for k in kpis:
        days = []
        for name, ep in eps.items():
            t = steps[name]
            if any(c not in ep.columns for c in k.columns):
                days.append(np.full(len(action_columns), np.nan))
                continue
            real = (ep.columns[k.column][:t], None if k.weight is None else ep.columns[k.weight][:t])
            twin = [(o.series[k.column][:t], None if k.weight is None else o.series[k.weight][:t]) for o in runs[name]]
            days.append(contrast_effects(k, ep.action[:t], real, twin, span, contrasts=contrasts[name],
                                         seed=seed))
        out.column_scores[k.name] = [[float(x) for x in d] for d in days]
        out.scores[k.name] = [float(np.nanmax(d)) if np.isfinite(d).any() else float("nan") for d in days]
    return out
