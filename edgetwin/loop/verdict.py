"""The canary's verdict: one round's prediction-powered estimates per guarded KPI.

`canary_verdict` replays the fleet's day in the twin (every group on the candidate, every group on
the current policy, and the canary's own assignment), rectifies it with the canary's measurements
(`edgetwin.loop.ppi`), and returns the estimates the verdict decides on; `check_canary_log` refuses
a canary log of another system or another fleet before anything is estimated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.loop.day_bound import unrevealed_day_bound

if TYPE_CHECKING:  # typed seams (issue 46), for mypy only
    from edgetwin.loop.plan import CanaryPlan
    from edgetwin.twin.twin import Twin
    from edgetwin.twin.whatif import PolicySpec

__all__ = ["DayVariance", "calibrated_day_variance", "canary_verdict", "check_canary_log", "day_seed",
           "day_to_day_variance", "guarded_day_variance", "stamp_revealed"]


class DayVariance(dict[str, tuple[float, float, float]]):
    """Per KPI column ``(var of the daily change carried at the first look, var of the daily
    baseline level, degrees of freedom)`` (`calibrated_day_variance`), the map every reader takes
    (`edgetwin.loop.ppi.day_term`: the verdict and the plan), and beside it ``revealed``: per column
    the part of the change's day variance the logs' level reveals (the twin's calibrated replay),
    which the verdict stamps on its rounds (``diff_var_day_revealed``) so that canaries on several
    days can let their own between-day spread replace the first look's bound
    (`edgetwin.loop.day_bound.pooled_day_term`)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.revealed: dict[str, float] = {}


def check_canary_log(canary_log: pd.DataFrame, twin: Twin, fleet_log: pd.DataFrame, columns: Sequence[str]) -> None:
    """Refuse a canary log that is not of this twin's system or of this fleet (one line, exit 2).

    Of this twin's system: it has the KPI columns and no column the twin's spec does not declare.
    Of this fleet: every group is a group of ``fleet_log``'s last episode with the same profile
    (group ids alone repeat across populations: the profile says who a group is)."""
    spec_cols = [f.name for f in twin.spec.features]
    missing = [c for c in ("agent", "t", "policy", *columns) if c not in canary_log.columns]
    if missing:
        raise InputError(f"the canary log lacks column(s) {missing}: not a log of this twin's spec", "canary log")
    extra = [c for c in canary_log.columns if c not in spec_cols and c not in
             ("episode", "t", "agent", "site", "scenario", "policy", "propensity", "reward")]  # fmt: skip
    if extra:
        raise InputError(f"the canary log has column(s) {extra[:5]} the twin's spec does not declare: another spec",
                         "canary log")  # fmt: skip
    last = fleet_log[fleet_log["episode"] == fleet_log["episode"].iloc[-1]]
    alien = sorted(set(canary_log["agent"].astype(str)) - set(last["agent"].astype(str)))
    if alien:
        raise InputError(f"{len(alien)} canary group(s) are not in the fleet the twin judged (e.g. {alien[0]!r}): "
                         "a canary of another fleet", "canary log")  # fmt: skip
    prof = [c for c in twin.spec.names("profile") if c in canary_log.columns and c in last.columns]
    if prof:
        a = canary_log.groupby(canary_log["agent"].astype(str))[prof].first().sort_index()
        b = last.groupby(last["agent"].astype(str))[prof].first().reindex(a.index)
        same = np.isclose(a.to_numpy(float), b.to_numpy(float), rtol=1e-6, atol=1e-9, equal_nan=True).all(axis=1)
        if not same.all():
            bad = a.index[~same][0]
            raise InputError(f"canary group {bad!r} has another profile than the fleet's group of that name: a canary "
                             "of another fleet", "canary log")  # fmt: skip


def canary_verdict(
    twin: Twin,
    fleet_log: pd.DataFrame,
    canary_log: pd.DataFrame,
    plan: CanaryPlan,
    candidate: PolicySpec,
    baseline: PolicySpec,
    *,
    candidate_version: str,
    pre_ticks: int = 4,
    ticks: int | None = None,
    seed: int = 0,
    members: Sequence[int] | None = None,
    fleet_rows: pd.DataFrame | None = None,
    day_var: Mapping[str, tuple[float, float, float]] | None = None,
    cuped: str = "pooled",
) -> dict[str, dict[str, float]]:
    """One round's PPI estimates per guarded KPI column (`edgetwin.loop.ppi.ppi_estimates`): the
    plan's margins (`edgetwin.contract.margins.KPIMargin`) name the columns and their directions.

    ``fleet_rows``: the rest of the fleet's rows over the canary's ticks (`CanaryResult.fleet_log`:
    every group outside the slice, on the current policy). With them the control arm is every group
    not on the candidate, not only the slice's control half: the candidate arm is a uniformly random
    draw from the fleet (a random slice, split at random), so its complement is as valid a control
    as the slice's other half, and 50-odd groups instead of 3 cut the control term's variance
    about tenfold. The twin's replay of the canary already predicts those groups (everyone outside
    the candidate arm is on the baseline there). None: the slice's control arm alone.
    ``cuped``: the pre-period adjustment's slope (`edgetwin.loop.ppi.ppi_mean_difference`): ``"per_arm"``
    (Lin 2013) where the arms are of very unequal sizes, as with ``fleet_rows``.

    The twin replays the fleet's day three times on the same world seed and window: every group on
    the candidate, every group on the baseline (the fleet-wide change the verdict is about), and
    the canary's own assignment, read from the canary log's ``policy`` column (the candidate arm's
    groups on the candidate, every other group of the fleet on the baseline, as the edge served
    them), against which the canary's measurements rectify the twin (`CanaryAssignment`: a
    candidate whose effect depends on how many groups run it, e.g. by congesting shared edge
    sites, is measured on the slice in the canary's configuration, not the fleet's). The twin's members
    are replayed one by one: the spread of their predicted interference, which no canary
    measures, widens the intervals (`edgetwin.loop.ppi.interference_var`)."""
    from edgetwin.loop.ppi import (
        CanaryAssignment,
        measured_group_means,
        ppi_estimates,
        twin_group_predictions,
    )

    cols = [m.kpi for m in plan.margins]
    check_canary_log(canary_log, twin, fleet_log, cols)
    ticks = ticks if ticks is not None else int(round(plan.hours * 4))
    rows = canary_log if fleet_rows is None or fleet_rows.empty else pd.concat([canary_log, fleet_rows], ignore_index=True)
    measured = measured_group_means(rows, cols, candidate_version, start_t=pre_ticks)
    treated = frozenset(str(a) for a in measured.index[(measured["arm"] == "candidate").to_numpy()])
    pols = {"candidate": candidate, "baseline": baseline, "canary": CanaryAssignment(candidate, baseline, treated)}
    # one replay per member (each on its own world seed, as `twin_group_series` draws them), so that
    # their spread over the interference can widen the intervals (`edgetwin.loop.ppi.interference_var`)
    per_member = [
        twin_group_predictions(twin, pols, fleet_log, cols, episodes=1, seed=seed, window=(pre_ticks, pre_ticks + ticks),
                               members=[m])
        for m in (members if members is not None else range(twin.n_members))
    ]  # fmt: skip
    preds = sum(per_member[1:], per_member[0]) / len(per_member)
    sl = getattr(plan, "slice", None)
    # matched pairs are analysed as pairs when the canary's control arm is the slice's own (`pair_order`)
    pairs = tuple(getattr(sl, "pairs", ()) or ()) if fleet_rows is None or fleet_rows.empty else ()
    est = ppi_estimates(preds, measured, {m.kpi: m.better for m in plan.margins}, "candidate", "baseline", canary="canary",
                        member_predictions=per_member, day_var=day_var, pairs=pairs, cuped=cuped)  # fmt: skip
    return stamp_revealed(est, day_var)


def stamp_revealed(est: dict[str, dict[str, float]], day_var: Mapping[str, object] | None) -> dict[str, dict[str, float]]:
    """``est`` with each KPI's revealed part of the day term (`DayVariance.revealed`) as
    ``diff_var_day_revealed`` (and its ``local:`` twin), which `edgetwin.loop.day_bound.pooled_day_term` reads once canaries
    ran on several days; a ``day_var`` without it (a plain map): nothing stamped, the rounds'
    term then stays a floor whole, as before the bound."""
    revealed = getattr(day_var, "revealed", None) or {}
    for k, one in est.items():
        if k in revealed:
            one["diff_var_day_revealed"] = one["local:diff_var_day_revealed"] = float(revealed[k])
    return est


def day_seed(seed: int, day: int) -> int:
    """The twin's world seed for replaying logged day ``day`` (0, 1, …) under the loop's ``seed``:
    each day its own draw, so that the twin's own day-to-day noise is part of the replayed spread
    (one seed for every day makes that noise common to all days, and the replayed days differ only
    by their populations and first states)."""
    return int(np.random.default_rng([int(seed), int(day), 0xDA7]).integers(2**31))


def calibrated_day_variance(
    twin_changes: np.ndarray, twin_levels: np.ndarray, observed_levels: np.ndarray, columns: Sequence[str]
) -> DayVariance:
    """Per column, ``(var of the daily change, var of the daily baseline level, days − 1)``: the
    larger of the twin's replayed day-to-day variance of the change, scaled up by how much more the
    logged days' baseline level moves than the twin's replay of it (``revealed``), and the first
    look's bound on the part the level cannot reveal (`edgetwin.loop.day_bound.unrevealed_day_bound`).

    Args:
        twin_changes: ``(D, K)`` the twin's fleet-wide change (candidate − baseline, mean over the
            groups) replaying each of ``D`` logged days, one column per KPI.
        twin_levels: ``(D, K)`` the twin's fleet-wide baseline level on the same replays.
        observed_levels: ``(D, K)`` the logged fleet mean of each column on each of those days (the
            days were run on the current policy: what any operator's logs show, no twin involved).

    Why the scaling: a twin replays a logged day from its population and first states; whatever else
    made that day different (the day's demand, its carbon intensity, anything the logs do not carry
    as a state the twin can read) is not replayed, so the twin's day-to-day spread is an *under*-estimate
    the twin cannot notice (issue 48: on the 1,000-group closed loop, 0.2-0.5 % against the
    emulator's 1.7-13.2 % per KPI). The baseline level's spread is observed directly in the logs;
    the ratio ``r = var(observed level) / var(twin's level)`` says by how much the replay misses
    the days' spread, and the change's variance is scaled by ``max(r, 1)`` (``revealed``). It
    assumes the change's day-to-day spread scales like the level's; on the emulated cluster it does
    not (the change is steady on most days and several times larger on the days the fleet
    congests): the scaled term is below the truth's daily spread for 64 of 84 (candidate, KPI,
    seed) triples, median 1.9x in sd. Hence the bound, which one canary day cannot check and
    canaries on several days can (`edgetwin.loop.day_bound.pooled_day_term`). ``max(r, 1)``: the logs may only raise the
    twin's term, never lower it (with ``D − 1`` degrees of freedom an observed variance below the
    twin's is mostly noise). Degrees of freedom ``D − 1`` (the observed variance's) for the
    Welch-Satterthwaite/t reference (`edgetwin.loop.ppi.welch_df`). A twin whose replay does not
    move the level (``var = 0``) cannot be scaled: ``revealed`` is then the observed level's
    variance. The baseline level's variance is the observed one, the larger of it and the twin's. A
    column the logs do not carry: the twin's replay alone, no bound (nothing observed to bound it by).
    """
    d = np.asarray(twin_changes, dtype=np.float64)
    b = np.asarray(twin_levels, dtype=np.float64)
    o = np.asarray(observed_levels, dtype=np.float64)
    n = d.shape[0]
    out = DayVariance()
    for j, c in enumerate(columns):
        v_d, v_b = float(np.var(d[:, j], ddof=1)), float(np.var(b[:, j], ddof=1))
        v_o = float(np.var(o[:, j], ddof=1)) if np.isfinite(o[:, j]).all() else float("nan")
        if not math.isfinite(v_o):  # the column was not logged on those days: the twin's replay alone
            out[c] = (v_d, v_b, float(n - 1))
            out.revealed[c] = v_d
            continue
        scaled = v_d * max(v_o / v_b, 1.0) if v_b > 0 else max(v_d, v_o)
        level = max(v_o, v_b)
        bound = unrevealed_day_bound(level, float(np.mean(o[:, j])), float(np.mean(d[:, j])))
        out[c] = (float(max(scaled, bound)), float(level), float(n - 1))
        out.revealed[c] = float(scaled)
    return out


def day_to_day_variance(
    twin: Twin,
    other_days: Sequence[pd.DataFrame],
    columns: Sequence[str],
    candidate: PolicySpec,
    baseline: PolicySpec,
    *,
    days: int = 6,
    seed: int = 0,
    member: int = 0,
) -> DayVariance:
    """Per KPI column, how much the fleet-wide change (and the baseline level) moves from day to
    day: ``(var of mean_N(f_c − f_b), var of the baseline level, days − 1)`` over the last ``days``
    episodes of ``other_days`` (e.g. the twin's training logs, or recent days of the fleet), the
    twin's replay of each day (on its own world seed, `day_seed`) calibrated by the logged days'
    own spread of the baseline level (`calibrated_day_variance`: the twin cannot understate the
    term silently).

    The verdict is about the change averaged over the days the decision will live with (DESIGN.md,
    "What a verdict is about"); a canary measures one day, whose change is one draw around that
    average, so this variance is added to the interval (`edgetwin.loop.ppi.ppi_mean_difference`'s
    ``day_var``) and to the plan's expected one (`edgetwin.loop.plan.plan_canary`: the same term,
    read through `edgetwin.loop.ppi.day_term`), shared by every round run on that day; canary
    rounds on several days estimate it again from themselves (`edgetwin.loop.ppi.combine_estimates`).
    One member suffices: the spread wanted is the days', not the members'. Fewer than 2 days:
    ``{}`` (nothing to estimate it from; the interval is then about the canary's day, and the loop's
    result says so)."""
    from edgetwin.loop.ppi import twin_group_predictions

    frames = [f for f in other_days if isinstance(f, pd.DataFrame) and "episode" in f.columns]
    if not frames:
        return DayVariance()
    log = pd.concat(frames, ignore_index=True)
    names = list(pd.unique(log["episode"]))[-int(days):]
    if len(names) < 2:
        return DayVariance()
    diffs, bases, observed = [], [], []
    for i, name in enumerate(names):
        one = log[log["episode"] == name]
        pr = twin_group_predictions(twin, {"candidate": candidate, "baseline": baseline}, one, list(columns),
                                    episodes=1, seed=day_seed(seed, i), members=[member])  # fmt: skip
        diffs.append([float(np.mean(pr[("candidate", c)] - pr[("baseline", c)])) for c in columns])
        bases.append([float(np.mean(pr[("baseline", c)])) for c in columns])
        observed.append([float(pd.to_numeric(one[c], errors="coerce").mean()) if c in one.columns else float("nan")
                         for c in columns])  # fmt: skip
    return calibrated_day_variance(np.asarray(diffs), np.asarray(bases), np.asarray(observed), list(columns))


def guarded_day_variance(twin: Twin, columns: Sequence[str], days: Sequence[pd.DataFrame], candidate: PolicySpec,
                         baseline: PolicySpec, seed: int) -> DayVariance:
    """`day_to_day_variance` of the guarded per-group-mean KPI ``columns`` over ``days`` (the
    recent logs of the fleet on the current policy), or ``{}`` when there are none: the one call the
    loop (`edgetwin.loop.rounds.canary_loop`), ``edgetwin canary plan`` and ``edgetwin canary
    verdict`` (`edgetwin.loop.evidence.judge_canary`) make, so that the operator's commands carry the
    same day term as the loop's verdicts and plans."""
    cols = sorted({str(c) for c in columns if c})
    return day_to_day_variance(twin, days, cols, candidate, baseline, seed=seed) if cols else DayVariance()

