"""Calibrating the interval of a *policy's value* on the values the log itself holds, cross-fitted.

The twin's bootstrap interval of a policy's value (members x episodes,
`edgetwin.twin.intervals.bootstrap_ci`) covers the twin's own mean, not the real value: every member
can be wrong the same way. `edgetwin.twin.calibration.calibrate` widens it by the twin's error on
held-out logged *episodes* (one score per episode, all of its rows pooled). A log with several
policies holds more than that: the real value of each logged policy — each regime of a sequence,
each randomized arm of a canary — on every day it ran. Scoring the twin there, out of fold, is
scoring it on policies it was not fitted on, the nearest thing in the log to the question it is
asked about an unseen policy.

The mechanism:

1. `episode_folds`: the log's episodes (days) in ``k`` folds (alternate episodes, so regimes that
   follow each other in time and trial days fall in every fold);
2. `cross_fitted_policy_values`: for each fold, a twin fitted on the *other* folds' rows (``fit``,
   the caller's `Twin.fit` arguments) replays the fold's episodes with their logged actions
   (`logged_policy_values`), and for each (episode, logged policy) compares the twin's mean reward
   over that policy's rows with the logged one. No row of a unit is in the twin that scores it;
3. `policy_value_calibration`: a relative score ``|y - ŷ| / |ŷ|`` per unit, one score per
   *independent* episode (the units of one day share its world — its population, its hidden load
   — so they are one sample, scored by their largest error: an interval covers the day only if it
   covers each of its policies), and the split-conformal quantile of those scores
   (`edgetwin.twin.intervals.conformal_quantile`). The result is an ordinary
   `edgetwin.twin.intervals.Calibration` (method ``"relative"``): `interval` widens a value's
   bootstrap interval by ``q · |value|``, and the level it supports is the one its number of
   independent episodes supports (`attained_level`: 3 days support 75 %, never 90 %; 9 are needed
   for 90 %), as the promotion gate already reads it.

Cross-fitting, not a split: the twin whose intervals are widened is fitted on every day, the scores
come from twins fitted on the other fold's days (as in CV+, Barber et al. 2021, whose worst-case
guarantee is ``1 - 2α`` rather than ``1 - α``); a twin fitted on half the days errs more than the
full one, which widens the interval rather than narrowing it. The calibration's episodes are the
twin's own training days, so it carries no ``episode_sha256`` (the gate's check that a held-out
calibration is not on training data does not apply: no score comes from a twin that saw its day).

What it promises: split-conformal coverage for a policy whose value error is exchangeable with the
logged policies' out-of-fold errors. For a policy far from every logged one (off the logs' support)
it promises nothing; that is what the out-of-support share is for. With one logged policy the scores
are the twin's error on that policy's own behaviour, which is typically smaller than its error
elsewhere: such a calibration says less, and the benchmark (docs/benchmarks/causal_twin) reports
how much less.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import REWARD_COLUMN
from edgetwin.twin.fidelity import logged_rollout
from edgetwin.twin.intervals import (
    LEVEL,
    Calibration,
    conformal_quantile,
    effect_multiple,
    replayed_effect_scores,
)
from edgetwin.twin.whatif.replay import logged_episodes

__all__ = [
    "LoggedActions",
    "cross_fitted_policy_values",
    "episode_folds",
    "logged_policy_values",
    "policy_value_calibration",
    "replayed_effect_calibration",
]

#: columns of a table of calibration units (`logged_policy_values`, `cross_fitted_policy_values`)
UNIT_COLUMNS = ("episode", "policy", "rows", "estimate", "truth")


class LoggedActions:
    """A platform policy that answers tick ``t`` of a recorded episode with the actions logged then.

    ``actions``: ``(T, N, A)`` in the order of the episode's agents (`LoggedEpisode.action`); tick
    ``t`` of every pass (one per ensemble member in `logged_rollout`) answers ``actions[t % T]``.
    Missing actions (an agent absent at a tick) are the episode's mean action of that column.
    """

    def __init__(self, actions: np.ndarray) -> None:
        a = np.asarray(actions, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            fill = np.nanmean(a.reshape(-1, a.shape[-1]), axis=0) if a.size else np.zeros(a.shape[-1])
        self.actions = np.where(np.isnan(a), np.nan_to_num(fill)[None, None, :], a)
        self.t = 0

    def act(self, obs: np.ndarray) -> np.ndarray:
        a = self.actions[self.t % len(self.actions)]
        if len(a) != len(obs):
            raise ValueError(f"logged actions are for {len(a)} agents, the episode has {len(obs)}")
        self.t += 1
        return a


def episode_folds(episodes: Sequence[Any], k: int = 2) -> list[tuple[list[Any], list[Any]]]:
    """``[(train, held)]`` episode ids of ``k`` cross-fitting folds: episode ``i`` (in log order) is
    held out in fold ``i % k``, so every episode is held out once and regimes that follow each other
    in time, and trial days, land in every fold."""
    eps = list(dict.fromkeys(episodes))
    if k < 2 or len(eps) < k:
        raise ValueError(f"need k >= 2 folds and at least k episodes; got k={k}, {len(eps)} episode(s)")
    return [([e for i, e in enumerate(eps) if i % k != f], [e for i, e in enumerate(eps) if i % k == f]) for f in range(k)]


def logged_policy_values(twin: Any, log: pd.DataFrame, seed: int = 0, kpi: str = REWARD_COLUMN) -> pd.DataFrame:
    """The twin's and the log's value of every logged policy on every episode of ``log``.

    Each episode is replayed in the twin from its logged first states with its *logged* actions
    (`LoggedActions`, every member: `logged_rollout` with ``all_members``); its rows are labelled
    with the log's ``policy`` of the same (t, agent) (``"logged"`` without a policy column).

    Returns:
        One row per (episode, policy): ``rows`` (logged rows of that policy), ``estimate`` (the
        twin's mean ``kpi`` over them, members averaged) and ``truth`` (the logged mean).

    Raises:
        InputError: ``log`` lacks ``kpi`` or a column the twin needs to replay it.
    """
    if kpi not in log.columns:
        raise InputError(f"the log has no {kpi!r} column to calibrate the policy values on", "--log")
    lab = log.assign(policy=log["policy"].astype(str) if "policy" in log.columns else "logged",
                     agent=log["agent"].astype(str), episode=log["episode"].astype(str))
    out = []
    for ep in logged_episodes(log, twin):
        rows = lab[lab["episode"] == ep.name]
        sim = logged_rollout(twin, LoggedActions(ep.action), log[log["episode"].astype(str) == ep.name],
                             seed=seed, all_members=True)
        sim = sim.assign(agent=sim["agent"].astype(str)).merge(
            rows[["t", "agent", "policy"]].drop_duplicates(["t", "agent"]), on=["t", "agent"], how="inner")
        est = sim.groupby("policy")[kpi].mean()
        real = rows.groupby("policy")[kpi].agg(["mean", "size"])
        for pol, r in real.iterrows():
            out.append({"episode": ep.name, "policy": str(pol), "rows": int(r["size"]),
                        "estimate": float(est.get(pol, np.nan)), "truth": float(r["mean"])})
    return pd.DataFrame(out, columns=list(UNIT_COLUMNS))


def cross_fitted_policy_values(
    fit: Callable[[pd.DataFrame], Any],
    log: pd.DataFrame,
    *,
    folds: int = 2,
    seed: int = 0,
    values: Callable[[Any, pd.DataFrame], pd.DataFrame] | None = None,
) -> pd.DataFrame:
    """Out-of-fold values of the logged policies: each fold's episodes scored by a model fitted on
    the other folds (see the module doc).

    Args:
        fit: training rows -> a fitted twin (or any model ``values`` understands), e.g.
            ``lambda rows: Twin.fit(rows, spec, seed=0, response_model="causal")``.
        log: the whole log (``episode``, ``policy``, the twin's columns and ``reward``).
        folds: ``k`` of `episode_folds`.
        seed: the replays' seed.
        values: ``(model, held-out rows) -> units`` (columns ``UNIT_COLUMNS``); default
            `logged_policy_values` of a twin.

    Returns:
        The units of every fold, with a ``fold`` column.
    """
    score = values or (lambda model, rows: logged_policy_values(model, rows, seed=seed))
    ep = log["episode"].astype(str)
    parts = []
    for f, (train, held) in enumerate(episode_folds(list(pd.unique(ep)), folds)):
        model = fit(log[ep.isin(train)].reset_index(drop=True))
        parts.append(score(model, log[ep.isin(held)].reset_index(drop=True)).assign(fold=f))
    return pd.concat(parts, ignore_index=True)


def policy_value_calibration(
    units: pd.DataFrame, level: float = LEVEL, kpi: str = REWARD_COLUMN, group: str = "episode"
) -> Calibration:
    """A `Calibration` of ``kpi``'s value intervals from out-of-fold units (`cross_fitted_policy_values`).

    Each unit's score is ``|truth - estimate| / |estimate|`` (``+inf`` when the estimate is 0 and the
    truth is not); the units of one ``group`` (an episode: they share its world) are one independent
    score, their largest. NaN units (nothing replayed) are dropped and counted. The quantile is the
    split-conformal one; ``n_independent`` is the number of groups, so ``attained(kpi)`` is the level
    they support (`edgetwin.twin.intervals.attained_level`). Method ``"relative"``: `interval`
    widens a value's bootstrap interval by ``q · |value|``.
    """
    missing = [c for c in ("estimate", "truth", group) if c not in units.columns]
    if missing:
        raise ValueError(f"calibration units lack column(s) {missing}")
    y, yhat = units["truth"].to_numpy(np.float64), units["estimate"].to_numpy(np.float64)
    err = np.abs(y - yhat)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(err == 0, 0.0, err / np.abs(yhat))
    per = pd.Series(rel, index=units[group].astype(str).to_numpy())
    per = per[~np.isnan(per.to_numpy())]
    by_group = per.groupby(level=0, sort=False).max()
    scores = [float(x) for x in by_group.to_numpy(np.float64)]
    n_groups = int(units[group].astype(str).nunique())
    q, exact = conformal_quantile(scores, level)
    pols = sorted(units["policy"].astype(str).unique()) if "policy" in units.columns else []
    cal = Calibration(level=level, method="relative", source=(
        f"{len(scores)} independent {group}(s) of out-of-fold value errors of {len(pols)} logged "
        f"polic{'y' if len(pols) == 1 else 'ies'} ({', '.join(pols)})"))
    cal.quantile[kpi], cal.exact[kpi], cal.scores[kpi] = q, exact, scores
    cal.n_independent[kpi] = len(scores)
    cal.dropped[kpi] = n_groups - len(scores)
    return cal



def replayed_effect_calibration(
    twin: Any, log: pd.DataFrame, kpis: Sequence[str], *, seed: int = 0, bins: int = 3, level: float = LEVEL
) -> dict[str, dict[str, Any]]:
    """The twin's effect-size error per unit of action moved, calibrated on held-out logged days.

    Each episode (day) of ``log`` (days the twin was not fitted on) is replayed in the twin from its
    logged first states with its logged actions (`LoggedActions`, every member, their outputs
    averaged per (t, agent)), free-running: its states are its own. The day's score per KPI is
    `edgetwin.twin.intervals.replayed_effect_scores` of its logged actions, logged KPIs and the
    twin's; the multiple ``λ`` is their split-conformal quantile over days (`effect_multiple`), so a
    policy's change interval gets ``λ · action_shift`` (change units) for the effect the log can show.
    Uses only the log and the twin: no policy is run on the real system.

    Returns:
        ``{kpi: {"multiple": λ, "exact": bool, "day_scores": [per day], "days": n}}``.

    Raises:
        InputError: ``log`` lacks a KPI or a column the twin needs to replay it.
    """
    missing = [k for k in kpis if k not in log.columns]
    if missing:
        raise InputError(f"the log has no {missing[0]!r} column to calibrate the effect sizes on", "--log")
    actions = list(twin.spec.action_columns)
    lab = log.assign(agent=log["agent"].astype(str), episode=log["episode"].astype(str))
    scores: dict[str, list[float]] = {k: [] for k in kpis}
    for ep in logged_episodes(log, twin):
        rows = lab[lab["episode"] == str(ep.name)]
        sim = logged_rollout(twin, LoggedActions(ep.action), log[log["episode"].astype(str) == str(ep.name)],
                             seed=seed, all_members=True)
        sim = sim.assign(agent=sim["agent"].astype(str)).groupby(["t", "agent"], as_index=False)[list(kpis)].mean()
        both = rows[["t", "agent", *actions, *kpis]].merge(sim, on=["t", "agent"], suffixes=("", "_twin"))
        day = replayed_effect_scores(both[actions].to_numpy(), both[list(kpis)].to_numpy(),
                                     both[[f"{k}_twin" for k in kpis]].to_numpy(), bins)
        for k, x in zip(kpis, day, strict=True):
            scores[k].append(float(x))
    out: dict[str, dict[str, Any]] = {}
    for k in kpis:
        lam, exact = effect_multiple(scores[k], level)
        out[k] = {"multiple": lam, "exact": exact, "day_scores": scores[k], "days": len(scores[k])}
    return out
