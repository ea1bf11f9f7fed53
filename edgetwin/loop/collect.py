"""Collect a canary run's durable log to disk, streaming, each segment once.

The sites spool their canary log in segments ``<run>-<seq>`` (``seq`` 1, 2, ... per site) and ship
each durably on ``edgetwin.canary.log.<site>`` (`edgetwin.edge.canary`). `collect_canary` reads
them through a durable consumer of its own (so it replays everything stored, whoever else read it),
appends each new ``(site, seq)`` of the run to one Parquet file as it arrives (`pyarrow`'s
`ParquetWriter`: one row group per segment; a run's log is never held in memory whole), skips a
redelivered segment, and says which sequence numbers of each site never arrived.

Why a file and not `CanaryLogCollector`: that collector keeps every segment in memory to assemble
the log at the end, which is right for the emulated loop in one process and wrong for a day of a
real fleet.
"""

from __future__ import annotations

import asyncio
import io
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.edge.bus import Subjects

__all__ = ["CollectResult", "collect_canary", "publish_outcomes"]


@dataclass
class CollectResult:
    """What `collect_canary` wrote.

    Attributes:
        path: the Parquet file. rows: rows written. segments: ``{site: [seq, ...]}`` written.
        missing: ``{site: [seq, ...]}`` below the highest sequence seen (or below the count a
            site's status says it shipped) that never arrived. duplicates: redelivered segments
            skipped. refused: segments refused (another site's, undecodable, out of bounds).
    """

    path: Path
    rows: int = 0
    segments: dict[str, list[int]] = field(default_factory=dict)
    missing: dict[str, list[int]] = field(default_factory=dict)
    duplicates: int = 0
    refused: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "rows": self.rows, "segments": {k: len(v) for k, v in self.segments.items()},
                "missing": self.missing, "duplicates": self.duplicates, "refused": self.refused}  # fmt: skip


