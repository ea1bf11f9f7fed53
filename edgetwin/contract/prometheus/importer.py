"""Import a log from Prometheus: run a mapping's queries, lay their series out as the log contract.

`import_prometheus` is what ``edgetwin logs import prometheus`` runs. For each mapped column it
asks the source (a server's ``/api/v1/query_range``, or a dump file) for the query's series on the
grid ``[start, end)`` at ``step``; each series is one agent's column, keyed by the labels the
mapping names. One row per (episode, t, agent) that any column has a value for:

* ``t`` is the grid step within the episode (0 at the episode's first step in the range);
* ``episode`` is the UTC calendar day of the step (``2026-03-01``), or a label's value;
* ``agent``, ``site``, ``scenario`` (and ``policy``) come from the labels the mapping names;
* a column without a value for a row's step is NaN there (validation quarantines such rows).

Then the log is written, its spec skeleton (from the mapping) is written beside it unless a spec is
already there, and the log is validated against that spec (`validate_log`): the quarantine file and
the report are the validator's, and ``usable + quarantined = all rows`` holds as for any log.

A series that lacks a key label (agent, site, scenario or the episode label) cannot be keyed: its
rows are written with that key empty, so that validation quarantines them (``empty agent``...) and
counts them, and the import's report says which query and label it was. A query that returns two
series for the same agent at the same step (they differ in a label the mapping does not name) is a
mistake in the mapping and stops the import, naming the entry and the label to aggregate away.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from edgetwin.contract.errors import InputError
from edgetwin.contract.logs import LOG_SUFFIXES, write_table
from edgetwin.contract.prometheus.dump import MetricsDump
from edgetwin.contract.prometheus.grid import Grid, parse_time
from edgetwin.contract.prometheus.http import (
    PrometheusAnswerRefused,
    PrometheusHTTP,
    PrometheusQueryError,
    PrometheusUnreachable,
    Series,
)
from edgetwin.contract.prometheus.mapping import ColumnQuery, Mapping, parse_duration
from edgetwin.contract.spec import TwinSpec, spec_path_for
from edgetwin.contract.validate import ValidationReport, validate_log

#: Where a series' key label was missing: rows written with that key empty (validation quarantines them).
_MISSING = "\x00missing"


@dataclass(frozen=True)
class MissingLabel:
    """Series of one query that lack a key label: their rows are written unkeyed and quarantined."""

    column: str
    key: str
    label: str
    series: int
    rows: int

    def describe(self) -> str:
        return (
            f"{self.column}: {self.series} series without label {self.label!r} (the {self.key}); "
            f"their {self.rows:,} values are written with an empty {self.key} and quarantined"
        )


@dataclass
class PrometheusImport:
    """What an import wrote and found.

    Attributes:
        log_path, spec_path: the log and the spec it was validated against.
        spec_written: True when the spec skeleton was written (False: a spec was already there).
        table: the log as written (before validation).
        report: the validator's report on it (quarantine file, usable rows, problems).
        series: series per column.
        missing: the series that lacked a key label, per query and label.
        source: the server URL or the dump file.
        grid: the time grid.
        requests: HTTP requests made (0 offline).
    """

    log_path: Path
    spec_path: Path
    spec_written: bool
    table: pd.DataFrame
    report: ValidationReport
    series: dict[str, int]
    missing: list[MissingLabel]
    source: str
    grid: Grid
    requests: int = 0
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """Lines for people: what was read, the missing labels, then the validator's report."""
        g = self.grid
        lines = [
            f"imported {len(self.table):,} rows x {len(self.series)} columns from {self.source} "
            f"({sum(self.series.values()):,} series, {g.n:,} steps of {g.step:g} s from {_iso(g.start)}"
            + (f", {self.requests} HTTP requests" if self.requests else "")
            + f") -> {self.log_path}",
            f"spec: {'skeleton written to' if self.spec_written else 'kept the one already at'} {self.spec_path}",
        ]
        lines += [f"  MISSING LABEL {m.describe()}" for m in self.missing]
        lines += [f"  NOTE {n}" for n in self.notes]
        lines.append(self.report.summary(markup=False))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "log": str(self.log_path),
            "spec": str(self.spec_path),
            "spec_written": self.spec_written,
            "source": self.source,
            "rows": len(self.table),
            "series": dict(self.series),
            "steps": self.grid.n,
            "step_seconds": self.grid.step,
            "start": _iso(self.grid.start),
            "requests": self.requests,
            "missing_labels": [m.__dict__ | {"text": m.describe()} for m in self.missing],
            "notes": list(self.notes),
            "validation": self.report.to_dict(),
        }


