"""Population models (GAN-SMMSG, GMM, GAN, WGAN-GP): sampling contract, seeds, save/load, fitting.

Runs on a synthetic profile table (3 scenarios; correlated, multi-modal, heavy-tailed, discrete
and binary columns) with small networks and few steps, so the whole file takes about a minute.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from edgetwin.cli import main
from edgetwin.errors import InputError
from edgetwin.generative import (
    MODELS,
    PopulationModel,
    agent_profiles,
    fit_population,
    load_population,
)
from edgetwin.twin.logs import write_table
from edgetwin.twin.metrics import fidelity_report
from edgetwin.twin.spec import Feature, TwinSpec

torch.set_num_threads(1)

SPEC = TwinSpec(
    features=(
        Feature("profile.load", "continuous", low=0.0, high=100.0),
        Feature("profile.task_s", "heavy_tailed", low=0.0),
        Feature("profile.priority", "discrete", values=(1.0, 2.0, 3.0)),
        Feature("profile.mobile", "binary"),
        Feature("state.queue", "continuous"),
        Feature("action.offload", "continuous", low=0.0, high=1.0),
    ),
    name="synthetic",
)
PROFILE = SPEC.names("profile")
SCENARIO_P = {"iot": 0.5, "mbb": 0.3, "iov": 0.2}
#: Small and fast: the tests check the contract and that learning happens, not peak fidelity.
SMALL = {"hidden": 64, "d_hidden": 64, "batch_per_scenario": 64, "noise_dim": 8}
SMALL_SMMSG = {**SMALL, "group_size": 32, "set_hidden": 32, "hist_bins": 20}


def synthetic_profiles(n: int, seed: int = 0) -> pd.DataFrame:
    """Correlated, bimodal load; log-normal task time tied to load; priority tied to load; mobility by scenario."""
    rng = np.random.default_rng(seed)
    scen = rng.choice(list(SCENARIO_P), size=n, p=list(SCENARIO_P.values()))
    high = rng.random(n) < np.select([scen == "iot", scen == "mbb"], [0.3, 0.6], 0.8)
    load = np.clip(np.where(high, rng.normal(70, 8, n), rng.normal(30, 6, n)) + 5.0 * (scen == "iov"), 0, 100)
    task = np.exp(rng.normal(0.5 + 0.003 * load + 1.0 * (scen == "mbb"), 0.8))
    pri = np.where(
        load > 50, rng.choice([2.0, 3.0], n, p=[0.3, 0.7]), rng.choice([1.0, 2.0], n, p=[0.7, 0.3])
    )
    mobile = (rng.random(n) < np.where(scen == "iov", 0.9, 0.1)).astype(float)
    return pd.DataFrame(
        {
            "scenario": scen,
            "profile.load": load,
            "profile.task_s": task,
            "profile.priority": pri,
            "profile.mobile": mobile,
        }
    )


def hyper_for(model: str, steps: int) -> dict:
    if model == "gmm":
        return {}
    return {**(SMALL_SMMSG if model == "gan-smmsg" else SMALL), "steps": steps}


@pytest.fixture(scope="module")
def train() -> pd.DataFrame:
    return synthetic_profiles(6000, seed=0)


@pytest.fixture(scope="module")
def held_out() -> pd.DataFrame:
    return synthetic_profiles(3000, seed=1)


@pytest.fixture(scope="module")
def models(train: pd.DataFrame) -> dict[str, PopulationModel]:
    return {m: fit_population(train, SPEC, m, seed=0, **hyper_for(m, 30)) for m in MODELS}


@pytest.fixture(scope="module")
def fitted(train: pd.DataFrame) -> PopulationModel:
    """A GAN-SMMSG trained long enough to have learned something (a few seconds)."""
    return fit_population(
        train, SPEC, "gan-smmsg", seed=0, **{**SMALL_SMMSG, "hidden": 128, "d_hidden": 128, "steps": 400}
    )


@pytest.mark.parametrize("model", MODELS)
def test_sample_contract(models: dict[str, PopulationModel], model: str) -> None:
    pm = models[model]
    df = pm.sample(2500, seed=3)
    assert list(df.columns) == ["scenario", *PROFILE]
    assert len(df) == 2500
    assert all(df[c].dtype == np.float64 for c in PROFILE)
    assert set(df["scenario"]) <= set(SCENARIO_P)
    assert np.isfinite(df[PROFILE].to_numpy()).all()
    # discrete columns only take allowed values, bounds hold
    assert set(df["profile.priority"].unique()) <= {1.0, 2.0, 3.0}
    assert set(df["profile.mobile"].unique()) <= {0.0, 1.0}
    assert df["profile.load"].between(0.0, 100.0).all()
    assert (df["profile.task_s"] >= 0.0).all()
    assert pm.sample(0).shape == (0, 1 + len(PROFILE))


@pytest.mark.parametrize("model", MODELS)
def test_same_seed_same_rows(models: dict[str, PopulationModel], model: str) -> None:
    pm = models[model]
    a, b, c = pm.sample(500, seed=7), pm.sample(500, seed=7), pm.sample(500, seed=8)
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(c)


@pytest.mark.parametrize("model", MODELS)
def test_save_load_round_trip(models: dict[str, PopulationModel], model: str, tmp_path: Path) -> None:
    pm = models[model]
    path = pm.save(tmp_path / model)
    back = load_population(path)
    assert type(back) is type(pm) and back.scenarios == pm.scenarios
    np.testing.assert_allclose(back.proportions, pm.proportions)
    assert back.spec.hash() == SPEC.hash()
    pd.testing.assert_frame_equal(back.sample(800, seed=11), pm.sample(800, seed=11))
    pd.testing.assert_frame_equal(back.sample(300, "iov", seed=2), pm.sample(300, "iov", seed=2))


def test_same_seed_same_fit(train: pd.DataFrame) -> None:
    a = fit_population(train, SPEC, "gan-smmsg", seed=5, **{**SMALL_SMMSG, "steps": 15})
    b = fit_population(train, SPEC, "gan-smmsg", seed=5, **{**SMALL_SMMSG, "steps": 15})
    c = fit_population(train, SPEC, "gan-smmsg", seed=6, **{**SMALL_SMMSG, "steps": 15})
    pd.testing.assert_frame_equal(a.sample(200, seed=0), b.sample(200, seed=0))
    assert not a.sample(200, seed=0).equals(c.sample(200, seed=0))


def test_scenario_proportions_and_conditioning(
    models: dict[str, PopulationModel], fitted: PopulationModel, train: pd.DataFrame
) -> None:
    for model, pm in (("gmm", models["gmm"]), ("gan-smmsg", fitted)):
        assert pm.scenarios == sorted(SCENARIO_P)
        want = train["scenario"].value_counts(normalize=True)
        np.testing.assert_allclose(pm.proportions, want.reindex(pm.scenarios).to_numpy())
        mixed = pm.sample(20_000, seed=1)["scenario"].value_counts(normalize=True)
        np.testing.assert_allclose(mixed.reindex(pm.scenarios).to_numpy(), pm.proportions, atol=0.015)
        iov = pm.sample(3000, scenario="iov", seed=1)
        iot = pm.sample(3000, scenario="iot", seed=1)
        assert (iov["scenario"] == "iov").all()
        # iov agents are mobile 90 % of the time, iot agents 10 %
        assert iov["profile.mobile"].mean() > iot["profile.mobile"].mean() + 0.4, model


def test_fit_beats_random_initialised_generator(
    fitted: PopulationModel, train: pd.DataFrame, held_out: pd.DataFrame
) -> None:
    untrained = fit_population(train, SPEC, "gan-smmsg", seed=0, **{**fitted.hyper, "steps": 0})
    r0 = fidelity_report(held_out, untrained.sample(3000, seed=1), SPEC, PROFILE)
    r1 = fidelity_report(held_out, fitted.sample(3000, seed=1), SPEC, PROFILE)
    assert r1["kl_mean"] < 0.25 * r0["kl_mean"], (r0["kl"], r1["kl"])
    assert r1["c2st_auc"] < r0["c2st_auc"] - 0.1, (r0["c2st_auc"], r1["c2st_auc"])
    assert r1["mmd"] < 0.5 * r0["mmd"]
    assert r1["kl_max"] < 0.15, r1["kl"]


def test_agent_profiles_one_row_per_episode_agent() -> None:
    rows = []
    for ep in (0, 1):
        for t in (2, 0, 1):  # out of order on purpose: the first step wins
            for agent, scen in (("a", "iot"), ("b", "mbb")):
                rows.append(
                    {
                        "episode": ep,
                        "t": t,
                        "agent": agent,
                        "scenario": scen,
                        "profile.load": 10.0 * ep + t,
                        "profile.task_s": 1.0,
                        "profile.priority": 1.0,
                        "profile.mobile": 0.0,
                        "state.queue": t,
                    }
                )
    prof = agent_profiles(pd.DataFrame(rows), SPEC)
    assert len(prof) == 4
    assert list(prof.columns) == ["episode", "agent", "scenario", *PROFILE]
    assert sorted(prof["profile.load"]) == [0.0, 0.0, 10.0, 10.0]
    # a profile table (no agent column) passes through; no scenario column -> one scenario
    flat = agent_profiles(synthetic_profiles(10).drop(columns="scenario"), SPEC)
    assert len(flat) == 10 and set(flat["scenario"]) == {"all"}


def test_bad_input_raises_input_error(train: pd.DataFrame, models: dict[str, PopulationModel]) -> None:
    with pytest.raises(InputError, match="unknown model"):
        fit_population(train, SPEC, "vae")
    with pytest.raises(InputError, match="unknown hyper"):
        fit_population(train, SPEC, "gan", stepz=3)
    with pytest.raises(InputError, match="missing"):
        fit_population(train.drop(columns="profile.load"), SPEC, "gmm")
    bad = train.copy()
    bad.loc[17, "profile.priority"] = 2.5
    with pytest.raises(InputError, match=r"row 17: column profile.priority"):
        fit_population(bad, SPEC, "gmm")
    nan = train.copy()
    nan.loc[3, "profile.task_s"] = np.nan
    with pytest.raises(InputError, match=r"row 3: column profile.task_s"):
        fit_population(nan, SPEC, "gmm")
    with pytest.raises(InputError, match="unknown scenario"):
        models["gmm"].sample(5, scenario="nope")
    with pytest.raises(InputError, match="population.json"):
        load_population(Path("/nonexistent/model"))


def test_cli_fit_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_table(synthetic_profiles(1500, seed=2), tmp_path / "profiles.csv")
    SPEC.save(tmp_path / "profiles.spec.toml")
    out = tmp_path / "pop"
    with pytest.raises(SystemExit) as e:
        main(
            [
                "population",
                "fit",
                str(log),
                "--out",
                str(out),
                "--model",
                "gan-smmsg",
                "--steps",
                "20",
                "--seed",
                "1",
                "--json",
            ]
        )
    assert e.value.code == 0
    assert (out / "population.json").is_file() and (out / "weights.pt").is_file()
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(
            [
                "population",
                "report",
                str(out),
                str(log),
                "--out",
                str(tmp_path / "rep"),
                "--n",
                "1000",
                "--json",
            ]
        )
    assert e.value.code == 0
    import json

    rep = json.loads(capsys.readouterr().out)
    assert set(rep["kl"]) == set(PROFILE) and 0.0 <= rep["c2st_auc"] <= 1.0
    assert (tmp_path / "rep" / "marginals.png").is_file()
    with pytest.raises(SystemExit) as e:
        main(["population", "fit", str(log), "--out", str(out), "--model", "vae"])
    assert e.value.code == 2
