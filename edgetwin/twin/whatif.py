"""What-if replays: run policies through a twin under composable scenario perturbations.

A *scenario* is a list of perturbations applied, in order, to the columns of a simulated tick.
Because the twin is generic, every perturbation names the column it acts on (the system's own
names, from its spec), so the same engine serves any system that writes the log contract::

    [[perturbation]]                       # an arrival burst at one site
    kind = "burst"
    column = "response.demand"
    factor = 3
    start = 20                             # steps [start, end) of the episode
    end = 40
    sites = ["edge-ams"]

    [[perturbation]]                       # link degradation everywhere, all episode long
    kind = "scale"
    column = "state.rtt_edge_ms"
    factor = 2

Kinds (`KINDS`): ``scale`` (× ``factor``), ``burst`` (× ``factor`` over a required window),
``add`` (+ ``value``), ``set`` (= ``value``), ``failure`` (= ``value``, default 0: a capacity or
availability column of a site goes to zero), ``clip`` (to ``[low, high]``: e.g. fewer nodes cap
an allocation), ``jitter`` (+ N(0, ``std``) or × (1 + N(0, ``cv``))), ``shift_time`` (``hours``
added to the twin's clock and to an optional time-of-day column whose bounds span one day) and
``population_shift`` (a profile column × ``factor`` and/or a new scenario mix
``scenario_weights``). Any perturbation may be limited to ``sites``, agent ``scenarios`` and a
window ``start``/``end``.

Where a perturbation acts follows the column's role: ``profile.*`` and ``state.*`` change what
the policy and the twin see at the start of the tick, ``action.*`` what the platform did (after
the policy acted), ``response.*``, ``kpi.*`` and ``reward`` what the twin answered (the site
means that the next tick's responses depend on see the perturbed values too). A perturbed state
is an exogenous condition, not a new trajectory: after the tick, the perturbation is undone where
it can be (scale, add, jitter) so that it does not compound, while ``set``/``failure``/``clip``
leave the column where the twin took it from the forced value.

Two ways to run (`run_whatif`):

* **generated**: fresh populations from the twin's population model, initial states from its
  logged first ticks (`Twin.simulation`);
* **counterfactual replay** (`LoggedEpisode`, from a log): each recorded episode's agents, sites,
  profiles and first states come from the log; the policy is swapped and the responses come from
  the twin. Built-in policy ``"logged"`` replays the log's own actions; columns named
  ``exogenous`` follow the log at every tick (traffic the policy cannot change, e.g. the clock or
  grid carbon intensity).

Every (policy, scenario) cell runs each replicate world with every ensemble member, the same
worlds and response noise for every policy and scenario (paired comparisons). KPIs are reported
with 95 % intervals from a two-level bootstrap over members and replicates, so the ensemble's
disagreement widens them; every number also carries the share of its agent-steps that lie outside
the logs' support (`Twin.support`), and is flagged when that share exceeds ``oos_tolerance``.
"""

from __future__ import annotations

import contextlib
import json
import math
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from edgetwin.contract.errors import InputError
from edgetwin.contract.policy import PlatformPolicy, RandomPolicy
from edgetwin.contract.spec import REWARD_COLUMN, TwinSpec, role_of
from edgetwin.imitation.world import World

#: Perturbation kinds and the keys each one takes (besides the common ones).
KINDS: dict[str, tuple[str, ...]] = {
    "scale": ("factor",),
    "burst": ("factor",),
    "add": ("value",),
    "set": ("value",),
    "failure": ("value",),
    "clip": ("low", "high"),
    "jitter": ("std", "cv"),
    "shift_time": ("hours", "period"),
    "population_shift": ("factor", "scenario_weights"),
}
COMMON_KEYS = ("kind", "column", "start", "end", "sites", "scenarios", "label")
#: Kinds that act for the whole episode (no window, no site filter).
EPISODE_KINDS = ("shift_time", "population_shift")
#: Roles whose columns a tick-level perturbation may act on (``reward`` counts as an output).
OUTPUT_ROLES = ("response", "kpi")
#: KPI statistics (`KpiDef.stat`).
STATS = ("mean", "sum", "ratio", "p50", "p90", "p95", "p99", "max")
#: Built-in policy names the engine resolves itself (others: `edgetwin.policies.gate.resolve_policy`).
BUILTIN_POLICIES = ("logging", "logged", "random")
DAY_HOURS = 24.0


