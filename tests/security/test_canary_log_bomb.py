"""Issue 45 item 5: a Parquet bomb in a canary log segment (or an outcome report) is refused from
its footer's declared rows and uncompressed sizes, before a page is decoded."""

from __future__ import annotations

import asyncio
import io
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from edgetwin.contract.errors import InputError
from edgetwin.edge.bus import Received
from edgetwin.edge.canary import CanaryLogCollector, canary_log_subject, segment_envelope
from edgetwin.edge.canary_command import outcome_rows
from edgetwin.edge.messages import Envelope, decode, encode
from edgetwin.edge.parquet_bounds import declared_size, read_parquet_bounded


def _bomb(rows: int) -> bytes:
    """``rows`` zeros: a few KB compressed, 8 bytes per row decoded."""
    t = pa.table({"agent": pa.array(np.zeros(rows, dtype=np.int64)), "kpi.slo": pa.array(np.zeros(rows))})
    buf = io.BytesIO()
    pq.write_table(t, buf, compression="zstd")
    return buf.getvalue()


def test_declared_sizes_are_read_without_decoding() -> None:
    data = _bomb(2_000_000)
    rows, size = declared_size(data, "bomb")
    assert rows == 2_000_000 and size >= 32_000_000 and len(data) < size // 50  # a bomb: >50x on decode
    with pytest.raises(InputError, match="refused undecoded"):
        read_parquet_bounded(data, max_rows=10**9, max_bytes=1_000_000, where="bomb")
    with pytest.raises(InputError, match="not a Parquet file"):
        read_parquet_bounded(b"PAR1 not really", 10, 10, where="junk")


def test_the_collector_refuses_a_bomb_segment_with_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    seg = tmp_path / "seg-000001.parquet"
    seg.write_bytes(_bomb(2_000_000))
    env = segment_envelope("a", "run1", seg, sender="runtime/a")
    collector = CanaryLogCollector(max_bytes=4_000_000)
    with caplog.at_level(logging.WARNING):
        asyncio.run(collector.handle(Received(canary_log_subject("a"), env, None, 0)))
    assert collector.refused == {"bounds": 1} and collector.log("a", "run1").empty
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0] and "decoded bytes" in lines[0]


def test_an_outcome_report_bomb_is_refused() -> None:
    env = Envelope(kind="canary_outcome", sender="system/a", payload={"site": "a", "t": 0},
                   tensors={"parquet": np.frombuffer(_bomb(2_000_000), dtype=np.uint8)})  # fmt: skip
    with pytest.raises(InputError, match="refused undecoded"):
        outcome_rows(decode(encode(env)), max_rows=100_000)


def test_a_dictionary_string_bomb_is_refused_before_it_expands() -> None:
    """One 100 KB string on 2,000 rows: a dictionary page of 100 KB, 200 MB once expanded."""
    long = "x" * 100_000
    t = pa.table({"agent": pa.array([long] * 2_000)})
    buf = io.BytesIO()
    pq.write_table(t, buf, compression="zstd")
    data = buf.getvalue()
    assert len(data) < 200_000
    with pytest.raises(InputError, match="expand to"):
        read_parquet_bounded(data, max_rows=10_000, max_bytes=10_000_000, where="strings")
    assert len(read_parquet_bounded(data, max_rows=10_000, max_bytes=300_000_000, where="strings")) == 2_000
