"""A twin's training data: reading a log for a fit (`load_log`), naming it (`data_sha256`, with
the library versions that read it), and drawing an ensemble member's bootstrap of its episodes
(`bootstrap_episodes`). Shared by `Twin.fit`, `Twin.update` (`edgetwin.twin.update`) and the
federated fit; re-exported by `edgetwin.twin.twin`."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from edgetwin.contract.spec import TwinSpec
from edgetwin.contract.validate import load_valid_log

__all__ = [
    "MappedLog",
    "bootstrap_episodes",
    "bootstrap_rows",
    "data_sha256",
    "episode_hash_columns",
    "episode_hashes",
    "library_versions",
    "load_log",
    "overlapping_episodes",
]


def data_sha256(df: pd.DataFrame) -> str:
    """sha256 of a table's content (row order and column order included)."""
    h = hashlib.sha256()
    h.update(json.dumps([str(c) for c in df.columns]).encode())
    h.update(pd.util.hash_pandas_object(df, index=False).to_numpy().tobytes())
    return h.hexdigest()


def episode_hash_columns(layout: Any) -> list[str]:
    """The columns an episode's hash covers: its time, agents, sites and the twin's profile, state
    and action columns (not its name: a renamed copy of a training episode is still one)."""
    return list(dict.fromkeys(["t", "agent", "site", *layout.profile, *layout.state, *layout.action]))


def episode_hashes(df: pd.DataFrame, columns: Sequence[str]) -> dict[str, str]:
    """``{episode: sha256}`` of each episode's rows over ``columns``, rows in (t, agent) order.

    Numbers are hashed as float64 and everything else as text, so the same rows read from CSV or
    Parquet hash alike. One row hash per row (`pandas.util.hash_pandas_object`, vectorised) and
    one sha256 per episode over its rows' hashes: cheap next to a fit (a second at a million rows).
    Raises KeyError naming a missing column.
    """
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise KeyError(f"the log lacks column(s) {missing}")
    d = df.sort_values(["episode", "t", "agent"], kind="stable")
    frame = pd.DataFrame(
        {
            c: (d[c].astype(np.float64) if pd.api.types.is_numeric_dtype(d[c]) else d[c].astype(str))
            for c in columns
        }
    )
    rows = pd.util.hash_pandas_object(frame, index=False).to_numpy()
    out = {}
    for name, ix in d.reset_index(drop=True).groupby("episode", sort=False).indices.items():
        out[str(name)] = hashlib.sha256(rows[ix].tobytes()).hexdigest()
    return out


def overlapping_episodes(
    twin_meta: Mapping[str, Any],
    df: pd.DataFrame,
    episodes: Sequence[str] | None = None,
    spec: TwinSpec | None = None,
) -> list[str]:
    """The episodes of ``df`` (only ``episodes`` when given) whose rows the twin was fitted on.

    Compared episode by episode with the twin's ``meta["episode_sha256"]`` (recorded at fit time);
    a twin saved before it records only ``data_sha256``, and then the whole table is compared (a
    log that *is* the training data overlaps in every episode). Returns the names, sorted.
    """
    known = twin_meta.get("episode_sha256")
    if isinstance(known, Mapping) and known:
        cols = list(twin_meta.get("episode_hash_columns") or [])
        try:
            mine = episode_hashes(df, cols)
        except KeyError:
            return []
        train = set(known.values())
        names = set(map(str, episodes)) if episodes is not None else set(mine)
        return sorted(n for n, h in mine.items() if n in names and h in train)
    sha = twin_meta.get("data_sha256")
    if sha and {"episode", "t", "agent"} <= set(df.columns):
        tables = [df]
        if spec is not None:  # the fit hashed the validated table (`load_log`), as the CLI reads a log
            # a log that does not validate is not the twin's training data
            with contextlib.suppress(Exception):
                tables.append(load_log(df, spec)[0])
        for t in tables:
            d = t.sort_values(["episode", "t", "agent"], kind="stable").reset_index(drop=True)
            if data_sha256(d) == sha:
                return sorted(map(str, episodes if episodes is not None else pd.unique(df["episode"])))
    return []


def library_versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for pkg in (
        "edgetwin",
        "torch",
        "stable-baselines3",
        "imitation",
        "scikit-learn",
        "numpy",
        "pandas",
        "gymnasium",
    ):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "absent"
    return out


def load_log(
    log: str | Path | pd.DataFrame, spec: str | Path | TwinSpec | None
) -> tuple[pd.DataFrame, TwinSpec]:
    """A usable log table and its spec, validated (`edgetwin.contract.validate.load_valid_log`)."""
    df, sp, _ = load_valid_log(log, spec)
    return df, sp