# ------------------------------------------------------------------------------------ scenarios
@dataclass(frozen=True)
class Perturbation:
    """One change to a column of the simulated ticks (see the module docstring for the kinds).

    Attributes:
        kind: one of `KINDS`.
        column: the column acted on (``profile.*``, ``state.*``, ``action.*``, ``response.*``,
            ``kpi.*`` or ``reward``); optional for ``shift_time`` and ``population_shift``.
        factor, value, low, high, std, cv, hours, period: the kind's parameters.
        start, end: the window ``[start, end)`` in steps of the episode (None: from the start /
            to the end).
        sites, scenarios: act only on agents of these sites / scenarios (None: all).
        scenario_weights: the new scenario mix of a ``population_shift`` (normalised).
        label: a name for reports.
        where: the file and entry it came from (error messages).
    """

    kind: str
    column: str | None = None
    factor: float | None = None
    value: float | None = None
    low: float | None = None
    high: float | None = None
    std: float | None = None
    cv: float | None = None
    hours: float | None = None
    period: float | None = None
    start: int | None = None
    end: int | None = None
    sites: tuple[str, ...] | None = None
    scenarios: tuple[str, ...] | None = None
    scenario_weights: Mapping[str, float] | None = None
    label: str = ""
    where: str = "perturbation"

    def __post_init__(self) -> None:
        # built in code as well as from files: either way a kind's missing parameter is an input error
        if self.kind not in KINDS:
            raise InputError(f"key 'kind': unknown kind {self.kind!r}; expected one of {sorted(KINDS)}", self.where)
        self._check_kind()

    @property
    def role(self) -> str | None:
        if self.column is None:
            return None
        return "output" if self.column == REWARD_COLUMN else role_of(self.column)

    def describe(self) -> str:
        if self.label:
            return self.label
        parts = [self.kind]
        if self.column:
            parts.append(self.column)
        for key in ("factor", "value", "low", "high", "std", "cv", "hours"):
            v = getattr(self, key)
            if v is not None:
                parts.append(f"{key}={v:g}")
        if self.scenario_weights:
            parts.append("mix=" + ",".join(f"{k}:{v:g}" for k, v in self.scenario_weights.items()))
        if self.start is not None or self.end is not None:
            parts.append(f"t∈[{self.start or 0},{'end' if self.end is None else self.end})")
        if self.sites:
            parts.append("sites=" + ",".join(self.sites))
        if self.scenarios:
            parts.append("scenarios=" + ",".join(self.scenarios))
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if v is not None and k != "where" and v != ""}
        for k in ("sites", "scenarios"):
            if k in d:
                d[k] = list(d[k])
        if "scenario_weights" in d:
            d["scenario_weights"] = dict(d["scenario_weights"])
        return d

    def active(self, t: int) -> bool:
        return (self.start is None or t >= self.start) and (self.end is None or t < self.end)

    # --- validation -----------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> Perturbation:
        """Parse one ``[[perturbation]]`` entry; raises `InputError` naming ``where`` and the key."""
        if not isinstance(d, Mapping):
            raise InputError(f"expected a table of keys, got {type(d).__name__}", where)
        kind = d.get("kind")
        if kind not in KINDS:
            raise InputError(f"key 'kind': unknown kind {kind!r}; expected one of {sorted(KINDS)}", where)
        allowed = set(COMMON_KEYS) | set(KINDS[kind])
        unknown = sorted(set(d) - allowed)
        if unknown:
            raise InputError(f"unknown key(s) {unknown} for kind {kind!r}; allowed: {sorted(allowed)}", where)

        def num(key: str, *, lo: float | None = None, strict: bool = False) -> float | None:
            if key not in d or d[key] is None:
                return None
            v = d[key]
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(float(v)):
                raise InputError(f"key {key!r}: expected a finite number, got {v!r}", where)
            if lo is not None and (float(v) <= lo if strict else float(v) < lo):
                raise InputError(f"key {key!r}: expected {'>' if strict else '>='} {lo:g}, got {v!r}", where)
            return float(v)

        def step(key: str) -> int | None:
            if key not in d or d[key] is None:
                return None
            v = d[key]
            if isinstance(v, bool) or not isinstance(v, int | float) or float(v) != int(v) or v < 0:
                raise InputError(f"key {key!r}: expected a step index >= 0, got {v!r}", where)
            return int(v)

        def names(key: str) -> tuple[str, ...] | None:
            if key not in d or d[key] is None:
                return None
            v = d[key]
            if isinstance(v, str):
                v = [v]
            if not isinstance(v, list | tuple) or not v or not all(isinstance(s, str) and s for s in v):
                raise InputError(f"key {key!r}: expected a non-empty list of names, got {v!r}", where)
            return tuple(v)

        column = d.get("column")
        if column is not None and not isinstance(column, str):
            raise InputError(f"key 'column': expected a column name, got {column!r}", where)
        start, end = step("start"), step("end")
        if start is not None and end is not None and end <= start:
            raise InputError(f"keys 'start'/'end': empty window [{start}, {end})", where)
        p = cls(
            kind=kind,
            column=column,
            factor=num("factor", lo=0.0, strict=kind in ("burst", "population_shift")),
            value=num("value"),
            low=num("low"),
            high=num("high"),
            std=num("std", lo=0.0),
            cv=num("cv", lo=0.0),
            hours=num("hours"),
            period=num("period", lo=0.0, strict=True),
            start=start,
            end=end,
            sites=names("sites"),
            scenarios=names("scenarios"),
            scenario_weights=_weights(d.get("scenario_weights"), where),
            label=str(d.get("label", "")),
            where=where,
        )
        return p

    def _check_kind(self) -> None:
        w, k = self.where, self.kind
        if k in ("scale", "burst") and self.factor is None:
            raise InputError(f"key 'factor': kind {k!r} needs a factor (e.g. factor = 2)", w)
        if k == "burst" and (self.start is None or self.end is None):
            raise InputError("keys 'start'/'end': a burst needs a window (start = ..., end = ...)", w)
        if k in ("add", "set") and self.value is None:
            raise InputError(f"key 'value': kind {k!r} needs a value", w)
        if k == "clip":
            if self.low is None and self.high is None:
                raise InputError("keys 'low'/'high': a clip needs at least one bound", w)
            if self.low is not None and self.high is not None and self.low > self.high:
                raise InputError(f"keys 'low'/'high': low {self.low:g} > high {self.high:g}", w)
        if k == "jitter" and (self.std is None) == (self.cv is None):
            raise InputError(
                "keys 'std'/'cv': a jitter needs exactly one of std (absolute) or cv (relative)", w
            )
        if k == "shift_time" and self.hours is None:
            raise InputError("key 'hours': a shift_time needs hours (e.g. hours = 3)", w)
        if k == "population_shift":
            if self.factor is None and self.scenario_weights is None:
                raise InputError("keys 'factor'/'scenario_weights': a population_shift needs one of them", w)
            if self.factor is not None and self.column is None:
                raise InputError("key 'column': a population_shift with a factor needs a profile.* column", w)
            if self.column is not None and self.factor is None:
                raise InputError("key 'factor': a population_shift of a column needs a factor", w)
        if k in EPISODE_KINDS:
            for key in ("start", "end", "sites"):
                if getattr(self, key) is not None:
                    raise InputError(f"key {key!r}: kind {k!r} acts on the whole episode; remove {key!r}", w)
        elif self.column is None:
            raise InputError(f"key 'column': kind {k!r} needs the column it acts on", w)

    def check(
        self, spec: TwinSpec, columns: Sequence[str], steps: int | None, scenario_labels: Sequence[str]
    ) -> None:
        """Check against a twin: the column exists and may be perturbed this way, the window fits.

        Args:
            spec: the twin's spec.
            columns: the columns a simulated tick has (profile, state, action, outputs).
            steps: episode length, when known.
            scenario_labels: the twin's scenario labels.
        """
        w = self.where
        if self.column is not None:
            if self.column not in columns:
                raise InputError(
                    f"key 'column': unknown column {self.column!r}; the twin simulates {list(columns)}", w
                )
            role = self.role
            if self.kind == "population_shift" and role != "profile":
                raise InputError(
                    f"key 'column': a population_shift acts on profile.* columns, not {self.column!r}", w
                )
            if self.kind == "shift_time":
                if role not in ("state", "profile"):
                    raise InputError(
                        f"key 'column': shift_time acts on a time-of-day state column, not {self.column!r}", w
                    )
                f = spec.feature(self.column)
                if self.period is None and (f.low is None or f.high is None):
                    raise InputError(
                        f"key 'period': {self.column!r} has no finite bounds, so give the value that spans one day",
                        w,
                    )
        if steps is not None:
            for key in ("start", "end"):
                v = getattr(self, key)
                if v is not None and (v > steps or (key == "start" and v >= steps)):
                    raise InputError(
                        f"key {key!r}: window [{self.start}, {self.end}) is outside the episode of {steps} steps",
                        w,
                    )
        for key, given in (("scenarios", self.scenarios), ("scenario_weights", self.scenario_weights)):
            unknown = sorted(set(given or ()) - set(scenario_labels))
            if unknown:
                raise InputError(
                    f"key {key!r}: unknown scenario(s) {unknown}; the twin knows {list(scenario_labels)}", w
                )


def _weights(raw: Any, where: str) -> dict[str, float] | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or not raw:
        raise InputError(f"key 'scenario_weights': expected a table scenario -> weight, got {raw!r}", where)
    out = {}
    for k, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(float(v)) or v < 0:
            raise InputError(
                f"key 'scenario_weights': weight of {k!r} must be a number >= 0, got {v!r}", where
            )
        out[str(k)] = float(v)
    if sum(out.values()) <= 0:
        raise InputError("key 'scenario_weights': the weights must have a positive sum", where)
    return out


@dataclass(frozen=True)
class Scenario:
    """A named list of perturbations, applied in order (they compose)."""

    name: str
    perturbations: tuple[Perturbation, ...] = ()
    description: str = ""
    source: str = ""

    @property
    def is_nominal(self) -> bool:
        return not self.perturbations

    def episode_level(self) -> list[Perturbation]:
        return [p for p in self.perturbations if p.kind in EPISODE_KINDS]

    def tick_level(self, role: str) -> list[Perturbation]:
        """Perturbations applied at every tick to columns of ``role`` (a shift_time's clock column too)."""
        return [
            p
            for p in self.perturbations
            if p.role == role
            and (p.kind not in EPISODE_KINDS or (p.kind == "shift_time" and p.column is not None))
        ]

    def check(
        self, spec: TwinSpec, columns: Sequence[str], steps: int | None, scenario_labels: Sequence[str]
    ) -> None:
        for p in self.perturbations:
            p.check(spec, columns, steps, scenario_labels)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "perturbations": [p.to_dict() for p in self.perturbations],
        }


NOMINAL = Scenario("nominal", (), "No perturbation: the system as the twin learned it.")


def scenario_from_dict(d: Mapping[str, Any], source: str, default_name: str) -> Scenario:
    """One scenario from a parsed table ``{name?, description?, perturbation: [...]}``."""
    name = d.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise InputError(f"key 'name': expected a non-empty string, got {name!r}", source)
    unknown = sorted(set(d) - {"name", "description", "perturbation", "perturbations", "kpi"})
    if unknown:
        raise InputError(
            f"scenario {name!r}: unknown key(s) {unknown}; expected name, description, [[perturbation]]",
            source,
        )
    raw = d.get("perturbation", d.get("perturbations", []))
    if isinstance(raw, Mapping):
        raw = [raw]
    if not isinstance(raw, list):
        raise InputError(f"scenario {name!r}: 'perturbation' must be a list of tables", source)
    perts = tuple(
        Perturbation.from_dict(p, f"{source}: scenario {name!r} perturbation #{i + 1}")
        for i, p in enumerate(raw)
    )
    return Scenario(name, perts, str(d.get("description", "")), source)