def import_prometheus(
    mapping: Mapping | str | Path,
    out: str | Path,
    *,
    start: str | float,
    end: str | float,
    step: str | float | None = None,
    url: str | None = None,
    from_file: str | Path | None = None,
    client: PrometheusHTTP | None = None,
    progress: bool = False,
    min_usable_fraction: float = 0.5,
    concurrency: int = 2,
) -> PrometheusImport:
    """Run a mapping against a server (``url``/``client``) or a dump (``from_file``); write, validate.

    Args:
        mapping: a `Mapping` or its TOML file.
        out: the log to write (``.parquet``/``.csv``); ``LOG.spec.toml`` and
            ``LOG.quarantine.csv`` go beside it.
        start, end: the range ``[start, end)``: RFC 3339 or unix seconds.
        step: the grid step (``60``, ``1m``); default the mapping's ``step``.
        url: the Prometheus server (e.g. ``http://127.0.0.1:9090``); or pass a configured ``client``.
        from_file: an OpenMetrics / text-exposition dump instead of a server.
        progress: a tqdm bar over queries (and their chunks).
        min_usable_fraction: as in `validate_log`.
        concurrency: queries in flight at once (the first error, in mapping order, is raised).

    Raises:
        InputError: a bad mapping, range or step; an unreachable server; a query the server rejects;
            a query with no series; several series per agent; an unwritable output (all exit 2).
    """
    m = mapping if isinstance(mapping, Mapping) else Mapping.load(mapping)
    if (url is None and client is None) == (from_file is None):
        raise InputError("give exactly one source: a server (--url) or a dump (--from-file)", "--url")
    if step is None and m.step is None:
        raise InputError("no step: give --step or `step` in the mapping", "--step")
    step_source = "--step" if step is not None else f"{m.source}: step"
    step_s = parse_duration(step if step is not None else m.step, step_source)  # type: ignore[arg-type]
    grid = Grid.over(parse_time(start, "--start"), parse_time(end, "--end"), step_s, step_source)
    out = Path(out)
    if not out.name.lower().endswith(LOG_SUFFIXES):  # before any query: not after minutes of them
        raise InputError(f"unknown log format; expected one of {', '.join(LOG_SUFFIXES)}", str(out))

    fetch: Callable[[ColumnQuery, Callable[[], None]], list[Series]]
    if from_file is not None:
        dump = MetricsDump(from_file)
        source = str(from_file)
        units_per_query = 1

        def fetch(cq: ColumnQuery, tick: Callable[[], None]) -> list[Series]:
            got = dump.series(cq.query, grid, cq.entry)
            tick()
            return got

        http = None
    else:
        try:
            http = client if client is not None else PrometheusHTTP(str(url))
        except ValueError as e:
            raise InputError(str(e), "--url") from None
        source = http.url
        units_per_query = len(grid.chunks(http.max_points))

        def fetch(cq: ColumnQuery, tick: Callable[[], None]) -> list[Series]:
            assert http is not None
            try:
                return http.series(cq.query, grid, on_chunk=tick)
            except PrometheusUnreachable as e:
                raise InputError(f"cannot reach Prometheus: {e}", "--url") from None
            except PrometheusAnswerRefused as e:
                raise InputError(f"refused the server's answer to this query: {e}", f"--url, {cq.entry}") from None
            except PrometheusQueryError as e:
                raise InputError(f"the server rejected the query: {e}", cq.entry) from None

    bar = tqdm(total=len(m.columns) * units_per_query, desc="prometheus", unit="query", disable=not progress)
    lock = threading.Lock()

    def tick() -> None:
        with lock:
            bar.update(1)

    def one(cq: ColumnQuery) -> list[Series]:
        series = [(lab, v) for lab, v in fetch(cq, tick) if np.isfinite(v).any()]
        if not series:
            raise InputError(
                f"the query returned no series with a value in {_iso(grid.start)} .. {_iso(grid.start + grid.n * grid.step)}"
                f" (query: {cq.query})",
                cq.entry,
            )
        return series

    try:
        if concurrency <= 1 or len(m.columns) == 1 or from_file is not None:  # a file: one thread is as fast
            per_column = [(cq, one(cq)) for cq in m.columns]
        else:
            # the server evaluates and encodes one query while this process decodes another's JSON
            with ThreadPoolExecutor(max_workers=int(concurrency), thread_name_prefix="prometheus") as pool:
                futures = [pool.submit(one, cq) for cq in m.columns]
                try:
                    per_column = [(cq, f.result()) for cq, f in zip(m.columns, futures, strict=True)]
                except BaseException:
                    for f in futures:
                        f.cancel()
                    raise
    finally:
        bar.close()

    table, missing = _assemble(m, per_column, grid)
    if table.empty:
        raise InputError("no row has a value in the range", m.source)
    try:
        write_table(table, out)
    except InputError:
        raise
    except OSError as e:
        raise InputError(f"cannot write the log ({e.strerror or e})", str(out)) from None
    spec_path = spec_path_for(out)
    spec_written = not spec_path.is_file()
    if spec_written:
        m.spec(grid.step).save(spec_path)
    spec = TwinSpec.load(spec_path)
    report = validate_log(out, spec=spec_path, min_usable_fraction=min_usable_fraction)
    report.spec_source = str(spec_path)
    notes = []
    if not spec_written and set(spec.names("profile") + spec.names("state") + spec.names("action")) - set(m.column_names):
        notes.append(f"the spec already at {spec_path} names columns the mapping does not fill")
    return PrometheusImport(
        log_path=out,
        spec_path=spec_path,
        spec_written=spec_written,
        table=table,
        report=report,
        series={cq.column: len(s) for cq, s in per_column},
        missing=missing,
        source=source,
        grid=grid,
        requests=0 if http is None else http.requests,
        notes=notes,
    )


