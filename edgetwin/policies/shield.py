"""The safety shield: project every action onto the feasible set before it is applied.

Seed 003 wraps each learned policy in a shield that "enforces SLO, thermal and budget limits through
projection" and "residency/compliance rules before execution", with SLO guard margins of 10-15 %,
migration caps of 2/min per service and per-cluster energy budgets. Here the feasible set of a batch
of per-agent actions ``(N, A)`` given observations ``(N, O)`` is the intersection of:

* the spec's action bounds, and the allowed values of discrete actions;
* :class:`Residency`: a discrete action (placement) may only take values allowed for the agent's tag;
* :class:`MigrationCap`: an agent may change a discrete placement at most ``max_moves`` times per
  ``window_s`` seconds (time advances by the spec's ``step_seconds`` per call);
* :class:`SLOGuard`: a lower bound on a continuous action from the agent's demand, so that the
  predicted utilisation stays ``<= 1 / (1 + margin)``;
* :class:`Budget`: ``Σ_agents Σ_cols coef · action <= limit`` per group (capacity, energy budget).

Continuous columns get the Euclidean projection onto box ∩ budget (exact for one budget; Dykstra
plus a final shrink towards the lower bounds for several). When the SLO guards cannot all be met
within a budget the budget wins (it is physical) and the guards are relaxed proportionally; the
shield counts it in :attr:`Shield.stats`. Discrete columns move to the nearest allowed value.

Nothing here knows a system's column names: every rule names the spec's columns.
:class:`ShieldWrapper` (gymnasium) and :class:`ShieldVecEnvWrapper` (SB3, one sub-env per agent,
so budgets bind across agents) apply it in training; `Shield.project` is what the edge calls.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, SupportsFloat

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper
from stable_baselines3.common.vec_env.base_vec_env import VecEnvObs

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import TwinSpec

# ------------------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class Budget:
    """``Σ_rows Σ_j coefficients[j] · action[row, j] <= limit`` within each group of rows.

    Attributes:
        name: for reports ("capacity", "energy").
        coefficients: action column -> consumption per unit of the action (>= 0).
        limit: the budget; or ``limit_column``: an observation column holding it (the group's
            minimum is used, conservatively).
        per_row_offset: consumption every row has regardless of its action (e.g. idle watts),
            subtracted from the limit once per row.
        group_by: an observation column (e.g. the site code); the budget holds per group.
    """

    name: str
    coefficients: Mapping[str, float]
    limit: float | None = None
    limit_column: str | None = None
    per_row_offset: float = 0.0
    group_by: str | None = None


@dataclass(frozen=True)
class SLOGuard:
    """A lower bound on one continuous action that keeps the SLO's headroom.

    ``kind="allocation"``: ``action >= (1 + margin) · scale · obs[demand]`` (give at least the
    demand plus the margin). ``kind="offload"``: the share kept local, ``(1 - action) · obs[demand]``,
    must not exceed ``capacity / (1 + margin)``, i.e. ``action >= 1 - capacity / ((1+margin) demand)``;
    ``capacity`` is a constant or an observation column.
    """

    action: str
    demand: str
    margin: float = 0.10
    kind: Literal["allocation", "offload"] = "allocation"
    scale: float = 1.0
    capacity: str | float | None = None


@dataclass(frozen=True)
class MigrationCap:
    """At most ``max_moves`` changes of a discrete action per agent within ``window_s`` seconds.

    ``current`` is the observation column holding the agent's present value (placement); without
    it the shield remembers the last value it let through for that row.
    """

    action: str
    current: str | None = None
    max_moves: int = 2
    window_s: float = 60.0


@dataclass(frozen=True)
class Residency:
    """A discrete action may only take ``allowed[tag]`` for agents whose ``obs[tag]`` is ``tag``.

    Tags that are not listed are unrestricted.
    """

    action: str
    tag: str
    allowed: Mapping[float, Sequence[float]]


@dataclass
class ShieldConfig:
    """All rules of a :class:`Shield`; JSON-serialisable (exported policies carry it)."""

    budgets: list[Budget] = field(default_factory=list)
    guards: list[SLOGuard] = field(default_factory=list)
    migration: list[MigrationCap] = field(default_factory=list)
    residency: list[Residency] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for r in d["residency"]:  # JSON keys must be strings
            r["allowed"] = {str(k): list(v) for k, v in r["allowed"].items()}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ShieldConfig:
        try:
            return cls(
                budgets=[Budget(**b) for b in d.get("budgets", [])],
                guards=[SLOGuard(**g) for g in d.get("guards", [])],
                migration=[MigrationCap(**m) for m in d.get("migration", [])],
                residency=[
                    Residency(r["action"], r["tag"], {float(k): tuple(v) for k, v in r["allowed"].items()})
                    for r in d.get("residency", [])
                ],
            )
        except (TypeError, KeyError) as e:
            raise InputError(f"bad shield configuration ({e})", "shield") from None


# ------------------------------------------------------------------------------------- shield


class Shield:
    """Projects per-agent actions onto the feasible set of its :class:`ShieldConfig`.

    Args:
        spec: gives the action and observation layout, bounds, allowed values and ``step_seconds``.
        config: the rules; column names are checked against ``spec``.
        unbounded: the box used for an action side the spec leaves unbounded.
    """

    def __init__(self, spec: TwinSpec, config: ShieldConfig | None = None, unbounded: float = 1e9) -> None:
        self.spec = spec
        self.config = config or ShieldConfig()
        self.obs_cols = spec.observation_columns
        self.act_cols = spec.action_columns
        self._obs_idx = {c: i for i, c in enumerate(self.obs_cols)}
        self._act_idx = {c: i for i, c in enumerate(self.act_cols)}
        low, high = spec.bounds("action")
        self.low = np.where(np.isfinite(low), low, -unbounded)
        self.high = np.where(np.isfinite(high), high, unbounded)
        self.values: list[np.ndarray | None] = [
            None if (v := f.allowed_values()) is None else np.sort(np.asarray(v, float))
            for f in spec.by_role("action")
        ]
        self.step_seconds = float(spec.step_seconds)
        self._check()
        self.stats: dict[str, int] = {
            "calls": 0,
            "changed_rows": 0,
            "guard_relaxed": 0,
            "migrations_blocked": 0,
        }
        self.reset()

    # --- configuration -----------------------------------------------------------------------
    def _obs(self, col: str, what: str) -> int:
        if col not in self._obs_idx:
            raise InputError(f"{what}: {col!r} is not an observation column ({self.obs_cols})", "shield")
        return self._obs_idx[col]

    def _act(self, col: str, what: str, discrete: bool | None = None) -> int:
        if col not in self._act_idx:
            raise InputError(f"{what}: {col!r} is not an action column ({self.act_cols})", "shield")
        j = self._act_idx[col]
        if discrete is True and self.values[j] is None:
            raise InputError(
                f"{what}: action {col!r} must be discrete (give it 'values' in the spec)", "shield"
            )
        if discrete is False and self.values[j] is not None:
            raise InputError(f"{what}: action {col!r} must be continuous", "shield")
        return j

    def _check(self) -> None:
        c = self.config
        for b in c.budgets:
            if (b.limit is None) == (b.limit_column is None):
                raise InputError(f"budget {b.name!r}: give exactly one of limit / limit_column", "shield")
            for col, coef in b.coefficients.items():
                self._act(col, f"budget {b.name!r}", discrete=False)
                if coef < 0:
                    raise InputError(f"budget {b.name!r}: coefficient of {col!r} must be >= 0", "shield")
            if b.limit_column:
                self._obs(b.limit_column, f"budget {b.name!r}")
            if b.group_by:
                self._obs(b.group_by, f"budget {b.name!r}")
        for g in c.guards:
            self._act(g.action, "SLO guard", discrete=False)
            self._obs(g.demand, "SLO guard")
            if not 0.0 <= g.margin <= 1.0:
                raise InputError(
                    f"SLO guard margin {g.margin} must be in [0, 1] (seed 003: 0.10-0.15)", "shield"
                )
            if g.kind == "offload" and g.capacity is None:
                raise InputError("an offload SLO guard needs a capacity (constant or column)", "shield")
            if isinstance(g.capacity, str):
                self._obs(g.capacity, "SLO guard")
        for m in c.migration:
            self._act(m.action, "migration cap", discrete=True)
            if m.current:
                self._obs(m.current, "migration cap")
        for r in c.residency:
            j = self._act(r.action, "residency", discrete=True)
            self._obs(r.tag, "residency")
            for tag, allowed in r.allowed.items():
                bad = set(map(float, allowed)) - set(self.values[j].tolist())  # type: ignore[union-attr]
                if bad or not allowed:
                    raise InputError(
                        f"residency for tag {tag}: values {sorted(bad)} not allowed by the spec", "shield"
                    )

    def reset(self) -> None:
        """Forget migration history and the clock (a new episode)."""
        self._now = 0.0
        self._moves: dict[tuple[int, int], deque[float]] = {}
        self._last: dict[tuple[int, int], float] = {}

    # --- the feasible set --------------------------------------------------------------------
    def _allowed(self, obs: np.ndarray, j: int) -> np.ndarray:
        """(N, K_j) bool: values of discrete action j allowed by the residency rules."""
        vals = self.values[j]
        assert vals is not None
        ok = np.ones((obs.shape[0], len(vals)), dtype=bool)
        for r in self.config.residency:
            if self._act_idx[r.action] != j:
                continue
            tags = obs[:, self._obs_idx[r.tag]]
            for tag, allowed in r.allowed.items():
                rows = np.isclose(tags, tag)
                ok[rows] &= np.isin(vals, np.asarray(allowed, float))[None, :]
        return ok

    def _current(self, obs: np.ndarray, m: MigrationCap, j: int) -> np.ndarray:
        """(N,) present value of discrete action j per row (NaN when unknown)."""
        if m.current:
            return obs[:, self._obs_idx[m.current]].astype(float)
        return np.array([self._last.get((j, i), np.nan) for i in range(obs.shape[0])])

    def _quota_left(self, n: int, m: MigrationCap, j: int) -> np.ndarray:
        left = np.empty(n, dtype=int)
        for i in range(n):
            q = self._moves.get((j, i))
            recent = 0 if q is None else sum(1 for t in q if t > self._now - m.window_s)
            left[i] = m.max_moves - recent
        return left

    def lower_bounds(self, obs: np.ndarray) -> np.ndarray:
        """(N, A) lower bounds: the spec's, raised by the SLO guards (capped at the upper bound)."""
        lo = np.broadcast_to(self.low, (obs.shape[0], len(self.low))).copy()
        for g in self.config.guards:
            j = self._act_idx[g.action]
            demand = obs[:, self._obs_idx[g.demand]].astype(float)
            if g.kind == "allocation":
                need = (1.0 + g.margin) * g.scale * demand
            else:
                assert g.capacity is not None  # _check: an offload guard has a capacity
                cap = obs[:, self._obs_idx[g.capacity]] if isinstance(g.capacity, str) else float(g.capacity)
                with np.errstate(divide="ignore", invalid="ignore"):
                    need = np.where(demand > 0, 1.0 - cap / ((1.0 + g.margin) * demand), -np.inf)
            lo[:, j] = np.maximum(lo[:, j], np.minimum(need, self.high[j]))
        return lo

    def action_masks(self, obs: np.ndarray) -> np.ndarray:
        """(N, Σ_j K_j) bool over the allowed values of each discrete action, in column order.

        This is the layout sb3-contrib's MaskablePPO expects for a (Multi)Discrete action space.
        """
        obs = np.atleast_2d(np.asarray(obs, float))
        blocks = []
        for j, vals in enumerate(self.values):
            if vals is None:
                continue
            ok = self._allowed(obs, j)
            for m in self.config.migration:
                if self._act_idx[m.action] != j:
                    continue
                cur = self._current(obs, m, j)
                frozen = (self._quota_left(obs.shape[0], m, j) <= 0) & ~np.isnan(cur)
                for i in np.flatnonzero(frozen):
                    stay = np.isclose(vals, cur[i]) & ok[i]
                    if stay.any():  # staying is only possible where residency allows it
                        ok[i] = stay
            blocks.append(ok)
        if not blocks:
            raise InputError("action masks need at least one discrete action column", "shield")
        return np.concatenate(blocks, axis=1)

    # --- projection --------------------------------------------------------------------------
    def project(self, obs: np.ndarray, actions: np.ndarray, advance: bool = True) -> np.ndarray:
        """The feasible actions nearest to ``actions``.

        Args:
            obs: (N, O) observations ``[profile.*, state.*]`` in spec order.
            actions: (N, A) proposed actions in spec units.
            advance: count this call as one step (migration history and clock); False to preview.

        Returns:
            (N, A) float64 actions that satisfy every rule (see the module docstring).
        """
        obs = np.atleast_2d(np.asarray(obs, float))
        proposed = np.atleast_2d(np.asarray(actions, float))
        n, a_dim = proposed.shape
        if obs.shape[0] != n or a_dim != len(self.act_cols) or obs.shape[1] != len(self.obs_cols):
            raise InputError(
                f"shield expects obs (N, {len(self.obs_cols)}) and actions (N, {len(self.act_cols)}), "
                f"got {obs.shape} and {proposed.shape}",
                "shield",
            )
        a = np.nan_to_num(proposed, nan=0.0, posinf=self.high.max(), neginf=self.low.min())
        a = np.clip(a, self.low, self.high)

        # discrete columns: nearest allowed value under residency, then the migration cap
        for j, vals in enumerate(self.values):
            if vals is None:
                continue
            ok = self._allowed(obs, j)
            dist = np.abs(a[:, j][:, None] - vals[None, :])
            a[:, j] = vals[np.argmin(np.where(ok, dist, np.inf), axis=1)]
            for m in self.config.migration:
                if self._act_idx[m.action] != j:
                    continue
                cur = self._current(obs, m, j)
                left = self._quota_left(n, m, j)
                moving = ~np.isnan(cur) & ~np.isclose(a[:, j], cur)
                cur_ok = np.array(
                    [
                        ok[i][np.isclose(vals, cur[i])].any() if not np.isnan(cur[i]) else False
                        for i in range(n)
                    ]
                )
                blocked = moving & (left <= 0) & cur_ok  # a residency breach must still move
                a[blocked, j] = cur[blocked]
                if advance:
                    self.stats["migrations_blocked"] += int(blocked.sum())
                    for k in np.flatnonzero(moving & ~blocked):
                        self._moves.setdefault((j, int(k)), deque()).append(self._now)
                    for i in range(n):
                        self._last[(j, i)] = a[i, j]

        # continuous columns: guards raise the lower bounds, budgets cap the sums
        lo = self.lower_bounds(obs)
        a = np.maximum(a, lo)
        a = self._project_budgets(obs, a, lo, advance)

        if advance:
            self._now += self.step_seconds
            self.stats["calls"] += 1
            self.stats["changed_rows"] += int((~np.isclose(a, proposed)).any(axis=1).sum())
        return a

    def _budget_rows(self, obs: np.ndarray, b: Budget) -> list[np.ndarray]:
        if b.group_by is None:
            return [np.arange(obs.shape[0])]
        g = obs[:, self._obs_idx[b.group_by]]
        return [np.flatnonzero(g == v) for v in np.unique(g)]

    def _limit(self, obs: np.ndarray, b: Budget, rows: np.ndarray) -> float:
        if b.limit is not None:
            base = float(b.limit)
        else:
            assert b.limit_column is not None  # _check: exactly one of limit / limit_column
            base = float(obs[rows, self._obs_idx[b.limit_column]].min())
        return base - b.per_row_offset * len(rows)

    def _project_budgets(self, obs: np.ndarray, a: np.ndarray, lo: np.ndarray, advance: bool) -> np.ndarray:
        budgets = self.config.budgets
        if not budgets:
            return a
        # (budget, rows, cols, coef, limit) blocks over the flattened continuous entries
        blocks = []
        for b in budgets:
            cols = np.array([self._act_idx[c] for c in b.coefficients])
            coef = np.array(list(b.coefficients.values()), float)
            for rows in self._budget_rows(obs, b):
                limit = self._limit(obs, b, rows)
                spec_lo = np.broadcast_to(self.low[cols], (len(rows), len(cols)))
                floor = float(np.sum(spec_lo * coef))
                if np.sum(lo[np.ix_(rows, cols)] * coef) > limit + 1e-12:
                    # guards cannot all hold within this budget: relax them towards the spec's
                    # bounds proportionally (the budget is physical; the guard is a preference)
                    s = max(0.0, (limit - floor)) / max(
                        np.sum((lo[np.ix_(rows, cols)] - spec_lo) * coef), 1e-300
                    )
                    lo[np.ix_(rows, cols)] = spec_lo + min(s, 1.0) * (lo[np.ix_(rows, cols)] - spec_lo)
                    if advance:
                        self.stats["guard_relaxed"] += 1
                blocks.append((rows, cols, coef, limit))
        hi = np.broadcast_to(self.high, a.shape)
        if len(blocks) == 1:
            rows, cols, coef, limit = blocks[0]
            idx = np.ix_(rows, cols)
            a[idx] = _project_box_halfspace(a[idx], lo[idx], hi[idx], coef[None, :], limit)
            return a
        # Dykstra's alternating projections onto each (box ∩ halfspace), then make sure
        y, incr = a.copy(), [np.zeros_like(a) for _ in blocks]
        for _ in range(50):
            prev = y
            for k, (rows, cols, coef, limit) in enumerate(blocks):
                idx = np.ix_(rows, cols)
                z = y + incr[k]
                p = z.copy()
                p[idx] = _project_box_halfspace(z[idx], lo[idx], hi[idx], coef[None, :], limit)
                incr[k] = z - p
                y = p
            if np.max(np.abs(y - prev)) < 1e-9:
                break
        for rows, cols, coef, limit in blocks:  # shrinking towards lo never breaks another budget
            idx = np.ix_(rows, cols)
            y[idx] = _shrink_to_budget(y[idx], lo[idx], coef[None, :], limit)
        return np.clip(y, lo, hi)


