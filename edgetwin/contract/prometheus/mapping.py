"""The import mapping: which PromQL query fills which contract column, and which labels key the rows.

A mapping is a small TOML file written by the operator (documented with a worked example in
``docs/log-format.md``, "Importing from Prometheus")::

    name = "checkout-platform"          # the spec skeleton's name
    step = "5m"                         # optional: the default of --step

    [keys]                              # where the row keys come from, for every query
    agent = "service"                   # a label name (or { label = "service" })
    site = "cluster"                    # a label, or a constant: { value = "north" }
    scenario = "tier"
    policy = "policy"                   # optional: the label naming the policy that decided
    episode = "day"                     # "day" (UTC calendar day, the default) or { label = "run" }

    [columns."state.queue_len"]         # one table per contract column, in spec order
    query = 'sum by (service, cluster, tier) (queue_length)'
    low = 0.0                           # optional feature attributes of the spec skeleton
    unit = "requests"

    [columns."action.cpu_share"]
    query = 'scheduler_cpu_share'
    labels = { agent = "deployment" }   # optional: this query's own label names

Everything here is checked before any query runs, and every error names the mapping file and the
entry (``columns."state.x"``, ``keys.agent``), so that a bad mapping costs no server time. The spec
skeleton (`Mapping.spec`) lists the columns in mapping order with their optional attributes; the
import writes it beside the log when none is there.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping as AbcMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import REWARD_COLUMN, Feature, TwinSpec, role_of

#: Contract columns a query may fill besides the role columns (``profile.*`` ... ``kpi.*``).
VALUE_COLUMNS: tuple[str, ...] = (REWARD_COLUMN, "propensity")
#: The row keys a mapping says how to read; ``agent`` is required, the others optional.
KEY_NAMES: tuple[str, ...] = ("agent", "site", "scenario", "policy")
_FEATURE_KEYS = ("kind", "low", "high", "values", "unit", "scope", "better", "margin")
_COLUMN_KEYS = ("query", "labels", *_FEATURE_KEYS)
_TOP_KEYS = ("name", "step", "keys", "columns")
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?$")


def parse_duration(text: str | int | float, where: str) -> float:
    """Seconds in a Prometheus duration (``90s``, ``5m``, ``1h30m``, ``1d``) or a plain number of seconds.

    Raises:
        InputError: not a positive duration (named by ``where``).
    """
    if isinstance(text, bool):
        raise InputError(f"expected a duration such as 60, 60s, 5m or 1h, got {text!r}", where)
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        s = str(text).strip()
        try:
            seconds = float(s)
        except ValueError:
            m = _DURATION.match(s)
            if not s or m is None or not any(m.groups()):
                raise InputError(f"expected a duration such as 60, 60s, 5m or 1h, got {text!r}", where) from None
            d, h, mi, se, ms = (int(g) if g else 0 for g in m.groups())
            seconds = d * 86400 + h * 3600 + mi * 60 + se + ms / 1000
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise InputError(f"a step must be a positive, finite duration, got {text!r}", where)
    return seconds


@dataclass(frozen=True)
class KeySource:
    """Where one row key comes from: a series label, or a constant (``site = { value = "north" }``)."""

    label: str | None = None
    value: str | None = None

    def read(self, labels: AbcMapping[str, str]) -> str | None:
        """The key of a series with these labels; None when the label is missing (or empty)."""
        if self.value is not None:
            return self.value
        assert self.label is not None
        got = labels.get(self.label)
        return got if got else None


@dataclass(frozen=True)
class ColumnQuery:
    """One contract column: its query, its label overrides and its spec attributes.

    Attributes:
        column: the contract column, e.g. ``"state.queue_len"``, ``"reward"``, ``"propensity"``.
        query: the PromQL query whose series fill it (one series per agent, or per agent and policy).
        keys: the key sources for this query (the mapping's ``[keys]`` with this entry's ``labels``).
        feature: the spec skeleton's feature (None for ``reward`` and ``propensity``).
        entry: how errors name it: ``MAPPING.toml: columns."state.queue_len"``.
    """

    column: str
    query: str
    keys: dict[str, KeySource]
    feature: Feature | None
    entry: str


@dataclass(frozen=True)
class Mapping:
    """A parsed, checked import mapping (see the module docstring for the TOML).

    Attributes:
        columns: one `ColumnQuery` per contract column, in mapping order.
        episode_label: the label that names episodes, or None for calendar days (UTC).
        name: the spec skeleton's name.
        step: the default step in seconds (``--step`` overrides it), or None.
        source: the mapping file (for messages).
    """

    columns: tuple[ColumnQuery, ...]
    episode_label: str | None = None
    name: str = "prometheus-import"
    step: float | None = None
    source: str = "mapping"
    _raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def load(cls, path: str | Path) -> Mapping:
        """Read and check a mapping file. Raises `InputError` naming the file and the entry."""
        path = Path(path)
        if not path.is_file():
            raise InputError("mapping file not found", str(path))
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise InputError(f"not valid TOML ({e})", str(path)) from None
        except UnicodeDecodeError as e:
            raise InputError(f"not UTF-8 text (byte {e.start + 1})", str(path)) from None
        return cls.from_dict(raw, source=str(path))

    @classmethod
    def from_dict(cls, raw: AbcMapping[str, Any], source: str = "mapping") -> Mapping:
        """Check a mapping given as data (what `load` reads from TOML)."""
        unknown = sorted(set(raw) - set(_TOP_KEYS))
        if unknown:
            raise InputError(f"unknown top-level keys {unknown}; expected some of {list(_TOP_KEYS)}", source)
        keys_raw = raw.get("keys")
        if not isinstance(keys_raw, AbcMapping):
            raise InputError("needs a [keys] table naming at least the label that gives `agent`", source)
        bad = sorted(set(keys_raw) - {*KEY_NAMES, "episode"})
        if bad:
            raise InputError(f"keys: unknown keys {bad}; expected some of {[*KEY_NAMES, 'episode']}", source)
        if "agent" not in keys_raw:
            raise InputError("keys.agent: missing; name the label that says which service group a series is", source)
        base = {k: _key_source(keys_raw[k], f"{source}: keys.{k}", allow_value=k != "agent") for k in KEY_NAMES if k in keys_raw}
        episode_label = _episode(keys_raw.get("episode", "day"), f"{source}: keys.episode")
        cols_raw = raw.get("columns")
        if not isinstance(cols_raw, AbcMapping) or not cols_raw:
            raise InputError('needs at least one [columns."<contract column>"] table with a query', source)
        columns = []
        for col, entry_raw in cols_raw.items():
            entry = f'{source}: columns."{col}"'
            if role_of(col) is None and col not in VALUE_COLUMNS:
                raise InputError(
                    "not a contract column; expected profile.*, state.*, action.*, response.*, kpi.*, "
                    f"{' or '.join(VALUE_COLUMNS)}",
                    entry,
                )
            if not isinstance(entry_raw, AbcMapping):
                raise InputError("must be a table with a `query`", entry)
            unknown = sorted(set(entry_raw) - set(_COLUMN_KEYS))
            if unknown:
                raise InputError(f"unknown keys {unknown}; expected some of {list(_COLUMN_KEYS)}", entry)
            query = entry_raw.get("query")
            if not isinstance(query, str) or not query.strip():
                raise InputError("`query` must be a non-empty PromQL string", entry)
            keys = dict(base)
            overrides = entry_raw.get("labels", {})
            if not isinstance(overrides, AbcMapping):
                raise InputError("`labels` must be a table such as { agent = \"deployment\" }", entry)
            for k, v in overrides.items():
                if k not in KEY_NAMES:
                    raise InputError(f"labels.{k}: unknown key; expected some of {list(KEY_NAMES)}", entry)
                keys[k] = _key_source(v, f"{entry}: labels.{k}", allow_value=k != "agent")
            feature = None
            attrs = {k: entry_raw[k] for k in _FEATURE_KEYS if k in entry_raw}
            if role_of(col) is not None:
                feature = _feature(col, attrs, entry)
            elif attrs:
                raise InputError(f"{col} is not a spec feature; it takes no {sorted(attrs)}", entry)
            columns.append(ColumnQuery(col, query.strip(), keys, feature, entry))
        step = None if raw.get("step") is None else parse_duration(raw["step"], f"{source}: step")
        name = raw.get("name", "prometheus-import")
        if not isinstance(name, str) or not name:
            raise InputError("`name` must be a non-empty string", source)
        mapping = cls(tuple(columns), episode_label, name, step, source, dict(raw))
        if not any(c.column.startswith("action.") for c in mapping.columns):
            raise InputError('names no action.* column; a twin needs what the platform did (columns."action.<name>")', source)
        return mapping

    @property
    def column_names(self) -> list[str]:
        return [c.column for c in self.columns]

    @property
    def labels_policy(self) -> bool:
        """True when some query reads the ``policy`` key (the log then has a ``policy`` column)."""
        return any("policy" in c.keys for c in self.columns)

    def spec(self, step_seconds: float) -> TwinSpec:
        """The spec skeleton: the mapped features in mapping order, their attributes, the step."""
        feats = tuple(c.feature for c in self.columns if c.feature is not None)
        try:
            return TwinSpec(features=feats, name=self.name, step_seconds=float(step_seconds))
        except InputError as e:
            raise InputError(f"the spec skeleton it gives is invalid: {e.message}", self.source) from None


def _key_source(v: Any, where: str, allow_value: bool) -> KeySource:
    if isinstance(v, str) and v:
        return KeySource(label=v)
    if isinstance(v, AbcMapping) and set(v) == {"label"} and isinstance(v["label"], str) and v["label"]:
        return KeySource(label=v["label"])
    if allow_value and isinstance(v, AbcMapping) and set(v) == {"value"} and isinstance(v["value"], str) and v["value"]:
        return KeySource(value=v["value"])
    what = 'a label name, { label = "..." } or { value = "..." }' if allow_value else 'a label name or { label = "..." }'
    raise InputError(f"expected {what}, got {v!r}", where)


def _episode(v: Any, where: str) -> str | None:
    if v == "day":
        return None
    if isinstance(v, AbcMapping) and set(v) == {"label"} and isinstance(v["label"], str) and v["label"]:
        return str(v["label"])
    raise InputError(f'expected "day" (UTC calendar days) or {{ label = "..." }}, got {v!r}', where)


def _feature(col: str, attrs: dict[str, Any], entry: str) -> Feature:
    """One feature, checked by `TwinSpec` itself (beside a placeholder action: a spec needs one)."""
    probe = "action.__probe__" if col != "action.__probe__" else "action.__probe2__"
    feats = [{"name": col, **attrs}] + ([] if col.startswith("action.") else [{"name": probe}])
    try:
        spec = TwinSpec.from_dict({"features": feats}, source=entry)
    except InputError as e:
        raise InputError(e.message.replace("spec: ", ""), entry) from None
    return spec.features[0]