def bootstrap_rows(
    episode: pd.Series | np.ndarray, episodes: np.ndarray, pick: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Which rows of a log a bootstrap draw of its episodes takes, and their new episode names:
    ``(rows (M,), names (M,))`` for the log's ``episode`` column ``(N,)``, its distinct
    ``episodes`` and the drawn indices ``pick``; the k-th drawn episode is named ``<episode>#k``.
    The drawn episodes come in the order of their new names, each with its rows in the log's
    order (`bootstrap_episodes`)."""
    ep_rows = pd.DataFrame({"episode": episode}).groupby("episode", sort=False).indices
    names = np.array([f"{episodes[e]}#{k}" for k, e in enumerate(pick)], dtype=object)
    order = np.argsort(names, kind="stable")
    rows = [ep_rows[episodes[pick[k]]] for k in order]
    return np.concatenate(rows), np.repeat(names[order], [len(r) for r in rows])


def bootstrap_episodes(df: pd.DataFrame, episodes: np.ndarray, pick: np.ndarray | None) -> pd.DataFrame:
    """The log with episodes ``episodes[pick]`` (all of it when ``pick`` is None); the k-th drawn
    episode is renamed ``<episode>#k``, so a repeated episode becomes a distinct one.

    The drawn episodes come in the order of their new names, each with its rows in ``df``'s
    order: when ``df`` is sorted by (episode, t, agent), as `Twin.fit` sorts it, so is the draw,
    and `build_steps`' sort of it is a view instead of one more copy of the draw (pandas
    copy-on-write). Which rows are drawn, and so the member, does not depend on the order.
    """
    if pick is None:
        return df
    rows, names = bootstrap_rows(df["episode"], episodes, pick)
    # one take of every drawn row (not a copy per draw and then their concatenation: at a million
    # rows the parts and the result would sit in a pool worker's memory together)
    out = df.take(rows).reset_index(drop=True)
    out["episode"] = names
    return out


class MappedLog:
    """A fit's log as an Arrow IPC file that pool workers memory-map (``path``; written once by
    `write`), from which each member takes only its bootstrap draw (`draw`).

    Why: a pool worker that received the log itself (unpickled) kept the whole table resident
    while it fitted a member from its draw, and for its next member: at a million rows ~0.4 GB per
    worker beside the draw, the step table and behaviour cloning's batches, the largest share of
    the 1M-row fit's peak that the members did not need (docs/benchmarks/scale/README.md, "The
    fit"). From the mapped file a worker reads the ``episode`` column and takes the drawn rows;
    the file's pages are the page cache's, shared by the workers and released with the map.
    The draw is `bootstrap_episodes`' frame exactly (tests/test_fit_memory.py): Arrow holds the
    log's float64, int64 and string columns as they are, and pandas' metadata restores the dtypes.
    """

    def __init__(self, path: str, n_rows: int = 0) -> None:
        self.path = path
        self.n_rows = int(n_rows)

    def __len__(self) -> int:
        """Rows of the written log (as ``len`` of the frame it was written from)."""
        return self.n_rows

    @classmethod
    def write(cls, df: pd.DataFrame, path: str) -> MappedLog:
        """Write ``df`` (index dropped) to ``path``."""
        import pyarrow as pa
        import pyarrow.ipc as ipc

        table = pa.Table.from_pandas(df, preserve_index=False)
        with pa.OSFile(path, "wb") as sink, ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        return cls(path, len(df))

    def rows_of(self, ids: np.ndarray) -> pd.DataFrame:
        """The rows of the episodes named ``ids``, in the log's order: ``df[df["episode"].isin(ids)]``
        of the written frame (index dropped), for a member's held-out episodes (its output noise)."""
        import pyarrow as pa
        import pyarrow.ipc as ipc

        table = ipc.open_file(pa.memory_map(self.path)).read_all()
        rows = np.flatnonzero(table.column("episode").to_pandas().isin(ids).to_numpy())
        out = table.take(pa.array(rows)).to_pandas()
        del table
        return out

    def draw(self, episodes: np.ndarray, pick: np.ndarray | None) -> pd.DataFrame:
        """`bootstrap_episodes` of the written log (all of it when ``pick`` is None)."""
        import pyarrow as pa
        import pyarrow.ipc as ipc

        # (no ``with``: a frame of the whole log may hold zero-copy views of the map, which then
        # lives as long as they do)
        table = ipc.open_file(pa.memory_map(self.path)).read_all()
        if pick is None:
            return table.to_pandas()
        rows, names = bootstrap_rows(table.column("episode").to_pandas(), episodes, pick)
        out = table.take(pa.array(rows)).to_pandas()
        del table  # the map goes with it: the draw is a copy
        out["episode"] = names
        return out
