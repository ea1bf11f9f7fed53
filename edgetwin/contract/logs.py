"""Reading and writing logs in the contract: one row per ``(episode, t, agent)``.

Validation (every problem at once, quarantine) lives in :mod:`edgetwin.contract.validate`; this module
only gets a table in and out of Parquet/CSV and finds the spec that goes with it.
"""

from __future__ import annotations

import csv
import gzip
import io
import zlib
from pathlib import Path
from typing import IO

import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import (
    KEY_COLUMNS,
    META_COLUMNS,
    POLICY_COLUMN,
    PROVENANCE_COLUMNS,
    REWARD_COLUMN,
    TwinSpec,
    role_of,
    spec_path_for,
)

LOG_SUFFIXES = (".parquet", ".pq", ".csv", ".csv.gz")


def _suffix(path: Path) -> str:
    name = path.name.lower()
    for s in LOG_SUFFIXES:
        if name.endswith(s):
            return s
    raise InputError(f"unknown log format; expected one of {', '.join(LOG_SUFFIXES)}", str(path))


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a log table as it is on disk (no checks beyond being a readable table).

    The one reader of logs: it checks the raw header for repeated column names *before* pandas
    sees it (pandas would rename a second ``t`` to ``t.1`` and the copy would be dropped as an
    unknown column), and turns every way
    a file can be unreadable — truncated gzip, undecodable bytes (with the line), a broken Parquet
    footer — into one `InputError` naming the file.

    Raises:
        InputError: the file is missing, has an unknown suffix, repeats a column name, or cannot be
            parsed.
    """
    path = Path(path)
    suffix = _suffix(path)
    if not path.is_file():
        raise InputError("log file not found", str(path))
    if suffix in (".parquet", ".pq"):
        return _read_parquet(path)
    header = _csv_header(path)
    _check_unique(header, path)
    try:
        # Keys stay strings so that '007' and 7 are not silently merged; validation types them.
        return pd.read_csv(
            path,
            dtype={"episode": str, "agent": str, "scenario": str, "site": str, POLICY_COLUMN: str},
            encoding="utf-8",
        )
    except UnicodeDecodeError:
        raise InputError(_undecodable(path), str(path)) from None
    except Exception as e:  # untrusted bytes: truncated gzip (EOFError, zlib.error), parser errors, ...
        raise InputError(f"cannot read the table ({_one_line(e)})", str(path)) from None


def _open_raw(path: Path) -> IO[bytes]:
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]  # a GzipFile is a binary IO
    return path.open("rb")


def _csv_header(path: Path) -> list[str]:
    """The column names of a CSV's first line, exactly as written (no renaming of repeats)."""
    try:
        with _open_raw(path) as f:
            first = f.readline()
    except (OSError, EOFError, zlib.error) as e:
        raise InputError(f"cannot read the table ({_one_line(e)})", str(path)) from None
    try:
        text = first.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"line 1 (the header), byte {e.start + 1}: not UTF-8 text", str(path)) from None
    if not text.strip():
        raise InputError("cannot read the table (the file is empty: no header line)", str(path))
    return next(csv.reader(io.StringIO(text)))


def _check_unique(columns: list[str], path: Path) -> None:
    names = [str(c) for c in columns]
    dup = sorted({c for c in names if names.count(c) > 1})
    if dup:
        raise InputError(
            f"column names repeat in the header: {', '.join(repr(c) for c in dup)} "
            "(a table has one column per name; rename or drop the copies)",
            str(path),
        )


def _undecodable(path: Path) -> str:
    """Where the first byte that is not UTF-8 is: line and byte within the line."""
    try:
        with _open_raw(path) as f:
            for lineno, raw in enumerate(f, start=1):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    return f"line {lineno}, byte {e.start + 1}: not UTF-8 text (re-encode the file as UTF-8)"
    except (OSError, EOFError, zlib.error):
        pass
    return "not UTF-8 text (re-encode the file as UTF-8)"


def _read_parquet(path: Path) -> pd.DataFrame:
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except Exception as e:  # a broken footer: Arrow raises several kinds
        raise InputError(f"cannot read the table: not a readable Parquet file ({_one_line(e)})", str(path)) from None
    _check_unique(names, path)
    try:
        # a full validation first: Arrow reads invalid UTF-8 in a string column without a word and
        # fails only when the column is first used, deep inside validation
        pq.read_table(path).validate(full=True)
        return pd.read_parquet(path)
    except Exception as e:  # untrusted bytes: Arrow and pandas' metadata reader raise many kinds
        raise InputError(f"cannot read the table ({_one_line(e)})", str(path)) from None


def _one_line(e: BaseException) -> str:
    """An exception as one short line (Arrow errors can append a whole schema)."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = text if len(text) <= 200 else text[:197] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def write_table(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a log table as Parquet or CSV, by the path's suffix."""
    path = Path(path)
    suffix = _suffix(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix in (".parquet", ".pq"):
        df.to_parquet(path, index=False)
    else:
        df.to_csv(path, index=False)
    return path


def resolve_spec(log_path: str | Path, spec: str | Path | TwinSpec | None, columns: list[str]) -> TwinSpec:
    """The spec for a log: the one given, else ``LOG.spec.toml`` beside it, else inferred."""
    if isinstance(spec, TwinSpec):
        return spec
    if spec is not None:
        return TwinSpec.load(spec)
    beside = spec_path_for(log_path)
    if beside.is_file():
        return TwinSpec.load(beside)
    return TwinSpec.infer(columns, name=Path(log_path).stem)


def ordered_columns(spec: TwinSpec, extra: list[str] | None = None) -> list[str]:
    """The contract's column order: keys, meta, features in spec order, reward, policy, propensity,
    then extras (reward, policy and propensity only when in ``extra``)."""
    cols = [*KEY_COLUMNS, *META_COLUMNS, *(f.name for f in spec.features)]
    extra = [c for c in (extra or []) if c not in cols]
    for c in (REWARD_COLUMN, *PROVENANCE_COLUMNS):
        if c in extra:
            extra.remove(c)
            cols.append(c)
    return cols + extra


def role_columns(columns: list[str]) -> list[str]:
    """The columns of a table that carry a role prefix, in table order."""
    return [c for c in columns if role_of(c) is not None]
