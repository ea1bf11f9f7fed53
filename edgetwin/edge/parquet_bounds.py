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


#: bytes per value once decoded, by Parquet physical type (a BYTE_ARRAY column is read as a
#: dictionary, `read_parquet_bounded`: one index per value, its distinct values counted in the
#: column chunk's own size)
_WIDTH = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8, "BYTE_ARRAY": 8}


def declared_size(data: bytes, where: str) -> tuple[int, int]:
    """``(rows, bytes)`` a Parquet file declares in its footer (no page is decoded): per column
    chunk the larger of its uncompressed size and its values times their decoded width. The
    uncompressed size alone is no bound: it is measured *after* decompression but *before*
    dictionary and run-length decoding, so 2 million zeros declare 16 KB and decode to 16 MB.

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
        for j in range(rg.num_columns):
            c = rg.column(j)
            width = _WIDTH.get(c.physical_type, 0)
            if c.physical_type == "FIXED_LEN_BYTE_ARRAY":
                width = int(meta.schema.column(j).length or 0)
            size += max(max(0, c.total_uncompressed_size), max(0, c.num_values) * width)
    return int(meta.num_rows), int(size)


def _dictionary_expansion(table: pa.Table) -> int:
    """The bytes the table's dictionary columns take once every row holds its own string (their
    values' lengths summed over the rows' indices: int32 work per row, no string copied)."""
    import pyarrow.compute as pc

    total = 0
    for col in table.columns:
        if not pa.types.is_dictionary(col.type):
            continue
        for chunk in col.chunks:
            lens = pc.binary_length(chunk.dictionary)
            total += int(pc.sum(pc.take(lens, chunk.indices)).as_py() or 0)
    return total


def read_parquet_bounded(data: bytes, max_rows: int, max_bytes: int, where: str) -> pd.DataFrame:
    """The DataFrame of Parquet ``data`` when its footer declares at most ``max_rows`` rows and
    ``max_bytes`` decoded bytes (`declared_size`); else `InputError` (one line naming ``where`` and
    the numbers). String columns are read as dictionaries first (a dictionary page of one long
    string repeated on every row would otherwise be copied into every row before any check), their
    expanded size checked against ``max_bytes`` too, and then handed back with the dtype
    ``pandas.read_parquet`` gives strings."""
    rows, size = declared_size(data, where)
    if rows > max_rows or size > max_bytes:
        raise InputError(f"Parquet declares {rows} rows / {size} decoded bytes, above the bound "
                         f"{max_rows} rows / {max_bytes} bytes (refused undecoded)", where=where)  # fmt: skip
    try:
        f = pq.ParquetFile(io.BytesIO(data))
        strings = [f.schema.column(j).path for j in range(len(f.schema)) if f.schema.column(j).physical_type == "BYTE_ARRAY"]
        table = pq.read_table(io.BytesIO(data), read_dictionary=strings or None)
        expanded = size + _dictionary_expansion(table)
        if expanded > max_bytes:
            raise InputError(f"Parquet strings expand to {expanded} bytes, above the bound {max_bytes} bytes "
                             "(refused before expanding)", where=where)  # fmt: skip
        df = table.to_pandas()
    except (pa.ArrowException, OSError, ValueError) as e:
        raise InputError(f"unreadable Parquet ({str(e).splitlines()[0][:120] if str(e) else type(e).__name__})",
                         where=where) from None  # fmt: skip
    for c in df.columns:
        if isinstance(df[c].dtype, pd.CategoricalDtype):
            df[c] = df[c].astype(df[c].cat.categories.dtype)
    return df
