"""`edgetwin canary verdict` carries the loop's day-to-day term (issue 48): with a fleet log of several
days the interval is about the change over those days (`guarded_day_variance`, the loop's call), and
with one day it says it is about the canary's day only."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from test_cli_canary_verdict import N_GROUPS, PRE, STEPS, warehouse_day, warehouse_spec

from edgetwin.cli import main
from edgetwin.policies.candidates import ConstantPolicy
from edgetwin.policies.export import export_policy
from edgetwin.twin.twin import Twin

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("shop")
    spec = warehouse_spec()
    train = pd.concat([warehouse_day(lambda i, t, r: r.uniform(0, 1, len(i)), 100 + e, f"d{e}", lambda i: "logging")
                       for e in range(4)], ignore_index=True)  # fmt: skip
    Twin.fit(train, spec, seed=0, members=2, progress=False, rounds=0, bc_epochs=2,
             population_model="empirical").save(d / "twin")  # fmt: skip
    for name, s in (("current", 0.4), ("cand", 0.35)):
        export_policy(ConstantPolicy(spec, [s]), d / name, spec)
    days = [warehouse_day(lambda i, t, r: np.full(len(i), 0.4), 103 + k, f"f{k}", lambda i: "v1") for k in range(4)]
    days[-1]["episode"] = "fleet"
    days[-1].to_parquet(d / "fleet-1.parquet")
    pd.concat(days, ignore_index=True).to_parquet(d / "fleet-4.parquet")
    arm = np.zeros(N_GROUPS, bool)
    arm[np.random.default_rng(3).choice(N_GROUPS, 12, replace=False)] = True
    canary = warehouse_day(lambda i, t, r: np.where(arm[i] & (t >= PRE), 0.35, 0.4), 107, "canary",
                           lambda i: "v2" if arm[i] else "v1")  # fmt: skip
    canary.loc[canary["t"] < PRE, "policy"] = "v1"
    canary.to_parquet(d / "canary.parquet")
    plan = {
        "candidate": "cand", "baseline": "current",
        "slice": {"agents": [f"w{i}" for i in range(N_GROUPS)], "treat_share": 0.3, "seed": 0},
        "hours": (STEPS - PRE) / 4, "margins": [{"kpi": "kpi.late", "max_regression": 0.05, "higher_is_better": False}],
        "kpis": [], "n_groups": N_GROUPS, "fleet_groups": N_GROUPS, "share": 1.0, "budget": {}, "decides": False,
        "why": ["test"],
    }  # fmt: skip
    (d / "plan.json").write_text(json.dumps(plan))
    return d


def _verdict(d: Path, fleet: str, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    try:
        main(["canary", "verdict", str(d / "twin"), "--canary-log", str(d / "canary.parquet"), "--fleet-log",
              str(d / fleet), "--plan", str(d / "plan.json"), "--current", str(d / "current"), "--candidate",
              str(d / "cand"), "--pre-ticks", str(PRE), "--json"])  # fmt: skip
    except SystemExit as e:
        assert int(e.code or 0) in (0, 1, 3), e.code
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_the_operators_verdict_carries_the_day_term(shop: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one = _verdict(shop, "fleet-1.parquet", capsys)
    many = _verdict(shop, "fleet-4.parquet", capsys)
    assert "about the canary's day only" in str(one["reason"])
    assert "about the canary's day only" not in str(many["reason"])
    (c1,), (c4,) = one["checks"], many["checks"]  # type: ignore[misc]
    # the same canary and fleet day: the same point, an interval at least as wide with the days' term
    assert c4["change"] == pytest.approx(c1["change"], rel=1e-6, abs=1e-9)
    assert c4["interval"][1] - c4["interval"][0] > c1["interval"][1] - c1["interval"][0]
