"""Log validation and quarantine: every problem found with file, row and column; nothing lost.

The logs here come from a toy system with its own column names (a web/batch queue with a CPU share
and an admission switch), built in the tests: validation must not depend on any particular system.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from edgetwin.cli import main
from edgetwin.contract.errors import InputError
from edgetwin.contract.logs import write_table
from edgetwin.contract.spec import Feature, TwinSpec
from edgetwin.contract.validate import (
    MAX_ROWS_LISTED,
    QuarantineWarning,
    ValidationReport,
    load_valid_log,
    quarantine_path_for,
    validate_log,
)

N_EP, N_T, N_AG = 3, 5, 4  # 60 rows: one bad row never removes a whole step


def toy_spec(scenarios: tuple[str, ...] | None = None) -> TwinSpec:
    return TwinSpec(
        features=(
            Feature("profile.arrival_rate", "heavy_tailed", low=0.0),
            Feature("profile.tier", "discrete", values=(1.0, 2.0, 3.0)),
            Feature("state.queue_len", "continuous", low=0.0, high=100.0),
            Feature("action.cpu_share", "continuous", low=0.0, high=1.0),
            Feature("action.admit", "binary"),
            Feature("response.offload", "continuous", low=0.0, high=1.0),
            Feature("kpi.latency_ms", "continuous", low=0.0, unit="ms"),
        ),
        name="toy-queue",
        reward_weights={"kpi.latency_ms": -0.01},
        scenarios=scenarios,
    )


def toy_log(n_ep: int = N_EP, n_t: int = N_T, n_ag: int = N_AG, seed: int = 0) -> pd.DataFrame:
    """A valid log: one row per (episode, t, agent), in file order episode > t > agent."""
    rng = np.random.default_rng(seed)
    ep, t, ag = (
        a.ravel() for a in np.meshgrid(np.arange(n_ep), np.arange(n_t), np.arange(n_ag), indexing="ij")
    )
    n = len(ep)
    return pd.DataFrame(
        {
            "episode": [f"day{e}" for e in ep],
            "t": t.astype(np.int64),
            "agent": [f"sg{a}" for a in ag],
            "scenario": np.where(ag % 2 == 0, "web", "batch"),
            "site": np.where(ep % 2 == 0, "north", "south"),
            "profile.arrival_rate": 1.0 + ag,
            "profile.tier": (ag % 3 + 1).astype(np.float64),
            "state.queue_len": rng.uniform(0, 100, n),
            "action.cpu_share": rng.uniform(0, 1, n),
            "action.admit": rng.integers(0, 2, n).astype(np.float64),
            "response.offload": rng.uniform(0, 1, n),
            "kpi.latency_ms": rng.uniform(1, 50, n),
            "reward": rng.normal(size=n),
        }
    )


def write_log(df: pd.DataFrame, tmp_path: Path, fmt: str = "csv", spec: TwinSpec | None = None) -> Path:
    """The log as LOG.<fmt> with its spec beside it (LOG.spec.toml)."""
    path = write_table(df, tmp_path / f"toy.{fmt}")
    (spec or toy_spec()).save(tmp_path / "toy.spec.toml")
    return path


def quarantine_file(report: ValidationReport) -> pd.DataFrame:
    assert report.quarantine_path is not None
    return pd.read_csv(report.quarantine_path, dtype={"episode": str, "agent": str})


def assert_conserved(report: ValidationReport) -> None:
    assert report.n_usable + report.n_quarantined == report.n_rows
    assert len(report.quarantined) == report.n_quarantined


# ------------------------------------------------------------------------------------- good logs
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_good_log_passes(tmp_path: Path, fmt: str) -> None:
    path = write_log(toy_log(), tmp_path, fmt)
    report = validate_log(path)
    assert report.usable, report.summary(markup=False)
    assert report.problems == []
    assert (report.n_rows, report.n_usable, report.n_quarantined) == (60, 60, 0)
    assert report.spec_source == str(tmp_path / "toy.spec.toml")
    assert (report.n_episodes, report.n_agents) == (N_EP, N_AG)
    assert report.scenarios == ("batch", "web") and report.sites == ("north", "south")
    assert report.quarantine_path is None and not quarantine_path_for(path).exists()
    assert "USABLE: all 60 rows" in report.summary(markup=False)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_load_valid_log_types_and_order(tmp_path: Path, fmt: str) -> None:
    df = toy_log()
    df["episode"] = np.repeat(np.arange(N_EP), N_T * N_AG)  # integer episodes are allowed
    shuffled = df.sample(frac=1.0, random_state=1)
    path = write_log(shuffled, tmp_path, fmt)
    table, spec, report = load_valid_log(path)
    assert report.usable and report.n_usable == len(df)
    assert spec == toy_spec()
    assert list(table.columns) == [
        "episode",
        "t",
        "agent",
        "scenario",
        "site",
        *(f.name for f in spec.features),
        "reward",
    ]
    assert table["t"].dtype == np.int64
    for c in ("episode", "agent", "scenario", "site"):
        assert pd.api.types.is_string_dtype(table[c]), c
    for f in spec.features:
        assert table[f.name].dtype == np.float64, f.name
    keys = list(zip(table["episode"], table["t"], table["agent"], strict=True))
    assert keys == sorted(keys)
    assert isinstance(table.index, pd.RangeIndex)
    # The values are the ones written, only reordered.
    expect = df.assign(episode=df["episode"].astype(str)).sort_values(["episode", "t", "agent"])
    np.testing.assert_allclose(table["state.queue_len"], expect["state.queue_len"])
    np.testing.assert_allclose(table["reward"], expect["reward"])


# ------------------------------------------------------------------------------------- row problems
def _set(df: pd.DataFrame, row: int, col: str, value: object) -> pd.DataFrame:
    df = df.copy()
    if isinstance(value, str) and col not in ("episode", "agent", "scenario", "site"):
        df[col] = df[col].astype(object)  # a number column with a stray string in it
    elif isinstance(value, float) and pd.api.types.is_integer_dtype(df[col].dtype):
        df[col] = df[col].astype(np.float64)  # t = 2.5: pandas will not upcast in place
    df.loc[row, col] = value
    return df


#: (corruption id, column, value written, problem code, words in the per-row reason)
ROW_CORRUPTIONS = [
    ("nan", "state.queue_len", np.nan, "missing_value", "empty"),
    ("inf", "kpi.latency_ms", np.inf, "non_finite", "infinite"),
    ("neg-inf", "response.offload", -np.inf, "non_finite", "infinite"),
    ("string", "action.cpu_share", "abc", "bad_type", "not a number"),
    ("above-high", "action.cpu_share", 1.5, "out_of_bounds", "outside [0, 1]"),
    ("below-low", "state.queue_len", -3.0, "out_of_bounds", "outside [0, 100]"),
    ("below-low-only", "profile.arrival_rate", -0.1, "out_of_bounds", "below 0"),
    ("not-allowed", "profile.tier", 4.0, "not_allowed", "not one of {1, 2, 3}"),
    ("binary", "action.admit", 0.5, "not_allowed", "not one of {0, 1}"),
    ("reward-nan", "reward", np.nan, "missing_value", "empty"),
    ("t-fraction", "t", 2.5, "non_integer_t", "not an integer"),
    ("t-negative", "t", -1, "negative_t", "negative"),
    ("t-string", "t", "three", "bad_type", "not a number"),
    ("t-empty", "t", np.nan, "empty_key", "empty t"),
    ("episode-empty", "episode", "", "empty_key", "empty episode"),
    ("agent-empty", "agent", "  ", "empty_key", "empty agent"),
    ("agent-nan", "agent", np.nan, "empty_key", "empty agent"),
    ("scenario-empty", "scenario", np.nan, "empty_value", "empty scenario"),
    ("site-empty", "site", "", "empty_value", "empty site"),
]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
@pytest.mark.parametrize(
    ("kind", "column", "value", "code", "reason"), ROW_CORRUPTIONS, ids=[c[0] for c in ROW_CORRUPTIONS]
)
def test_row_problem_is_reported_and_quarantined(
    tmp_path: Path, fmt: str, kind: str, column: str, value: object, code: str, reason: str
) -> None:
    row = 37
    df = _set(toy_log(), row, column, value)
    if (
        fmt == "parquet"
        and df[column].dtype == object
        and column not in ("episode", "agent", "scenario", "site")
    ):
        df[column] = df[column].astype(str)  # Parquet cannot mix types: the whole column is text
    path = write_log(df, tmp_path, fmt)
    report = validate_log(path)
    assert_conserved(report)
    assert report.usable, report.summary(markup=False)  # one bad row does not sink the log
    [problem] = report.find(code, column)
    assert (problem.severity, problem.count, problem.rows) == ("quarantine", 1, (row,))
    assert f"column {column}:" in problem.describe() and f"at row {row}" in problem.describe()
    assert report.n_quarantined == 1 and report.n_usable == 59
    q = quarantine_file(report)
    assert q["row"].tolist() == [row]
    assert reason in q["reason"].iloc[0]
    assert report.quarantine_path == quarantine_path_for(path)
    # The original row is kept as it was, beside its row number and reason.
    assert q["episode"].iloc[0] == str(df["episode"].iloc[row]) or kind == "episode-empty"


def test_row_problems_are_left_out_of_the_loaded_table(tmp_path: Path) -> None:
    df = _set(_set(toy_log(), 5, "state.queue_len", 500.0), 9, "action.admit", 2.0)
    path = write_log(df, tmp_path)
    with pytest.warns(QuarantineWarning, match="2 quarantined"):
        table, _, report = load_valid_log(path)
    assert len(table) == 58 and report.n_quarantined == 2
    assert (table["state.queue_len"] <= 100).all() and table["action.admit"].isin([0, 1]).all()
    # A library load writes no file unless asked; the rows are still in the report.
    assert report.quarantine_path is None and not quarantine_path_for(path).exists()
    assert report.quarantined["row"].tolist() == [5, 9]
    q_path = tmp_path / "elsewhere" / "q.csv"
    with pytest.warns(QuarantineWarning):
        load_valid_log(path, quarantine_path=q_path)
    assert pd.read_csv(q_path)["row"].tolist() == [5, 9]


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    df = toy_log()
    df = _set(df, 3, "state.queue_len", np.nan)
    df = _set(df, 4, "profile.tier", 7.0)
    df = _set(df, 10, "t", -2)
    df = _set(df, 11, "agent", "")
    df["note"] = "x"
    df = df.drop(columns=["response.offload"])
    report = validate_log(write_log(df, tmp_path))
    codes = {(p.code, p.column) for p in report.problems}
    assert {
        ("spec_column_missing", "response.offload"),
        ("missing_value", "state.queue_len"),
        ("not_allowed", "profile.tier"),
        ("negative_t", "t"),
        ("empty_key", "agent"),
        ("unknown_column", None),
    } <= codes
    assert not report.usable
    assert report.problems[0].severity == "fatal"  # fatal first
    assert_conserved(report)
    assert sorted(quarantine_file(report)["row"]) == [3, 4, 10, 11]


def test_counts_are_exact_and_listed_rows_capped(tmp_path: Path) -> None:
    df = toy_log()
    bad = [2, 7, 13, 21, 22, 30, 41, 44, 50, 51, 58, 59]
    df.loc[bad, "action.cpu_share"] = 1.25
    report = validate_log(write_log(df, tmp_path))
    [p] = report.find("out_of_bounds", "action.cpu_share")
    assert p.count == len(bad) and p.rows == tuple(bad[:MAX_ROWS_LISTED])
    assert p.describe() == (
        "column action.cpu_share: 12 rows outside [0, 1], first at rows "
        + ", ".join(map(str, bad[:MAX_ROWS_LISTED]))
    )
    assert sorted(quarantine_file(report)["row"]) == bad


def test_unknown_scenario_is_quarantined(tmp_path: Path) -> None:
    df = toy_log()
    df.loc[8, "scenario"] = "video"
    report = validate_log(write_log(df, tmp_path, spec=toy_spec(scenarios=("web", "batch"))))
    [p] = report.find("unknown_scenario", "scenario")
    assert p.rows == (8,) and "web, batch" in p.message


def test_duplicate_key_keeps_the_first(tmp_path: Path) -> None:
    df = toy_log()
    dup = pd.concat([df, df.iloc[[7, 7, 20]]], ignore_index=True)  # rows 60, 61 copy 7; 62 copies 20
    report = validate_log(write_log(dup, tmp_path))
    [p] = report.find("duplicate_key")
    assert p.count == 3 and p.rows == (60, 61, 62)
    q = quarantine_file(report)
    assert q.set_index("row")["reason"].to_dict() == {
        60: "duplicate (episode, t, agent) of row 7",
        61: "duplicate (episode, t, agent) of row 7",
        62: "duplicate (episode, t, agent) of row 20",
    }
    with pytest.warns(QuarantineWarning):
        table, _, _ = load_valid_log(write_log(dup, tmp_path))
    assert len(table) == 60 and not table.duplicated(["episode", "t", "agent"]).any()


# ------------------------------------------------------------------------------------- episode problems
def test_gap_quarantines_the_episode_from_the_gap_on(tmp_path: Path) -> None:
    df = toy_log()
    df = df[~((df["episode"] == "day1") & (df["t"] == 2))].reset_index(drop=True)  # day1: t 0 1 _ 3 4
    report = validate_log(write_log(df, tmp_path))
    assert report.usable
    [p] = report.find("gap_in_t")
    after_gap = df.index[(df["episode"] == "day1") & (df["t"] >= 3)].tolist()
    assert p.count == len(after_gap) == 2 * N_AG
    assert "day1 (t 1->3)" in p.message
    q = quarantine_file(report)
    assert q["row"].tolist() == after_gap
    assert q["reason"].str.contains("jumps from t=1 to t=3").all()
    with pytest.warns(QuarantineWarning):
        table, _, _ = load_valid_log(write_log(df, tmp_path))
    assert sorted(table.loc[table["episode"] == "day1", "t"].unique()) == [0, 1]


def test_rows_quarantined_at_every_agent_of_a_step_make_a_gap(tmp_path: Path) -> None:
    df = toy_log()
    step = df.index[(df["episode"] == "day0") & (df["t"] == 3)]
    df.loc[step, "kpi.latency_ms"] = -1.0  # every agent at day0 t=3 out of bounds
    report = validate_log(write_log(df, tmp_path))
    [gap] = report.find("gap_in_t")
    assert gap.rows == tuple(df.index[(df["episode"] == "day0") & (df["t"] == 4)][:MAX_ROWS_LISTED])
    assert report.n_quarantined == 2 * N_AG
    assert_conserved(report)


def test_single_step_episodes_are_quarantined_whole(tmp_path: Path) -> None:
    df = toy_log()
    lone = toy_log(n_ep=1, n_t=1).assign(episode="lonely")  # an episode with only t=0
    # An episode whose only gap leaves one step: t 0, then 2..4 -> cut at 2, leaving a single step.
    cut = toy_log(n_ep=1).assign(episode="cut")
    cut = cut[cut["t"] != 1]
    df = pd.concat([df, lone, cut], ignore_index=True)
    report = validate_log(write_log(df, tmp_path))
    [single] = report.find("single_step")
    lone_rows = df.index[df["episode"] == "lonely"].tolist()
    cut0_rows = df.index[(df["episode"] == "cut") & (df["t"] == 0)].tolist()
    assert single.count == len(lone_rows) + len(cut0_rows)
    assert "lonely" in single.message and "cut" in single.message
    q = quarantine_file(report).set_index("row")["reason"]
    assert set(q.index) == set(df.index[df["episode"].isin(["lonely", "cut"])])
    assert (q[lone_rows] == "episode has a single step").all()
    assert q[df.index[(df["episode"] == "cut") & (df["t"] > 0)]].str.startswith("gap in t").all()
    assert report.usable and report.n_usable == 60


def test_agent_absent_mid_episode_is_a_warning(tmp_path: Path) -> None:
    df = toy_log()
    df = df[~((df["episode"] == "day2") & (df["t"] == 2) & (df["agent"] == "sg1"))].reset_index(drop=True)
    report = validate_log(write_log(df, tmp_path))
    [p] = report.find("agent_gap")
    assert p.severity == "warning" and p.count == 1
    assert df.loc[p.rows[0], ["episode", "t", "agent"]].tolist() == ["day2", 3, "sg1"]
    assert report.n_quarantined == 0 and report.usable


# ------------------------------------------------------------------------------------- structure
@pytest.mark.parametrize("key", ["episode", "t", "agent"])
def test_missing_key_column_is_fatal(tmp_path: Path, key: str) -> None:
    df = _set(toy_log().drop(columns=[key]), 4, "state.queue_len", -1.0)
    report = validate_log(write_log(df, tmp_path))
    assert not report.usable
    [p] = report.find("missing_column", key)
    assert p.severity == "fatal"
    assert report.find("out_of_bounds", "state.queue_len")[0].rows == (4,)  # still reported
    assert_conserved(report)
    with pytest.raises(
        InputError, match=rf"toy\.csv: the log is not usable: column {key}: key column is missing"
    ):
        load_valid_log(report.source)


def test_spec_column_absent_is_fatal(tmp_path: Path) -> None:
    report = validate_log(write_log(toy_log().drop(columns=["profile.tier"]), tmp_path))
    [p] = report.fatal
    assert (p.code, p.column) == ("spec_column_missing", "profile.tier")
    assert "NOT USABLE" in report.verdict()


def test_reward_column_named_by_weights_must_exist(tmp_path: Path) -> None:
    spec = TwinSpec(features=toy_spec().features, reward_weights={"reward": 1.0})
    report = validate_log(toy_log().drop(columns=["reward"]), spec=spec)
    assert [(p.code, p.column) for p in report.fatal] == [("spec_column_missing", "reward")]


def test_too_few_usable_rows_is_fatal(tmp_path: Path) -> None:
    df = toy_log()
    df.loc[:40, "response.offload"] = 7.0  # 41 of 60 rows out of bounds
    path = write_log(df, tmp_path)
    report = validate_log(path)
    assert [p.code for p in report.fatal] == ["too_few_usable_rows"]
    assert report.n_quarantined == 41 and quarantine_file(report)["row"].tolist() == list(range(41))
    assert validate_log(path, min_usable_fraction=0.3).usable
    with pytest.raises(InputError, match="min_usable_fraction"):
        validate_log(path, min_usable_fraction=1.5)


def test_no_usable_rows_and_empty_log_are_fatal(tmp_path: Path) -> None:
    df = toy_log()
    df["action.admit"] = 3.0
    report = validate_log(df, spec=toy_spec(), min_usable_fraction=0.0)
    assert [p.code for p in report.fatal] == ["no_usable_rows"] and report.n_usable == 0
    empty = write_log(toy_log().iloc[:0], tmp_path)
    report = validate_log(empty)
    assert [p.message for p in report.fatal] == ["the log has no rows"]


def test_unknown_and_absent_meta_columns_are_warnings(tmp_path: Path) -> None:
    df = toy_log().drop(columns=["scenario", "site"])
    df["state.typo_len"] = 1.0
    df["comment"] = "hi"
    path = write_log(df, tmp_path)
    report = validate_log(path)
    assert report.usable and report.n_quarantined == 0
    messages = [p.describe() for p in report.warnings]
    assert "log: role columns not named by the spec, ignored: state.typo_len" in messages
    assert "log: columns outside the contract, ignored: comment" in messages
    assert "column scenario: absent: every row gets scenario 'default'" in messages
    table, _, _ = load_valid_log(path)
    assert "comment" not in table and "state.typo_len" not in table
    assert set(table["scenario"]) == {"default"} and set(table["site"]) == {"default"}


def test_scenario_column_required_when_spec_lists_scenarios() -> None:
    report = validate_log(toy_log().drop(columns=["scenario"]), spec=toy_spec(scenarios=("web", "batch")))
    assert [(p.code, p.column) for p in report.fatal] == [("missing_column", "scenario")]


def test_repeated_column_names_are_fatal() -> None:
    df = toy_log()
    df = pd.concat([df, df[["state.queue_len"]]], axis=1)
    report = validate_log(df, spec=toy_spec())
    assert [p.code for p in report.fatal] == ["duplicate_column"]


def test_spec_is_inferred_with_a_warning(tmp_path: Path) -> None:
    path = write_table(toy_log(), tmp_path / "bare.parquet")
    report = validate_log(path)
    assert report.spec_source == "inferred" and report.usable
    [w] = report.find("spec_inferred")
    assert "bare.spec.toml not found" in w.message
    assert [f.name for f in report.spec.features] == [c for c in toy_log().columns if "." in c]
    no_action = write_table(toy_log().drop(columns=["action.cpu_share", "action.admit"]), tmp_path / "x.csv")
    with pytest.raises(InputError, match=r"x\.csv: no spec given or found \(expected .*x\.spec\.toml\)"):
        validate_log(no_action)


# ------------------------------------------------------------------------------------- unreadable input
@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("ragged.csv", b"episode,t,agent\nday0,0,a\nday0,1,a,extra,fields\n", "cannot read the table"),
        ("empty.csv", b"", "cannot read the table"),
        ("garbage.parquet", b"this is not parquet at all", "cannot read the table"),
        ("binary.csv", bytes(range(256)) * 4, "cannot read the table"),
        ("log.xlsx", b"whatever", "unknown log format"),
    ],
)
def test_unreadable_file_is_an_input_error_with_the_path(
    tmp_path: Path, name: str, content: bytes, match: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InputError, match=match) as err:
        validate_log(path)
    assert err.value.where == str(path)


def test_missing_log_and_bad_spec_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="log file not found"):
        validate_log(tmp_path / "nope.csv")
    path = write_log(toy_log(), tmp_path)
    (tmp_path / "toy.spec.toml").write_text("this is = = not toml")
    with pytest.raises(InputError, match=r"toy\.spec\.toml: not valid TOML"):
        validate_log(path)


def test_unwritable_quarantine_is_an_input_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    df = _set(toy_log(), 1, "t", -5)
    with pytest.raises(InputError, match="cannot write the quarantine file"):
        validate_log(df, spec=toy_spec(), quarantine_path=blocker / "q.csv")


# ------------------------------------------------------------------------------------- report
def test_summary_is_rich_printable_and_json_is_plain(tmp_path: Path) -> None:
    df = _set(toy_log(), 3, "action.cpu_share", 9.0)
    df["[weird]"] = 0  # markup-like text must be printed as is
    report = validate_log(write_log(df, tmp_path))
    console = Console(record=True, width=400)
    console.print(report.summary())
    text = console.export_text()
    assert "column action.cpu_share: 1 row outside [0, 1], at row 3" in text
    assert "[weird]" in text and "QUARANTINE" in text and "USABLE: 59 of 60 rows" in text
    assert report.summary(markup=False) == text.rstrip("\n")
    d = json.loads(json.dumps(report.to_dict()))
    assert (
        d["usable"]
        and d["n_quarantined"] == 1
        and d["quarantine_path"] == str(quarantine_path_for(report.source))
    )
    assert {"code": "out_of_bounds", "column": "action.cpu_share", "rows": [3], "count": 1}.items() <= d[
        "problems"
    ][0].items()


# ------------------------------------------------------------------------------------- property
CORRUPTIONS = {
    # kind -> (column, value, problem code)
    "nan": ("state.queue_len", np.nan, "missing_value"),
    "inf": ("response.offload", np.inf, "non_finite"),
    "string": ("kpi.latency_ms", "n/a", "bad_type"),
    "high": ("action.cpu_share", 2.0, "out_of_bounds"),
    "low": ("profile.arrival_rate", -5.0, "out_of_bounds"),
    "tier": ("profile.tier", 0.0, "not_allowed"),
    "admit": ("action.admit", -1.0, "not_allowed"),
    "t": ("t", 0.5, "non_integer_t"),
    "agent": ("agent", "", "empty_key"),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cells=st.dictionaries(
        st.integers(0, N_EP * N_T * N_AG - 1), st.sampled_from(sorted(CORRUPTIONS)), min_size=1, max_size=25
    ),
    dups=st.lists(st.integers(0, N_EP * N_T * N_AG - 1), max_size=3),
)
def test_random_corruptions_are_each_reported_and_quarantined(cells: dict[int, str], dups: list[int]) -> None:
    df = toy_log()
    for row, kind in cells.items():
        column, value, _ = CORRUPTIONS[kind]
        df = _set(df, row, column, value)
    clean_copies = [r for r in dups if r not in cells]
    df = pd.concat([df, df.iloc[clean_copies]], ignore_index=True)
    report = validate_log(df, spec=toy_spec(), min_usable_fraction=0.0)

    assert_conserved(report)
    reasons = report.quarantined.set_index("row")["reason"]
    # Every corrupted cell: its row is quarantined and the problem of its column counts it exactly.
    for kind in set(cells.values()):
        column, _, code = CORRUPTIONS[kind]
        rows = sorted(r for r, k in cells.items() if k == kind)
        [p] = report.find(code, column)
        assert p.count == len(rows) and list(p.rows) == rows[:MAX_ROWS_LISTED]
        assert set(rows) <= set(reasons.index)
    # Every appended copy of a clean row is a duplicate of it.
    for i, r in enumerate(clean_copies):
        assert f"of row {r}" in reasons[N_EP * N_T * N_AG + i]
    # Nothing else is quarantined, except whole steps lost to a gap or single-step episodes.
    others = reasons.drop(index=[*cells, *range(N_EP * N_T * N_AG, len(df))], errors="ignore")
    assert others.str.contains("gap in t|single step").all(), others.tolist()


# ------------------------------------------------------------------------------------- CLI
def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write_log(_set(toy_log(), 6, "state.queue_len", 1e9), tmp_path)
    code, out, _ = _cli(["logs", "validate", str(good)], capsys)
    assert code == 0 and "USABLE: 59 of 60 rows" in out
    assert quarantine_path_for(good).exists()

    code, out, _ = _cli(
        ["logs", "validate", str(good), "--json", "--quarantine", str(tmp_path / "q.csv")], capsys
    )
    assert code == 0 and json.loads(out)["quarantine_path"] == str(tmp_path / "q.csv")

    bad = write_table(toy_log().drop(columns=["agent"]), tmp_path / "bad.csv")
    code, out, _ = _cli(["logs", "validate", str(bad), "--spec", str(tmp_path / "toy.spec.toml")], capsys)
    assert code == 2 and "NOT USABLE" in out and "column agent: key column is missing" in out

    many_bad = toy_log()
    many_bad.loc[:39, "action.admit"] = 0.5  # 40 of 60 rows not in {0, 1}
    many = write_table(many_bad, tmp_path / "many.csv")
    spec_flag = ["--spec", str(tmp_path / "toy.spec.toml")]
    assert _cli(["logs", "validate", str(many), *spec_flag], capsys)[0] == 2
    assert _cli(["logs", "validate", str(many), *spec_flag, "--min-usable", "0.3"], capsys)[0] == 0
    code, _, err = _cli(["logs", "validate", str(many), "--min-usable", "1.5"], capsys)
    assert code == 2 and "--min-usable" in err

    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"nope")
    code, _, err = _cli(["logs", "validate", str(broken)], capsys)
    assert code == 2 and err.strip().startswith("error:") and str(broken) in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_console_script(tmp_path: Path) -> None:
    path = write_log(toy_log(), tmp_path, "parquet")
    exe = Path(sys.executable).with_name("edgetwin")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "edgetwin.cli"]
    proc = subprocess.run(
        [*cmd, "logs", "validate", str(path), "--json"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["n_usable"] == 60
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean log loads without a QuarantineWarning
        load_valid_log(path)


# ------------------------------------------------------------------------------------- docs
def test_example_in_log_format_doc_is_valid(tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "log-format.md").read_text()
    blocks = {}
    for lang in ("toml", "csv"):
        start = doc.index(f"```{lang}\n") + len(f"```{lang}\n")
        blocks[lang] = doc[start : doc.index("```", start)]
    (tmp_path / "queue.spec.toml").write_text(blocks["toml"])
    (tmp_path / "queue.csv").write_text(blocks["csv"])
    report = validate_log(tmp_path / "queue.csv")
    assert report.spec.name == "queue-platform" and report.spec_source.endswith("queue.spec.toml")
    assert report.usable and report.problems == [] and report.n_rows == 12
