"""Population models (GAN-SMMSG, GMM, GAN, WGAN-GP): sampling contract, seeds, save/load, fitting.

Runs on a synthetic profile table (3 scenarios; correlated, multi-modal, heavy-tailed, discrete
and binary columns) with small networks and few steps, so the whole file takes about a minute.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from edgetwin.cli import main
from edgetwin.contract.errors import InputError
from edgetwin.contract.logs import write_table
from edgetwin.contract.metrics import fidelity_report
from edgetwin.contract.spec import Feature, TwinSpec
from edgetwin.generative import (
    MODELS,
    PopulationModel,
    agent_profiles,
    fit_population,
    load_population,
)
from edgetwin.generative.calibration import MarginalCalibration

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
SMALL_SMMSG = {
    **SMALL,
    "group_size": 32,
    "set_hidden": 32,
    "hist_bins": 20,
    "base_components": [4, 8],
    "select_every": 0,
}


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


#: A plain MLP generator without the calibration layer: what the adversarial game alone learns.
PLAIN = {"base": "none", "calibrate": False}


@pytest.fixture(scope="module")
def fitted(train: pd.DataFrame) -> PopulationModel:
    """A plain GAN-SMMSG generator trained long enough to have learned something (a few seconds)."""
    return fit_population(
        train,
        SPEC,
        "gan-smmsg",
        seed=0,
        **{**SMALL_SMMSG, **PLAIN, "hidden": 128, "d_hidden": 128, "steps": 400},
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


@pytest.mark.slow  # the default run's 10-minute budget; the generator's fit stays in the default run: test_same_seed_same_fit, test_checkpoint_selection_on_a_validation_split
def test_fit_beats_random_initialised_generator(
    fitted: PopulationModel, train: pd.DataFrame, held_out: pd.DataFrame
) -> None:
    untrained = fit_population(
        train, SPEC, "gan-smmsg", seed=0, **{k: v for k, v in fitted.hyper.items() if k != "steps"}, steps=0
    )
    r0 = fidelity_report(held_out, untrained.sample(3000, seed=1), SPEC, PROFILE)
    r1 = fidelity_report(held_out, fitted.sample(3000, seed=1), SPEC, PROFILE)
    assert r1["kl_mean"] < 0.25 * r0["kl_mean"], (r0["kl"], r1["kl"])
    assert r1["c2st_auc"] < r0["c2st_auc"] - 0.1, (r0["c2st_auc"], r1["c2st_auc"])
    assert r1["mmd"] < 0.5 * r0["mmd"]
    assert r1["kl_max"] < 0.15, r1["kl"]


@pytest.mark.slow  # the default run's 10-minute budget; a 60 s fit; the generator's fit and sampling stay in the default run
def test_calibration_layer_brings_marginals_to_training_data(
    fitted: PopulationModel, train: pd.DataFrame, held_out: pd.DataFrame
) -> None:
    floor = fidelity_report(held_out, train, SPEC, PROFILE)  # sampling noise of the training rows
    # An untrained generator has wrong marginals; calibrating it fixes them, not its joint.
    untrained = fit_population(train, SPEC, "gan-smmsg", seed=0, **{**SMALL_SMMSG, **PLAIN, "steps": 0})
    r0 = fidelity_report(held_out, untrained.sample(6000, seed=1), SPEC, PROFILE)
    untrained.fit_calibration(train, seed=0, samples_per_scenario=5000)
    r0c = fidelity_report(held_out, untrained.sample(6000, seed=1), SPEC, PROFILE)
    assert r0c["kl_mean"] < 0.1 * r0["kl_mean"], (r0["kl"], r0c["kl"])
    assert r0c["kl_max"] < 2 * floor["kl_max"] + 0.01, (floor["kl"], r0c["kl"])
    # On a trained generator it keeps the marginals at the floor and the copula (rank
    # correlations) intact.
    raw = fidelity_report(held_out, fitted.sample(6000, seed=1), SPEC, PROFILE)
    pm = copy.deepcopy(fitted)
    pm.fit_calibration(train, seed=0, samples_per_scenario=5000)
    cal = fidelity_report(held_out, pm.sample(6000, seed=1), SPEC, PROFILE)
    assert cal["kl_max"] < 2 * floor["kl_max"] + 0.01, (floor["kl"], cal["kl"])
    assert abs(cal["corr_dist"] - raw["corr_dist"]) < 0.03
    a, b = pm.sample(300, seed=4), pm.sample(300, seed=4)
    pd.testing.assert_frame_equal(a, b)


def test_calibration_fit_on_a_toy_problem() -> None:
    rng = np.random.default_rng(0)
    n = 40_000
    # two scenarios; column 0 continuous, columns 1..3 a logit block
    s_gen, s_tgt = rng.integers(0, 2, n), rng.integers(0, 2, n)
    gen = np.column_stack([rng.normal(1.0, 2.0, n), rng.normal(0.0, 1.0, (n, 3))])
    tgt_x = np.where(s_tgt == 0, rng.exponential(1.0, n), rng.normal(-3.0, 0.5, n))
    share = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    cats = np.array([rng.choice(3, p=share[s]) for s in s_tgt])
    target = np.column_stack([tgt_x, np.eye(3)[cats]])
    cal = MarginalCalibration.fit(gen, s_gen, target, s_tgt, 2, [0], [(1, 4)])
    # monotone in the input, per scenario
    grid = np.linspace(-10, 10, 2001)
    for s in (0, 1):
        y = cal.apply(np.column_stack([grid, np.zeros((len(grid), 3))]), np.full(len(grid), s))[:, 0]
        assert np.all(np.diff(y) >= 0)
    out = cal.apply(gen, s_gen)
    for s in (0, 1):
        ks = stats.ks_2samp(out[s_gen == s, 0], tgt_x[s_tgt == s]).statistic
        assert ks < 0.02, (s, ks)
        logits = out[s_gen == s, 1:4]
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        np.testing.assert_allclose(
            p.mean(axis=0), np.bincount(cats[s_tgt == s], minlength=3) / (s_tgt == s).sum(), atol=1e-3
        )
        # ranks are kept: the map is a monotone function of the raw value
        assert stats.spearmanr(out[s_gen == s, 0], gen[s_gen == s, 0]).statistic > 0.999
    back = MarginalCalibration.from_state(cal.state())
    np.testing.assert_array_equal(back.apply(gen[:500], s_gen[:500]), out[:500])


def test_calibration_saved_with_the_model(models: dict[str, PopulationModel], tmp_path: Path) -> None:
    pm = models["gan-smmsg"]
    # the base mixture's size was chosen on a validation split of the training rows
    assert pm.meta["base_components_selected"] in (4, 8)
    assert set(pm.meta["base_components_val_loglik"]) == {4, 8}
    assert pm.calibration is not None  # on by default for GAN-SMMSG
    assert (pm.save(tmp_path / "m") / "calibration.npz").is_file()
    assert models["gmm"].calibration is None
    assert not (models["gmm"].save(tmp_path / "m") / "calibration.npz").exists()  # stale file removed


def test_checkpoint_selection_on_a_validation_split(train: pd.DataFrame) -> None:
    pm = fit_population(train, SPEC, "gan-smmsg", seed=0, **{**SMALL_SMMSG, "steps": 20, "select_every": 10})
    sel = pm.meta["selection"]
    assert [r["step"] for r in sel] == [0, 10, 20]
    best = min(sel, key=lambda r: r["val_c2st_auc"])
    assert pm.meta["selected_step"] == best["step"]
    assert pm.calibration is not None  # the final calibration is fitted after the selection


@pytest.mark.slow  # the default run's 10-minute budget; the generators' sampling contract stays in the default run: test_sample_contract
def test_gmm_residual_generator_starts_at_its_mixture(train: pd.DataFrame, held_out: pd.DataFrame) -> None:
    """At step 0 the residual is zero: GAN-SMMSG with base="gmm" samples from its fitted mixtures."""
    start = fit_population(
        train, SPEC, "gan-smmsg", seed=0, **{**SMALL_SMMSG, "steps": 0, "calibrate": False}
    )
    gmm = fit_population(train, SPEC, "gmm", seed=0)
    r0 = fidelity_report(held_out, start.sample(6000, seed=1), SPEC, PROFILE)
    rg = fidelity_report(held_out, gmm.sample(6000, seed=1), SPEC, PROFILE)
    assert abs(r0["kl_mean"] - rg["kl_mean"]) < 0.01, (r0["kl"], rg["kl"])
    assert abs(r0["c2st_auc"] - rg["c2st_auc"]) < 0.05


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
    assert (out / "population.json").is_file() and (out / "weights.safetensors").is_file()
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
