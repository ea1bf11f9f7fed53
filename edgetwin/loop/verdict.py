"""The canary's verdict: one round's prediction-powered estimates per guarded KPI.

`canary_verdict` replays the fleet's day in the twin (every group on the candidate, every group on
the current policy, and the canary's own assignment), rectifies it with the canary's measurements
(`edgetwin.loop.ppi`), and returns the estimates the verdict decides on; `check_canary_log` refuses
a canary log of another system or another fleet before anything is estimated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError

__all__ = ["canary_verdict", "check_canary_log"]


def check_canary_log(canary_log: pd.DataFrame, twin: Any, fleet_log: pd.DataFrame, columns: Sequence[str]) -> None:
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
    twin: Any,
    fleet_log: pd.DataFrame,
    canary_log: pd.DataFrame,
    plan: Any,
    candidate: Any,
    baseline: Any,
    *,
    candidate_version: str,
    better: dict[str, str],
    pre_ticks: int = 4,
    ticks: int | None = None,
    seed: int = 0,
    members: Sequence[int] | None = None,
    fleet_rows: pd.DataFrame | None = None,
    level: float = 0.90,
) -> dict[str, dict[str, float]]:
    """One round's PPI estimates per guarded KPI column (`edgetwin.loop.ppi.ppi_estimates`).

    ``fleet_rows``: the rest of the fleet's rows over the canary's ticks (`CanaryResult.fleet_log`:
    every group outside the slice, on the current policy). With them the control arm is every group
    not on the candidate, not only the slice's control half: the candidate arm is a uniformly random
    draw from the fleet (a random slice, split at random), so its complement is as valid a control
    as the slice's other half, and 50-odd groups instead of 3 cut the control term's variance
    about tenfold. The twin's replay of the canary already predicts those groups (everyone outside
    the candidate arm is on the baseline there). None: the slice's control arm alone.

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
    return ppi_estimates(preds, measured, {c: better[c] for c in cols}, "candidate", "baseline", level=level,
                         canary="canary", member_predictions=per_member)  # fmt: skip