def _read_doc(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise InputError("file not found", str(path))
    text = path.read_text()
    if path.suffix.lower() == ".json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"not valid JSON ({e})", str(path)) from None
    else:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise InputError(f"not valid TOML ({e}); JSON files need a .json suffix", str(path)) from None
    if not isinstance(doc, dict):
        raise InputError("expected a table / object at the top level", str(path))
    return doc


def load_scenarios(path: str | Path) -> list[Scenario]:
    """Scenarios of a TOML or JSON file: top-level ``[[perturbation]]`` (one scenario named after
    the file, or ``name = ...``), or several ``[[scenario]]`` tables each with its perturbations.

    Raises:
        InputError: unreadable file, unknown kind or key, bad value (naming file, entry and key).
    """
    path = Path(path)
    doc = _read_doc(path)
    src = str(path)
    if "scenario" in doc:
        if set(doc) - {"scenario", "kpi"}:
            raise InputError(
                f"a file with [[scenario]] tables may only also hold [[kpi]]; found {sorted(set(doc) - {'scenario', 'kpi'})}",
                src,
            )
        raw = doc["scenario"]
        if not isinstance(raw, list) or not raw:
            raise InputError("'scenario' must be a non-empty list of tables ([[scenario]])", src)
        out = [scenario_from_dict(s, src, f"{path.stem}-{i + 1}") for i, s in enumerate(raw)]
    else:
        out = [scenario_from_dict(doc, src, path.stem)]
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise InputError(f"scenario names must be unique, got {names}", src)
    return out


# ------------------------------------------------------------------------------------ KPIs
@dataclass(frozen=True)
class KpiDef:
    """A KPI computed from one episode's agent-steps.

    Attributes:
        name: how reports call it.
        column: the column it reads (an observation, action or output column, or ``reward``).
        stat: ``mean`` (over agent-steps, weighted by ``weight`` if given), ``sum`` (per agent:
            the episode total divided by the agents, e.g. the return), ``ratio`` (``Σ column /
            Σ weight``, e.g. energy per task), quantiles ``p50``..``p99`` (weighted), ``max``.
        weight: a column weighting the mean/quantiles, or the denominator of a ratio.
        better: ``"higher"``, ``"lower"`` or None (no direction: reported, never guarded).
        unit: for reports.
    """

    name: str
    column: str
    stat: str = "mean"
    weight: str | None = None
    better: str | None = None
    unit: str = ""

    def __post_init__(self) -> None:
        if self.stat not in STATS:
            raise InputError(f"KPI {self.name!r}: stat {self.stat!r} is not one of {STATS}", "kpi")
        if self.better not in (None, "higher", "lower"):
            raise InputError(
                f"KPI {self.name!r}: better must be 'higher' or 'lower', got {self.better!r}", "kpi"
            )
        if self.stat == "ratio" and self.weight is None:
            raise InputError(f"KPI {self.name!r}: a ratio needs a weight column (its denominator)", "kpi")

    @property
    def columns(self) -> list[str]:
        return [self.column] + ([self.weight] if self.weight else [])

    def compute(self, x: np.ndarray, w: np.ndarray | None) -> float:
        """The KPI of one episode: ``x``, ``w`` are ``(T, N)`` arrays of its agent-steps."""
        x = np.asarray(x, dtype=np.float64)
        ok = np.isfinite(x)
        if w is not None:
            w = np.maximum(np.nan_to_num(np.asarray(w, dtype=np.float64)), 0.0)
        if not ok.any():
            return float("nan")
        if self.stat == "sum":
            return float(np.nansum(x) / max(x.shape[-1], 1))
        if self.stat == "ratio":
            assert w is not None
            den = w[ok].sum()
            return float(x[ok].sum() / den) if den > 0 else float("nan")
        if self.stat == "max":
            return float(np.nanmax(x))
        xv, wv = x[ok], (None if w is None else w[ok])
        if self.stat == "mean":
            if wv is not None and wv.sum() > 0:
                return float(np.average(xv, weights=wv))
            return float(xv.mean())
        q = float(self.stat[1:]) / 100.0
        return weighted_quantile(xv, wv, q)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and v != ""}


def weighted_quantile(x: np.ndarray, w: np.ndarray | None, q: float) -> float:
    """The ``q`` quantile of ``x`` with non-negative weights ``w`` (plain quantile if None/zero)."""
    if w is None or w.sum() <= 0:
        return float(np.quantile(x, q))
    order = np.argsort(x, kind="stable")
    cw = np.cumsum(w[order])
    return float(x[order][min(int(np.searchsorted(cw, q * cw[-1], side="left")), len(x) - 1)])


def default_kpis(spec: TwinSpec, outputs: Sequence[str]) -> list[KpiDef]:
    """The mean of every output column, plus the return when there is a reward.

    Directions come from the spec's reward weights (a positive weight: higher is better); the
    reward and return are higher-is-better; other columns have no direction until a KPI file
    gives one.
    """
    weights = dict(spec.reward_weights)
    has_reward = bool(spec.reward_weights or spec.reward_function) or REWARD_COLUMN in outputs
    out = []
    for c in outputs:
        w = weights.get(c, 0.0)
        better = "higher" if (c == REWARD_COLUMN or w > 0) else ("lower" if w < 0 else None)
        unit = "" if c == REWARD_COLUMN else spec.feature(c).unit
        out.append(KpiDef(c, c, "mean", better=better, unit=unit))
    if has_reward:
        if REWARD_COLUMN not in outputs:
            out.append(KpiDef(REWARD_COLUMN, REWARD_COLUMN, "mean", better="higher"))
        out.append(KpiDef("return", REWARD_COLUMN, "sum", better="higher"))
    return out


def kpis_from_dicts(raw: Any, source: str) -> list[KpiDef]:
    """Parse ``[[kpi]]`` tables ``{name, column, stat?, weight?, better?, unit?}``."""
    if isinstance(raw, Mapping):
        raw = [raw]
    if not isinstance(raw, list):
        raise InputError("'kpi' must be a list of tables ([[kpi]])", source)
    out = []
    for i, d in enumerate(raw):
        where = f"{source}: kpi #{i + 1}"
        if not isinstance(d, Mapping) or "column" not in d:
            raise InputError(
                "a [[kpi]] needs at least 'column' (and usually 'name', 'stat', 'better')", where
            )
        unknown = sorted(set(d) - {"name", "column", "stat", "weight", "better", "unit"})
        if unknown:
            raise InputError(
                f"unknown key(s) {unknown}; allowed: name, column, stat, weight, better, unit", where
            )
        try:
            out.append(
                KpiDef(
                    name=str(d.get("name", d["column"])),
                    column=str(d["column"]),
                    stat=str(d.get("stat", "mean")),
                    weight=None if d.get("weight") is None else str(d["weight"]),
                    better=d.get("better"),
                    unit=str(d.get("unit", "")),
                )
            )
        except InputError as e:
            raise InputError(str(e).removeprefix("kpi: "), where) from None
    return out


def load_kpis(path: str | Path) -> list[KpiDef]:
    """``[[kpi]]`` tables of a TOML/JSON file (a scenario file may carry them too)."""
    path = Path(path)
    doc = _read_doc(path)
    if "kpi" not in doc:
        raise InputError("no [[kpi]] table", str(path))
    return kpis_from_dicts(doc["kpi"], str(path))


def merge_kpis(base: Sequence[KpiDef], extra: Sequence[KpiDef]) -> list[KpiDef]:
    """``base`` with ``extra`` added; an extra KPI with a base KPI's name replaces it."""
    names = {k.name for k in extra}
    return [k for k in base if k.name not in names] + list(extra)


# ------------------------------------------------------------------------------------ replay
@dataclass
class LoggedEpisode:
    """One recorded episode, ready to be replayed: who, where, from which state, what was done.

    Attributes:
        name: the episode's id in the log.
        agents: ``(N,)`` agent ids (those present at the first logged tick).
        scenario: ``(N,)`` scenario ids of the twin; site: ``(N,)`` site codes; site_names: names.
        profile: ``(N, P)``; state: ``(T, N, S)`` logged states (NaN where the agent is absent).
        action: ``(T, N, A)`` logged actions; t0: the first logged step.
        columns: ``(T, N)`` logged arrays of every column KPIs may read.
    """

    name: str
    agents: np.ndarray
    scenario: np.ndarray
    site: np.ndarray
    site_names: list[str]
    profile: np.ndarray
    state: np.ndarray
    action: np.ndarray
    t0: int
    columns: dict[str, np.ndarray]

    @property
    def steps(self) -> int:
        return int(self.state.shape[0])


