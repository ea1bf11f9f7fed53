"""Parquet from the bus, decoded only within declared bounds (a Parquet bomb is refused unread).

A Parquet file's footer declares every row group's row count and every column chunk's
uncompressed size; pyarrow reads the footer without touching the data pages. A few hundred KB of
highly compressible pages can otherwise decode into gigabytes (issue 45 item 5: 516 KB -> 800 MB),
so every Parquet payload received from the bus (canary log segments, outcome reports) is checked
here first, as the Arrow decision path checks its record batches' buffer sizes
(`edgetwin.edge.decision_wire`).

Why not a memory limit on the decoder instead: pyarrow has no per-read allocation cap, and the
declared sizes are what the decoder will allocate (dictionary pages and nested offsets included
in ``total_uncompressed_size``), so checking them is both cheap and tight. A file whose data pages
lie about their sizes fails pyarrow's own page checks.
"""

from __future__ import annotations

import io

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from edgetwin.contract.errors import InputError

__all__ = ["declared_size", "read_parquet_bounded"]


def declared_size(data: bytes, where: str) -> tuple[int, int]:
    """``(rows, uncompressed bytes)`` a Parquet file declares in its footer (no page is decoded).

    Raises:
        InputError: the bytes are not a Parquet file.
    """
    try:
        meta = pq.ParquetFile(io.BytesIO(data)).metadata
    except (pa.ArrowException, OSError, ValueError) as e:
        raise InputError(f"not a Parquet file ({str(e).splitlines()[0][:120] if str(e) else type(e).__name__})",
                         where=where) from None  # fmt: skip
    size = 0
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        size += sum(max(0, rg.column(j).total_uncompressed_size) for j in range(rg.num_columns))
    return int(meta.num_rows), int(size)


def read_parquet_bounded(data: bytes, max_rows: int, max_bytes: int, where: str) -> pd.DataFrame:
    """The DataFrame of Parquet ``data`` when its footer declares at most ``max_rows`` rows and
    ``max_bytes`` uncompressed bytes; else `InputError` (one line naming ``where`` and the numbers)."""
    rows, size = declared_size(data, where)
    if rows > max_rows or size > max_bytes:
        raise InputError(f"Parquet declares {rows} rows / {size} uncompressed bytes, above the bound "
                         f"{max_rows} rows / {max_bytes} bytes (refused undecoded)", where=where)  # fmt: skip
    try:
        return pq.read_table(io.BytesIO(data)).to_pandas()
    except (pa.ArrowException, OSError, ValueError) as e:
        raise InputError(f"unreadable Parquet ({str(e).splitlines()[0][:120] if str(e) else type(e).__name__})",
                         where=where) from None  # fmt: skip
