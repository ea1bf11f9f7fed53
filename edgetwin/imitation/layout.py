"""`Layout`: the roles, scalers and detected structure of a log that MAIL-MMSG, its baselines and the
twin share.

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

`Layout.from_log` also finds, in any log, the state columns it need not learn: a clock (advances by
the same step every tick, modulo its range), an echo (repeats one output of the last tick) and the
site-level columns (one value per site and tick); `ColumnScaler` standardises every role.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import REWARD_COLUMN, Feature, TwinSpec

__all__ = ["DAY_SECONDS", "PERSISTENT_RATIO", "ColumnScaler", "Layout"]

DAY_SECONDS = 86_400.0
#: row counts for which `ColumnScaler` keeps its statistics repeated per row (a twin's ticks)
_TILE_ROWS = (64, 16_384)


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
    #: per statistic, ``(the (D,) array, it repeated as (n, D) rows)`` (see `_rows`)
    _tiles: dict[str, tuple[np.ndarray, np.ndarray]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __getstate__(self) -> dict[str, Any]:
        return {k: (v if k != "_tiles" else {}) for k, v in self.__dict__.items() if k != "_zbounds"}

    def _rows(self, name: str, n: int) -> np.ndarray:
        """A ``(D,)`` statistic or bound (``mean``, ``std``, ``low``, ``high``) as ``(n, D)`` rows, kept for the last ``n`` (a twin
        steps the same agents every tick), or the ``(D,)`` array itself for few or very many rows.

        numpy applies a ``(D,)`` operand row by row, one short inner loop per row; a full
        ``(n, D)`` operand is one long loop, about 3x faster at a twin's thousands of agents.
        Every element meets the same value either way, so the results are the same to the bit.
        """
        v: np.ndarray = getattr(self, name)
        if not _TILE_ROWS[0] <= n <= _TILE_ROWS[1]:
            return v
        hit = self._tiles.get(name)
        if hit is None or hit[0] is not v or hit[1].shape[0] != n:
            rows = np.tile(v, (n, 1))
            rows.flags.writeable = False
            hit = self._tiles[name] = (v, rows)
        return hit[1]

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
        z = _forward_log(np.asarray(raw, dtype=np.float64), self.log)  # a fresh float64 array
        n = len(z)
        z -= self._rows("mean", n)  # in place: the same operations in the same order
        z /= self._rows("std", n)
        return z.astype(np.float32)

    def inverse(self, z: np.ndarray) -> np.ndarray:
        """Standardised ``(N, D)`` -> raw ``(N, D)`` float64, clipped to bounds, discrete snapped."""
        x = np.array(z, dtype=np.float64)  # a copy, then worked on in place
        n = len(x)
        x *= self._rows("std", n)
        x += self._rows("mean", n)
        if self.log.any():
            # exp of a wild model output must not overflow to inf before clipping
            g = x[:, self.log]  # (a copy: worked on in place, then written back)
            np.maximum(g, -50.0, out=g)
            np.minimum(g, 50.0, out=g)
            x[:, self.log] = np.expm1(g, out=g)
        return self._legalise(x, out=x)

    def inverse_column(self, z: np.ndarray, j: int) -> np.ndarray:
        """`inverse` of column ``j`` alone: standardised ``(N,)`` -> raw ``(N,)`` float64 (what the
        output noise model's raw-mean matching evaluates many times, one column at a time)."""
        if self.values[j] is not None:  # discrete: the full inverse snaps it
            full = np.zeros((len(z), self.width))
            full[:, j] = z
            return self.inverse(full)[:, j]
        x = np.asarray(z, np.float64) * self.std[j] + self.mean[j]
        if self.log[j]:
            x = np.expm1(np.clip(x, -50.0, 50.0))
        return np.clip(x, self.low[j], self.high[j])

    def legal_z(self, z: np.ndarray) -> np.ndarray | None:
        """``transform(inverse(z))`` of standardised ``z (N, D)`` up to rounding, as float32: ``z``
        clipped to the bounds' standardised images (a log column's to ``log1p`` of them, floored at
        ``log1p(0)`` and capped at the 50 that `inverse` caps ``expm1``'s argument at). None when a
        column is discrete (snapping is not a clip).

        Why: a twin's tick needs the z-values of its legal raw outputs; going through raw units
        and back costs an ``expm1`` and a ``log1p`` per value for what is, within float rounding
        (~1e-16 relative before the float32 cast), a clip.
        """
        if any(v is not None for v in self.values):
            return None
        hit = self.__dict__.get("_zbounds")
        if hit is None or hit[0] is not self.mean or hit[1] is not self.std:
            lo, hi = self.low.copy(), self.high.copy()
            if self.log.any():
                lo[self.log] = np.log1p(np.maximum(lo[self.log], 0.0))
                hi[self.log] = np.minimum(np.log1p(hi[self.log]), 50.0)
            zlo = ((lo - self.mean) / self.std).astype(np.float32)
            zhi = ((hi - self.mean) / self.std).astype(np.float32)
            hit = self.__dict__["_zbounds"] = (self.mean, self.std, zlo, zhi)
        out = np.maximum(np.asarray(z, np.float32), hit[2])
        np.minimum(out, hit[3], out=out)
        out += np.float32(0.0)
        return out

    def legalise(self, x: np.ndarray) -> np.ndarray:
        """Clip raw values to bounds and snap discrete columns to their nearest allowed value."""
        return self._legalise(x)

    def _legalise(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """`legalise`, into ``out`` (which may be ``x`` itself) when given."""
        # np.maximum / np.minimum against the bounds kept as rows (`_rows`: ~3x np.clip with (D,)
        # bounds at a twin's sizes), then + 0.0: which zero a tie between -0.0 and a 0.0 bound
        # keeps depends on the kernel (a broadcast or full operand, a SIMD body or its tail), so
        # every zero is made +0.0 and a value's bits do not depend on the rows beside it
        n = x.shape[0]
        x = np.maximum(x, self._rows("low", n), out=out)
        np.minimum(x, self._rows("high", n), out=x)
        x += 0.0
        for j, vals in enumerate(self.values):
            if vals is not None and x.shape[0]:
                idx = np.abs(x[:, j : j + 1] - vals[None, :]).argmin(axis=1)
                x[:, j] = vals[idx]
        return x

    def legalise_column(self, j: int, v: np.ndarray) -> np.ndarray:
        """Raw values ``(n,)`` of column ``j`` clipped and snapped as `legalise` does (a fresh array)."""
        v = np.maximum(v, self.low[j])
        np.minimum(v, self.high[j], out=v)
        v += 0.0
        vals = self.values[j] if j < len(self.values) else None
        if vals is not None and len(v):
            v = vals[np.abs(v[:, None] - vals[None, :]).argmin(axis=1)]
        return v

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
        g = out[:, log]  # (a copy: worked on in place, then written back; the same values)
        np.maximum(g, 0.0, out=g)
        out[:, log] = np.log1p(g, out=g)
    return out


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
        declared: per state column, whether the spec's ``[[dynamics]]`` compute it (the world
            then sets it from the declaration every tick; a model's prediction for it is unused).
        input_range: per state column, ``(low, high)`` of its logged values in z units: what the
            learned models see of a *declared* column is clipped to it (`model_state`), since a
            declared column goes where the logs never were by design (a backlog under an
            overload) and a model fed a value it never saw extrapolates arbitrarily; the
            declaration itself computes it exactly. The logs' support is measured the same way:
            a declared column beyond its logged range is no extrapolation of a learned part.
            Empty for twins saved before it.
        site_profile_columns: per profile column, whether it is a site constant
            (``scope = "site"``): a generated world takes it from the logged site, not the
            population model.
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
    declared: list[bool] = field(default_factory=list)
    input_range: list[tuple[float, float]] = field(default_factory=list)
    site_profile_columns: list[bool] = field(default_factory=list)

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
        scoped = {f.name for f in spec.features if f.scope == "site"}
        declared_names = set(spec.declared_columns)
        # a column the spec says is the site's is the site's, whatever the logs show
        site_state = [a or c in scoped for a, c in zip(_site_level(log, state), state, strict=True)]
        declared = [c in declared_names for c in state]
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
            clock=[None if d else c for c, d in zip(_clocks(log, state, spec), declared, strict=True)],
            echo=[None if d else e for e, d in zip(_echoes(log, state, outputs), declared, strict=True)],
            declared=declared,
            input_range=_z_range(log, state, scalers["state"]),
            site_profile_columns=[c in scoped for c in profile],
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
            "declared": self.declared,
            "input_range": [list(r) for r in self.input_range],
            "site_profile_columns": self.site_profile_columns,
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
            declared=[bool(v) for v in d.get("declared", [])],
            input_range=[(float(a), float(b)) for a, b in d.get("input_range", [])],
            site_profile_columns=[bool(v) for v in d.get("site_profile_columns", [])],
        )

    def model_state(self, zs: np.ndarray) -> np.ndarray:
        """``zs (N, S)`` standardised states as the learned models see them: declared columns
        clipped to their logged range (`input_range`), the others unchanged."""
        if not any(self.declared) or len(self.input_range) != len(self.state):
            return zs
        cols = np.flatnonzero(self.declared)
        lo = np.array([self.input_range[j][0] for j in cols])
        hi = np.array([self.input_range[j][1] for j in cols])
        out = np.array(zs, dtype=np.float64, copy=True)
        g = out[:, cols]  # (a copy; np.maximum / np.minimum: np.clip against (k,) bounds is ~3x slower)
        np.maximum(g, lo, out=g)
        np.minimum(g, hi, out=g)
        out[:, cols] = g + 0.0  # (+0.0: every zero +0.0, whichever a kernel kept at a tie)
        return out

    def apply_declared(
        self,
        profile: np.ndarray,
        state: np.ndarray,
        action: np.ndarray,
        outputs: np.ndarray,
        site: np.ndarray,
        nxt: np.ndarray,
        n_sites: int | None = None,
    ) -> np.ndarray:
        """``nxt (N, S)`` with every declared state column computed from the tick (raw units).

        The declarations read the tick's raw ``profile (N, P)``, ``state (N, S)``, ``action (N, A)``
        and the learned ``outputs (N, Y)``, so a declared site column sees what every agent of
        its site did and answered at this tick (`edgetwin.contract.dynamics`). ``n_sites``:
        ``site.max() + 1`` when the caller knows it.
        """
        if not any(self.declared):
            return nxt
        dynamics = self._runtime("dynamics", self.spec.declared_dynamics)
        if dynamics is None:
            return nxt
        reads = dynamics.reads  # the columns the declarations read (None: a function may read any)
        cols: dict[str, np.ndarray] = {}
        for names, block in ((self.profile, profile), (self.state, state), (self.action, action), (self.outputs, outputs)):
            for j, c in enumerate(names):
                if reads is None or c in reads:
                    cols[c] = block[:, j]
        values = dynamics.next_state(cols, site, n_sites)
        for j, c in enumerate(self.state):
            if c in values:
                nxt[:, j] = values[c]
        return nxt

    def _runtime(self, key: str, compute: Any, source: Any = None) -> Any:
        """``compute()`` kept on this layout while its spec (and ``source``) are the same objects:
        a tick asks for the declared dynamics and column sets every time, and they do not change
        under it (not pickled: `__getstate__`)."""
        memo = self.__dict__.setdefault("_runtime_memo", {})
        hit = memo.get(key)
        if hit is None or hit[0] is not self.spec or hit[1] is not source:
            hit = memo[key] = (self.spec, source, compute())
        return hit[2]

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_runtime_memo"}

    @property
    def site_state_columns(self) -> np.ndarray:
        """Indices of the `site_state` columns (read-only)."""
        return self._runtime(
            "site_cols",
            lambda: _frozen(np.flatnonzero(np.asarray(self.site_state, dtype=bool)) if self.site_state else np.zeros(0, np.int64)),
            self.site_state,
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
        (raw units, legalised to the state column's bounds: `ColumnScaler.legalise_column`, the
        numbers `legalise` of the whole state gives them; the other columns are legal already)."""
        sc = self.scalers["state"]
        for j, k in enumerate(self.echo):
            if k is not None:
                nxt[:, j] = sc.legalise_column(j, outputs[:, k])
        return nxt


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


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


def _z_range(log: pd.DataFrame, state: list[str], scaler: ColumnScaler) -> list[tuple[float, float]]:
    """Per state column, ``(min, max)`` of its logged values in z units."""
    if not state:
        return []
    z = scaler.transform(log[state].to_numpy(np.float64))
    return [(float(np.nanmin(z[:, j])), float(np.nanmax(z[:, j]))) for j in range(len(state))]


def _site_level(log: pd.DataFrame, state: list[str], tol: float = 1e-9) -> list[bool]:
    """Which state columns take one value per (episode, site, t) in the logs (site properties)."""
    if not state:
        return []
    groups = log.groupby(["episode", "site", "t"], sort=False)[state]
    spread = (groups.max() - groups.min()).abs().max(axis=0)
    scale = log[state].abs().max(axis=0).clip(lower=1.0)
    multi = bool((log.groupby(["episode", "site", "t"], sort=False).size() > 1).any())
    return [bool(multi and spread[c] <= tol * scale[c]) for c in state]