def _assemble(
    m: Mapping, per_column: list[tuple[ColumnQuery, list[Series]]], grid: Grid
) -> tuple[pd.DataFrame, list[MissingLabel]]:
    """The long table from each column's series (see the module docstring)."""
    idents: dict[tuple[str, str, str, str, str], int] = {}
    keyed: list[tuple[ColumnQuery, list[tuple[int, np.ndarray, str | None]]]] = []
    missing: list[MissingLabel] = []
    want = [k for k in ("site", "scenario") if any(k in cq.keys for cq, _ in per_column)]
    with_policy = m.labels_policy
    for cq, series in per_column:
        lacking: dict[tuple[str, str], list[int]] = {}
        rows: list[tuple[int, np.ndarray, str | None]] = []
        for j, (labels, values) in enumerate(series):
            key: dict[str, str] = {}
            absent: list[tuple[str, str]] = []
            sources = {"agent": cq.keys["agent"], **{k: cq.keys[k] for k in want if k in cq.keys}}
            for name, src in sources.items():
                got = src.read(labels)
                if got is None:
                    absent.append((name, str(src.label)))
                key[name] = got or ""
            if m.episode_label is not None:
                ep = labels.get(m.episode_label) or ""
                if not ep:
                    absent.append(("episode", m.episode_label))
                key["episode"] = ep
            # optional per row: a query without the label (a state, a KPI) says nothing about the policy
            policy = cq.keys["policy"].read(labels) if "policy" in cq.keys else None
            uniq = ""
            if absent:
                for a in absent:
                    lacking.setdefault(a, []).append(int(np.isfinite(values).sum()))
                uniq = f"{_MISSING}{cq.column}:{j}"  # its own rows: never merged with another series
            ident = (uniq, key.get("episode", ""), key["agent"], key.get("site", ""), key.get("scenario", ""))
            idx = idents.setdefault(ident, len(idents))
            rows.append((idx, values, policy))
        for (name, label), counts in lacking.items():
            missing.append(MissingLabel(cq.column, name, label, len(counts), int(sum(counts))))
        _check_one_series_per_agent(cq, series, rows, idents)
        keyed.append((cq, rows))

    n_id = len(idents)
    present = np.zeros((n_id, grid.n), dtype=bool)
    matrices: dict[str, np.ndarray] = {}
    # policies as codes (0: none named) so that agreement is checked with array operations
    policy_ids: dict[str, int] = {}
    policy_m = np.zeros((n_id, grid.n), dtype=np.int32) if with_policy else None
    for cq, rows in keyed:
        mat = np.full((n_id, grid.n), np.nan)
        for idx, values, policy in rows:
            ok = np.isfinite(values)
            mat[idx, ok] = values[ok]
            if policy_m is not None and policy is not None:
                code = policy_ids.setdefault(policy, len(policy_ids) + 1)
                _set_policy(policy_m, idx, ok, code, policy_ids, cq, idents)
        present |= np.isfinite(mat)
        matrices[cq.column] = mat
    ids, ks = np.nonzero(present)
    keys = list(idents)
    ep_of_id = np.array([k[1] for k in keys], dtype=object)
    agent_of_id = np.array([k[2] for k in keys], dtype=object)
    if m.episode_label is None:
        days = np.floor(grid.times / 86400.0).astype(np.int64)
        first_k = {d: int(np.argmax(days == d)) for d in np.unique(days)}
        names = {d: datetime.fromtimestamp(int(d) * 86400, UTC).strftime("%Y-%m-%d") for d in first_k}
        day_k = days[ks]
        episode = np.array([names[d] for d in day_k], dtype=object) if len(ks) else np.array([], dtype=object)
        t = ks - np.array([first_k[d] for d in day_k], dtype=np.int64) if len(ks) else ks
    else:
        episode = ep_of_id[ids]
        first = pd.Series(ks).groupby(episode).transform("min").to_numpy() if len(ks) else ks
        t = ks - first
    data: dict[str, Any] = {"episode": episode, "t": np.asarray(t, dtype=np.int64), "agent": agent_of_id[ids]}
    for k, pos in (("scenario", 4), ("site", 3)):
        if k in want:
            data[k] = np.array([key[pos] for key in keys], dtype=object)[ids]
    if policy_m is not None:
        policy_names = np.array([None, *policy_ids], dtype=object)  # code -> name; 0 -> None (empty policy)
        data["policy"] = policy_names[policy_m[ids, ks]]
    for col, mat in matrices.items():
        data[col] = mat[ids, ks]
    table = pd.DataFrame(data)
    if len(table):
        table = table.sort_values(["episode", "t", "agent"], kind="stable").reset_index(drop=True)
    return table, missing


