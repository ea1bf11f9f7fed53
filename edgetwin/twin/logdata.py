"""A twin's training data: reading a log for a fit (`load_log`), naming it (`data_sha256`, with
the library versions that read it), and drawing an ensemble member's bootstrap of its episodes
(`bootstrap_episodes`). Shared by `Twin.fit`, `Twin.update` (`edgetwin.twin.update`) and the
federated fit; re-exported by `edgetwin.twin.twin`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd

from edgetwin.contract.spec import TwinSpec
from edgetwin.contract.validate import load_valid_log

__all__ = ["bootstrap_episodes", "data_sha256", "library_versions", "load_log"]


def data_sha256(df: pd.DataFrame) -> str:
    """sha256 of a table's content (row order and column order included)."""
    h = hashlib.sha256()
    h.update(json.dumps([str(c) for c in df.columns]).encode())
    h.update(pd.util.hash_pandas_object(df, index=False).to_numpy().tobytes())
    return h.hexdigest()


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
    ep_rows = df.groupby("episode", sort=False).indices
    names = np.array([f"{episodes[e]}#{k}" for k, e in enumerate(pick)], dtype=object)
    order = np.argsort(names, kind="stable")
    rows = [ep_rows[episodes[pick[k]]] for k in order]
    # one take of every drawn row (not a copy per draw and then their concatenation: at a million
    # rows the parts and the result would sit in a pool worker's memory together)
    out = df.take(np.concatenate(rows)).reset_index(drop=True)
    out["episode"] = np.repeat(names[order], [len(r) for r in rows])
    return out