def _shrink_to_budget(x: np.ndarray, lo: np.ndarray, coef: np.ndarray, limit: float) -> np.ndarray:
    """Scale ``x - lo`` so that ``Σ coef x <= limit`` (assumes ``Σ coef lo <= limit``)."""
    used, floor = float(np.sum(coef * x)), float(np.sum(coef * lo))
    if used <= limit:
        return x
    s = max(0.0, limit - floor) / max(used - floor, 1e-300)
    out = lo + s * (x - lo)
    # rounding can leave the sum a hair above the limit: nudge down the largest entry
    excess = float(np.sum(coef * out)) - limit
    if excess > 0:
        k = np.unravel_index(np.argmax(coef * (out - lo)), out.shape)
        out[k] = max(lo[k], out[k] - excess / max(float(np.broadcast_to(coef, out.shape)[k]), 1e-300))
    return out


def _project_box_halfspace(
    y: np.ndarray, lo: np.ndarray, hi: np.ndarray, coef: np.ndarray, limit: float
) -> np.ndarray:
    """Euclidean projection of ``y`` onto ``{lo <= x <= hi, Σ coef x <= limit}`` (coef >= 0).

    KKT: ``x(λ) = clip(y - λ coef, lo, hi)`` with the smallest ``λ >= 0`` that meets the budget;
    ``Σ coef x(λ)`` falls monotonically in λ, so bisection finds it.
    """
    coef = np.broadcast_to(coef, y.shape)
    x = np.clip(y, lo, hi)
    if float(np.sum(coef * x)) <= limit:
        return x
    if float(np.sum(coef * lo)) >= limit:
        return lo.copy()
    lam_lo, lam_hi = 0.0, 1.0
    while float(np.sum(coef * np.clip(y - lam_hi * coef, lo, hi))) > limit:
        lam_hi *= 2.0
    for _ in range(100):
        if lam_hi - lam_lo <= 1e-12 * lam_hi:
            break
        mid = 0.5 * (lam_lo + lam_hi)
        if float(np.sum(coef * np.clip(y - mid * coef, lo, hi))) > limit:
            lam_lo = mid
        else:
            lam_hi = mid
    return _shrink_to_budget(np.clip(y - lam_hi * coef, lo, hi), lo, coef, limit)


