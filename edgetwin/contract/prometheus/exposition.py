"""Writing a log in the contract as OpenMetrics, with the mapping that reads it back.

The inverse of the import, for systems that keep their logs as tables (the emulated cluster, a
replay) and for tests and benchmarks of the import: `write_openmetrics` turns each column into a
gauge family ``<prefix><role>_<name>`` (``state.queue_len`` -> ``edgetwin_state_queue_len``), one
series per (agent, site, scenario[, policy]) labelled so, one sample per row at the row's time;
`mapping_for` writes the import mapping that reads those families back into the same columns.
The file is what ``promtool tsdb create-blocks-from openmetrics`` backfills into a Prometheus TSDB.

Times: episode ``e`` (the ``e``-th episode in sorted order) starts ``e`` calendar days after
``start`` (a UTC midnight) and row ``t`` is ``t * step_seconds`` into it, so that an import with
``episode = "day"`` gives the episodes back as days. An episode must fit in a day.
Values are written in Python's shortest round-trip form (``repr``), so the float64 values read back
are the ones written; NaN is not written (a missing value is a missing sample).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.contract.prometheus.mapping import VALUE_COLUMNS
from edgetwin.contract.spec import TwinSpec, role_of

DAY = 86400.0
_BAD = re.compile(r"[^a-zA-Z0-9_:]")


def metric_name(column: str, prefix: str = "edgetwin_") -> str:
    """The gauge family of a column: ``state.queue_len`` -> ``edgetwin_state_queue_len``."""
    return prefix + _BAD.sub("_", column.replace(".", "_"))


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def write_openmetrics(
    table: pd.DataFrame,
    path: str | Path,
    *,
    start: float,
    step_seconds: float,
    columns: Sequence[str] | None = None,
    prefix: str = "edgetwin_",
) -> Path:
    """Write a contract table as an OpenMetrics text file (gauges, timestamps in seconds, ``# EOF``).

    Args:
        table: the log (``episode``, ``t``, ``agent``, optional ``site``/``scenario``/``policy``,
            value columns).
        path: the file to write.
        start: unix seconds of the first episode's ``t = 0`` (a UTC midnight for day episodes).
        step_seconds: seconds per ``t``.
        columns: the value columns to write (default: every role column, ``reward``, ``propensity``).
        prefix: the families' name prefix.

    Raises:
        InputError: an episode longer than a day, or two columns that map to the same family name.
    """
    if columns is None:
        columns = [c for c in table.columns if role_of(str(c)) is not None or c in VALUE_COLUMNS]
    names = [metric_name(c, prefix) for c in columns]
    if len(set(names)) != len(names):
        raise InputError(f"columns {list(columns)} map to repeated metric names", "columns")
    t = table["t"].to_numpy(dtype=np.int64)
    if len(t) and (int(t.max()) + 1) * step_seconds > DAY:
        raise InputError(f"an episode of {int(t.max()) + 1} steps of {step_seconds:g} s is longer than a day", "step_seconds")
    episodes = sorted(table["episode"].unique(), key=_episode_order)
    ep_index = table["episode"].map({e: i for i, e in enumerate(episodes)}).to_numpy(dtype=np.int64)
    ts = start + ep_index * DAY + t * float(step_seconds)
    label_cols = [c for c in ("agent", "site", "scenario", "policy") if c in table.columns]
    lab = pd.Series([""] * len(table), index=table.index, dtype=object)
    for i, c in enumerate(label_cols):
        lab = lab + (("," if i else "") + f'{c}="') + table[c].astype(str).map(_escape) + '"'
    labels = ("{" + lab + "}").to_numpy(dtype=object)
    order = np.lexsort((ts, labels.astype(str)))  # by series, then time (promtool reads series in order)
    labels, ts_text = labels[order], pd.Series(ts[order]).map(_ts).to_numpy(dtype=object)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for col, name in zip(columns, names, strict=True):
            v = table[col].to_numpy(dtype=np.float64)[order]
            ok = np.isfinite(v)
            f.write(f"# TYPE {name} gauge\n# HELP {name} edgetwin log column {col}\n")
            body = name + labels[ok] + " " + pd.Series(v[ok]).map(repr).to_numpy(dtype=object) + " " + ts_text[ok] + "\n"
            f.write("".join(body.tolist()))
        f.write("# EOF\n")
    return path


def mapping_for(
    columns: Sequence[str],
    spec: TwinSpec | None = None,
    *,
    prefix: str = "edgetwin_",
    name: str = "edgetwin-openmetrics",
    step: str | float | None = None,
    policy: bool = False,
) -> dict[str, Any]:
    """The import mapping (as TOML-able data) that reads `write_openmetrics`' families back.

    Each column's query is its family's bare name (a plain selector: it works offline too); the
    spec's feature attributes (kind, bounds, values, unit, scope, better, margin) are copied, so the import's spec
    skeleton is the spec the log was written with, up to its reward and dynamics.
    """
    keys: dict[str, Any] = {"agent": "agent", "site": "site", "scenario": "scenario", "episode": "day"}
    if policy:
        keys["policy"] = "policy"
    cols: dict[str, Any] = {}
    for c in columns:
        entry: dict[str, Any] = {"query": metric_name(c, prefix)}
        if spec is not None and role_of(c) is not None:
            f = spec.feature(c)
            entry["kind"] = f.kind
            for k in ("low", "high"):
                if getattr(f, k) is not None:
                    entry[k] = float(getattr(f, k))
            if f.values is not None:
                entry["values"] = [float(v) for v in f.values]
            if f.unit:
                entry["unit"] = f.unit
            if f.scope != "agent":
                entry["scope"] = f.scope
            if f.better is not None:
                entry["better"] = f.better
            if f.margin is not None:
                entry["margin"] = float(f.margin)
        cols[c] = entry
    out: dict[str, Any] = {"name": name, "keys": keys, "columns": cols}
    if step is not None:
        out["step"] = step
    return out


def _ts(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _episode_order(e: Any) -> tuple[int, Any]:
    """Episodes in numeric order when they are numbers (``2`` before ``10``), else as text."""
    try:
        return (0, float(e))
    except (TypeError, ValueError):
        return (1, str(e))