def _check_one_series_per_agent(
    cq: ColumnQuery, series: list[Series], rows: list[tuple[int, np.ndarray, str | None]], idents: dict
) -> None:
    """Two series of one query for the same agent (and episode label) at the same step: a bad mapping."""
    keys = list(idents)
    seen: dict[tuple[str, str], tuple[int, np.ndarray]] = {}
    for j, (idx, values, _) in enumerate(rows):
        uniq, ep, agent = keys[idx][:3]
        if uniq:
            continue
        ok = np.isfinite(values)
        prev = seen.get((ep, agent))
        if prev is None:
            seen[(ep, agent)] = (j, ok)
            continue
        both = prev[1] & ok
        if both.any():
            a, b = series[prev[0]][0], series[j][0]
            differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            shown = ", ".join(f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in differ[:3])
            raise InputError(
                f"the query returns several series for agent {agent!r} at the same steps (they differ in "
                f"{shown}); aggregate them in the query (e.g. sum by ({cq.keys['agent'].label}, ...) (...)) "
                "or name the label in [keys]",
                cq.entry,
            )
        seen[(ep, agent)] = (prev[0], prev[1] | ok)


def _set_policy(
    policy_m: np.ndarray, idx: int, ok: np.ndarray, code: int, policy_ids: dict[str, int], cq: ColumnQuery, idents: dict
) -> None:
    cur = policy_m[idx, ok]
    clash = (cur != 0) & (cur != code)
    if clash.any():
        other = next(name for name, c in policy_ids.items() if c == cur[clash][0])
        policy = next(name for name, c in policy_ids.items() if c == code)
        agent = list(idents)[idx][2]
        raise InputError(
            f"series for agent {agent!r} name policy {policy!r} where an earlier column's series name {other!r} "
            "at the same steps; every query must agree on which policy decided",
            cq.entry,
        )
    policy_m[idx, ok] = code


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")