def violations(shield: Shield, obs: np.ndarray, actions: np.ndarray, tol: float = 1e-7) -> list[str]:
    """Every rule that ``actions`` break (empty when feasible); the independent check the tests use.

    The migration cap is checked against the shield's present history, so call it before the
    ``project(..., advance=True)`` that would record the moves, or use ``advance=False``.
    """
    obs = np.atleast_2d(np.asarray(obs, float))
    a = np.atleast_2d(np.asarray(actions, float))
    out: list[str] = []
    scale = 1.0 + np.abs(a)
    if (a < shield.low - tol * scale).any() or (a > shield.high + tol * scale).any():
        out.append("bounds")
    for j, vals in enumerate(shield.values):
        if vals is None:
            continue
        if not np.isin(a[:, j], vals).all():
            out.append(f"values:{shield.act_cols[j]}")
        ok = shield._allowed(obs, j)
        hit = (a[:, j][:, None] == vals[None, :]) & ok
        if not hit.any(axis=1).all():
            out.append(f"residency:{shield.act_cols[j]}")
    for m in shield.config.migration:
        j = shield._act_idx[m.action]
        vals_j = shield.values[j]
        assert vals_j is not None  # _check: a migration cap is on a discrete action
        cur = shield._current(obs, m, j)
        moving = ~np.isnan(cur) & ~np.isclose(a[:, j], cur)
        cur_ok = np.array(
            [
                not np.isnan(cur[i])
                and shield._allowed(obs[i : i + 1], j)[0][np.isclose(vals_j, cur[i])].any()
                for i in range(len(cur))
            ]
        )
        if (moving & cur_ok & (shield._quota_left(len(cur), m, j) <= 0)).any():
            out.append(f"migration:{m.action}")
    for b in shield.config.budgets:
        cols = np.array([shield._act_idx[c] for c in b.coefficients], dtype=np.intp)
        coef = np.array(list(b.coefficients.values()))
        for rows in shield._budget_rows(obs, b):
            limit = shield._limit(obs, b, rows)
            floor = float(np.sum(shield.low[cols] * coef)) * len(rows)
            used = float(np.sum(a[np.ix_(rows, cols)] * coef))
            if used > max(limit, floor) + tol * (1.0 + abs(limit)):
                out.append(f"budget:{b.name}")
    return out