class _SegmentWriter:
    """Appends segments to one Parquet file; the first segment's schema is the file's (a later
    segment is cast to it, e.g. an all-null column; one with other columns is refused)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(f".{path.name}.part")
        self.writer: Any = None
        self.schema: Any = None

    def append(self, raw: bytes, where: str, max_rows: int, max_bytes: int) -> int:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from edgetwin.edge.parquet_bounds import declared_size

        rows, size = declared_size(raw, where)  # decoded only within bounds, as the edge's collector does
        if rows > max_rows or size > max_bytes:
            raise InputError(f"segment declares {rows} rows / {size} bytes, above {max_rows} / {max_bytes}", where)
        table = pq.read_table(io.BytesIO(raw))
        if self.writer is None:
            self.schema = table.schema.remove_metadata()
            self.tmp.parent.mkdir(parents=True, exist_ok=True)
            self.writer = pq.ParquetWriter(self.tmp, self.schema)
        if table.schema.names != self.schema.names:
            if sorted(table.schema.names) != sorted(self.schema.names):
                raise InputError(f"segment columns {table.schema.names} differ from the log's {self.schema.names}", where)
            table = table.select(self.schema.names)
        try:
            table = table.cast(self.schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise InputError(f"segment does not fit the log's schema ({e})", where) from None
        self.writer.write_table(table)
        return int(table.num_rows)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.tmp.replace(self.path)


async def collect_canary(
    bus: Any,
    run: str,
    out: str | Path,
    *,
    idle: float = 2.0,
    timeout: float = 600.0,
    expected: dict[str, int] | None = None,
    max_rows: int = 1_000_000,
    max_bytes: int = 512 * 1024 * 1024,
) -> CollectResult:
    """Read run ``run``'s log segments from the bus into ``out`` (Parquet), each ``(site, seq)`` once.

    Args:
        bus: a connected bus (NATS for a real fleet: the segments are stored by JetStream).
        run: the run id. out: the Parquet file written (replaced when done; nothing is written
            when no segment of the run arrived).
        idle: stop once no segment of the run arrived for this many seconds (and every
            ``expected`` segment did). timeout: stop after this many seconds whatever arrived.
        expected: segments each site shipped (its status's ``shipped``): a site's sequence numbers
            up to it that never arrive are reported missing, as are gaps below the highest seen.
        max_rows, max_bytes: a segment whose Parquet footer declares more is refused undecoded.

    A segment is the site's when its sender is ``runtime/<site>`` and its subject and payload name
    that site (on a bus with `edgetwin.edge.message_auth`, the bus has verified the sender); any
    other is refused and counted (``refused``), as is one that does not decode or fit the log.

    Raises:
        InputError: no segment of the run arrived.
    """
    Subjects._tok(run, "canary run id")
    path = Path(out)
    writer = _SegmentWriter(path)
    res = CollectResult(path)
    seen: dict[str, set[int]] = {}
    last = [time.monotonic()]

    async def handle(rcv: Any) -> None:
        env = rcv.envelope
        if env.kind != "canary_log" or str(env.payload.get("canary")) != run:
            return
        # attributed to its sender's site (``runtime/<site>``), never to what its payload claims:
        # the edge's `CanaryLogCollector` rule, so that a site cannot write into another's log
        sender, claimed = str(env.sender), str(env.payload["site"])
        site = sender.removeprefix("runtime/") if sender.startswith("runtime/") else None
        on = rcv.subject.rsplit(".", 1)[-1]
        if site is None or claimed != site or on != site:
            res.refused += 1
            return
        seq = int(env.payload["seq"])
        got = seen.setdefault(site, set())
        if seq in got:
            res.duplicates += 1
            return
        raw = np.asarray(env.tensors["parquet"], dtype=np.uint8).tobytes()
        try:
            res.rows += writer.append(raw, f"canary log {run}-{seq} of {site}", max_rows, max_bytes)
        except InputError:
            res.refused += 1
            return
        got.add(seq)
        last[0] = time.monotonic()

    def complete() -> bool:
        return all(len(seen.get(s, ())) >= n for s, n in (expected or {}).items())

    sub = await bus.subscribe_durable(f"{Subjects.PREFIX}.canary.log.>", f"collect-{run}-{uuid.uuid4().hex[:8]}", handle)
    start = time.monotonic()
    try:
        while time.monotonic() - start < timeout:
            await asyncio.sleep(0.05)
            if time.monotonic() - last[0] >= idle and (complete() or time.monotonic() - last[0] >= 3 * idle):
                break
    finally:
        await sub.unsubscribe()
        writer.close()
    if not seen:
        raise InputError(f"no log segment of run {run!r} on the bus", "canary collect")
    for site, got in sorted(seen.items()):
        res.segments[site] = sorted(got)
        top = max(max(got), int((expected or {}).get(site, 0)))
        gap = sorted(set(range(1, top + 1)) - got)
        if gap:
            res.missing[site] = gap
    for site, n in (expected or {}).items():
        if site not in seen and n > 0:
            res.missing[site] = list(range(1, n + 1))
    return res


async def publish_outcomes(
    bus: Any, outcomes: pd.DataFrame, site: str, *, sender: str = "system", day: str | int = ""
) -> int:
    """Report a system's outcome rows to edge ``site``, one durable ``canary_outcome`` per tick
    (`edgetwin.edge.canary_command.outcome_envelope` on ``edgetwin.canary.outcome.<site>``); the
    site joins each with the decisions it made for the same groups at that tick into its canary
    log (``policy`` = the version that decided, ``propensity``, ``arm``; `edgetwin.edge.canary_join`).

    The rows are the log contract's (at least ``t``, ``agent`` and the guarded ``kpi.*``): a
    system that reports as it runs (`edgetwin.loop.fleet.drive_cluster_over_bus`), or outcomes
    read from the system's metrics afterwards, e.g. ``edgetwin logs import prometheus`` (whose
    ``t`` is the tick of the day its ``episode`` names). A ``policy`` / ``propensity`` column is
    not sent: who decided is the site's record, not the system's claim.

    Args:
        bus: a connected bus (on NATS with ``bus.auth`` holding ``sender``'s key when the sites'
            ``--reporters`` require signed reports).
        day: names the reports' message ids (``outcome-<site>-<day>-<t>``: JetStream drops a
            re-sent report of the same day and tick as a duplicate; another day's tick t is new).

    Returns:
        The reports published (one per tick).
    """
    from edgetwin.edge.canary_command import outcome_envelope, outcome_subject

    for c in ("t", "agent"):
        if c not in outcomes.columns:
            raise InputError(f"outcome rows lack column {c!r}", "outcomes")
    rows = outcomes.drop(columns=[c for c in ("policy", "propensity") if c in outcomes.columns])
    n = 0
    for t, part in rows.groupby("t", sort=True):
        env = outcome_envelope(site, int(t), part.reset_index(drop=True), sender=sender)
        env.msg_id = f"outcome-{site}-{day}-{int(t)}"
        await bus.publish_durable(outcome_subject(site), env)
        n += 1
    return n
