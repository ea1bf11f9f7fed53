"""A pool worker's member draw from the memory-mapped log (`MappedLog`) is the draw from the log
itself (`bootstrap_episodes`), column for column and bit for bit, so that fitting members on a
pool (which maps the log) and serially (which does not) fit the same members."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from edgetwin.twin.logdata import MappedLog, bootstrap_episodes


def _log() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    n_ep, n_t, n_ag = 4, 5, 3
    ep, t, ag = (a.ravel() for a in np.meshgrid(np.arange(n_ep), np.arange(n_t), np.arange(n_ag), indexing="ij"))
    df = pd.DataFrame({"episode": ep, "t": t, "agent": [f"a{i}" for i in ag], "scenario": np.where(ag == 0, "iot", "mbb")})
    df["state.x"] = rng.standard_normal(len(df)) * 1e3
    df["response.y"] = rng.standard_normal(len(df)) / 7.0
    df["policy"] = np.where(rng.random(len(df)) < 0.3, "arm", "logging")
    return df


def test_the_mapped_draw_is_the_draw(tmp_path: Path) -> None:
    df = _log()
    episodes = df["episode"].unique()
    mapped = MappedLog.write(df, str(tmp_path / "log.arrow"))
    for pick in (np.array([2, 0, 2, 3]), np.array([1, 1, 1, 1]), None):
        want = bootstrap_episodes(df, episodes, pick)
        got = mapped.draw(episodes, pick)
        pd.testing.assert_frame_equal(got, want, check_exact=True)
    # a string episode column too (as a loaded CSV log has)
    df["episode"] = "day-" + df["episode"].astype(str)
    episodes = df["episode"].unique()
    mapped = MappedLog.write(df, str(tmp_path / "log2.arrow"))
    pick = np.array([3, 3, 0, 1])
    pd.testing.assert_frame_equal(mapped.draw(episodes, pick), bootstrap_episodes(df, episodes, pick), check_exact=True)


def test_the_mapped_rows_of_held_out_episodes_are_the_logs(tmp_path: Path) -> None:
    """A member's output noise reads its held-out episodes from the mapped log in a pool worker and
    from the log itself serially: the same rows, bit for bit."""
    df = _log()
    mapped = MappedLog.write(df, str(tmp_path / "log.arrow"))
    assert len(mapped) == len(df)
    ids = np.array([3, 1])
    want = df[df["episode"].isin(ids)].reset_index(drop=True)
    pd.testing.assert_frame_equal(mapped.rows_of(ids), want, check_exact=True)
