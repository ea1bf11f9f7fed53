"""Reading and writing logs in the contract: one row per ``(episode, t, agent)``.

Validation (every problem at once, quarantine) lives in :mod:`edgetwin.contract.validate`; this module
only gets a table in and out of Parquet/CSV and finds the spec that goes with it.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import KEY_COLUMNS, META_COLUMNS, REWARD_COLUMN, TwinSpec, role_of, spec_path_for

LOG_SUFFIXES = (".parquet", ".pq", ".csv", ".csv.gz")


def _suffix(path: Path) -> str:
    name = path.name.lower()
    for s in LOG_SUFFIXES:
        if name.endswith(s):
            return s
    raise InputError(f"unknown log format; expected one of {', '.join(LOG_SUFFIXES)}", str(path))


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a log table as it is on disk (no checks beyond being a readable table).

    Raises:
        InputError: the file is missing, has an unknown suffix or cannot be parsed.
    """
    path = Path(path)
    suffix = _suffix(path)
    if not path.is_file():
        raise InputError("log file not found", str(path))
    try:
        if suffix in (".parquet", ".pq"):
            return pd.read_parquet(path)
        # Keys stay strings so that '007' and 7 are not silently merged; validation types them.
        return pd.read_csv(path, dtype={"episode": str, "agent": str, "scenario": str, "site": str})
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise InputError(f"cannot read the table ({type(e).__name__}: {e})", str(path)) from None


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
    """The contract's column order: keys, meta, features in spec order, reward, then extras."""
    cols = [*KEY_COLUMNS, *META_COLUMNS, *(f.name for f in spec.features)]
    extra = [c for c in (extra or []) if c not in cols]
    if REWARD_COLUMN in extra:
        extra.remove(REWARD_COLUMN)
        cols.append(REWARD_COLUMN)
    return cols + extra


def role_columns(columns: list[str]) -> list[str]:
    """The columns of a table that carry a role prefix, in table order."""
    return [c for c in columns if role_of(c) is not None]
