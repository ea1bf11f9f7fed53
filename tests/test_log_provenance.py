"""The log contract's optional ``policy`` and ``propensity`` columns: read, checked, quarantined, kept.

``policy`` names who made each row's decision; ``propensity`` is the probability (discrete actions) or
density (any continuous action) of the logged action under that policy, where known. The toy system
here is the queue of ``test_validate`` (its own column names): validation must not assume the cluster's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from edgetwin.contract.logs import ordered_columns, write_table
from edgetwin.contract.spec import POLICY_COLUMN, PROPENSITY_COLUMN, Feature, TwinSpec
from edgetwin.contract.validate import load_valid_log, validate_log


def spec(continuous_action: bool = True) -> TwinSpec:
    action = (
        Feature("action.cpu_share", "continuous", low=0.0, high=1.0)
        if continuous_action
        else Feature("action.cpu_level", "discrete", values=(0.0, 1.0, 2.0))
    )
    return TwinSpec(
        features=(
            Feature("state.queue_len", "continuous", low=0.0, high=100.0),
            action,
            Feature("action.admit", "binary"),
            Feature("response.offload", "continuous", low=0.0, high=1.0),
        ),
        name="toy-queue",
    )


def log(continuous_action: bool = True, n_ep: int = 2, n_t: int = 4, n_ag: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    ep, t, ag = (a.ravel() for a in np.meshgrid(np.arange(n_ep), np.arange(n_t), np.arange(n_ag), indexing="ij"))
    n = len(ep)
    df = pd.DataFrame(
        {
            "episode": [f"day{e}" for e in ep],
            "t": t.astype(np.int64),
            "agent": [f"sg{a}" for a in ag],
            "scenario": "web",
            "site": "north",
            "state.queue_len": rng.uniform(0, 100, n),
            "action.admit": rng.integers(0, 2, n).astype(np.float64),
            "response.offload": rng.uniform(0, 1, n),
            # "007" must stay "007" (an id, not a number), like the keys
            POLICY_COLUMN: np.where(ag == 0, "007", "heuristic-v1"),
            # a density above 1 is legal with a continuous action (10 % noise on a [0, 1] knob: ~4)
            PROPENSITY_COLUMN: np.where(ag == 0, 0.5, 3.9),
        }
    )
    if continuous_action:
        df.insert(6, "action.cpu_share", rng.uniform(0, 1, n))
    else:
        df.insert(6, "action.cpu_level", rng.integers(0, 3, n).astype(np.float64))
        df[PROPENSITY_COLUMN] = np.where(ag == 0, 0.5, 0.9)
    return df


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_policy_and_propensity_are_loaded_typed(tmp_path: Path, fmt: str) -> None:
    path = write_table(log(), tmp_path / f"q.{fmt}")
    table, _, report = load_valid_log(path, spec())
    assert report.n_quarantined == 0 and not report.warnings
    assert report.policies == ("007", "heuristic-v1")
    assert report.to_dict()["policies"] == ["007", "heuristic-v1"]
    assert "policies 007, heuristic-v1" in report.summary(markup=False)
    assert table[POLICY_COLUMN].tolist().count("007") == 8
    assert table[PROPENSITY_COLUMN].dtype == np.float64
    assert set(table[PROPENSITY_COLUMN]) == {0.5, 3.9}
    # the contract's order: ..., features, reward, policy, propensity
    assert ordered_columns(spec(), [PROPENSITY_COLUMN, "reward", POLICY_COLUMN])[-3:] == [
        "reward",
        POLICY_COLUMN,
        PROPENSITY_COLUMN,
    ]


def test_a_log_without_them_loads_as_before() -> None:
    table, _, report = load_valid_log(log().drop(columns=[POLICY_COLUMN, PROPENSITY_COLUMN]), spec())
    assert POLICY_COLUMN not in table.columns and PROPENSITY_COLUMN not in table.columns
    assert report.policies == ()
    assert not report.find("unknown_column")


@pytest.mark.parametrize(
    "column, value, code, reason",
    [
        (POLICY_COLUMN, "", "empty_value", "empty policy"),
        (POLICY_COLUMN, "   ", "empty_value", "empty policy"),
        (PROPENSITY_COLUMN, "high", "bad_type", "propensity is not a number"),
        (PROPENSITY_COLUMN, "inf", "non_finite", "propensity is infinite"),
        (PROPENSITY_COLUMN, "0", "propensity_not_positive", "propensity <= 0"),
        (PROPENSITY_COLUMN, "-0.2", "propensity_not_positive", "propensity <= 0"),
    ],
)
def test_bad_rows_are_quarantined_with_a_reason(
    tmp_path: Path, column: str, value: str, code: str, reason: str
) -> None:
    df = log().astype({column: object})
    df.loc[5, column] = value
    path = tmp_path / "q.csv"
    df.to_csv(path, index=False)
    report = validate_log(path, spec())
    assert report.usable
    (problem,) = report.find(code, column)
    assert problem.severity == "quarantine" and problem.count == 1 and problem.rows == (5,)
    assert report.n_quarantined == 1 and report.n_usable + report.n_quarantined == report.n_rows
    quarantined = pd.read_csv(tmp_path / "q.quarantine.csv")
    assert quarantined["row"].tolist() == [5] and reason in quarantined["reason"][0]


def test_probability_above_one_only_refused_for_discrete_actions() -> None:
    discrete = log(continuous_action=False)
    discrete.loc[[2, 7], PROPENSITY_COLUMN] = [1.5, 1.0]  # 1.0 is a deterministic policy's: fine
    report = validate_log(discrete, spec(continuous_action=False))
    (problem,) = report.find("propensity_above_one", PROPENSITY_COLUMN)
    assert problem.rows == (2,) and report.n_quarantined == 1
    continuous = log()
    continuous.loc[[2, 7], PROPENSITY_COLUMN] = [1.5, 40.0]  # densities
    assert validate_log(continuous, spec()).n_quarantined == 0


def test_empty_propensity_is_unknown_kept_with_a_warning() -> None:
    df = log()
    df.loc[[1, 4], PROPENSITY_COLUMN] = np.nan
    table, _, report = load_valid_log(df, spec())
    assert report.n_quarantined == 0
    (warning,) = report.find("propensity_unknown", PROPENSITY_COLUMN)
    assert warning.severity == "warning" and warning.count == 2
    assert int(table[PROPENSITY_COLUMN].isna().sum()) == 2
