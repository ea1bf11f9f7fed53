"""`build_steps` keys its (site, t) groups and (episode, agent, t) rows by integers (issue 47: the
member fit's cost): the lag and next-row lookups agree with a plain dictionary of the rows on a log
with gaps (an agent missing a tick, a site missing a tick) and integer episode names."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from edgetwin.imitation.layout import Layout
from edgetwin.imitation.steps import build_steps

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_imitation import toy_log, toy_spec  # noqa: E402


def test_next_rows_and_site_groups_by_integer_keys_match_a_dictionary() -> None:
    df = toy_log(episodes=3, agents=6, steps=7, seed=4)
    df["episode"] = df["episode"].astype("category").cat.codes.astype(np.int64) * 10  # integer names
    drop = (df["agent"] == df["agent"].iloc[0]) & (df["t"] == 3)  # one agent misses t = 3
    site0, ep0 = df["site"].iloc[0], df["episode"].iloc[0]
    drop |= (df["site"] == site0) & (df["t"] == 5) & (df["episode"] == ep0)  # a site misses t = 5
    df = df[~drop].sample(frac=1.0, random_state=0).reset_index(drop=True)  # any row order
    layout = Layout.fit(df, toy_spec())
    st = build_steps(df, layout)
    f = st.frame
    key = {(str(e), str(a), int(t)): i for i, (e, a, t) in enumerate(zip(f["episode"], f["agent"], f["t"], strict=True))}
    want = np.array([key.get((str(e), str(a), int(t) + 1), -1) for e, a, t in zip(f["episode"], f["agent"], f["t"], strict=True)])
    assert np.array_equal(st.next_index, want) and np.array_equal(st.has_next, want >= 0)
    assert (~st.has_next).sum() > 3 * 6  # the gaps made rows without a next one beyond the last tick
    # one group per (episode, site, t), numbered in order of first appearance
    groups: dict[tuple[str, str, int], int] = {}
    first = [groups.setdefault((str(e), str(s), int(t)), len(groups)) for e, s, t in zip(f["episode"], f["site"], f["t"], strict=True)]
    assert np.array_equal(st.site_group, np.asarray(first))
    # a site that logged nothing at t - 1 gives its rows zero lags
    s0 = 2 + 3 + 2
    after_gap = ((f["site"] == site0) & (f["t"] == 6) & (f["episode"] == ep0)).to_numpy()
    assert after_gap.any() and np.allclose(st.x_client[after_gap, s0 + 3 : s0 + 8], 0.0)