def logged_episodes(
    log: pd.DataFrame, twin: Any, max_episodes: int | None = None, steps: int | None = None
) -> list[LoggedEpisode]:
    """Cut a (validated) log into `LoggedEpisode` s for counterfactual replay.

    Args:
        log: a table in the contract with the twin's columns.
        twin: the twin (its layout says which columns are which).
        max_episodes: replay at most this many episodes (the last ones: the most recent traffic).
        steps: cut episodes to this many steps.

    Raises:
        InputError: a column of the twin is missing, a scenario the twin does not know.
    """
    lay = twin.layout
    need = ["episode", "t", "agent", "scenario", "site", *lay.profile, *lay.state, *lay.action]
    missing = [c for c in need if c not in log.columns]
    if missing:
        raise InputError(f"the log lacks column(s) {missing} that the twin needs to replay it", "--log")
    scen_map = {s: i for i, s in enumerate(lay.scenarios)}
    names = list(pd.unique(log["episode"]))
    if max_episodes is not None:
        names = names[-int(max_episodes) :]
    kpi_cols = [c for c in dict.fromkeys([*lay.outputs, REWARD_COLUMN]) if c in log.columns]
    out = []
    for name in names:
        ep = log[log["episode"] == name].sort_values(["t", "agent"], kind="stable")
        t0 = int(ep["t"].min())
        first = ep[ep["t"] == t0]
        scen = first["scenario"].astype(str).map(scen_map)
        if scen.isna().any():
            bad = first["scenario"][scen.isna()].iloc[0]
            raise InputError(
                f"episode {name!r}: scenario {bad!r} is unknown to the twin ({lay.scenarios})", "--log"
            )
        agents = first["agent"].astype(str).to_numpy()
        site_codes, site_names = pd.factorize(first["site"].astype(str))
        t_max = int(ep["t"].max())
        n_t = t_max - t0 + 1 if steps is None else min(int(steps), t_max - t0 + 1)
        wide: dict[str, np.ndarray] = {}
        cols = list(dict.fromkeys([*lay.state, *lay.action, *kpi_cols, *lay.profile]))
        ep = ep[ep["t"] < t0 + n_t]
        idx = pd.MultiIndex.from_product([range(t0, t0 + n_t), agents], names=["t", "agent"])
        table = ep.assign(agent=ep["agent"].astype(str)).set_index(["t", "agent"])[cols]
        table = table[~table.index.duplicated()].reindex(idx)
        for c in cols:
            wide[c] = table[c].to_numpy(np.float64).reshape(n_t, len(agents))
        out.append(
            LoggedEpisode(
                name=str(name),
                agents=agents,
                scenario=scen.to_numpy(np.int64),
                site=site_codes.astype(np.int64),
                site_names=[str(s) for s in site_names],
                profile=first[lay.profile].to_numpy(np.float64),
                state=np.stack([wide[c] for c in lay.state], axis=-1)
                if lay.state
                else np.zeros((n_t, len(agents), 0)),
                action=np.stack([wide[c] for c in lay.action], axis=-1),
                t0=t0,
                columns={c: wide[c] for c in cols},
            )
        )
    if not out:
        raise InputError("the log has no episode to replay", "--log")
    return out


# ------------------------------------------------------------------------------------ policies
#: Builds the policy for one episode: ``(seed, member, scenario ids (N,)) -> PlatformPolicy``.
PolicyFactory = Callable[[int, int, np.ndarray], PlatformPolicy]


@dataclass
class PolicySpec:
    """A policy under test: its name in reports and how to build it per episode.

    ``factory`` is None for the built-in ``"logged"`` (replay the log's actions).
    """

    name: str
    factory: PolicyFactory | None


def builtin_policy(name: str, twin: Any) -> PolicySpec:
    """``"random"`` (uniform in the action bounds), ``"logging"`` (the twin's clone of the logging
    policy, sampling its spread, per scenario, from the acting member) or ``"logged"``."""
    if name == "random":
        return PolicySpec(name, lambda seed, member, scen: RandomPolicy(twin.spec, seed=seed))
    if name == "logging":
        from edgetwin.imitation.baselines import ClonedPlatformPolicy

        def clone(seed: int, member: int, scen: np.ndarray) -> PlatformPolicy:
            engines = twin.members[member].engines
            return ClonedPlatformPolicy(twin.layout, engines, scenario=scen, stochastic=True, seed=seed)

        return PolicySpec(name, clone)
    if name == "logged":
        return PolicySpec(name, None)
    raise InputError(f"unknown built-in policy {name!r}; expected one of {BUILTIN_POLICIES}", "--policy")


def fixed_policy(name: str, policy: PlatformPolicy) -> PolicySpec:
    """A policy object used as is in every episode (its ``reset()`` is called per episode)."""

    def same(seed: int, member: int, scen: np.ndarray) -> PlatformPolicy:
        if hasattr(policy, "reset"):
            policy.reset()
        return policy

    return PolicySpec(name, same)


# ------------------------------------------------------------------------------------ one episode
@dataclass
class EpisodeOutcome:
    """What one simulated episode gave: KPI values, per-step means, support shares."""

    kpis: dict[str, float]
    timeline: dict[str, np.ndarray]
    oos: float
    oos_t: np.ndarray


class _Masks:
    """Which agents each perturbation touches (site/scenario filters) in one world."""

    def __init__(
        self, scenario: np.ndarray, site: np.ndarray, site_names: Sequence[str], labels: Sequence[str]
    ) -> None:
        self.scenario, self.site = scenario, site
        self.site_names = list(site_names)
        self.labels = list(labels)

    def rows(self, p: Perturbation) -> np.ndarray:
        m = np.ones(len(self.scenario), dtype=bool)
        if p.sites is not None:
            codes = [i for i, s in enumerate(self.site_names) if s in p.sites]
            m &= np.isin(self.site, codes)
        if p.scenarios is not None:
            m &= np.isin(self.scenario, [self.labels.index(s) for s in p.scenarios])
        return m


class _Applier:
    """Applies the tick-level perturbations of one role to a ``(N, D)`` block of raw columns."""

    def __init__(
        self,
        perts: list[Perturbation],
        columns: Sequence[str],
        masks: _Masks,
        spec: TwinSpec,
        rng: np.random.Generator,
    ) -> None:
        self.items = [
            (p, list(columns).index(p.column)) for p in perts if p.column is not None and p.column in columns
        ]
        self.masks = masks
        self.spec = spec
        self.rng = rng
        # a shift_time's column is a clock: shifted by a share of its span, wrapping around
        self.clock = {
            id(p): _time_shift(p, spec, spec.step_seconds)[1:]
            for p, _ in self.items
            if p.kind == "shift_time"
        }

    def __bool__(self) -> bool:
        return bool(self.items)

    def apply(
        self, x: np.ndarray, t: int
    ) -> tuple[np.ndarray, list[tuple[Perturbation, int, np.ndarray, Any]]]:
        """Perturbed copy of ``x`` and what was done (for `undo`)."""
        x = x.copy()
        done = []
        for p, j in self.items:
            if not p.active(t):
                continue
            rows = self.masks.rows(p)
            if not rows.any():
                continue
            v = x[rows, j]
            aux: Any = None
            if p.kind in ("scale", "burst"):
                v = v * p.factor
            elif p.kind == "add":
                v = v + p.value
            elif p.kind in ("set", "failure"):
                v = np.full_like(v, 0.0 if p.value is None else p.value)
            elif p.kind == "clip":
                v = np.clip(v, -np.inf if p.low is None else p.low, np.inf if p.high is None else p.high)
            elif p.kind == "jitter":
                z = self.rng.standard_normal(len(v))
                if p.std is not None:
                    aux = z * p.std
                    v = v + aux
                else:
                    assert p.cv is not None  # _check_kind: a jitter has exactly one of std and cv
                    aux = 1.0 + p.cv * z
                    v = v * aux
            elif p.kind == "shift_time":
                delta, low, span = self.clock[id(p)]
                aux = (delta, low, span)
                v = low + np.mod(v - low + delta, span)
            x[rows, j] = v
            done.append((p, j, rows, aux))
        return x, done

    @staticmethod
    def undo(x: np.ndarray, done: list[tuple[Perturbation, int, np.ndarray, Any]]) -> np.ndarray:
        """Map a next state back to the unperturbed trajectory where the change is invertible."""
        x = x.copy()
        for p, j, rows, aux in reversed(done):
            if p.kind in ("scale", "burst") and p.factor and p.factor > 0:
                x[rows, j] = x[rows, j] / p.factor
            elif p.kind == "add":
                x[rows, j] = x[rows, j] - p.value
            elif p.kind == "shift_time":
                delta, low, span = aux
                x[rows, j] = low + np.mod(x[rows, j] - low - delta, span)
            elif p.kind == "jitter":
                if p.std is not None:
                    x[rows, j] = x[rows, j] - aux
                else:
                    safe = np.abs(aux) > 1e-6
                    sub = x[rows, j]
                    sub[safe] = sub[safe] / aux[safe]
                    x[rows, j] = sub
        return x


