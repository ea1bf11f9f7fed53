"""The twin spec: what each column of a log means, its bounds, the transition and the reward.

A spec is a small TOML file that travels with a log (``LOG.spec.toml`` beside it, or ``--spec``)::

    name = "emulated-edge"
    step_seconds = 300.0

    [[features]]
    name = "profile.mean_task_s"
    kind = "heavy_tailed"          # continuous | heavy_tailed | discrete | categorical | binary
    low = 0.05
    high = 3600.0

    [[features]]
    name = "profile.priority"
    kind = "discrete"
    values = [1, 2, 3]

    [[features]]
    name = "state.site_backlog_s"
    scope = "site"                 # one value per site and tick (default "agent")

    [[features]]
    name = "kpi.revenue"
    better = "higher"              # what the operator wants of an outcome: the gate, the canary's
    margin = 0.02                  # guard and its verdict guard it, at this relative margin

    [[dynamics]]                   # optional: declared columns are computed, not learned
    column = "state.site_backlog_s"
    queue = { arrivals = "sum(kpi.edge_cpu) / profile.site_vcpu", service = "1" }

    [transition]                   # optional: absent -> the twin learns the next state
    function = "mypkg.dynamics:next_state"

    [reward]                       # weighted sum of columns, or a function
    weights = { "response.offload_ratio" = 1.0, "kpi.slo_violation" = -0.5 }
    # function = "mypkg.rewards:reward"

The role of a feature is its column prefix (``profile.``, ``state.``, ``action.``, ``response.``,
``kpi.``); the order of ``[[features]]`` within a role is the order of the observation and action
vectors everywhere (``[profile.*, state.*]`` -> ``action.*``). ``[[dynamics]]`` is
`edgetwin.contract.dynamics`.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tomli_w

from edgetwin.contract.dynamics import Declaration, DeclaredDynamics
from edgetwin.contract.errors import InputError
from edgetwin.contract.functions import resolve_function_ref

Role = Literal["profile", "state", "action", "response", "kpi"]
ROLES: tuple[Role, ...] = ("profile", "state", "action", "response", "kpi")
Kind = Literal["continuous", "heavy_tailed", "discrete", "categorical", "binary"]
KINDS: tuple[Kind, ...] = ("continuous", "heavy_tailed", "discrete", "categorical", "binary")
Scope = Literal["agent", "site"]
SCOPES: tuple[Scope, ...] = ("agent", "site")

#: Columns every log has: the row key and the agent's metadata.
KEY_COLUMNS: tuple[str, ...] = ("episode", "t", "agent")
META_COLUMNS: tuple[str, ...] = ("scenario", "site")
REWARD_COLUMN = "reward"
#: Optional: the id of the policy that made the row's decision (a registry version, ``logging``, a
#: canary arm). With several policies in one log, response models can tell the system's laws from a
#: scheduler's habits (the causal twin); without it a log is read as one unknown logging policy.
POLICY_COLUMN = "policy"
#: Optional: the probability (all ``action.*`` features discrete) or density (any continuous) of the
#: row's logged action under its policy, where known; empty where not known.
PROPENSITY_COLUMN = "propensity"
#: The provenance columns: who decided, and how likely that decision was. Recognised by exact name
#: (no role prefix, so `role_of` gives None and no spec lists them); never features.
PROVENANCE_COLUMNS: tuple[str, ...] = (POLICY_COLUMN, PROPENSITY_COLUMN)

#: ``fn(state (N,S), action (N,A), response (N,R)) -> next_state (N,S)``, arrays in spec order.
TransitionFn = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
#: ``fn(columns: {name: (N,) array}) -> reward (N,)``; columns are every feature of the step.
RewardFn = Callable[[Mapping[str, np.ndarray]], np.ndarray]


def role_of(column: str) -> Role | None:
    """The role of a column from its prefix, or None for key, meta and reward columns."""
    prefix, _, rest = column.partition(".")
    if rest and prefix in ROLES:
        return prefix  # type: ignore[return-value]
    return None


@dataclass(frozen=True)
class Feature:
    """One typed column of the log.

    Attributes:
        name: full column name, e.g. ``"profile.mean_task_s"``.
        kind: how it is distributed; generative models transform it accordingly.
        low, high: inclusive bounds, or None when unbounded on that side.
        values: the allowed values of a ``discrete``/``categorical`` feature (numeric codes).
        unit: free text for documentation and plots.
        scope: ``"agent"`` (default) or ``"site"``: one value per site (and tick, for a state),
            the same for every agent of the site; only ``profile.*`` and ``state.*`` features.
        better: ``"higher"`` / ``"lower"`` / None: the direction the operator wants an outcome
            (``response.*``, ``kpi.*``) to move, whether or not the reward weighs it. A KPI with a
            direction is guarded by the gate, the canary's guard and its verdict.
        margin: the relative worsening the operator accepts on it (0.05 = 5 %; None: the gate's
            default margin); only with ``better``.
    """

    name: str
    kind: Kind = "continuous"
    low: float | None = None
    high: float | None = None
    values: tuple[float, ...] | None = None
    unit: str = ""
    scope: Scope = "agent"
    better: str | None = None
    margin: float | None = None

    @property
    def role(self) -> Role:
        role = role_of(self.name)
        assert role is not None, self.name  # guaranteed by TwinSpec.__post_init__
        return role

    @property
    def short(self) -> str:
        """The name without its role prefix."""
        return self.name.partition(".")[2]

    @property
    def is_discrete(self) -> bool:
        return self.kind in ("discrete", "categorical", "binary")

    def allowed_values(self) -> tuple[float, ...] | None:
        if self.kind == "binary":
            return (0.0, 1.0)
        return self.values


@dataclass(frozen=True)
class TwinSpec:
    """Roles, kinds and bounds of a log's columns, plus how the next state and the reward follow.

    Attributes:
        features: typed columns; their order within a role is the vector order everywhere.
        name: a name for humans.
        step_seconds: simulated seconds per step ``t`` (used for time-of-day plots).
        transition: ``"module:function"`` of the known next-state dynamics, or None (learned).
        reward_weights: the built-in reward: ``sum(w * column)`` over the named columns.
        reward_function: ``"module:function"`` computing the reward instead (see `RewardFn`).
        scenarios: the scenario labels, when known in advance (checked by validation).
        dynamics: the declared state columns (``[[dynamics]]``), computed instead of learned.
    """

    features: tuple[Feature, ...]
    name: str = "unnamed"
    step_seconds: float = 1.0
    transition: str | None = None
    reward_weights: Mapping[str, float] = field(default_factory=dict)
    reward_function: str | None = None
    scenarios: tuple[str, ...] | None = None
    dynamics: tuple[Declaration, ...] = ()

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for f in self.features:
            if role_of(f.name) is None:
                raise InputError(
                    f"feature {f.name!r} must start with one of {', '.join(r + '.' for r in ROLES)}",
                    "spec",
                )
            if f.kind not in KINDS:
                raise InputError(f"feature {f.name!r}: kind {f.kind!r} is not one of {KINDS}", "spec")
            if f.kind in ("discrete", "categorical") and not f.values:
                raise InputError(f"feature {f.name!r}: kind {f.kind!r} needs 'values'", "spec")
            for side, bound in (("low", f.low), ("high", f.high)):
                if bound is not None and not np.isfinite(bound):
                    # NaN would switch the bound check off without a word; inf means "no bound": omit it
                    raise InputError(
                        f"feature {f.name!r}: {side} = {bound} is not a finite number (omit it for no bound)",
                        "spec",
                    )
            if f.values is not None and not all(np.isfinite(v) for v in f.values):
                raise InputError(f"feature {f.name!r}: 'values' must be finite numbers, got {list(f.values)}", "spec")
            if f.low is not None and f.high is not None and f.low > f.high:
                raise InputError(f"feature {f.name!r}: low {f.low} > high {f.high}", "spec")
            if f.name in seen:
                raise InputError(f"feature {f.name!r} is listed twice", "spec")
            if f.scope not in SCOPES:
                raise InputError(f"feature {f.name!r}: scope {f.scope!r} is not one of {SCOPES}", "spec")
            if f.scope == "site" and f.role not in ("profile", "state"):
                raise InputError(f"feature {f.name!r}: only profile.* and state.* features can have scope 'site'", "spec")
            if f.better is not None and (f.better not in ("higher", "lower") or f.role not in ("response", "kpi")):
                raise InputError(f"feature {f.name!r}: better = {f.better!r}: 'higher' or 'lower', on response.* and "
                                 "kpi.* features only", "spec")  # fmt: skip
            if f.margin is not None and (f.better is None or not (0.0 <= f.margin < 10.0)):
                raise InputError(f"feature {f.name!r}: margin = {f.margin!r} needs a direction (better) and a relative "
                                 "worsening in [0, 10)", "spec")  # fmt: skip
            seen.add(f.name)
        for col in self.reward_weights:
            if col not in seen and col != REWARD_COLUMN:
                raise InputError(f"reward weight names {col!r}, which is not a feature", "spec")
        for key, ref in (("transition", self.transition), ("reward function", self.reward_function)):
            if ref is not None and not isinstance(ref, str):
                raise InputError(f"{key} must be a 'module:function' string, got {ref!r}", "spec")
        if self.reward_weights and self.reward_function:
            raise InputError("reward: give either 'weights' or 'function', not both", "spec")
        if not self.by_role("action"):
            raise InputError("a spec needs at least one action.* feature", "spec")
        known: dict[str, Scope] = {f.name: f.scope for f in self.features}
        known[REWARD_COLUMN] = "agent"
        declared: set[str] = set()
        for i, d in enumerate(self.dynamics, start=1):
            d.check(known, i)
            if d.column in declared:
                raise InputError(f"[[dynamics]] entry {i}: {d.column!r} is declared twice", "spec")
            declared.add(d.column)

    # --- views -------------------------------------------------------------------------------
    def by_role(self, role: Role) -> tuple[Feature, ...]:
        return tuple(f for f in self.features if f.role == role)

    def names(self, role: Role) -> list[str]:
        return [f.name for f in self.by_role(role)]

    @property
    def observation_columns(self) -> list[str]:
        """What a platform policy sees per agent: ``[profile.*, state.*]`` in spec order."""
        return self.names("profile") + self.names("state")

    @property
    def action_columns(self) -> list[str]:
        return self.names("action")

    def discrete_actions(self) -> bool:
        """True when every ``action.*`` feature is discrete, categorical or binary.

        Then an action has a probability and ``propensity`` is at most 1; with any continuous action
        feature, ``propensity`` is a density (w.r.t. counting measure on the discrete features times
        Lebesgue measure on the continuous ones) and can exceed 1.
        """
        return all(f.is_discrete for f in self.by_role("action"))

    def feature(self, name: str) -> Feature:
        for f in self.features:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def declared_columns(self) -> list[str]:
        """The state columns the spec's ``[[dynamics]]`` compute (not learned), in spec order."""
        return [d.column for d in self.dynamics]

    def site_scoped(self, role: Role) -> list[bool]:
        """Per feature of ``role`` (spec order), whether it is declared ``scope = "site"``."""
        return [f.scope == "site" for f in self.by_role(role)]

    def declared_dynamics(self) -> DeclaredDynamics | None:
        """The ``[[dynamics]]`` ready to apply, or None when the spec declares none."""
        if not self.dynamics:
            return None
        bounds = {d.column: (self.feature(d.column).low, self.feature(d.column).high) for d in self.dynamics}
        return DeclaredDynamics(tuple(self.dynamics), float(self.step_seconds), bounds)

    def bounds(self, role: Role) -> tuple[np.ndarray, np.ndarray]:
        """(low, high) arrays of a role's features; unbounded sides are -inf / +inf."""
        feats = self.by_role(role)
        low = np.array([-np.inf if f.low is None else f.low for f in feats], dtype=np.float64)
        high = np.array([np.inf if f.high is None else f.high for f in feats], dtype=np.float64)
        return low, high

    # --- callables named by the spec ------------------------------------------------------------
    def transition_fn(self) -> TransitionFn | None:
        return None if self.transition is None else _import_callable(self.transition, "transition")

    def reward_fn(self) -> RewardFn:
        """The reward as a function of a step's columns ``{name: (N,) array}`` -> ``(N,)``."""
        if self.reward_function is not None:
            return _import_callable(self.reward_function, "reward")
        weights = dict(self.reward_weights)

        def weighted(columns: Mapping[str, np.ndarray]) -> np.ndarray:
            n = len(next(iter(columns.values())))
            total = np.zeros(n, dtype=np.float64)
            for col, w in weights.items():
                total += w * np.asarray(columns[col], dtype=np.float64)
            return total

        return weighted

    # --- persistence ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "step_seconds": float(self.step_seconds)}
        if self.scenarios is not None:
            out["scenarios"] = list(self.scenarios)
        feats = []
        for f in self.features:
            d: dict[str, Any] = {"name": f.name, "kind": f.kind}
            if f.low is not None:
                d["low"] = float(f.low)
            if f.high is not None:
                d["high"] = float(f.high)
            if f.values is not None:
                d["values"] = [float(v) for v in f.values]
            if f.unit:
                d["unit"] = f.unit
            if f.scope != "agent":
                d["scope"] = f.scope
            if f.better is not None:
                d["better"] = f.better
            if f.margin is not None:
                d["margin"] = float(f.margin)
            feats.append(d)
        out["features"] = feats
        if self.dynamics:
            out["dynamics"] = [dict(d.raw) for d in self.dynamics]
        if self.transition:
            out["transition"] = {"function": self.transition}
        reward: dict[str, Any] = {}
        if self.reward_weights:
            reward["weights"] = {k: float(v) for k, v in self.reward_weights.items()}
        if self.reward_function:
            reward["function"] = self.reward_function
        if reward:
            out["reward"] = reward
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "spec") -> TwinSpec:
        try:
            return cls._from_dict(d, source)
        except InputError:
            raise
        except (TypeError, ValueError, AttributeError) as e:  # a value of the wrong TOML type
            raise InputError(f"malformed spec ({type(e).__name__}: {e})", source) from None

    @classmethod
    def _from_dict(cls, d: Mapping[str, Any], source: str) -> TwinSpec:
        try:
            raw_feats = d["features"]
        except KeyError:
            raise InputError("no [[features]] table", source) from None
        feats = []
        for i, fd in enumerate(raw_feats):
            if "name" not in fd:
                raise InputError(f"[[features]] entry {i + 1} has no 'name'", source)
            unknown = set(fd) - {"name", "kind", "low", "high", "values", "unit", "scope", "better", "margin"}
            if unknown:
                raise InputError(f"feature {fd['name']!r}: unknown keys {sorted(unknown)}", source)
            values = fd.get("values")
            feats.append(
                Feature(
                    name=str(fd["name"]),
                    kind=fd.get("kind", "continuous"),
                    low=None if fd.get("low") is None else float(fd["low"]),
                    high=None if fd.get("high") is None else float(fd["high"]),
                    values=None if values is None else tuple(float(v) for v in values),
                    unit=str(fd.get("unit", "")),
                    scope=fd.get("scope", "agent"),
                    better=None if fd.get("better") is None else str(fd["better"]),
                    margin=None if fd.get("margin") is None else float(fd["margin"]),
                )
            )
        raw_dyn = d.get("dynamics", [])
        if not isinstance(raw_dyn, list):
            raise InputError("'dynamics' must be an array of tables ([[dynamics]])", source)
        reward = d.get("reward", {})
        transition = d.get("transition", {})
        scen = d.get("scenarios")
        try:
            dynamics = tuple(Declaration.parse(entry, i) for i, entry in enumerate(raw_dyn, start=1))
            return cls(
                features=tuple(feats),
                name=str(d.get("name", "unnamed")),
                step_seconds=float(d.get("step_seconds", 1.0)),
                transition=transition.get("function"),
                reward_weights={str(k): float(v) for k, v in reward.get("weights", {}).items()},
                reward_function=reward.get("function"),
                scenarios=None if scen is None else tuple(str(s) for s in scen),
                dynamics=dynamics,
            )
        except InputError as e:
            raise InputError(str(e).removeprefix("spec: "), source) from None

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(tomli_w.dumps(self.to_dict()))
        return path

    @classmethod
    def load(cls, path: str | Path) -> TwinSpec:
        path = Path(path)
        if not path.is_file():
            raise InputError("spec file not found", str(path))
        try:
            d = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise InputError(f"not valid TOML ({e})", str(path)) from None
        except UnicodeDecodeError as e:
            raise InputError(f"not UTF-8 text (byte {e.start + 1})", str(path)) from None
        except OSError as e:
            raise InputError(f"cannot read the spec ({e.strerror or e})", str(path)) from None
        return cls.from_dict(d, source=str(path))

    def hash(self) -> str:
        """A stable short hash of the spec's content (policies and twins carry it)."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @classmethod
    def infer(cls, columns: Iterable[str], name: str = "inferred") -> TwinSpec:
        """A spec with every role column continuous and unbounded (used when none is given)."""
        feats = tuple(Feature(name=c) for c in columns if role_of(c) is not None)
        return cls(features=feats, name=name)


def spec_path_for(log_path: str | Path) -> Path:
    """Where the spec of a log lives by convention: ``logs.parquet`` -> ``logs.spec.toml``."""
    p = Path(log_path)
    return p.with_name(p.name.split(".")[0] + ".spec.toml")


def function_refs(spec: TwinSpec) -> list[tuple[str, str]]:
    """``(entry, "module:function")`` of every function reference of a spec, for validation."""
    refs = []
    if spec.transition is not None:
        refs.append(("[transition] function", spec.transition))
    if spec.reward_function is not None:
        refs.append(("[reward] function", spec.reward_function))
    return refs


def _import_callable(ref: str, what: str) -> Any:
    return resolve_function_ref(ref, entry=f"{what} function")
