"""`Perturbation`: one change to a column of a simulated tick, limited to sites, scenarios and a window.

The kinds (`KINDS`) and where each acts are described in `edgetwin.twin.whatif`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import REWARD_COLUMN, TwinSpec, role_of

__all__ = ["COMMON_KEYS", "EPISODE_KINDS", "KINDS", "Perturbation"]

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


COMMON_KEYS = ("kind", "column", "start", "end", "start_hour", "end_hour", "sites", "scenarios", "label")


#: Kinds that act for the whole episode (no window, no site filter).
EPISODE_KINDS = ("shift_time", "population_shift")


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
        start_hour, end_hour: the window in hours since the episode began instead (e.g. 17.5 to
            20 for an evening peak), so that a scenario holds for any step length; resolved to
            ``start``/``end`` against the twin's ``step_seconds`` by `check`.
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
    start_hour: float | None = None
    end_hour: float | None = None
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
        if self.start_hour is not None or self.end_hour is not None:
            parts.append(f"h∈[{self.start_hour or 0:g},{'end' if self.end_hour is None else f'{self.end_hour:g}'})")
        elif self.start is not None or self.end is not None:
            parts.append(f"t∈[{self.start or 0},{'end' if self.end is None else self.end})")
        if self.sites:
            parts.append("sites=" + ",".join(self.sites))
        if self.scenarios:
            parts.append("scenarios=" + ",".join(self.scenarios))
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if v is not None and k != "where" and v != ""}
        if self.start_hour is not None or self.end_hour is not None:  # start/end are derived from them
            d.pop("start", None)
            d.pop("end", None)
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
        start_hour, end_hour = num("start_hour", lo=0.0), num("end_hour", lo=0.0)
        if (start_hour is not None or end_hour is not None) and (start is not None or end is not None):
            raise InputError("keys 'start'/'end' and 'start_hour'/'end_hour': give the window in steps or in hours, not both", where)
        if start_hour is not None and end_hour is not None and end_hour <= start_hour:
            raise InputError(f"keys 'start_hour'/'end_hour': empty window [{start_hour:g}, {end_hour:g}) h", where)
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
            start_hour=start_hour,
            end_hour=end_hour,
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
        if k == "burst" and (self.start is None or self.end is None) and (self.start_hour is None or self.end_hour is None):
            raise InputError("keys 'start'/'end': a burst needs a window (start = ..., end = ..., or start_hour/end_hour)", w)
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
            for key in ("start", "end", "start_hour", "end_hour", "sites"):
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
        if self.start_hour is not None or self.end_hour is not None:
            # hours -> steps of this twin (the dataclass is frozen for users; this is its own derived window)
            def to_step(h: float | None) -> int | None:
                return None if h is None else int(round(h * 3600.0 / spec.step_seconds))

            object.__setattr__(self, "start", to_step(self.start_hour))
            object.__setattr__(self, "end", to_step(self.end_hour))
            if self.start is not None and self.end is not None and self.end <= self.start:
                raise InputError(
                    f"keys 'start_hour'/'end_hour': [{self.start_hour:g}, {self.end_hour:g}) h is less than one "
                    f"step of {spec.step_seconds:g} s",
                    w,
                )
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
                        f"key {key!r}: window [{self.start}, {self.end}) is outside the episode of {steps} steps"
                        + (f" ({steps * spec.step_seconds / 3600:g} h)" if self.start_hour is not None or self.end_hour is not None else ""),
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