def _time_shift(p: Perturbation, spec: TwinSpec, step_seconds: float) -> tuple[int, float, float, float]:
    """``(ticks, column delta, low, span)`` of a shift_time."""
    hours = p.hours
    assert hours is not None  # _check_kind: a shift_time needs hours
    ticks = int(round(hours * 3600.0 / step_seconds)) if step_seconds > 0 else 0
    if p.column is None:
        return ticks, 0.0, 0.0, 1.0
    f = spec.feature(p.column)
    low = 0.0 if f.low is None else float(f.low)
    if p.period is not None:
        span = float(p.period)
    else:
        # Perturbation.check: without a period, the column has finite bounds
        assert f.low is not None and f.high is not None
        span = float(f.high) - float(f.low)
    return ticks, hours / DAY_HOURS * span, low, span


def run_episode(
    twin: Any,
    policy: PolicySpec,
    scenario: Scenario,
    kpis: Sequence[KpiDef],
    *,
    seed: int,
    member: int,
    steps: int | None = None,
    n_agents: int | None = None,
    stochastic: bool = True,
    logged: LoggedEpisode | None = None,
    exogenous: Sequence[str] = (),
    support_rows: int = 16,
) -> EpisodeOutcome:
    """Simulate one episode of ``policy`` under ``scenario`` and score it.

    Args:
        twin: the twin.
        policy: the policy (``"logged"`` needs ``logged``).
        scenario: the perturbations.
        kpis: what to compute.
        seed: world seed: population, initial states, response noise and jitter (shared by every
            policy and scenario given the same seed, so comparisons are paired).
        member: the ensemble member that answers.
        steps: ticks (default: the logged episode's length, else the twin's horizon).
        n_agents: agents of a generated world (default: one logged site unit's worth).
        stochastic: sample responses (else use their mean).
        logged: replay this recorded episode (its agents, sites, profiles, first states).
        exogenous: state columns that follow ``logged`` at every tick.
        support_rows: agent-steps per tick whose distance to the logs' support is measured.
    """
    from edgetwin.twin.twin import Simulation

    lay = twin.layout
    spec = twin.spec
    sim = Simulation(twin, n_agents=n_agents, seed=seed, stochastic=stochastic, member=member)
    rng = np.random.default_rng([seed, 7])  # perturbation noise and support sampling, apart from the twin's
    site_names: list[str]
    source = np.arange(sim.n)  # row of ``logged`` each agent copies (population shifts duplicate rows)
    if logged is not None:
        steps = logged.steps if steps is None else min(int(steps), logged.steps)
        scen, site, profile, state = (
            logged.scenario,
            logged.site,
            logged.profile.copy(),
            logged.state[0].copy(),
        )
        site_names = list(logged.site_names)
        source = np.arange(len(scen))
    else:
        steps = lay.horizon if steps is None else int(steps)
        w = sim.world
        scen, site, profile, state = w.scenario, w.site, w.profile.copy(), w.state.copy()
        site_names = list(sim.site_names)
    if policy.factory is None and logged is None:
        raise InputError("the policy 'logged' replays a log's actions: give a log (--log)", "--policy")

    # --- episode-level perturbations: population shifts and the clock ---------------------------
    shift_ticks = 0
    for p in scenario.episode_level():
        if p.kind == "population_shift":
            if p.scenario_weights is not None:
                scen, site, profile, state, source = _reweight(
                    twin, p, scen, site, profile, state, source, logged, rng
                )
            if p.factor is not None and p.column is not None:
                masks = _Masks(scen, site, site_names, lay.scenarios)
                rows = masks.rows(p)
                j = lay.profile.index(p.column)
                profile[rows, j] *= p.factor
        elif p.kind == "shift_time":  # the twin's clock here; its column, if any, at every tick
            shift_ticks += _time_shift(p, spec, spec.step_seconds)[0]
    profile = lay.scalers["profile"].legalise(profile)
    state = lay.scalers["state"].legalise(state)
    n_sites = int(site.max()) + 1 if len(site) else 0
    sim.place(
        World(
            lay,
            scen,
            site,
            profile,
            state,
            np.zeros((n_sites, lay.n_lag)),
            t=(logged.t0 if logged else 0) + shift_ticks,
        )
    )
    n = len(scen)

    masks = _Masks(scen, site, site_names, lay.scenarios)
    appliers = {
        "profile": _Applier(scenario.tick_level("profile"), lay.profile, masks, spec, rng),
        "state": _Applier(scenario.tick_level("state"), lay.state, masks, spec, rng),
        "action": _Applier(scenario.tick_level("action"), lay.action, masks, spec, rng),
        # the reward is an output when the twin predicts it; else it follows the (perturbed) outputs
        "output": _Applier(
            [
                p
                for p in scenario.perturbations
                if p.kind not in EPISODE_KINDS and p.role in (*OUTPUT_ROLES, "output")
            ],
            lay.outputs,
            masks,
            spec,
            rng,
        ),
        "reward": _Applier(
            [p for p in scenario.perturbations if p.role == "output" and not lay.predict_reward],
            [REWARD_COLUMN],
            masks,
            spec,
            rng,
        ),
    }
    exo = [lay.state.index(c) for c in exogenous] if logged is not None else []
    pol = None if policy.factory is None else policy.factory(int(seed), int(member), scen)

    need = sorted({c for k in kpis for c in k.columns})
    series: dict[str, list[np.ndarray]] = {c: [] for c in need}
    timeline: dict[str, list[float]] = {
        c: [] for c in [*lay.outputs, *([] if lay.predict_reward else [REWARD_COLUMN])]
    }
    z_rows: list[np.ndarray] = []
    z_t: list[np.ndarray] = []
    base_profile = sim.world.profile.copy()
    last_logged_action = None
    for t in range(steps):
        w = sim.world
        # what the policy and the twin see this tick
        view_profile = base_profile
        if appliers["profile"]:
            view_profile, _ = appliers["profile"].apply(base_profile, t)
            view_profile = lay.scalers["profile"].legalise(view_profile)
        w.profile = view_profile
        done: list[Any] = []
        if appliers["state"]:
            view_state, done = appliers["state"].apply(w.state, t)
            w.state = lay.scalers["state"].legalise(view_state)
        obs = sim.obs()
        if pol is None:
            assert logged is not None
            act = logged.action[t][source]
            if last_logged_action is not None:  # an agent absent at t keeps its last logged action
                act = np.where(np.isnan(act), last_logged_action, act)
            act = np.nan_to_num(act, nan=0.0)
            last_logged_action = act
        else:
            act = np.asarray(pol.act(obs), dtype=np.float64).reshape(n, len(lay.action))
        if appliers["action"]:
            act, _ = appliers["action"].apply(sim.legal_action(act), t)
        rows = np.arange(n)
        outputs, reward, _ = sim.respond(rows, act, with_disagreement=False)
        legal = sim.pending_action
        state_now = w.state.copy()
        if appliers["output"]:
            outputs, _ = appliers["output"].apply(outputs, t)
            outputs = lay.scalers["outputs"].legalise(outputs)
            # the next tick's site means (the client's lagged inputs) see the perturbed outputs
            sim.override_outputs(rows, outputs)
            reward = sim.reward_of(rows, state_now, legal, outputs)
        if appliers["reward"]:
            reward = appliers["reward"].apply(np.asarray(reward, np.float64)[:, None], t)[0][:, 0]
        cols: dict[str, np.ndarray] = {}
        for j, c in enumerate(lay.profile):
            cols[c] = view_profile[:, j]
        for j, c in enumerate(lay.state):
            cols[c] = state_now[:, j]
        for j, c in enumerate(lay.action):
            cols[c] = legal[:, j]
        for j, c in enumerate(lay.outputs):
            cols[c] = outputs[:, j]
        cols.setdefault(REWARD_COLUMN, np.asarray(reward, dtype=np.float64))
        for c in need:
            if c not in cols:
                raise InputError(
                    f"KPI column {c!r} is not simulated by the twin; it has {sorted(cols)}", "kpi"
                )
            series[c].append(np.asarray(cols[c], dtype=np.float64))
        for c in timeline:
            timeline[c].append(float(np.mean(cols[c])))
        pick = rng.choice(n, size=min(support_rows, n), replace=False)
        z_rows.append(
            np.concatenate(
                [
                    lay.scalers["profile"].transform(view_profile[pick]),
                    lay.scalers["state"].transform(state_now[pick]),
                    lay.scalers["action"].transform(legal[pick]),
                ],
                axis=1,
            )
        )
        z_t.append(np.full(len(pick), t))
        nxt = sim.end_tick()
        if done:
            nxt = _Applier.undo(nxt, done)
        if exo and logged is not None and t + 1 < logged.steps:
            forced = logged.state[t + 1][source][:, exo]
            keep = np.isnan(forced)
            nxt[:, exo] = np.where(keep, nxt[:, exo], forced)
        sim.world.state = lay.scalers["state"].legalise(nxt)
        sim.world.profile = base_profile
    values = {
        k.name: k.compute(
            np.stack(series[k.column]), None if k.weight is None else np.stack(series[k.weight])
        )
        for k in kpis
    }
    z = np.concatenate(z_rows)
    d = twin.support.distance(z)
    out = d > twin.support.threshold
    tt = np.concatenate(z_t)
    oos_t = np.bincount(tt, weights=out.astype(float), minlength=steps) / np.maximum(
        np.bincount(tt, minlength=steps), 1
    )
    return EpisodeOutcome(
        kpis=values,
        timeline={c: np.asarray(v) for c, v in timeline.items()},
        oos=float(out.mean()) if len(out) else 0.0,
        oos_t=oos_t,
    )


