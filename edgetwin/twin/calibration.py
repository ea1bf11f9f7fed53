"""Calibrating the twin's intervals on held-out logs, and measuring their coverage there.

`calibrate` replays held-out logged episodes with their logged actions and scores the ensemble's
answer against the logged KPIs (`calibration_from_result`); `held_out_coverage` measures, cross-fitted
over a log's episodes, how often the logged KPI falls inside the calibrated interval. The interval
constructions themselves are in `edgetwin.twin.intervals`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from edgetwin.twin.intervals import (
    DEFAULT_METHOD,
    LEVEL,
    Calibration,
    calibration_from_arrays,
    interval,
)
from edgetwin.twin.logdata import episode_hashes
from edgetwin.twin.whatif import KpiDef, WhatIfResult, builtin_policy, run_whatif

__all__ = ["calibrate", "calibration_from_result", "cross_fitted_hits", "held_out_coverage", "two_folds"]


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
    cal = calibration_from_arrays(
        {k.name: cell.values[k.name] for k in result.kpis}, result.logged_kpis, level,
        f"{n_eps} held-out logged episode(s) x {cell.oos.shape[0]} member(s)",
    )  # fmt: skip
    if result.replayed_effects is not None:  # the change intervals' effect-size term, same days
        result.replayed_effects.apply(cal, level)
    return cal


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
    method: str = DEFAULT_METHOD,
    progress: bool = False,
    workers: int | None = 1,
    ray_address: str | None = None,
) -> Calibration:
    """Calibrate ``twin``'s intervals on held-out ``log`` (episodes it was not fitted on).

    Replays the last ``episodes`` recorded episodes with their logged actions, ``seeds`` noise
    seeds each, with every member, and scores each against the logged KPIs
    (`calibration_from_result`). ``workers`` / ``ray_address``: where the replays run (`run_whatif`);
    the result does not depend on it.
    """
    res = run_whatif(
        twin, [builtin_policy("logged", twin)], [], kpis=kpis, episodes=episodes, seeds=seeds, seed=seed,
        members=members, steps=steps, log=log, progress=progress, workers=workers, ray_address=ray_address,
    )  # fmt: skip
    cal = calibration_from_result(res, "logged", level)
    cal.method = method
    names = set(map(str, res.settings.get("recorded_episodes") or []))
    cols = list(twin.meta.get("episode_hash_columns") or [])
    if cols:  # what it was calibrated on, for the gate's overlap check against the twin's data
        with contextlib.suppress(KeyError):  # a log without the twin's columns failed the replay already
            cal.episode_sha256 = {n: h for n, h in episode_hashes(log, cols).items() if n in names}
    return cal


def two_folds(n_episodes: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``[(calibrate, test)]`` episode indices of the two cross-fitting folds: alternate episodes
    (0, 2, 4, ... tested in the first fold, 1, 3, ... in the second), so the two sets of a fold are
    disjoint and every episode is tested exactly once, calibrated on episodes other than itself."""
    tested = np.arange(n_episodes) % 2 == 0
    return [(np.flatnonzero(~t), np.flatnonzero(t)) for t in (tested, ~tested)]


def cross_fitted_hits(
    values: np.ndarray,
    truth: Sequence[float] | np.ndarray,
    ep_of_rep: np.ndarray,
    kpi: str,
    folds: Sequence[tuple[np.ndarray, np.ndarray]],
    level: float = LEVEL,
    method: str = DEFAULT_METHOD,
    seed: int = 0,
) -> tuple[list[bool], list[bool]]:
    """Whether each tested episode's logged KPI falls inside its interval, calibrated on its fold's
    other episodes, and inside the plain bootstrap one.

    Args:
        values: ``(M, R)`` the KPI of every (member, replicate); replicate ``r`` replays episode
            ``ep_of_rep[r]``.
        truth: ``(E,)`` the KPI each episode logged.
        folds: ``(calibrate, test)`` episode indices (`two_folds`).

    Returns:
        ``(calibrated, plain)``: one bool per tested episode, in the folds' order. A fold's
        calibration is `calibration_from_arrays` on its calibration episodes' replicates: the
        ensemble's mean per replicate scored against the logged KPI, as `calibrate` does.
    """
    v = np.asarray(values, dtype=np.float64)
    y = np.asarray(truth, dtype=np.float64)
    hits: list[bool] = []
    plain: list[bool] = []
    for cal_eps, test_eps in folds:
        cal_cols = np.isin(ep_of_rep, cal_eps)
        cal = calibration_from_arrays({kpi: v[:, cal_cols]}, {kpi: y}, level, groups=ep_of_rep[cal_cols])
        cal.method = method
        for e in test_eps:
            ve = v[:, ep_of_rep == e]
            lo, hi = interval(ve, cal, kpi, seed=seed, level=level)
            lo0, hi0 = interval(ve, None, kpi, seed=seed, level=level)
            hits.append(bool(lo <= y[e] <= hi))
            plain.append(bool(lo0 <= y[e] <= hi0))
    return hits, plain


def held_out_coverage(
    twin: Any,
    log: pd.DataFrame,
    kpis: Sequence[KpiDef] | None = None,
    *,
    episodes: int = 6,
    seeds: int = 2,
    seed: int = 0,
    level: float = LEVEL,
    method: str = DEFAULT_METHOD,
) -> dict[str, Any]:
    """How often a logged KPI falls inside the twin's calibrated interval, on held-out logs.

    The last ``episodes`` recorded episodes of ``log`` are replayed with their logged actions
    (every member, ``seeds`` noise seeds). Cross-fitted in two folds: the intervals of one half of
    the episodes are calibrated on the other half, so no episode's truth widens its own interval.

    Returns:
        ``{"level", "coverage": share of (episode, KPI) pairs covered, "coverage_plain":
        the same for the plain bootstrap, "per_kpi": {kpi: {"coverage", "coverage_plain",
        "q"}}, "episodes", "folds": [{"calibrate": [episode], "test": [episode]}] (`two_folds`),
        "calibration": the calibration on all episodes}``; coverage is NaN with fewer than 2
        episodes.
    """
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
    folds = two_folds(n_eps)
    out["folds"] = [{"calibrate": [str(names[e]) for e in cal], "test": [str(names[e]) for e in test]} for cal, test in folds]
    hits: list[bool] = []
    plain: list[bool] = []
    for k in res.kpis:
        y = res.logged_kpis.get(k.name)
        if y is None or len(y) != n_eps:
            continue
        kh, kp = cross_fitted_hits(cell.values[k.name], y, ep_of_rep, k.name, folds, level, method, seed)
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
