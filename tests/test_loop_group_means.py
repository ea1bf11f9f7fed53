"""`edgetwin.loop.ppi.measured_group_means`' arm labels: a group is on the candidate's arm when the candidate decided
any of its rows at or after the canary's start, whatever the policy column's dtype (one vectorised groupby; the
per-group Python lambda it replaced made one Python call per group)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from edgetwin.loop.ppi import measured_group_means


@pytest.mark.parametrize("dtype", ["object", "category", "string[pyarrow]"])
def test_arms_follow_the_rows_the_candidate_decided(dtype: str) -> None:
    rows = []
    for agent, pols in {"g0": ["cur", "cur", "v1", "v1"], "g1": ["cur"] * 4, "g2": ["v1"] * 4,
                        "g3": ["v1", "cur", "cur", "cur"], "g4": ["cur", None, "cur", "cur"]}.items():  # fmt: skip
        rows += [{"agent": agent, "t": t, "policy": p, "slo": float(t)} for t, p in enumerate(pols)]
    log = pd.DataFrame(rows)
    log["policy"] = log["policy"].astype(dtype)
    out = measured_group_means(log, ["slo"], "v1", start_t=1)
    # g3's only candidate row is before the start: control; g0 and g2 decided by v1 after it: candidate
    assert out["arm"].to_dict() == {"g0": "candidate", "g1": "control", "g2": "candidate", "g3": "control", "g4": "control"}
    assert np.allclose(out["slo"].to_numpy(), 2.0) and np.allclose(out["pre:slo"].to_numpy(), 0.0)