def _reweight(
    twin: Any,
    p: Perturbation,
    scen: np.ndarray,
    site: np.ndarray,
    profile: np.ndarray,
    state: np.ndarray,
    source: np.ndarray,
    logged: LoggedEpisode | None,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Redraw each site's agents so that the scenario mix follows ``p.scenario_weights``.

    Sites keep their sizes. A generated world draws new agents from the population model (initial
    states from the logged first ticks); a replay copies logged agents of the scenario (any site).
    """
    lay = twin.layout
    labels = lay.scenarios
    mix = np.array([p.scenario_weights.get(s, 0.0) for s in labels], dtype=np.float64)  # type: ignore[union-attr]
    mix /= mix.sum()
    new_scen = np.empty_like(scen)
    for k in np.unique(site):
        rows = np.flatnonzero(site == k)
        new_scen[rows] = rng.choice(len(labels), size=len(rows), p=mix)
    new_profile = np.zeros_like(profile)
    new_state = np.zeros_like(state)
    new_source = np.zeros_like(source)
    for s in np.unique(new_scen):
        rows = np.flatnonzero(new_scen == s)
        same = np.flatnonzero(scen == s)
        if logged is None:
            pop = twin.population.sample(len(rows), scenario=labels[s], seed=int(rng.integers(2**31)))
            new_profile[rows] = lay.scalers["profile"].legalise(pop[lay.profile].to_numpy(np.float64))
            new_state[rows] = twin.initial.sample(lay, np.full(len(rows), s), new_profile[rows], rng)
            new_source[rows] = rows
        else:
            if len(same) == 0:
                raise InputError(
                    f"scenario_weights asks for {labels[s]!r} agents but episode {logged.name!r} has none to replay",
                    p.where,
                )
            pick = same[rng.integers(len(same), size=len(rows))]
            new_profile[rows], new_state[rows], new_source[rows] = profile[pick], state[pick], source[pick]
    return new_scen, site, new_profile, new_state, new_source


# ------------------------------------------------------------------------------------ many episodes
@dataclass
class Cell:
    """All episodes of one (policy, scenario): arrays over members ``M`` and replicates ``R``.

    Attributes:
        values: KPI name -> ``(M, R)``; timeline: column -> ``(M, R, T)`` per-step means
            (NaN-padded); oos: ``(M, R)`` and oos_t: ``(M, R, T)`` shares out of support.
    """

    policy: str
    scenario: str
    values: dict[str, np.ndarray]
    timeline: dict[str, np.ndarray]
    oos: np.ndarray
    oos_t: np.ndarray


def bootstrap_ci(
    values: np.ndarray,
    stat: Callable[[np.ndarray], float] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile interval of ``stat`` (default: the mean) of ``(M, R)`` values, resampling members
    and replicates independently (two-level bootstrap): both the ensemble's disagreement and the
    spread over worlds widen it. NaN entries are ignored."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim == 1:
        v = v[None, :]
    m, r = v.shape
    fn = stat or (lambda a: float(np.nanmean(a)))
    if m * r <= 1:
        x = fn(v)
        return x, x
    rng = np.random.default_rng(seed)
    mi = rng.integers(m, size=(n_boot, m))
    ri = rng.integers(r, size=(n_boot, r))
    if stat is None:  # the mean, vectorised over resamples: (B, M, R)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN resample gives NaN, dropped below
            boots = np.nanmean(v[mi[:, :, None], ri[:, None, :]], axis=(1, 2))
    else:
        boots = np.array([fn(v[mi[b]][:, ri[b]]) for b in range(n_boot)])
    boots = boots[np.isfinite(boots)]
    if not len(boots):
        return float("nan"), float("nan")
    a = (1.0 - level) / 2.0
    return float(np.quantile(boots, a)), float(np.quantile(boots, 1.0 - a))


@dataclass
class WhatIfResult:
    """Every cell of a what-if run plus what it was run on; see `edgetwin.twin.report` for output.

    Attributes:
        cells: ``(policy, scenario) -> Cell``.
        policies: policy names in order (the baseline first when there is one).
        baseline, candidate: names for comparisons (None when a single policy ran).
        scenarios: in order, the nominal one first.
        kpis: the KPI definitions.
        logged_kpis: replay mode: KPI name -> ``(R,)`` values of the recorded episodes themselves.
        settings: how it was run (seed, episodes, members, mode, ...).
        oos_tolerance: a number is flagged when more than this share of its agent-steps is out of support.
    """

    cells: dict[tuple[str, str], Cell]
    policies: list[str]
    baseline: str | None
    candidate: str | None
    scenarios: list[Scenario]
    kpis: list[KpiDef]
    settings: dict[str, Any]
    logged_kpis: dict[str, np.ndarray] = field(default_factory=dict)
    oos_tolerance: float = 0.05
    _memo: dict[tuple[str, ...], dict[str, Any]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def candidates(self) -> list[str]:
        """Every policy compared with the baseline (all but the baseline)."""
        return [] if self.baseline is None else [p for p in self.policies if p != self.baseline]

    def cell(self, policy: str, scenario: str) -> Cell:
        return self.cells[(policy, scenario)]

    def kpi(self, name: str) -> KpiDef:
        for k in self.kpis:
            if k.name == name:
                return k
        raise KeyError(name)

    def summary(self, policy: str, scenario: str, kpi: str) -> dict[str, Any]:
        """Mean, 95 % interval (members x replicates), member spread and support share of one number."""
        key = ("summary", policy, scenario, kpi)
        if key not in self._memo:
            self._memo[key] = self._summary(policy, scenario, kpi)
        return dict(self._memo[key])

    def _summary(self, policy: str, scenario: str, kpi: str) -> dict[str, Any]:
        c = self.cell(policy, scenario)
        v = c.values[kpi]
        lo, hi = bootstrap_ci(v, seed=int(self.settings.get("seed", 0)))
        member_means = np.nanmean(v, axis=1)
        oos = float(np.nanmean(c.oos))
        return {
            "mean": float(np.nanmean(v)),
            "ci_low": lo,
            "ci_high": hi,
            "member_spread": float(np.std(member_means)) if len(member_means) > 1 else 0.0,
            "out_of_support": oos,
            "flagged": bool(oos > self.oos_tolerance),
        }

    def compare(
        self, scenario: str, kpi: str, candidate: str | None = None, baseline: str | None = None
    ) -> dict[str, Any]:
        """Paired relative change of ``candidate`` vs ``baseline`` on one KPI under one scenario.

        ``change`` is ``(candidate - baseline) / |baseline|`` of the means; ``worsening`` the same
        signed so that positive is worse (None when the KPI has no direction).
        """
        cand = candidate or self.candidate
        base = baseline or self.baseline
        if cand is None or base is None:
            raise ValueError("compare needs a candidate and a baseline policy")
        key = ("compare", cand, base, scenario, kpi)
        if key not in self._memo:
            self._memo[key] = self._compare(scenario, kpi, cand, base)
        return dict(self._memo[key])

    def _compare(self, scenario: str, kpi: str, cand: str, base: str) -> dict[str, Any]:
        a, b = self.cell(cand, scenario), self.cell(base, scenario)
        va, vb = a.values[kpi], b.values[kpi]
        k = self.kpi(kpi)

        def rel(ix: np.ndarray) -> float:  # ix: (M, R) stacked [cand, base] resample
            return _rel_change(float(np.nanmean(ix[0])), float(np.nanmean(ix[1])))

        both = np.stack([va, vb])  # (2, M, R): resampled jointly, so the comparison stays paired
        lo, hi = _paired_ci(both, rel, seed=int(self.settings.get("seed", 0)))
        change = rel(both)
        sign = {"higher": -1.0, "lower": 1.0}.get(k.better or "", 0.0)
        ma, mb = float(np.nanmean(va)), float(np.nanmean(vb))
        oos = max(float(np.nanmean(a.oos)), float(np.nanmean(b.oos)))
        return {
            "scenario": scenario,
            "kpi": kpi,
            "better": k.better,
            "baseline": mb,
            "candidate": ma,
            "delta": ma - mb,
            "change": change,
            "change_ci": [lo, hi],
            "worsening": None if sign == 0.0 else sign * change,
            "worsening_abs": None if sign == 0.0 else sign * (ma - mb),
            "out_of_support": oos,
            "flagged": bool(oos > self.oos_tolerance),
        }

    def to_dict(self) -> dict[str, Any]:
        results = []
        for (pol, scen), _ in self.cells.items():
            results.append(
                {
                    "policy": pol,
                    "scenario": scen,
                    "out_of_support": float(np.nanmean(self.cells[(pol, scen)].oos)),
                    "kpis": {k.name: self.summary(pol, scen, k.name) for k in self.kpis},
                }
            )
        comparisons = []
        for cand in self.candidates:
            for s in self.scenarios:
                for k in self.kpis:
                    comparisons.append(
                        {"candidate_policy": cand, **self.compare(s.name, k.name, candidate=cand)}
                    )
        logged = {}
        for name, v in self.logged_kpis.items():
            lo, hi = bootstrap_ci(v[None, :], seed=int(self.settings.get("seed", 0)))
            logged[name] = {"mean": float(np.nanmean(v)), "ci_low": lo, "ci_high": hi}
        return {
            "settings": self.settings,
            "policies": self.policies,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "scenarios": [s.to_dict() for s in self.scenarios],
            "kpis": [k.to_dict() for k in self.kpis],
            "oos_tolerance": self.oos_tolerance,
            "results": results,
            "comparisons": comparisons,
            "logged": logged,
        }


def _rel_change(cand: float, base: float) -> float:
    if not (math.isfinite(cand) and math.isfinite(base)):
        return float("nan")
    if base == 0.0:
        return 0.0 if cand == 0.0 else math.copysign(math.inf, cand)
    return (cand - base) / abs(base)


def _paired_ci(
    both: np.ndarray, fn: Callable[[np.ndarray], float], seed: int, n_boot: int = 1000
) -> tuple[float, float]:
    _, m, r = both.shape
    if m * r <= 1:
        x = fn(both)
        return x, x
    rng = np.random.default_rng(seed)
    mi = rng.integers(m, size=(n_boot, m))
    ri = rng.integers(r, size=(n_boot, r))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        means = np.nanmean(both[:, mi[:, :, None], ri[:, None, :]], axis=(2, 3))  # (2, B): resampled jointly
    boots = np.array([fn(means[:, b].reshape(2, 1, 1)) for b in range(n_boot)])
    boots = boots[np.isfinite(boots)]
    if not len(boots):
        return float("nan"), float("nan")
    return float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))


def episode_seeds(seed: int, n: int) -> list[int]:
    """Independent, reproducible world seeds."""
    return [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(int(seed)).spawn(n)]


def logged_episode_kpis(
    episodes: Sequence[LoggedEpisode], kpis: Sequence[KpiDef], spec: TwinSpec
) -> dict[str, np.ndarray]:
    """KPIs of the recorded episodes themselves, computed exactly as for simulated ones."""
    reward_fn = spec.reward_fn() if (spec.reward_weights or spec.reward_function) else None
    out: dict[str, list[float]] = {k.name: [] for k in kpis}
    for ep in episodes:
        cols = dict(ep.columns)
        if REWARD_COLUMN not in cols and reward_fn is not None:
            t, n = ep.steps, len(ep.agents)
            flat = {c: v.reshape(-1) for c, v in cols.items()}
            for j, c in enumerate(spec.names("profile")):
                if c not in flat and j < ep.profile.shape[1]:
                    flat[c] = np.tile(ep.profile[:, j], t)
            with contextlib.suppress(KeyError):  # the reward reads a column the log lacks
                cols[REWARD_COLUMN] = np.asarray(reward_fn(flat), dtype=np.float64).reshape(t, n)
        for k in kpis:
            if all(c in cols for c in k.columns):
                out[k.name].append(k.compute(cols[k.column], None if k.weight is None else cols[k.weight]))
    return {k: np.asarray(v) for k, v in out.items() if v}


def logged_support_share(twin: Any, episodes: Sequence[LoggedEpisode], seed: int = 0, max_rows: int = 4000) -> float:
    """Share of recorded agent-steps ``[profile, state, action]`` outside the twin's support."""
    lay = twin.layout
    rng = np.random.default_rng(seed)
    rows = []
    for ep in episodes:
        t, n = ep.steps, len(ep.agents)
        z = np.concatenate(
            [
                np.broadcast_to(lay.scalers["profile"].transform(ep.profile), (t, n, len(lay.profile))).reshape(t * n, -1),
                lay.scalers["state"].transform(ep.state.reshape(t * n, -1)),
                lay.scalers["action"].transform(ep.action.reshape(t * n, -1)),
            ],
            axis=1,
        )
        z = z[np.isfinite(z).all(axis=1)]
        take = rng.choice(len(z), size=min(len(z), max_rows // max(len(episodes), 1)), replace=False)
        rows.append(z[take])
    z = np.concatenate(rows) if rows else np.zeros((0, 1))
    if not len(z):
        return 0.0
    return float((twin.support.distance(z) > twin.support.threshold).mean())


def run_whatif(
    twin: Any,
    policies: Sequence[PolicySpec],
    scenarios: Iterable[Scenario] = (),
    *,
    baseline: str | None = None,
    kpis: Sequence[KpiDef] | None = None,
    episodes: int = 2,
    seeds: int = 1,
    seed: int = 0,
    members: Sequence[int] | None = None,
    steps: int | None = None,
    n_agents: int | None = None,
    stochastic: bool = True,
    log: pd.DataFrame | None = None,
    exogenous: Sequence[str] = (),
    include_nominal: bool = True,
    oos_tolerance: float = 0.05,
    progress: bool = True,
) -> WhatIfResult:
    """Run ``policies`` through ``twin`` under every scenario, over seeds, episodes and members.

    Args:
        twin: a `Twin`.
        policies: the policies (`builtin_policy`, `fixed_policy`, or
            `edgetwin.policies.gate.resolve_policy`); names must be unique.
        scenarios: the what-ifs; the unperturbed ``"nominal"`` scenario is added first.
        baseline: name of the policy the others are compared with (default: the first of two).
        kpis: the KPIs (default: `default_kpis`).
        episodes: generated mode: episodes per seed; replay mode: the number of recorded
            episodes replayed (the last ones of the log).
        seeds: independent seeds (``seed``, and ``seeds - 1`` derived ones) of the worlds and noise.
        seed: the base seed; the same seed gives the same result.
        members: ensemble members that answer (default: all); every replicate runs with each.
        steps: ticks per episode (default: the twin's horizon, or the recorded episode's length).
        n_agents: agents per generated world (default: as many as a logged episode had on average).
        stochastic: sample the twin's responses (else their means).
        log: replay its episodes (counterfactual replay) instead of generating worlds.
        exogenous: replay mode: state columns taken from the log at every tick.
        include_nominal: run the unperturbed scenario too.
        oos_tolerance: flag a number when more than this share of its agent-steps is out of support.
        progress: tqdm bar.

    Raises:
        InputError: bad scenarios (naming file, entry and key), unknown KPI columns, bad options.
    """
    lay = twin.layout
    spec = twin.spec
    if episodes < 1:
        raise InputError(f"expected >= 1, got {episodes}", "--episodes")
    if seeds < 1:
        raise InputError(f"expected >= 1, got {seeds}", "--seeds")
    if steps is not None and steps < 1:
        raise InputError(f"expected >= 1, got {steps}", "--steps")
    if not 0.0 <= oos_tolerance <= 1.0:
        raise InputError(f"expected a share in [0, 1], got {oos_tolerance}", "--oos-tolerance")
    names = [p.name for p in policies]
    if not names:
        raise InputError("give at least one policy", "--policy")
    if len(set(names)) != len(names):
        raise InputError(f"policy names must be unique, got {names}", "--policy")
    if baseline is None and len(names) == 2:
        baseline = names[0]
    if baseline is not None and baseline not in names:
        raise InputError(f"baseline {baseline!r} is not among the policies {names}", "--baseline")
    candidate = next((n for n in names if n != baseline), None) if baseline is not None else None
    members = list(range(twin.n_members)) if members is None else [int(m) for m in members]
    bad = [m for m in members if not 0 <= m < twin.n_members]
    if bad or not members:
        raise InputError(f"members must be in 0..{twin.n_members - 1}, got {members}", "--members")

    outputs = lay.outputs + ([] if lay.predict_reward else [REWARD_COLUMN])
    kpis = list(kpis) if kpis is not None else default_kpis(spec, outputs)
    columns = [*lay.profile, *lay.state, *lay.action, *outputs]
    for k in kpis:
        for c in k.columns:
            if c not in columns:
                raise InputError(
                    f"KPI {k.name!r} reads column {c!r}, which the twin does not simulate", "kpi"
                )
    for c in exogenous:
        if c not in lay.state:
            raise InputError(f"{c!r} is not a state column of the twin ({lay.state})", "--exogenous")
    if exogenous and log is None:
        raise InputError("exogenous columns follow a log: give one (--log)", "--exogenous")

    scen_list = list(scenarios)
    if include_nominal and not any(s.name == NOMINAL.name for s in scen_list):
        scen_list = [NOMINAL, *scen_list]
    if not scen_list:
        raise InputError("nothing to run: no scenario and include_nominal=False", "--scenario")
    if len({s.name for s in scen_list}) != len(scen_list):
        raise InputError(f"scenario names must be unique, got {[s.name for s in scen_list]}", "--scenario")

    recorded: list[LoggedEpisode] | None = None
    if log is not None:
        recorded = logged_episodes(log, twin, max_episodes=episodes, steps=steps)
        lengths = [ep.steps for ep in recorded]
        known_sites = sorted({s for ep in recorded for s in ep.site_names})
        run_steps = max(lengths)
    else:
        if n_agents is None:
            n_ep = max(int(twin.meta.get("n_episodes", 1)), 1)
            n_agents = max(1, int(round(twin.composition.units.sum() / n_ep)))
        run_steps = lay.horizon if steps is None else int(steps)
        lengths = [run_steps]
        known_sites = None
    for s in scen_list:
        s.check(spec, columns, min(lengths), lay.scenarios)
        for p in s.perturbations:
            if p.sites is None:
                continue
            if known_sites is not None:
                unknown = sorted(set(p.sites) - set(known_sites))
                if unknown:
                    raise InputError(
                        f"key 'sites': unknown site(s) {unknown}; the log has {known_sites}", p.where
                    )
            elif not all(x.startswith("site") and x[4:].isdigit() for x in p.sites):
                raise InputError(
                    f"key 'sites': generated worlds name their sites site0, site1, ...; got {list(p.sites)} "
                    "(replay a log with --log to perturb named sites)",
                    p.where,
                )

    # replicate worlds: (seed index, episode) in generated mode, (seed index, recorded episode) in replay
    base_seeds = episode_seeds(seed, seeds)
    reps: list[tuple[int, LoggedEpisode | None]] = []
    if recorded is None:
        for base_seed in base_seeds:
            reps += [(w, None) for w in episode_seeds(base_seed, episodes)]
    else:
        for base_seed in base_seeds:
            reps += [(w, ep) for w, ep in zip(episode_seeds(base_seed, len(recorded)), recorded, strict=True)]
    total = len(policies) * len(scen_list) * len(members) * len(reps)
    bar = tqdm(total=total, desc="what-if episodes", disable=not progress)
    cells: dict[tuple[str, str], Cell] = {}
    for pol in policies:
        for scen in scen_list:
            vals = {k.name: np.full((len(members), len(reps)), np.nan) for k in kpis}
            tl = {c: np.full((len(members), len(reps), run_steps), np.nan) for c in outputs}
            oos = np.zeros((len(members), len(reps)))
            oos_t = np.full((len(members), len(reps), run_steps), np.nan)
            for mi, m in enumerate(members):
                for ri, (wseed, ep) in enumerate(reps):
                    res = run_episode(
                        twin, pol, scen, kpis, seed=wseed, member=m, steps=steps, n_agents=n_agents,
                        stochastic=stochastic, logged=ep, exogenous=exogenous,
                    )  # fmt: skip
                    for name, value in res.kpis.items():
                        vals[name][mi, ri] = value
                    for c, series in res.timeline.items():
                        tl[c][mi, ri, : len(series)] = series
                    oos[mi, ri] = res.oos
                    oos_t[mi, ri, : len(res.oos_t)] = res.oos_t
                    bar.update(1)
            cells[(pol.name, scen.name)] = Cell(pol.name, scen.name, vals, tl, oos, oos_t)
    bar.close()
    logged_kpis = logged_episode_kpis(recorded, kpis, spec) if recorded is not None else {}
    logged_oos = None if recorded is None else logged_support_share(twin, recorded, seed=seed)
    order = names if baseline is None else [baseline, *[n for n in names if n != baseline]]
    settings = {
        "mode": "replay" if recorded is not None else "generated",
        "seed": int(seed),
        "seeds": int(seeds),
        "episodes": int(episodes) if recorded is None else len(recorded),
        "replicates": len(reps),
        "members": members,
        "twin_members": int(twin.n_members),
        "steps": int(run_steps),
        "n_agents": None if recorded is not None else int(n_agents or 0),
        "stochastic": bool(stochastic),
        "exogenous": list(exogenous),
        "recorded_episodes": None if recorded is None else [ep.name for ep in recorded],
        "step_seconds": float(spec.step_seconds),
        "spec": spec.name,
        "spec_hash": spec.hash(),
        "twin_data_sha256": twin.meta.get("data_sha256"),
        # replay: the share of the recorded traffic's own agent-steps outside the training logs'
        # support, the reference for the shares of the simulated numbers
        "recorded_out_of_support": logged_oos,
    }
    return WhatIfResult(
        cells=cells,
        policies=order,
        baseline=baseline,
        candidate=candidate,
        scenarios=scen_list,
        kpis=list(kpis),
        settings=settings,
        logged_kpis=logged_kpis,
        oos_tolerance=oos_tolerance,
    )


__all__ = [
    "KINDS",
    "NOMINAL",
    "Cell",
    "EpisodeOutcome",
    "KpiDef",
    "LoggedEpisode",
    "Perturbation",
    "PolicySpec",
    "Scenario",
    "WhatIfResult",
    "bootstrap_ci",
    "builtin_policy",
    "default_kpis",
    "fixed_policy",
    "load_kpis",
    "load_scenarios",
    "logged_episodes",
    "merge_kpis",
    "run_episode",
    "run_whatif",
]
