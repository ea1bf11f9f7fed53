"""Adapters from real workload traces to one `TraceSample` (task durations, cpu, memory, arrivals).

The emulated cluster takes the *shapes* of task time, cpu and memory and the arrival-rate curve
over the day from a trace when one is given (see `edgetwin.emulator.population`). One reader per format
in ``../shared/data`` (MANIFEST.md):

==========================  ===============================================================
``alibaba-batch-task``      Alibaba cluster-trace-v2017 ``batch_task.csv`` (task create/end s,
                            cpus x100, normalised memory)
``opendc``                  OpenDC ``tasks.parquet`` (+ ``fragments.parquet`` beside it):
                            Bitbrains, SURF Lisa (ms, MHz, KB)
``google-task-events``      Google cluster-data 2011 ``task_events`` (µs, normalised requests)
``azure-llm``               Azure LLM inference 2023 (``TIMESTAMP, ContextTokens,
                            GeneratedTokens``): arrivals; service time from a token model
``cloudsimpy-jobs``         CloudSimPy ``jobs.csv`` (Alibaba v2017 re-shaped)
==========================  ===============================================================

A malformed file raises `InputError` naming the file, the (1-based, header = line 1) row and the
column, and what was expected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from edgetwin.contract.errors import InputError

FORMATS: tuple[str, ...] = ("alibaba-batch-task", "opendc", "google-task-events", "azure-llm", "cloudsimpy-jobs")


@dataclass(eq=False)
class TraceSample:
    """Tasks and arrivals of a real trace, in common units.

    Attributes:
        name: a label (format and file).
        durations_s: (n,) task run times in seconds, or None when the trace has none.
        cpu: (n,) cores requested/used per task, or None.
        memory: (n,) memory per task in ``memory_unit``, or None.
        arrivals_s: (m,) sorted arrival (submission) times in seconds from the trace's start.
        memory_unit: ``"GB"`` or ``"normalised"`` (fraction of the largest machine).
        cpu_unit: ``"cores"`` or ``"normalised"``.
        meta: free-form facts about the read (rows kept/dropped and why).

    Only the shapes matter to the cluster (each is rescaled to a component's median), so normalised
    units are fine.
    """

    name: str
    durations_s: np.ndarray | None
    cpu: np.ndarray | None
    memory: np.ndarray | None
    arrivals_s: np.ndarray | None
    memory_unit: str = "GB"
    cpu_unit: str = "cores"
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def span_s(self) -> float:
        a = self.arrivals_s
        return float(a[-1] - a[0]) if a is not None and len(a) > 1 else 0.0

    def arrival_profile(self, bins: int = 96, period_s: float = 86400.0, smooth_bins: int = 3) -> np.ndarray:
        """Arrival-rate multiplier over a day, ``(bins,)`` with mean 1.

        A trace covering at least 3/4 of ``period_s`` is folded by time of day (its start taken as
        midnight); a shorter one (e.g. an hour of LLM requests) has its rate curve over its span
        stretched onto the day. A circular moving average of ``smooth_bins`` bins removes counting
        noise; with fewer than 20 arrivals per bin the curve is shrunk toward flat in proportion;
        bins are clipped to [0.1, 10] of the mean so a quiet bin never stops all arrivals.
        """
        if self.arrivals_s is None or len(self.arrivals_s) < 2:
            return np.ones(bins)
        a = np.asarray(self.arrivals_s, dtype=np.float64) - float(self.arrivals_s[0])
        span = max(self.span_s, 1e-9)
        if span >= 0.75 * period_s:
            days = max(span / period_s, 1.0)
            counts = np.bincount((np.floor((a % period_s) / period_s * bins)).astype(np.int64) % bins, minlength=bins)
            # Hours of the day seen fewer times (partial last day) are rescaled by their coverage.
            cover = np.full(bins, np.floor(days))
            tail = span - np.floor(days) * period_s
            cover[: int(np.ceil(tail / period_s * bins))] += 1
            rate = counts / np.maximum(cover, 1)
        else:
            rate = np.bincount(np.minimum((a / span * bins).astype(np.int64), bins - 1), minlength=bins).astype(np.float64)
        if smooth_bins > 1:
            k = np.ones(smooth_bins) / smooth_bins
            rate = np.convolve(np.concatenate([rate[-smooth_bins:], rate, rate[:smooth_bins]]), k, mode="same")[
                smooth_bins:-smooth_bins
            ]
        rate = rate / max(rate.mean(), 1e-12)
        # Shrink toward flat when there are few arrivals per bin (50 VMs say little about a day).
        w = min(1.0, len(a) / (20.0 * bins))
        rate = np.clip(w * rate + (1.0 - w), 0.1, 10.0)
        return rate / rate.mean()

    def summary(self) -> dict[str, Any]:
        def q(x: np.ndarray | None) -> dict[str, float] | None:
            if x is None or len(x) == 0:
                return None
            return {k: float(v) for k, v in zip(("p10", "p50", "p90", "p99"), np.quantile(x, [0.1, 0.5, 0.9, 0.99]), strict=True)}

        return {
            "name": self.name,
            "tasks": 0 if self.durations_s is None else len(self.durations_s),
            "arrivals": 0 if self.arrivals_s is None else len(self.arrivals_s),
            "span_s": self.span_s,
            "duration_s": q(self.durations_s),
            f"cpu_{self.cpu_unit}": q(self.cpu),
            f"memory_{self.memory_unit}": q(self.memory),
            **self.meta,
        }


# ------------------------------------------------------------------------------------ helpers
def _need_file(path: Path) -> None:
    if not path.is_file():
        raise InputError("trace file not found", str(path))


def _read_csv(path: Path, **kw: Any) -> pd.DataFrame:
    try:
        return pd.read_csv(path, **kw)
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise InputError(f"cannot read as CSV ({type(e).__name__}: {e})", str(path)) from None


def _require(df: pd.DataFrame, cols: list[str], path: Path, what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise InputError(f"not a {what} file: missing columns {missing}; found {list(df.columns)[:10]}", str(path))


def _numeric(df: pd.DataFrame, col: str, path: Path, first_line: int = 2, allow_missing: bool = False) -> np.ndarray:
    """Column as floats; the first non-numeric (or, unless allowed, missing) cell is an InputError
    naming ``file:line:column`` (``first_line`` = file line of the first data row)."""
    raw = df[col]
    vals = pd.to_numeric(raw, errors="coerce")
    bad = vals.isna() & (raw.notna() if allow_missing else True)
    if allow_missing:
        bad &= raw.astype(str).str.strip().ne("")
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise InputError(
            f"expected a number, got {raw.iloc[i]!r} ({int(bad.sum())} bad cells in this column)",
            f"{path}:{i + first_line}:{col}",
        )
    return vals.to_numpy(dtype=np.float64)


def _nonneg(x: np.ndarray, col: str, path: Path, first_line: int = 2) -> None:
    neg = np.flatnonzero(np.nan_to_num(x, nan=0.0) < 0)
    if len(neg):
        raise InputError(f"expected a value >= 0, got {x[neg[0]]}", f"{path}:{neg[0] + first_line}:{col}")


def _arrivals(t: np.ndarray) -> np.ndarray:
    t = np.sort(t[np.isfinite(t)])
    return t - t[0] if len(t) else t


# ------------------------------------------------------------------------------------ readers
ALIBABA_BATCH_TASK_COLUMNS = [
    "task_create_time",
    "task_end_time",
    "job_id",
    "task_id",
    "number_of_instances",
    "status",
    "number_of_cpus_requested_per_instance_in_the_task",
    "normalized_memory_requested_per_instance_in_the_task",
]


def read_alibaba_batch_task(path: str | Path) -> TraceSample:
    """Alibaba cluster-trace-v2017 ``batch_task``: one row per task (times s, cpus x100).

    Durations are ``end - create`` of ``Terminated`` tasks; cpu is cores (``cpus / 100``); memory is
    normalised; arrivals are every task's create time. A file without the header line (the original
    trace's layout) is read with the schema's column names.
    """
    path = Path(path)
    _need_file(path)
    with path.open() as f:
        first = f.readline()
    has_header = "task_create_time" in first
    df = _read_csv(
        path,
        skipinitialspace=True,
        header=0 if has_header else None,
        names=None if has_header else ALIBABA_BATCH_TASK_COLUMNS,
        dtype=str,
    )
    df.columns = [str(c).strip() for c in df.columns]
    _require(df, ALIBABA_BATCH_TASK_COLUMNS, path, "Alibaba v2017 batch_task")
    line0 = 2 if has_header else 1
    create = _numeric(df, "task_create_time", path, line0)
    end = _numeric(df, "task_end_time", path, line0)
    cpu = _numeric(df, "number_of_cpus_requested_per_instance_in_the_task", path, line0, allow_missing=True) / 100.0
    mem = _numeric(df, "normalized_memory_requested_per_instance_in_the_task", path, line0, allow_missing=True)
    _nonneg(cpu, "number_of_cpus_requested_per_instance_in_the_task", path, line0)
    _nonneg(mem, "normalized_memory_requested_per_instance_in_the_task", path, line0)
    done = (df["status"].str.strip() == "Terminated").to_numpy() & (end > create)
    return TraceSample(
        name=f"alibaba-batch-task:{path.name}",
        durations_s=(end - create)[done],
        cpu=cpu[done & np.isfinite(cpu) & (cpu > 0)],
        memory=mem[done & np.isfinite(mem) & (mem > 0)],
        arrivals_s=_arrivals(create),
        memory_unit="normalised",
        meta={"rows": len(df), "terminated_with_duration": int(done.sum())},
    )


def read_cloudsimpy_jobs(path: str | Path) -> TraceSample:
    """CloudSimPy ``jobs.csv`` (Alibaba v2017 batch tasks re-shaped): submit_time s, duration s,
    cpu cores, normalised memory."""
    path = Path(path)
    _need_file(path)
    df = _read_csv(path)
    _require(df, ["submit_time", "duration", "cpu", "memory"], path, "CloudSimPy jobs")
    sub = _numeric(df, "submit_time", path)
    dur = _numeric(df, "duration", path)
    cpu = _numeric(df, "cpu", path)
    mem = _numeric(df, "memory", path)
    for x, c in ((dur, "duration"), (cpu, "cpu"), (mem, "memory")):
        _nonneg(x, c, path)
    return TraceSample(
        name=f"cloudsimpy-jobs:{path.name}",
        durations_s=dur[dur > 0],
        cpu=cpu[cpu > 0],
        memory=mem[mem > 0],
        arrivals_s=_arrivals(sub),
        memory_unit="normalised",
        meta={"rows": len(df)},
    )


def _read_parquet(path: Path, cols: list[str], what: str) -> pd.DataFrame:
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as e:
        raise InputError(f"cannot read as Parquet ({type(e).__name__}: {e})", str(path)) from None
    df = table.to_pandas()
    _require(df, cols, path, what)
    for c in cols:
        if not pd.api.types.is_numeric_dtype(df[c]):
            bad = pd.to_numeric(df[c], errors="coerce").isna()
            i = int(np.flatnonzero(bad.to_numpy())[0]) if bad.any() else 0
            raise InputError(f"expected a numeric column, got {df[c].dtype} (e.g. {df[c].iloc[i]!r})", f"{path}:{i + 1}:{c}")
    return df


def read_opendc(path: str | Path) -> TraceSample:
    """OpenDC workload trace (v4): ``tasks.parquet`` (``submission_time`` ms epoch, ``duration`` ms,
    ``cpu_count``, ``cpu_capacity`` MHz, ``mem_capacity`` KB), optionally ``fragments.parquet``
    beside it (``id, duration`` ms, ``cpu_usage`` MHz).

    ``path`` is the tasks file or its folder. With fragments, cpu is the task's mean cores in use
    (duration-weighted ``cpu_usage`` over the MHz of one core), otherwise its ``cpu_count``.
    Parquet rows are numbered from 1.
    """
    path = Path(path)
    tasks_path = path / "tasks.parquet" if path.is_dir() else path
    _need_file(tasks_path)
    cols = ["id", "submission_time", "duration", "cpu_count", "cpu_capacity", "mem_capacity"]
    tasks = _read_parquet(tasks_path, cols, "OpenDC tasks")
    for c in ("duration", "cpu_count", "cpu_capacity", "mem_capacity"):
        _nonneg(tasks[c].to_numpy(dtype=np.float64), c, tasks_path, first_line=1)
    dur = tasks["duration"].to_numpy(dtype=np.float64) / 1000.0
    cores = tasks["cpu_count"].to_numpy(dtype=np.float64)
    mhz_per_core = tasks["cpu_capacity"].to_numpy(dtype=np.float64) / np.maximum(cores, 1.0)
    cpu = cores.copy()
    frag_path = tasks_path.with_name("fragments.parquet")
    meta: dict[str, Any] = {"rows": len(tasks), "fragments": False}
    if frag_path.is_file():
        frags = _read_parquet(frag_path, ["id", "duration", "cpu_usage"], "OpenDC fragments")
        _nonneg(frags["duration"].to_numpy(dtype=np.float64), "duration", frag_path, first_line=1)
        _nonneg(frags["cpu_usage"].to_numpy(dtype=np.float64), "cpu_usage", frag_path, first_line=1)
        w = frags["duration"].to_numpy(dtype=np.float64)
        g = pd.DataFrame({"id": frags["id"].to_numpy(), "wu": w * frags["cpu_usage"].to_numpy(dtype=np.float64), "w": w})
        agg = g.groupby("id")[["wu", "w"]].sum()
        mean_mhz = (agg["wu"] / agg["w"].where(agg["w"] > 0)).reindex(tasks["id"].to_numpy()).to_numpy()
        used = mean_mhz / np.maximum(mhz_per_core, 1e-9)
        cpu = np.where(np.isfinite(used) & (used > 0), used, cpu)
        meta["fragments"] = True
        meta["tasks_with_fragments"] = int(np.isfinite(mean_mhz).sum())
    sub = tasks["submission_time"].to_numpy(dtype=np.float64) / 1000.0
    mem_gb = tasks["mem_capacity"].to_numpy(dtype=np.float64) / 1024.0**2
    return TraceSample(
        name=f"opendc:{tasks_path.parent.name}",
        durations_s=dur[dur > 0],
        cpu=cpu[cpu > 0],
        memory=mem_gb[mem_gb > 0],
        arrivals_s=_arrivals(sub),
        meta=meta,
    )


GOOGLE_TASK_EVENT_COLUMNS = [
    "timestamp_us",
    "missing_info",
    "job_id",
    "task_index",
    "machine_id",
    "event_type",
    "user",
    "scheduling_class",
    "priority",
    "cpu_request",
    "memory_request",
    "disk_request",
    "different_machine",
]


def read_google_task_events(path: str | Path) -> TraceSample:
    """Google cluster-data 2011 ``task_events`` (13 columns, no header or a ``#`` comment header).

    Arrivals are SUBMIT (0) events; durations run from a task's last SCHEDULE (1) to its FINISH
    (4); cpu and memory are the normalised requests of submitted tasks.
    """
    path = Path(path)
    _need_file(path)
    df = _read_csv(path, header=None, comment=None, dtype=str, skip_blank_lines=True)
    first_line = 1
    if len(df) and str(df.iloc[0, 0]).startswith("#"):
        df = df.iloc[1:].reset_index(drop=True)
        first_line = 2
    if df.shape[1] != len(GOOGLE_TASK_EVENT_COLUMNS):
        raise InputError(
            f"expected {len(GOOGLE_TASK_EVENT_COLUMNS)} columns (Google 2011 task_events), got {df.shape[1]}", str(path)
        )
    df.columns = GOOGLE_TASK_EVENT_COLUMNS
    ts = _numeric(df, "timestamp_us", path, first_line) / 1e6
    ev = _numeric(df, "event_type", path, first_line)
    job = _numeric(df, "job_id", path, first_line)
    idx = _numeric(df, "task_index", path, first_line)
    cpu = _numeric(df, "cpu_request", path, first_line, allow_missing=True)
    mem = _numeric(df, "memory_request", path, first_line, allow_missing=True)
    unknown = np.flatnonzero(~np.isin(ev, np.arange(9)))
    if len(unknown):
        i = int(unknown[0])
        raise InputError(f"event type must be 0..8, got {ev[i]}", f"{path}:{i + first_line}:event_type")
    submit = ev == 0
    durations: list[float] = []
    started: dict[tuple[float, float], float] = {}
    for t, e, j, k in zip(ts, ev, job, idx, strict=True):
        if e == 1:
            started[(j, k)] = t
        elif e == 4 and (j, k) in started:
            durations.append(t - started.pop((j, k)))
    d = np.asarray(durations)
    return TraceSample(
        name=f"google-task-events:{path.name}",
        durations_s=d[d > 0] if len(d) else None,
        cpu=cpu[submit & (cpu > 0)],
        memory=mem[submit & (mem > 0)],
        arrivals_s=_arrivals(ts[submit]),
        memory_unit="normalised",
        cpu_unit="normalised",
        meta={"rows": len(df), "finished_tasks": len(d)},
    )


def read_azure_llm(path: str | Path, prefill_tokens_per_s: float = 4000.0, decode_tokens_per_s: float = 40.0) -> TraceSample:
    """Azure LLM inference trace 2023 (``TIMESTAMP, ContextTokens, GeneratedTokens``).

    The trace has arrivals and token counts but no run times: a request's service time is modelled
    as ``context / prefill_tokens_per_s + generated / decode_tokens_per_s`` (defaults are typical of
    one accelerator serving a 7-13B model; change them to match your hardware). No cpu/memory.
    """
    path = Path(path)
    _need_file(path)
    df = _read_csv(path, dtype=str)
    _require(df, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], path, "Azure LLM inference")
    ts = pd.to_datetime(df["TIMESTAMP"], errors="coerce")
    if ts.isna().any():
        i = int(np.flatnonzero(ts.isna().to_numpy())[0])
        raise InputError(f"expected a timestamp, got {df['TIMESTAMP'].iloc[i]!r}", f"{path}:{i + 2}:TIMESTAMP")
    ctx = _numeric(df, "ContextTokens", path)
    gen = _numeric(df, "GeneratedTokens", path)
    _nonneg(ctx, "ContextTokens", path)
    _nonneg(gen, "GeneratedTokens", path)
    t = (ts - ts.min()).dt.total_seconds().to_numpy()
    dur = ctx / prefill_tokens_per_s + gen / decode_tokens_per_s
    return TraceSample(
        name=f"azure-llm:{path.name}",
        durations_s=dur[dur > 0],
        cpu=None,
        memory=None,
        arrivals_s=_arrivals(t),
        meta={"rows": len(df), "durations": "modelled from token counts"},
    )


_READERS = {
    "alibaba-batch-task": read_alibaba_batch_task,
    "opendc": read_opendc,
    "google-task-events": read_google_task_events,
    "azure-llm": read_azure_llm,
    "cloudsimpy-jobs": read_cloudsimpy_jobs,
}


def detect_format(path: str | Path) -> str:
    """Guess a trace's format from its name and first line; `InputError` if none fits."""
    path = Path(path)
    if path.is_dir() or path.suffix in (".parquet", ".pq"):
        return "opendc"
    if not path.is_file():
        raise InputError("trace file not found", str(path))
    with path.open(errors="replace") as f:
        first = f.readline()
    head = first.replace(" ", "")
    if "task_create_time" in head:
        return "alibaba-batch-task"
    if head.startswith("TIMESTAMP") and "ContextTokens" in head:
        return "azure-llm"
    if "submit_time" in head and "duration" in head:
        return "cloudsimpy-jobs"
    if first.startswith("#") and "Event type" in first or first.count(",") == 12:
        return "google-task-events"
    if first.count(",") == 7:
        return "alibaba-batch-task"
    raise InputError(f"cannot tell the trace format from its first line; give one of {FORMATS}", str(path))


def read_trace(path: str | Path, fmt: str | None = None) -> TraceSample:
    """Read a trace in any supported format (auto-detected unless ``fmt`` names one of `FORMATS`)."""
    fmt = fmt or detect_format(path)
    if fmt not in _READERS:
        raise InputError(f"unknown trace format {fmt!r}; expected one of {FORMATS}", "--trace-format")
    return _READERS[fmt](path)
