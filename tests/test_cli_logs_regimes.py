"""``edgetwin logs generate --regime / --trial``: the logs a real operator has, from the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from edgetwin.contract.validate import validate_log
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import Regime, generate_logs


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from edgetwin.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    captured = capsys.readouterr()
    return int(exit_.value.code or 0), captured.out, captured.err


def test_regimes_and_trials_from_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ops.parquet"
    code, stdout, err = _cli(
        capsys, "logs", "generate", "--out", str(out), "--agents", "20", "--steps", "3", "--seed", "4", "--no-plot",
        "--regime", "heuristic:2:0.1", "--regime", "least-loaded:1:10%",
        "--trial", "0.5:2:random,regime_switching", "--json",
    )
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["episodes"] == 5 and summary["rows"] == 5 * 3 * 20
    assert [r["policy"] for r in summary["regimes"]] == ["heuristic+noise0.1", "least_loaded+noise0.1",
                                                          "least_loaded+noise0.1"]
    assert summary["regimes"][2]["arms"] == ["arm-random", "arm-regime_switching"]
    log = pd.read_parquet(out)
    # the regimes in order, one policy a day; the trial's days hold the base policy and both arms
    by_day = log.groupby("episode")["policy"].unique()
    assert list(by_day[0]) == list(by_day[1]) == ["heuristic+noise0.1"]
    assert list(by_day[2]) == ["least_loaded+noise0.1"]
    for day in (3, 4):
        assert set(by_day[day]) == {"least_loaded+noise0.1", "arm-random", "arm-regime_switching"}
    assert summary["policies"] == {k: int(v) for k, v in log["policy"].value_counts().items()}
    # every policy here samples, so every row has its propensity (a density: positive, finite)
    assert np.isfinite(log["propensity"]).all() and (log["propensity"] > 0).all()
    report = validate_log(out)
    assert report.usable and report.n_quarantined == 0
    assert list(report.policies) == sorted(summary["policies"])
    # the same as the Python API with the same regimes
    again, _ = generate_logs(
        ClusterConfig(n_agents=20, steps=3), seed=4,
        regimes=[Regime("heuristic", 2, 0.1), Regime("least_loaded", 1, 0.1),
                 Regime("least_loaded", 2, 0.1, name="least_loaded+noise0.1",
                        arms={"arm-random": "random", "arm-regime_switching": "regime_switching"}, arm_share=0.5)],
    )
    pd.testing.assert_frame_equal(log, again)


def test_a_trial_after_a_single_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c1.csv"
    code, stdout, err = _cli(capsys, "logs", "generate", "--out", str(out), "--agents", "10", "--steps", "2",
                             "--policy", "heuristic", "--noise", "0.1", "--episodes", "2", "--trial", "1:1:random",
                             "--no-plot", "--json")
    assert code == 0, err
    log = pd.read_csv(out)
    assert set(log.loc[log["episode"] < 2, "policy"]) == {"heuristic+noise0.1"}
    assert set(log.loc[log["episode"] == 2, "policy"]) == {"arm-random"}  # share 1: every group in the trial
    assert validate_log(out).usable


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("--regime", "heuristic"), "--regime"),
        (("--regime", "nosuch:2"), "--regime"),
        (("--regime", "heuristic:0"), "--regime"),
        (("--regime", "heuristic:1.5"), "--regime"),
        (("--regime", "heuristic:2:-0.1"), "--regime"),
        (("--regime", "heuristic:2:abc"), "--regime"),
        (("--trial", "0:1:random"), "--trial"),
        (("--trial", "0.1:1"), "--trial"),
        (("--trial", "0.1:1:random,nosuch"), "--trial"),
        (("--trial", "0.1:1:random,random"), "--trial"),
        (("--trial", "x:1:random"), "--trial"),
        (("--regime", "heuristic:2", "--episodes", "3"), "--episodes"),
        (("--policy", "nosuch"), "--policy"),
        (("--noise", "2"), "--noise"),
    ],
)
def test_bad_regimes_and_trials_exit_2_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], flag: str
) -> None:
    code, _, err = _cli(capsys, "logs", "generate", "--out", str(tmp_path / "x.parquet"), "--agents", "2",
                        "--steps", "1", "--no-plot", *args)
    assert code == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and flag in lines[0] and "Traceback" not in err, err
    assert not (tmp_path / "x.parquet").exists()
