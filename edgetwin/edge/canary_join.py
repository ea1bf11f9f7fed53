"""A canary's decisions joined with the system's outcome reports into rows of its log.

During a canary the runtime knows what it decided (per row: the service group, the tick, the
observation, the action, the registry version that decided it, the action's propensity, the arm)
and the system knows what followed (the ``kpi.*``, ``response.*``, ``reward`` ... of the same group
at the same tick, `edgetwin.edge.canary_command.outcome_envelope`). `DecisionBook` keeps the
decisions of the ticks whose outcomes have not arrived yet, keyed by ``(agent, t)``, and `join`
makes one tick's canary log rows: the log contract's columns (``episode``, ``t``, ``agent``,
``scenario``, ``site``, the observation and action columns, the outcome columns, ``policy`` = the
registry version, ``propensity``) and ``arm`` (which arm served the row: ``fleet`` during the
pre-period, when every group is still on the current policy).

A pandas inner merge on ``agent`` is the join; what is here beyond it is the bookkeeping a
long-running server needs: a bounded number of ticks kept (a tick whose outcome never comes is
dropped and counted, not kept forever), and counts of what found no partner.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

__all__ = ["DecisionBook", "Joined"]


@dataclasses.dataclass(frozen=True)
class Joined:
    """One tick's join.

    Attributes:
        rows: the canary log rows (one per group with both a decision and an outcome).
        decisions_unmatched: decisions of that tick whose group had no outcome row.
        outcomes_unmatched: outcome rows whose group had no decision at that tick (not in the log:
            nothing says which policy decided them).
    """

    rows: pd.DataFrame
    decisions_unmatched: int
    outcomes_unmatched: int


class DecisionBook:
    """Decisions awaiting their outcomes, per tick.

    Args:
        observation_columns, action_columns: the served policy's columns (names of the ``obs`` and
            ``actions`` arrays' columns in the log).
        max_ticks: ticks kept at most; the oldest is dropped (its decisions counted as unmatched)
            when a newer one would exceed it.
    """

    def __init__(self, observation_columns: Sequence[str], action_columns: Sequence[str], max_ticks: int = 64) -> None:
        self.observation_columns = list(observation_columns)
        self.action_columns = list(action_columns)
        self.max_ticks = int(max_ticks)
        self._ticks: dict[int, list[pd.DataFrame]] = {}
        self.dropped = 0

    def add(
        self, t: int, agents: Sequence[str], sites: Sequence[str], scenarios: Sequence[str] | None,
        obs: np.ndarray, actions: np.ndarray, policy: np.ndarray, propensity: np.ndarray, arm: np.ndarray,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> None:  # fmt: skip
        """Record N decisions of tick ``t`` (obs (N, O), actions (N, A), the rest (N,)); ``extra``:
        more (N,) columns the runtime records with the decision (a switchback's ``tick``, ``block``
        and ``arm_probability``), placed before ``policy``."""
        df = pd.DataFrame(np.asarray(obs, dtype=np.float64), columns=self.observation_columns)
        for j, c in enumerate(self.action_columns):
            df[c] = np.asarray(actions, dtype=np.float64)[:, j]
        df.insert(0, "agent", [str(a) for a in agents])
        df.insert(1, "site", [str(s) for s in sites])
        if scenarios is not None:
            df.insert(2, "scenario", [str(s) for s in scenarios])
        for name, values in (extra or {}).items():
            df[name] = np.broadcast_to(np.asarray(values), (len(df),))
        df["policy"] = np.asarray(policy, dtype=object).astype(str)
        df["propensity"] = np.asarray(propensity, dtype=np.float64)
        df["arm"] = np.asarray(arm, dtype=object).astype(str)
        self._ticks.setdefault(int(t), []).append(df)
        while len(self._ticks) > self.max_ticks:
            oldest = min(self._ticks)
            self.dropped += sum(len(d) for d in self._ticks.pop(oldest))

    def pending(self) -> int:
        """Decisions waiting for an outcome."""
        return sum(len(d) for chunks in self._ticks.values() for d in chunks)

    def join(self, t: int, outcomes: pd.DataFrame, episode: str) -> Joined:
        """Tick ``t``'s log rows (the tick's decisions are then forgotten).

        Args:
            outcomes: the system's rows for tick ``t``: ``agent`` and outcome columns (an outcome
                column that names an observation, action, ``site``, ``policy``, ``propensity`` or
                ``arm`` is ignored: the decision's value is what the policy saw and did).
            episode: the ``episode`` of rows whose outcome does not name one.
        """
        chunks = self._ticks.pop(int(t), [])
        dec = pd.concat(chunks, ignore_index=True) if chunks else pd.DataFrame(columns=["agent"])
        # a group asked twice in one tick: the last decision is the one the system applied
        dec = dec.drop_duplicates("agent", keep="last")
        ours = set(dec.columns) - {"agent"}
        if "scenario" not in dec.columns:
            ours.discard("scenario")
        out = outcomes.drop(columns=[c for c in outcomes.columns if c in ours or c == "t"])
        out = out.drop_duplicates("agent", keep="last")
        out = out.assign(agent=out["agent"].astype(str))
        rows = dec.merge(out, on="agent", how="inner", validate="one_to_one")
        rows.insert(0, "t", int(t))
        if "episode" not in rows.columns:
            rows.insert(0, "episode", episode)
        lead = [c for c in ("episode", "t", "agent", "scenario", "site") if c in rows.columns]
        tail = ["policy", "propensity", "arm"]
        rows = rows[lead + [c for c in rows.columns if c not in lead and c not in tail] + tail]
        return Joined(rows.reset_index(drop=True), len(dec) - len(rows), len(out) - len(rows))
