"""The shared harness of MAIL-MMSG, its baselines and the twin: scaling, site aggregates, one tick.

Everything here is generic over the log contract: columns come from the `TwinSpec` roles, agents
interact only through their ``site`` (means over the agents of a site at a tick), and nothing
assumes a particular system's column names.

Vocabulary (shapes use N agents, P/S/A profile/state/action widths, Y modelled outputs):

* **outputs** ``Y`` = ``[response.*, kpi.*, reward?]`` - what the client model predicts for a step,
  plus ``Δstate`` (in standardised state units) when the spec names no transition function.
* **client inputs** ``X`` = ``[z(profile), z(state), z(action), site means of z(state) at t,
  site means of z(action) and z(outputs) at t-1, log site size, site means of z(profile),
  time of day (sin, cos)]`` (the profile means only when ``layout.site_profile``).
  Other agents' actions and outputs enter lagged by one tick, so the model is *causal per
  agent*: an agent's outcome depends on its own action and on what its site looked like at the
  start of the tick. That is what lets a per-agent environment (one agent acts per `step`) give
  each agent its reward at once and agree exactly with the batched path.
* **engine inputs** = ``[z(profile), z(state)]``, the platform's per-agent observation layout.
* **site-level state**: state columns that the log shows as one value per (episode, site, t)
  (`Layout.site_state`) are kept equal across a site's agents: by default the mean of their
  predictions; optionally (`SiteStateModel`) a model of the whole site's tick, which also sees
  every agent's action of that tick (known when the tick ends, so still causal).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from sklearn.neighbors import NearestNeighbors

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import REWARD_COLUMN, Feature, TwinSpec

DAY_SECONDS = 86_400.0


# ------------------------------------------------------------------------------------ scaling
@dataclass
class ColumnScaler:
    """Per-column ``log1p`` (heavy-tailed, non-negative) then standardisation, and its inverse.

    `inverse` maps back to raw units, clips to the spec's bounds and snaps discrete features to
    their allowed values, so everything a model produces is a legal value of the column.

    Attributes:
        names: the columns, in order.
        log: which columns are modelled in ``log1p`` space.
        mean, std: statistics of the transformed columns (std floored to avoid division by 0).
        low, high: raw bounds (``±inf`` when unbounded).
        values: allowed values per column, or None for continuous ones.
    """

    names: list[str]
    log: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    low: np.ndarray
    high: np.ndarray
    values: list[np.ndarray | None] = field(default_factory=list)

    @classmethod
    def fit(cls, frame: pd.DataFrame, features: Sequence[Feature | None]) -> ColumnScaler:
        names = list(frame.columns)
        raw = frame.to_numpy(dtype=np.float64)
        log = (
            np.array(
                [
                    f is not None and f.kind == "heavy_tailed" and bool(np.nanmin(raw[:, j]) >= 0.0)
                    for j, f in enumerate(features)
                ],
                dtype=bool,
            )
            if len(names)
            else np.zeros(0, dtype=bool)
        )
        z = _forward_log(raw, log)
        mean = np.nanmean(z, axis=0) if len(z) else np.zeros(len(names))
        std = np.nanstd(z, axis=0) if len(z) else np.ones(len(names))
        std = np.where(np.isfinite(std) & (std > 1e-8), std, 1.0)
        low = np.array([-np.inf if f is None or f.low is None else f.low for f in features], dtype=np.float64)
        high = np.array(
            [np.inf if f is None or f.high is None else f.high for f in features], dtype=np.float64
        )
        values = [
            None
            if f is None or f.allowed_values() is None
            else np.asarray(f.allowed_values(), dtype=np.float64)
            for f in features
        ]
        return cls(names, log, np.nan_to_num(mean), std, low, high, values)

    @property
    def width(self) -> int:
        return len(self.names)

    def transform(self, raw: np.ndarray) -> np.ndarray:
        """Raw ``(N, D)`` -> standardised ``(N, D)`` float32."""
        return ((_forward_log(np.asarray(raw, dtype=np.float64), self.log) - self.mean) / self.std).astype(
            np.float32
        )

    def inverse(self, z: np.ndarray) -> np.ndarray:
        """Standardised ``(N, D)`` -> raw ``(N, D)`` float64, clipped to bounds, discrete snapped."""
        x = np.asarray(z, dtype=np.float64) * self.std + self.mean
        if self.log.any():
            # exp of a wild model output must not overflow to inf before clipping
            x[:, self.log] = np.expm1(np.clip(x[:, self.log], -50.0, 50.0))
        return self.legalise(x)

    def legalise(self, x: np.ndarray) -> np.ndarray:
        """Clip raw values to bounds and snap discrete columns to their nearest allowed value."""
        x = np.clip(x, self.low, self.high)
        for j, vals in enumerate(self.values):
            if vals is not None and x.shape[0]:
                idx = np.abs(x[:, j : j + 1] - vals[None, :]).argmin(axis=1)
                x[:, j] = vals[idx]
        return x

    def to_dict(self) -> dict[str, Any]:
        return {
            "names": self.names,
            "log": self.log.tolist(),
            "mean": self.mean.tolist(),
            "std": self.std.tolist(),
            "low": [None if not np.isfinite(v) else float(v) for v in self.low],
            "high": [None if not np.isfinite(v) else float(v) for v in self.high],
            "values": [None if v is None else v.tolist() for v in self.values],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ColumnScaler:
        return cls(
            names=list(d["names"]),
            log=np.asarray(d["log"], dtype=bool),
            mean=np.asarray(d["mean"], dtype=np.float64),
            std=np.asarray(d["std"], dtype=np.float64),
            low=np.array([-np.inf if v is None else v for v in d["low"]], dtype=np.float64),
            high=np.array([np.inf if v is None else v for v in d["high"]], dtype=np.float64),
            values=[None if v is None else np.asarray(v, dtype=np.float64) for v in d["values"]],
        )


def _forward_log(raw: np.ndarray, log: np.ndarray) -> np.ndarray:
    out = raw.astype(np.float64, copy=True)
    if log.any():
        out[:, log] = np.log1p(np.maximum(out[:, log], 0.0))
    return out


# ------------------------------------------------------------------------------------ layout
@dataclass
class Layout:
    """Which columns play which part, and how each is scaled; fitted once per twin.

    Attributes:
        spec: the twin spec.
        profile, state, action, response, kpi: column names by role (spec order, present in the log).
        predict_reward: the log has a ``reward`` column, which the client model also predicts.
        learn_transition: the spec names no transition, so the client model predicts ``Δstate``.
        scenarios: scenario labels in a fixed order (index = scenario id).
        scalers: ``profile``, ``state``, ``action`` and ``outputs`` scalers.
        log_size_center: mean ``log1p(agents per site)`` in the logs (centres the size input).
        use_time: add time-of-day ``(sin, cos)`` inputs, from ``t * spec.step_seconds``.
        horizon: the typical episode length of the logs (steps).
        site_state: per state column, whether it is a property of the site (equal for all agents
            of a site at a tick in the logs, e.g. a site's utilisation); the twin keeps such
            columns equal across a site's agents.
        state_absolute: per state column, whether the transition model predicts its next value
            itself rather than its change: all columns but the near-random-walk ones
            (``Var Δz < PERSISTENT_RATIO · Var z`` in the logs, e.g. a clock), because a
            predicted change integrates the model's errors into a drift over an episode.
        site_profile: the client inputs include the site means of z(profile) (who shares the
            site: its load follows its members' profiles, which no single agent's inputs show).
        clock: per state column, its step (raw units) when the logs show it advancing by exactly that
            much every tick (modulo its spec range, e.g. a time of day), else None; the twin rolls
            such a column exactly instead of learning it, because a learned clock drifts.
        echo: per state column, the index in `outputs` of the output it repeats one tick later
            when the logs show it doing so exactly (e.g. "its offload ratio last tick"), else None;
            the twin copies its own output of the tick there, so a state that carries an agent's
            last response cannot disagree with the response the twin drew.
    """

    spec: TwinSpec
    profile: list[str]
    state: list[str]
    action: list[str]
    response: list[str]
    kpi: list[str]
    predict_reward: bool
    learn_transition: bool
    scenarios: list[str]
    scalers: dict[str, ColumnScaler]
    log_size_center: float
    use_time: bool
    horizon: int
    site_state: list[bool] = field(default_factory=list)
    state_absolute: list[bool] = field(default_factory=list)
    site_profile: bool = False
    clock: list[float | None] = field(default_factory=list)
    echo: list[int | None] = field(default_factory=list)

    @classmethod
    def fit(cls, log: pd.DataFrame, spec: TwinSpec, use_time: bool = True) -> Layout:
        """Fit roles and scalers from a validated log table (one row per episode, t, agent)."""
        missing = [c for c in ("episode", "t", "agent", "scenario", "site") if c not in log.columns]
        if missing:
            raise InputError(f"log has no column(s) {missing}; the contract needs them", "log")
        present = set(log.columns)

        def role(r: str, required: bool) -> list[str]:
            names = [n for n in spec.names(r) if n in present]  # type: ignore[arg-type]
            lacking = [n for n in spec.names(r) if n not in present]  # type: ignore[arg-type]
            if lacking and required:
                raise InputError(f"the spec names {lacking} but the log has no such column(s)", "log")
            return names

        profile, state, action = role("profile", True), role("state", True), role("action", True)
        response, kpi = role("response", True), role("kpi", False)
        predict_reward = REWARD_COLUMN in present
        outputs = response + kpi + ([REWARD_COLUMN] if predict_reward else [])
        if not outputs and spec.transition is not None:
            raise InputError(
                "nothing to learn: no response.*, kpi.* or reward column, and a known transition", "log"
            )
        if not outputs and not state:
            raise InputError(
                "nothing to learn: the log has no response.*, kpi.*, reward or state.* column", "log"
            )

        def feats(names: list[str]) -> list[Feature | None]:
            return [spec.feature(n) if n != REWARD_COLUMN else None for n in names]

        scalers = {
            "profile": ColumnScaler.fit(log[profile], feats(profile)),
            "state": ColumnScaler.fit(log[state], feats(state)),
            "action": ColumnScaler.fit(log[action], feats(action)),
            "outputs": ColumnScaler.fit(log[outputs], feats(outputs)),
        }
        sizes = log.groupby(["episode", "t", "site"], sort=False).size().to_numpy()
        lengths = log.groupby("episode", sort=False)["t"].max().to_numpy() + 1
        site_state = _site_level(log, state)
        state_absolute = _weakly_persistent(log, state, scalers["state"])
        return cls(
            spec=spec,
            profile=profile,
            state=state,
            action=action,
            response=response,
            kpi=kpi,
            predict_reward=predict_reward,
            learn_transition=spec.transition is None and bool(state),
            scenarios=sorted(str(s) for s in log["scenario"].unique()),
            scalers=scalers,
            log_size_center=float(np.log1p(sizes).mean()) if len(sizes) else 0.0,
            use_time=use_time,
            horizon=int(np.median(lengths)) if len(lengths) else 1,
            site_state=site_state,
            state_absolute=state_absolute,
            site_profile=True,
            clock=_clocks(log, state, spec),
            echo=_echoes(log, state, outputs),
        )

    # --- widths ---------------------------------------------------------------------------
    @property
    def outputs(self) -> list[str]:
        return self.response + self.kpi + ([REWARD_COLUMN] if self.predict_reward else [])

    @property
    def n_outputs(self) -> int:
        return len(self.outputs)

    @property
    def n_model_outputs(self) -> int:
        """Width of the client model's output: outputs plus Δstate when the transition is learned."""
        return self.n_outputs + (len(self.state) if self.learn_transition else 0)

    @property
    def n_client_inputs(self) -> int:
        p, s, a, y = len(self.profile), len(self.state), len(self.action), self.n_outputs
        return p + s + a + s + a + y + 1 + (2 if self.use_time else 0) + (p if self.site_profile else 0)

    @property
    def n_lag(self) -> int:
        """Width of a site's lagged means: ``[z(action), z(outputs)]``."""
        return len(self.action) + self.n_outputs

    @property
    def n_engine_inputs(self) -> int:
        return len(self.profile) + len(self.state)

    @property
    def n_transition_inputs(self) -> int:
        """Width of the transition model's input: client inputs, own outputs, site means now."""
        return self.n_client_inputs + self.n_outputs + self.n_lag

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec.to_dict(),
            "profile": self.profile,
            "state": self.state,
            "action": self.action,
            "response": self.response,
            "kpi": self.kpi,
            "predict_reward": self.predict_reward,
            "learn_transition": self.learn_transition,
            "scenarios": self.scenarios,
            "scalers": {k: v.to_dict() for k, v in self.scalers.items()},
            "log_size_center": self.log_size_center,
            "use_time": self.use_time,
            "horizon": self.horizon,
            "site_state": self.site_state,
            "state_absolute": self.state_absolute,
            "site_profile": self.site_profile,
            "clock": self.clock,
            "echo": self.echo,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Layout:
        return cls(
            spec=TwinSpec.from_dict(d["spec"]),
            profile=d["profile"],
            state=d["state"],
            action=d["action"],
            response=d["response"],
            kpi=d["kpi"],
            predict_reward=bool(d["predict_reward"]),
            learn_transition=bool(d["learn_transition"]),
            scenarios=list(d["scenarios"]),
            scalers={k: ColumnScaler.from_dict(v) for k, v in d["scalers"].items()},
            log_size_center=float(d["log_size_center"]),
            use_time=bool(d["use_time"]),
            horizon=int(d["horizon"]),
            site_state=[bool(v) for v in d.get("site_state", [])],
            state_absolute=[bool(v) for v in d.get("state_absolute", [])],
            site_profile=bool(d.get("site_profile", False)),
            clock=[None if v is None else float(v) for v in d.get("clock", [])],
            echo=[None if v is None else int(v) for v in d.get("echo", [])],
        )

    def roll_clocks(self, state: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        """``nxt (N, S)`` with every `clock` column set to ``state``'s value one step on (raw units)."""
        for j, step in enumerate(self.clock):
            if step is None:
                continue
            period = _period(self.spec, self.state[j])
            low = self.spec.feature(self.state[j]).low or 0.0
            moved = state[:, j] + step
            nxt[:, j] = moved if period is None else low + np.mod(moved - low, period)
        return nxt

    def roll_echoes(self, outputs: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        """``nxt (N, S)`` with every `echo` column set to the tick's ``outputs (N, Y)`` it repeats
        (raw units, legalised to the state column's bounds)."""
        cols = [(j, k) for j, k in enumerate(self.echo) if k is not None]
        if cols:
            for j, k in cols:
                nxt[:, j] = outputs[:, k]
            nxt[:] = self.scalers["state"].legalise(nxt)
        return nxt


#: A state column whose tick-to-tick change has less than this share of its variance is modelled
#: by its change (it is nearly a random walk or a clock); all others by their next value.
PERSISTENT_RATIO = 0.1


def _agent_rows(log: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """The log sorted by (episode, agent, t), and which of its rows follow their agent's previous
    tick (``t`` one more than the row before it)."""
    df = log.sort_values(["episode", "agent", "t"], kind="stable")
    consecutive = (df.groupby(["episode", "agent"], sort=False)["t"].diff() == 1).to_numpy()
    return df, consecutive


def _weakly_persistent(log: pd.DataFrame, state: list[str], scaler: ColumnScaler) -> list[bool]:
    """Which state columns are not near-random walks (``Var Δz >= PERSISTENT_RATIO · Var z``)."""
    if not state:
        return []
    df, consecutive = _agent_rows(log)
    z = pd.DataFrame(scaler.transform(df[state].to_numpy(np.float64)), columns=state, index=df.index)
    dz = z.groupby([df["episode"], df["agent"]], sort=False).diff()[consecutive]
    if len(dz) < 2:
        return [False] * len(state)
    return [bool(dz[c].var() >= PERSISTENT_RATIO * z[c].var()) and bool(z[c].var() > 0) for c in state]


def _period(spec: TwinSpec, column: str) -> float | None:
    """The range a wrapping clock column cycles through (its spec's ``high - low``), if bounded."""
    f = spec.feature(column)
    if f.low is None or f.high is None or not f.high > f.low:
        return None
    return float(f.high - f.low)


def _clocks(log: pd.DataFrame, state: list[str], spec: TwinSpec, tol: float = 1e-6) -> list[float | None]:
    """Per state column, the constant non-zero step it takes every tick in the logs (modulo its
    spec range when bounded), or None: such a column is a clock, not something to learn."""
    if not state:
        return []
    df, consecutive = _agent_rows(log)
    if consecutive.sum() < 2:
        return [None] * len(state)
    deltas = df.groupby(["episode", "agent"], sort=False)[state].diff().to_numpy(np.float64)[consecutive]
    out: list[float | None] = []
    for j, c in enumerate(state):
        d = deltas[:, j]
        period = _period(spec, c)
        if period is not None:
            d = np.mod(d, period)
            d = np.where(d > period - tol * period, d - period, d)  # 0.9999.. of a period is 0
        step = float(np.median(d))
        scale = period if period is not None else max(float(np.abs(df[c]).max()), 1.0)
        exact = bool(np.all(np.abs(d - step) <= tol * scale))
        out.append(step if exact and abs(step) > tol * scale else None)
    return out


def _echoes(log: pd.DataFrame, state: list[str], outputs: list[str], tol: float = 1e-6) -> list[int | None]:
    """Per state column, the index in ``outputs`` of the output whose value of tick t it takes at
    t+1 for every agent in the logs (within ``tol`` of the columns' scale), or None."""
    if not state or not outputs:
        return [None] * len(state)
    df, consecutive = _agent_rows(log)
    if consecutive.sum() < 2:
        return [None] * len(state)
    nxt = df[state].to_numpy(np.float64)[consecutive]
    # the output of each row's previous tick, aligned with the row
    prev = df.groupby(["episode", "agent"], sort=False)[outputs].shift(1).to_numpy(np.float64)[consecutive]
    out: list[int | None] = []
    for j, c in enumerate(state):
        match = None
        for k, o in enumerate(outputs):
            scale = max(float(np.nanmax(np.abs(df[[c, o]].to_numpy(np.float64)))), 1.0)
            if np.nanstd(prev[:, k]) > 0 and np.all(np.abs(nxt[:, j] - prev[:, k]) <= tol * scale):
                match = k
                break
        out.append(match)
    return out


def _site_level(log: pd.DataFrame, state: list[str], tol: float = 1e-9) -> list[bool]:
    """Which state columns take one value per (episode, site, t) in the logs (site properties)."""
    if not state:
        return []
    groups = log.groupby(["episode", "site", "t"], sort=False)[state]
    spread = (groups.max() - groups.min()).abs().max(axis=0)
    scale = log[state].abs().max(axis=0).clip(lower=1.0)
    multi = bool((log.groupby(["episode", "site", "t"], sort=False).size() > 1).any())
    return [bool(multi and spread[c] <= tol * scale[c]) for c in state]


# ------------------------------------------------------------------------------ features
def group_means(values: np.ndarray, codes: np.ndarray, n_groups: int) -> np.ndarray:
    """Per-group means of ``values (N, D)`` by integer ``codes (N,)`` -> ``(n_groups, D)``."""
    counts = np.bincount(codes, minlength=n_groups).astype(np.float64)
    out = np.zeros((n_groups, values.shape[1]), dtype=np.float64)
    for j in range(values.shape[1]):
        out[:, j] = np.bincount(codes, weights=values[:, j], minlength=n_groups)
    return out / np.maximum(counts, 1.0)[:, None]


def client_features(
    layout: Layout,
    zp: np.ndarray,
    zs: np.ndarray,
    za: np.ndarray,
    codes: np.ndarray,
    n_groups: int,
    lag: np.ndarray,
    t: np.ndarray,
    state_means: np.ndarray | None = None,
    site_size: np.ndarray | None = None,
    profile_means: np.ndarray | None = None,
) -> np.ndarray:
    """Assemble the client model's inputs ``X (N, layout.n_client_inputs)`` (float32).

    Args:
        zp, zs, za: standardised profile / state / action, ``(N, P)``, ``(N, S)``, ``(N, A)``.
        codes: ``(N,)`` id of the (site, tick) group each row belongs to, ``0..n_groups-1``.
        lag: ``(N, A+Y)`` site means of standardised actions and outputs at t-1 for each row's
            site (zeros at t = 0, the standardised mean).
        t: ``(N,)`` step index, for the time-of-day inputs.
        state_means, site_size: ``(N, S)`` site means of z(state) and ``(N,)`` agents per site,
            when the rows are a subset of their sites (default: computed from these rows).
        profile_means: ``(N, P)`` site means of z(profile), likewise (used when
            ``layout.site_profile``).
    """
    if site_size is None:
        site_size = np.bincount(codes, minlength=n_groups)[codes]
    if state_means is None:
        state_means = group_means(np.asarray(zs, np.float64), codes, n_groups)[codes]
    parts = [
        zp,
        zs,
        za,
        state_means,
        lag,
        (np.log1p(site_size) - layout.log_size_center)[:, None],
    ]
    if layout.site_profile:
        if profile_means is None:
            profile_means = group_means(np.asarray(zp, np.float64), codes, n_groups)[codes]
        parts.append(profile_means)
    if layout.use_time:
        phase = (
            2.0 * np.pi * ((np.asarray(t, np.float64) * layout.spec.step_seconds) % DAY_SECONDS) / DAY_SECONDS
        )
        parts += [np.sin(phase)[:, None], np.cos(phase)[:, None]]
    return np.concatenate([np.asarray(p, dtype=np.float32).reshape(len(codes), -1) for p in parts], axis=1)


# ------------------------------------------------------------------------------ training data
@dataclass
class StepTable:
    """A log turned into model-ready arrays, row-aligned with the sorted log.

    Attributes:
        frame: the log sorted by (episode, t, agent), index reset.
        x_client: ``(N, n_client_inputs)`` client inputs.
        y_client: ``(N, n_model_outputs)`` standardised targets; Δstate is NaN where no next row.
        x_engine: ``(N, n_engine_inputs)`` engine inputs; ``za``: ``(N, A)`` standardised actions.
        has_next: ``(N,)`` the row's agent appears at t+1 of the same episode.
        next_index: ``(N,)`` row index of that next row (or -1).
        scenario: ``(N,)`` scenario id (index into ``layout.scenarios``).
        episode: ``(N,)`` episode codes.
        site_now: ``(N, A+Y)`` site means of standardised actions and outputs at the row's own
            tick (what the transition model sees: the tick's actions are all known at its end).
        site_group: ``(N,)`` id of the row's (episode, site, t) group, ``0..n_groups-1``.
    """

    frame: pd.DataFrame
    x_client: np.ndarray
    y_client: np.ndarray
    x_engine: np.ndarray
    za: np.ndarray
    has_next: np.ndarray
    next_index: np.ndarray
    scenario: np.ndarray
    episode: np.ndarray
    site_now: np.ndarray | None = None
    site_group: np.ndarray | None = None

    def rows(self, scenario: int | None = None, need_next: bool = False) -> np.ndarray:
        """Row indices of one scenario (or all), optionally only those with a next row."""
        mask = np.ones(len(self.frame), dtype=bool) if scenario is None else self.scenario == scenario
        if need_next:
            mask &= self.has_next
        return np.flatnonzero(mask)


def build_steps(log: pd.DataFrame, layout: Layout) -> StepTable:
    """Turn a log table into `StepTable` arrays (vectorised; no per-row Python)."""
    df = log.sort_values(["episode", "t", "agent"], kind="stable").reset_index(drop=True)
    sc = layout.scalers
    zp = sc["profile"].transform(df[layout.profile].to_numpy(np.float64))
    zs = sc["state"].transform(df[layout.state].to_numpy(np.float64))
    za = sc["action"].transform(df[layout.action].to_numpy(np.float64))
    zy = sc["outputs"].transform(df[layout.outputs].to_numpy(np.float64))
    t = df["t"].to_numpy(np.int64)
    site_key = df["episode"].astype(str) + "\x1f" + df["site"].astype(str)
    site_codes, _ = pd.factorize(site_key)
    group_codes, group_uniques = pd.factorize(pd.MultiIndex.from_arrays([site_codes, t]))
    n_groups = len(group_uniques)

    # actions and outputs of each (site, t) group, shifted so that every row sees t-1
    y_means = group_means(np.concatenate([za, zy], axis=1).astype(np.float64), group_codes, n_groups)
    g_site = np.asarray([u[0] for u in group_uniques], dtype=np.int64)
    g_t = np.asarray([u[1] for u in group_uniques], dtype=np.int64)
    lookup = pd.Series(np.arange(n_groups), index=pd.MultiIndex.from_arrays([g_site, g_t]))
    prev = lookup.reindex(pd.MultiIndex.from_arrays([site_codes, t - 1])).to_numpy()
    lag = np.zeros((len(df), layout.n_lag), dtype=np.float64)
    ok = ~np.isnan(prev)
    lag[ok] = y_means[prev[ok].astype(np.int64)]

    x = client_features(layout, zp, zs, za, group_codes, n_groups, lag, t)

    # next-state targets: the same (episode, agent) at t+1
    key = pd.MultiIndex.from_arrays([df["episode"].astype(str), df["agent"].astype(str), t])
    row_of = pd.Series(np.arange(len(df)), index=key)
    if row_of.index.has_duplicates:
        dup = row_of.index[row_of.index.duplicated()][0]
        raise InputError(f"duplicate (episode, agent, t) row {dup}; validate the log first", "log")
    nxt = row_of.reindex(
        pd.MultiIndex.from_arrays([df["episode"].astype(str), df["agent"].astype(str), t + 1])
    )
    nxt_arr = nxt.to_numpy()
    has_next = ~np.isnan(nxt_arr)
    next_index = np.where(has_next, np.nan_to_num(nxt_arr, nan=-1), -1).astype(np.int64)
    y = zy
    if layout.learn_transition:
        delta = np.full_like(zs, np.nan)
        delta[has_next] = zs[next_index[has_next]] - zs[has_next]
        y = np.concatenate([zy, delta], axis=1)
    scen_index = {s: i for i, s in enumerate(layout.scenarios)}
    scenario = df["scenario"].astype(str).map(scen_index)
    if scenario.isna().any():
        bad = df["scenario"][scenario.isna()].iloc[0]
        raise InputError(f"scenario {bad!r} was not seen when the twin was fitted", "log")
    return StepTable(
        frame=df,
        x_client=x,
        y_client=y.astype(np.float32),
        x_engine=np.concatenate([zp, zs], axis=1).astype(np.float32),
        za=za,
        has_next=has_next,
        next_index=next_index,
        scenario=scenario.to_numpy(np.int64),
        episode=pd.factorize(df["episode"])[0],
        site_now=y_means[group_codes].astype(np.float32),
        site_group=np.asarray(group_codes, dtype=np.int64),
    )


def transition_features(x_client: np.ndarray, zy: np.ndarray, site_now: np.ndarray) -> np.ndarray:
    """The transition model's inputs ``(N, n_transition_inputs)`` (float32).

    Args:
        x_client: ``(N, n_client_inputs)`` client inputs of the tick.
        zy: ``(N, Y)`` the agent's own standardised outputs of the tick (the next state follows
            what it actually did, e.g. a "last tick's response" state column).
        site_now: ``(N, A+Y)`` its site's means of standardised actions and outputs of the tick.
    """
    return np.concatenate(
        [np.asarray(x_client, np.float32), np.asarray(zy, np.float32), np.asarray(site_now, np.float32)], axis=1
    )


# ------------------------------------------------------------------------ site-level state
def time_features(t: np.ndarray, step_seconds: float) -> np.ndarray:
    """``(N, 2)`` time of day ``(sin, cos)`` of step indices ``t (N,)``."""
    phase = 2.0 * np.pi * ((np.asarray(t, np.float64) * step_seconds) % DAY_SECONDS) / DAY_SECONDS
    return np.stack([np.sin(phase), np.cos(phase)], axis=1)


def site_element_features(
    layout: Layout,
    zp: np.ndarray,
    zs: np.ndarray,
    za: np.ndarray,
    zy: np.ndarray,
    scenario: np.ndarray,
    t: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-agent inputs of the site-state model: ``(who, did)``.

    Returns:
        who: ``(N, P+S'+L+n_scenarios·5)`` who the agent is and when: z(profile), its own
            (non-site) z(state) ``S'``, ``log`` of its ``L`` heavy-tailed non-negative profile
            columns (raw units: a load is a *product* of such columns, which is linear in their
            logs), its scenario one-hot, and that one-hot times the time of day's first two
            harmonics (a scenario's daily pattern; zeros without ``layout.use_time``).
        did: ``(N, A+Y+1)`` what happened at this tick: z(action), z(outputs), and a constant 1.
    """
    own = ~np.asarray(layout.site_state, dtype=bool) if layout.site_state else np.ones(zs.shape[1], bool)
    n = len(scenario)
    onehot = np.eye(len(layout.scenarios), dtype=np.float32)[np.asarray(scenario, np.int64)]
    if layout.use_time:
        t1 = time_features(t, layout.spec.step_seconds)
        t2 = time_features(2 * np.asarray(t), layout.spec.step_seconds)
        harmonics = np.concatenate([t1, t2], axis=1)
    else:
        harmonics = np.zeros((n, 4))
    daily = (onehot[:, :, None] * harmonics[:, None, :].astype(np.float32)).reshape(n, -1)
    heavy = layout.scalers["profile"].log
    raw = layout.scalers["profile"].inverse(np.asarray(zp, np.float64))[:, heavy] if np.any(heavy) else np.zeros((n, 0))
    logs = np.clip(np.log(np.maximum(raw, 1e-9)), -20.0, 20.0)
    who = np.concatenate(
        [np.asarray(v, np.float32).reshape(n, -1) for v in (zp, zs[:, own], logs)] + [onehot, daily],
        axis=1,
    )
    did = np.concatenate(
        [np.asarray(v, np.float32).reshape(n, -1) for v in (za, zy)] + [np.ones((n, 1), np.float32)], axis=1
    )
    return who, did


class SiteStateModel:
    """Next values of the site-level state columns from the whole site's tick.

    A site property at ``t+1`` (its load, the capacity its agents reserved) adds up what every
    agent of the site did *at t*, weighted by who the agent is: e.g. a reservation ratio is a sum
    over agents of ``capacity x nominal load / site vCPU``, which no site mean of actions and no
    single agent's inputs express. So each agent contributes, per column ``j``,

        ``φ_ij = exp(m_j(who_i)) · (u_j · did_i)``     (``did = [z(action), z(outputs), 1]``
                                                      and their pairwise products)

    a contribution *linear in what it did and in its pairwise products* (an edge load is demand x
    offload ratio x edge share: the agent's response times the platform's action, scaled by who
    it is), scaled by a positive magnitude that is log-linear in who it is and when (``m`` is
    linear in `site_element_features`' ``who``, which holds the logs of the heavy-tailed profile
    columns and each scenario's daily harmonics: a load is a product of such columns, so its log
    is linear in them). The site's next standardised values are
    ``b(c) + exp(g(c)) ⊙ mean_i φ_i`` with ``c`` the site context (its site-level state at t, its
    mean actions and outputs at t-1, log size, time) and ``b``, ``g`` linear. Every part is linear
    or log-linear on purpose: a site's load is dominated by its few heaviest agents, so the logs
    hold few independent examples of what matters; an MLP per agent (this model's previous form)
    fitted them and did not carry over to other days (held-out R² of the emulated cluster's
    reservation ratio 0.01 / 0.17 / -1.00 on three seeds, this form -0.05 / 0.89 / -0.10;
    `benchmarks/twin_site_state.py`). And under a random logging
    policy each agent's action varies over its whole range but a site's mean action hardly moves,
    so a contribution linear in the action extrapolates a policy that moves every agent the same
    way the way a sum does. Columns that are near-random walks (`Layout.state_absolute` False, e.g.
    a clock) are predicted as changes. Causal: every input is known when the tick ends. Fitted by
    full-batch Adam on the logged (episode, site, t) groups; one random 15 % of the episodes is
    held out to pick the epoch and, per column, whether the products stay (a column whose
    held-out error they do not lower is fitted without them).

    Attributes:
        columns: indices of the site-level state columns (into ``layout.state``).
        absolute: per such column, predict the next value (True) or the change (False).
        net: the torch parameters: ``magnitude`` (``m``, linear), ``linear`` (``u``, ``(k, D)``)
            and ``context`` (``[b, g]``, linear).
        z_low, z_high: the logged range of the columns (z); predictions are clipped to it, because
            a site pushed beyond anything logged feeds its own next prediction and runs away.
        val_r2: per column, R² of the next value on the held-out episodes.
        products: per column, whether its contributions use the pairwise products.
    """

    def __init__(
        self,
        layout: Layout,
        seed: int = 0,
        columns: Sequence[str] | None = None,
        interactions: bool = True,
    ) -> None:
        import torch as th

        self.columns = self.select_columns(layout, columns)
        self.interactions = interactions
        absolute = np.asarray(layout.state_absolute or [True] * len(layout.state), dtype=bool)
        self.absolute = absolute[self.columns]
        self.log_size_center = layout.log_size_center
        self.use_time = layout.use_time
        k = len(self.columns)
        n_site = int(np.sum(layout.site_state))
        n_log = int(np.sum(layout.scalers["profile"].log))
        n_who = len(layout.profile) + len(layout.state) - n_site + n_log + 5 * len(layout.scenarios)
        n_acts = len(layout.action) + layout.n_outputs
        self.n_did = n_acts + 1 + (n_acts * (n_acts - 1) // 2 if interactions else 0)
        th.manual_seed(seed)
        n_ctx = k + layout.n_lag + 1 + 2
        magnitude = th.nn.Linear(n_who, k)
        self.net = th.nn.ModuleDict(
            {
                "magnitude": magnitude,
                "linear": th.nn.Linear(self.n_did, k, bias=False),
                "context": th.nn.Linear(n_ctx, 2 * k),
            }
        )
        # start from equal magnitudes: the logs move them only as far as the data asks
        th.nn.init.zeros_(magnitude.weight)
        th.nn.init.zeros_(magnitude.bias)
        self.k = k
        self.z_low = np.full(k, -np.inf)
        self.z_high = np.full(k, np.inf)
        self.val_r2 = np.full(k, np.nan)
        self.products = np.full(k, interactions)

    @staticmethod
    def select_columns(layout: Layout, columns: Sequence[str] | None = None) -> np.ndarray:
        """Indices (into ``layout.state``) of the columns to model: ``columns`` (default: every
        site-level state column); raises `InputError` for a name that is not a site-level column."""
        site = [c for c, is_site in zip(layout.state, layout.site_state, strict=False) if is_site]
        names = site if columns is None else list(columns)
        bad = [c for c in names if c not in site]
        if bad:
            raise InputError(
                f"site-model column(s) {bad} are not site-level state columns of this log "
                f"(one value per site and tick); those are {site}",
                "site_model",
            )
        return np.array(sorted(layout.state.index(c) for c in names), dtype=np.int64)

    def _terms(self, did: Any) -> Any:
        """``did`` with the pairwise products of its action and output entries appended."""
        import torch as th

        if not getattr(self, "interactions", False):  # a model pickled before the products
            return did
        i, j = th.triu_indices(did.shape[1] - 1, did.shape[1] - 1, offset=1)
        return th.cat([did, did[:, i] * did[:, j]], dim=1)

    def _forward(self, who: Any, did: Any, codes: Any, site_x: Any) -> Any:
        import torch as th

        phi = self.net["linear"](self._terms(did)) * th.exp(self.net["magnitude"](who).clamp(-30.0, 30.0))
        n_groups = site_x.shape[0]
        pooled = th.zeros((n_groups, self.k), dtype=phi.dtype).index_add_(0, codes, phi)
        pooled = pooled / th.bincount(codes, minlength=n_groups).clamp(min=1).to(phi.dtype)[:, None]
        bg = self.net["context"](site_x)
        return bg[:, : self.k] + th.exp(bg[:, self.k :].clamp(-5.0, 5.0)) * pooled

    def site_inputs(
        self, zs_site: np.ndarray, lag: np.ndarray, size: np.ndarray, t: np.ndarray, step_seconds: float
    ) -> np.ndarray:
        """``(G, k + A+Y + 3)`` site-level inputs: z(site state) at t, the site's mean z(action)
        and z(outputs) at t-1 (``lag``, zeros at t = 0), centred log size, time (sin, cos)."""
        tt = time_features(t, step_seconds) if self.use_time else np.zeros((len(size), 2))
        return np.concatenate(
            [zs_site, lag, (np.log1p(size) - self.log_size_center)[:, None], tt], axis=1
        ).astype(np.float32)

    def predict(self, who: np.ndarray, did: np.ndarray, codes: np.ndarray, site_x: np.ndarray) -> np.ndarray:
        """Next z of the site columns ``(G, k)`` (changes already added) for groups ``codes``."""
        import torch as th

        with th.no_grad():
            out = self._forward(
                th.as_tensor(who, dtype=th.float32),
                th.as_tensor(did, dtype=th.float32),
                th.as_tensor(np.asarray(codes, np.int64)),
                th.as_tensor(site_x, dtype=th.float32),
            ).numpy()
        zs_site = site_x[:, : len(self.columns)]
        z = np.where(self.absolute, out, zs_site + out).astype(np.float64)
        return np.clip(z, self.z_low, self.z_high)

    def logged_groups(
        self, steps: StepTable, layout: Layout
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The logged (episode, site, t) groups of a `StepTable` as this model's inputs.

        Returns:
            ``(who (N, .), did (N, .), codes (N,), site_x (G, .), zs_next (G, k))``: the inputs of
            `predict` and the logged next z of the model's columns (NaN where a group has no
            next tick).
        """
        p, s = len(layout.profile), len(layout.state)
        zp, zs = steps.x_client[:, :p], steps.x_client[:, p : p + s]
        t_rows = steps.frame["t"].to_numpy(np.int64)
        who, did = site_element_features(
            layout, zp, zs, steps.za, steps.y_client[:, : layout.n_outputs], steps.scenario, t_rows
        )
        codes = np.asarray(steps.site_group)
        n_groups = int(codes.max()) + 1 if len(codes) else 0
        zs_next = np.full((n_groups, len(self.columns)), np.nan)
        has = steps.has_next
        zs_next[codes[has]] = zs[steps.next_index[has]][:, self.columns]
        first = np.unique(codes, return_index=True)[1]
        lag0 = p + s + len(layout.action) + s
        site_x = self.site_inputs(
            zs[first][:, self.columns],
            steps.x_client[first, lag0 : lag0 + layout.n_lag],
            np.bincount(codes, minlength=n_groups).astype(np.float64),
            t_rows[first],
            layout.spec.step_seconds,
        )
        return who, did, codes, site_x, zs_next

    def _train(self, tensors: list[Any], trn: Any, val: Any, epochs: int, lr: float) -> np.ndarray:
        """Full-batch Adam on the training groups ``trn``; each column keeps its best epoch on the
        held-out groups ``val`` (on ``trn`` when there are none). Returns that best per-column
        mean squared error ``(k,)``."""
        import torch as th

        opt = th.optim.Adam(self.net.parameters(), lr=lr)
        sched = th.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
        # Every parameter belongs to one column (row j of each layer; rows j and k+j of the
        # context), so each column keeps its own best epoch on the held-out episodes.
        k = self.k
        column_of_row = {name: np.arange(len(v)) % k for name, v in self.net.state_dict().items()}
        best = np.full(k, np.inf)
        best_state = {name: v.detach().clone() for name, v in self.net.state_dict().items()}
        for _ in range(epochs):
            out = self._forward(*tensors[:4])
            err = (out - tensors[4]) ** 2
            loss = err[trn].mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            score = (err[val] if bool(val.any()) else err[trn]).mean(0).detach().numpy()
            better = np.flatnonzero(score < best)
            if len(better):
                best[better] = score[better]
                for name, v in self.net.state_dict().items():
                    rows = np.isin(column_of_row[name], better)
                    best_state[name][rows] = v[rows].detach().clone()
        self.net.load_state_dict(best_state)
        return best

    def _take_columns(self, linear: SiteStateModel, columns: np.ndarray) -> None:
        """Give ``columns`` the parameters of ``linear`` (the same model without products; its
        product weights are zero here)."""
        if not len(columns):
            return
        state, theirs = self.net.state_dict(), linear.net.state_dict()
        for name, v in state.items():
            rows = np.isin(np.arange(len(v)) % self.k, columns)
            if name == "linear.weight":
                v[rows] = 0.0
                v[rows, : theirs[name].shape[1]] = theirs[name][rows]
            else:
                v[rows] = theirs[name][rows]
        self.net.load_state_dict(state)

    @classmethod
    def fit(
        cls,
        steps: StepTable,
        layout: Layout,
        seed: int = 0,
        epochs: int = 800,
        lr: float = 3e-3,
        columns: Sequence[str] | None = None,
        interactions: bool = True,
    ) -> SiteStateModel | None:
        """Fit on a `StepTable`; None when the log has no site-level state column (or no next tick).

        Args:
            columns: the site-level state columns to model (default: all of them).
            interactions: offer each column the pairwise products of actions and outputs (kept
                where they lower its held-out error); False: the form linear in each.
        """
        import torch as th

        if not layout.learn_transition or not any(layout.site_state) or steps.site_group is None:
            return None
        model = cls(layout, seed=seed, columns=columns, interactions=False)
        if not len(model.columns):
            return None
        who, did, codes, site_x, zs_next = model.logged_groups(steps, layout)
        zs_now = site_x[:, : len(model.columns)]
        target = np.where(model.absolute, zs_next, zs_next - zs_now).astype(np.float32)
        ok = np.isfinite(target).all(axis=1)
        if ok.sum() < 4:
            return None
        model.z_low, model.z_high = np.min(zs_next[ok], axis=0), np.max(zs_next[ok], axis=0)
        rng = np.random.default_rng(seed)
        ep_of_group = steps.episode[np.unique(codes, return_index=True)[1]]
        eps = np.unique(ep_of_group)
        held: np.ndarray | list[int] = (
            rng.choice(eps, size=max(1, int(round(0.15 * len(eps)))), replace=False) if len(eps) > 2 else []
        )
        val = ok & np.isin(ep_of_group, held)
        tensors = [th.as_tensor(v) for v in (who, did, codes, site_x, np.nan_to_num(target))]
        trn_t, val_t = th.as_tensor(ok & ~val), th.as_tensor(val)
        score = model._train(tensors, trn_t, val_t, epochs, lr)
        if interactions and val.any():
            # The products add ~(A+Y)²/2 weights per column; a column keeps them only where they
            # predict the held-out episodes better (without held-out episodes they are not offered:
            # on the training groups the larger form always wins).
            wider = cls(layout, seed=seed, columns=columns, interactions=True)
            wider.products = wider._train(tensors, trn_t, val_t, epochs, lr) < score
            wider._take_columns(model, np.flatnonzero(~wider.products))
            wider.z_low, wider.z_high = model.z_low, model.z_high
            model = wider
        if val.any():
            pred = model.predict(who, did, codes, site_x)[val]
            truth = zs_next[val]
            var = truth.var(0)
            # a column that hardly moves on the held-out episodes has no meaningful R²
            model.val_r2 = np.where(var > 1e-6, 1.0 - ((pred - truth) ** 2).mean(0) / np.maximum(var, 1e-12), np.nan)
        return model


# ------------------------------------------------------------------------------------ a world
@dataclass
class World:
    """N simulated agents on sites, advanced one tick at a time (batched over all agents).

    Attributes:
        layout: the twin's layout.
        scenario: ``(N,)`` scenario ids; ``site``: ``(N,)`` site ids ``0..n_sites-1``.
        profile: ``(N, P)`` raw profiles; ``state``: ``(N, S)`` raw states at the current tick.
        lag: ``(n_sites, A+Y)`` site means of standardised actions and outputs of the previous tick.
        t: the current tick.
        site_model: a `SiteStateModel` that moves the site-level state columns at the end of each
            tick from the whole site's tick; None: the mean of the agents' own predictions.
    """

    layout: Layout
    scenario: np.ndarray
    site: np.ndarray
    profile: np.ndarray
    state: np.ndarray
    lag: np.ndarray
    t: int = 0
    site_model: Any = None

    @property
    def n(self) -> int:
        return len(self.scenario)

    @property
    def n_sites(self) -> int:
        return int(self.site.max()) + 1 if self.n else 0

    def zprofile(self) -> np.ndarray:
        return self.layout.scalers["profile"].transform(self.profile)

    def engine_inputs(self) -> np.ndarray:
        """``(N, P+S)`` standardised ``[profile, state]``."""
        sc = self.layout.scalers
        return np.concatenate(
            [sc["profile"].transform(self.profile), sc["state"].transform(self.state)], axis=1
        )

    def client_inputs(self, action: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Client inputs for raw actions taken at this tick.

        Args:
            action: ``(N, A)``, or ``(len(rows), A)`` when ``rows`` is given.
            rows: compute only these agents' inputs (the others' actions are not needed: the
                model is causal per agent).
        """
        sc = self.layout.scalers
        zs_all = sc["state"].transform(self.state)
        means = group_means(np.asarray(zs_all, np.float64), self.site, self.n_sites)[self.site]
        r = np.arange(self.n) if rows is None else np.asarray(rows)
        return client_features(
            self.layout,
            sc["profile"].transform(self.profile[r]),
            zs_all[r],
            sc["action"].transform(action),
            self.site[r],
            self.n_sites,
            self.lag[self.site[r]],
            np.full(len(r), self.t),
            state_means=means[r],
            site_size=np.bincount(self.site, minlength=self.n_sites)[self.site[r]],
            profile_means=(
                group_means(np.asarray(self.zprofile(), np.float64), self.site, self.n_sites)[self.site[r]]
                if self.layout.site_profile
                else None
            ),
        )

    def apply(
        self, action: np.ndarray, y: np.ndarray, transition: Mapping[int, Any] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Apply standardised model outputs ``y (N, n_model_outputs)`` of this tick.

        Args:
            action: ``(N, A)`` raw actions of the tick.
            y: ``(N, n_model_outputs)`` standardised client outputs (``Δstate`` last, if learned).
            transition: per scenario id, a model with ``mean(x) -> Δz(state)`` over
                `transition_features`; when given (and the transition is learned) it replaces the
                client's ``Δstate``: it sees the whole site's actions and outputs of this tick.

        Returns:
            ``(outputs_raw (N, Y), next_state_raw (N, S))``; the world moves to t+1.
        """
        lay = self.layout
        ny = lay.n_outputs
        out_raw = lay.scalers["outputs"].inverse(y[:, :ny]) if ny else np.zeros((self.n, 0))
        zs = lay.scalers["state"].transform(self.state)
        zy = lay.scalers["outputs"].transform(out_raw) if ny else np.zeros((self.n, 0))
        za = lay.scalers["action"].transform(action)
        site_now = group_means(np.concatenate([za, zy], axis=1).astype(np.float64), self.site, self.n_sites)
        fn = lay.spec.transition_fn()
        if fn is not None:
            resp = out_raw[:, : len(lay.response)]
            nxt = np.asarray(fn(self.state, action, resp), dtype=np.float64).reshape(self.n, len(lay.state))
            nxt = lay.scalers["state"].legalise(nxt)
        elif lay.learn_transition:
            delta = np.asarray(y[:, ny:], dtype=np.float64)
            if transition is not None:
                x = transition_features(self.client_inputs(action), zy, site_now[self.site])
                pred = np.zeros_like(delta)
                for s in np.unique(self.scenario):
                    idx = np.flatnonzero(self.scenario == s)
                    pred[idx] = transition[int(s)].mean(x[idx])
                absolute = np.asarray(lay.state_absolute or [False] * len(lay.state), dtype=bool)
                delta = np.where(absolute, pred - zs, pred)
            z_next = zs + delta
            site_cols: np.ndarray | list[int] = (
                np.flatnonzero(np.asarray(lay.site_state, dtype=bool)) if lay.site_state else []
            )
            if len(site_cols):
                # a site's property is one value for all its agents: their mean prediction
                z_next[:, site_cols] = group_means(z_next[:, site_cols], self.site, self.n_sites)[self.site]
            if self.site_model is not None and len(site_cols):
                z_next[:, self.site_model.columns] = self._site_next(zs, za, zy)[self.site]
            nxt = lay.roll_clocks(self.state, lay.scalers["state"].inverse(z_next))
            nxt = lay.roll_echoes(out_raw, nxt)
        else:
            nxt = self.state.copy()
        self.lag = site_now
        self.state = nxt
        self.t += 1
        return out_raw, nxt

    def _site_next(self, zs: np.ndarray, za: np.ndarray, zy: np.ndarray) -> np.ndarray:
        """``(n_sites, k)`` next z of the site-level columns from the site model (before `lag` moves)."""
        m = self.site_model
        who, did = site_element_features(
            self.layout, self.zprofile(), zs, za, zy, self.scenario, np.full(self.n, self.t)
        )
        n_sites = self.n_sites
        zs_site = group_means(np.asarray(zs[:, m.columns], np.float64), self.site, n_sites)
        size = np.bincount(self.site, minlength=n_sites).astype(np.float64)
        site_x = m.site_inputs(zs_site, self.lag, size, np.full(n_sites, self.t), self.layout.spec.step_seconds)
        return m.predict(who, did, self.site, site_x)


# --------------------------------------------------------------------------- who is where, from where
@dataclass
class Composition:
    """How many agents of each scenario share a site, as logged; worlds are built from it.

    Attributes:
        units: ``(U, n_scenarios)`` agent counts per logged (episode, site) at its first tick.
    """

    units: np.ndarray

    @classmethod
    def fit(cls, log: pd.DataFrame, layout: Layout) -> Composition:
        first = log[log["t"] == log.groupby("episode")["t"].transform("min")]
        counts = (
            first.groupby(["episode", "site", "scenario"], sort=True)
            .size()
            .unstack("scenario", fill_value=0)
            .reindex(columns=layout.scenarios, fill_value=0)
        )
        return cls(units=counts.to_numpy(np.int64))

    def sample(self, rng: np.random.Generator, n_agents: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Draw logged site units until ``n_agents`` agents (default: one unit's worth).

        Returns:
            ``(scenario (N,), site (N,))`` integer ids; sites are numbered ``0..``.
        """
        target = int(self.units[rng.integers(len(self.units))].sum()) if n_agents is None else int(n_agents)
        if target < 1:
            raise InputError(f"n_agents must be >= 1, got {n_agents}", "n_agents")
        scen: list[np.ndarray] = []
        site: list[np.ndarray] = []
        total, k = 0, 0
        while total < target:
            unit = self.units[rng.integers(len(self.units))]
            ids = np.repeat(np.arange(len(unit)), unit)
            ids = ids[: target - total]
            if len(ids):
                scen.append(ids)
                site.append(np.full(len(ids), k))
                total += len(ids)
                k += 1
        return np.concatenate(scen), np.concatenate(site)


@dataclass
class InitialStates:
    """Initial states drawn from logged first ticks, matched to a profile by nearest neighbours.

    As in seed 004 §3.1.2, what the model does not predict is loaded from real trajectories: a new
    agent starts from the first logged state of one of the ``k`` logged agents of its scenario
    whose profiles are nearest to its own.
    """

    zprofiles: list[np.ndarray]
    states: list[np.ndarray]
    k: int = 5

    @classmethod
    def fit(cls, log: pd.DataFrame, layout: Layout) -> InitialStates:
        first = log[log["t"] == log.groupby(["episode", "agent"])["t"].transform("min")]
        zp, st = [], []
        for s in layout.scenarios:
            rows = first[first["scenario"].astype(str) == s]
            zp.append(layout.scalers["profile"].transform(rows[layout.profile].to_numpy(np.float64)))
            st.append(rows[layout.state].to_numpy(np.float64))
        return cls(zp, st)

    def sample(
        self, layout: Layout, scenario: np.ndarray, profile: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray:
        """``(N, S)`` raw initial states for agents with raw ``profile (N, P)``."""
        out = np.zeros((len(scenario), len(layout.state)))
        zp = layout.scalers["profile"].transform(profile)
        for s in np.unique(scenario):
            rows = np.flatnonzero(scenario == s)
            bank_p, bank_s = self.zprofiles[s], self.states[s]
            if len(bank_s) == 0:
                continue
            k = min(self.k, len(bank_s))
            if bank_p.shape[1] == 0:
                pick = rng.integers(len(bank_s), size=len(rows))
            else:
                nn = NearestNeighbors(n_neighbors=k).fit(bank_p)
                near = nn.kneighbors(zp[rows], return_distance=False)
                pick = near[np.arange(len(rows)), rng.integers(k, size=len(rows))]
            out[rows] = bank_s[pick]
        return out

    def to_arrays(self) -> dict[str, np.ndarray]:
        d: dict[str, np.ndarray] = {}
        for i, (p, s) in enumerate(zip(self.zprofiles, self.states, strict=True)):
            d[f"p{i}"], d[f"s{i}"] = p, s
        return d

    @classmethod
    def from_arrays(cls, d: Any, n_scenarios: int) -> InitialStates:
        return cls(
            [np.asarray(d[f"p{i}"]) for i in range(n_scenarios)],
            [np.asarray(d[f"s{i}"]) for i in range(n_scenarios)],
        )