# ------------------------------------------------------------------------------------- wrappers


class ShieldWrapper(gym.Wrapper):
    """Applies a :class:`Shield` to a per-agent gymnasium env (observation ``(O,)``, action ``(A,)``).

    Wrap it *inside* any action rescaling, so that the shield sees spec units. ``info["shield"]``
    says whether the action was changed and by how much (L2 distance); ``action_masks()`` is what
    sb3-contrib's MaskablePPO asks for.
    """

    def __init__(self, env: gym.Env, shield: Shield) -> None:
        super().__init__(env)
        self.shield = shield
        self._obs: np.ndarray | None = None

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self.shield.reset()
        self._obs = np.asarray(obs, float)
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        assert self._obs is not None, "reset() first"
        raw = np.asarray(action, float).reshape(1, -1)
        safe = self.shield.project(self._obs[None, :], raw)[0]
        space = self.env.action_space
        obs, reward, terminated, truncated, info = self.env.step(
            safe.astype(space.dtype) if isinstance(space, gym.spaces.Box) else safe
        )
        self._obs = np.asarray(obs, float)
        info = dict(info)
        info["shield"] = {
            "changed": bool(not np.allclose(raw[0], safe)),
            "distance": float(np.linalg.norm(raw[0] - safe)),
        }
        return obs, reward, terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        assert self._obs is not None, "reset() first"
        return self.shield.action_masks(self._obs[None, :])[0]


class ShieldVecEnvWrapper(VecEnvWrapper):
    """Applies a :class:`Shield` across the sub-envs of an SB3 VecEnv (row i = sub-env i).

    With one sub-env per service group, budgets such as a site's capacity bind across agents.
    """

    def __init__(self, venv: VecEnv, shield: Shield) -> None:
        super().__init__(venv)
        self.shield = shield
        self._obs: np.ndarray | None = None

    def reset(self) -> VecEnvObs:
        obs = self.venv.reset()
        self.shield.reset()
        self._obs = np.asarray(obs, float)
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        assert self._obs is not None, "reset() first"
        self.venv.step_async(
            self.shield.project(self._obs, np.asarray(actions, float).reshape(self.num_envs, -1))
        )

    def step_wait(self) -> Any:
        obs, rewards, dones, infos = self.venv.step_wait()
        self._obs = np.asarray(obs, float)
        return obs, rewards, dones, infos

    def action_masks(self) -> np.ndarray:
        assert self._obs is not None, "reset() first"
        return self.shield.action_masks(self._obs)
