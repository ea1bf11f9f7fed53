"""Fitting and loading population models: `fit_population`, `load_population`, `agent_profiles`.

`MODEL_CLASSES` names the models a user can ask for (``--model``); `agent_profiles` turns a log into
the one-row-per-agent table they are fitted on.
"""


from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import TwinSpec
from edgetwin.generative.base import PopulationModel, data_hash, versions
from edgetwin.generative.gan import GANPopulation, GANSMMSGPopulation, WGANPopulation
from edgetwin.generative.gmm import GMMPopulation
from edgetwin.generative.transform import ProfileTransformer

MODELS = ("gan-smmsg", "gmm", "gan", "wgan")
MODEL_CLASSES: dict[str, type[PopulationModel]] = {
    "gan-smmsg": GANSMMSGPopulation,
    "gmm": GMMPopulation,
    "gan": GANPopulation,
    "wgan": WGANPopulation,
}
#: Scenario label given to every row of a table that has no ``scenario`` column.
DEFAULT_SCENARIO = "all"



def agent_profiles(log: pd.DataFrame, spec: TwinSpec) -> pd.DataFrame:
    """One row per agent of a log: its scenario and static ``profile.*`` features.

    Profiles are static, so each ``(episode, agent)`` (or each ``agent`` when the log has no
    ``episode`` column) contributes the row of its first step ``t``. A table that has no
    ``agent`` column is taken to be a profile table already (one row per agent).

    Args:
        log: a log in the contract (one row per ``(episode, t, agent)``) or a profile table.
        spec: names the profile columns, in order.

    Returns:
        DataFrame with columns ``["scenario", *spec.names("profile")]`` (plus ``episode`` and
        ``agent`` when the log has them, first), index reset. Without a ``scenario`` column every
        row gets `DEFAULT_SCENARIO`.

    Raises:
        InputError: a profile column is missing.
    """
    cols = spec.names("profile")
    if not cols:
        raise InputError("the spec has no profile.* features", "spec")
    missing = [c for c in cols if c not in log.columns]
    if missing:
        raise InputError(f"profile column(s) {missing} missing; the table has {list(log.columns)}", "log")
    df = log
    keys = [k for k in ("episode", "agent") if k in df.columns]
    if "agent" in df.columns:
        if "t" in df.columns:
            df = df.sort_values([*keys, "t"], kind="stable")
        df = df.drop_duplicates(subset=keys, keep="first")
    out = pd.DataFrame(index=df.index)
    for k in keys:
        out[k] = df[k].to_numpy()
    out["scenario"] = df["scenario"].astype(str).to_numpy() if "scenario" in df.columns else DEFAULT_SCENARIO
    for c in cols:
        out[c] = pd.to_numeric(df[c], errors="coerce").to_numpy(np.float64)
    return out.reset_index(drop=True)


def fit_population(
    profiles: pd.DataFrame,
    spec: TwinSpec,
    model: str = "gan-smmsg",
    seed: int = 0,
    progress: bool = False,
    **hyper: Any,
) -> PopulationModel:
    """Fit a population model on one row per agent.

    Args:
        profiles: columns ``scenario`` (optional: absent -> one scenario, `DEFAULT_SCENARIO`) and
            every ``profile.*`` feature of ``spec``; one row per agent (see `agent_profiles`).
        spec: the twin spec; profile kinds choose the encoding (see `ProfileTransformer`).
        model: one of `MODELS`.
        seed: same seed and data -> same model.
        progress: show a tqdm bar.
        **hyper: model hyper-parameters, e.g. ``steps`` (generator updates), ``alpha``, ``beta``,
            ``n_components`` (GMM), ``transform`` (``"quantile"`` or ``"standard"``), and
            ``calibrate`` / ``calibrate_samples``: fit the marginal calibration layer
            (`edgetwin.generative.calibration`) after training, from that many generated rows per
            scenario (on by default for GAN-SMMSG only).

    Raises:
        InputError: unknown model or hyper-parameter, missing or non-finite profile values, a
            discrete value that is not allowed, or too few rows.
    """
    if model not in MODEL_CLASSES:
        raise InputError(f"unknown model {model!r}; expected one of {', '.join(MODELS)}", "--model")
    cls = MODEL_CLASSES[model]
    transform = hyper.pop("transform", "quantile")
    allowed: set[str]
    if cls is GMMPopulation:
        allowed = {"n_components", "reg_covar", "calibrate", "calibrate_samples"}
    else:
        assert issubclass(cls, GANPopulation)  # every other entry of MODEL_CLASSES is a GAN
        allowed = cls.hyper_keys()
    unknown = sorted(set(hyper) - allowed)
    if unknown:
        raise InputError(
            f"unknown hyper-parameter(s) {unknown} for {model!r}; known: {sorted(allowed)}", model
        )
    profiles = profiles.copy()
    if "scenario" not in profiles.columns:
        profiles["scenario"] = DEFAULT_SCENARIO
    profiles["scenario"] = profiles["scenario"].astype(str)
    if len(profiles) < 2:
        raise InputError(f"need at least 2 profile rows to fit, got {len(profiles)}", "profiles")
    counts = profiles["scenario"].value_counts().sort_index()
    scenarios = [str(s) for s in counts.index]
    transformer = ProfileTransformer(spec, method=transform).fit(profiles)
    meta = {
        "n_train": len(profiles),
        "seed": seed,
        "data_hash": data_hash(profiles, ["scenario", *spec.names("profile")]),
        "versions": versions(),
    }
    pm = cls(
        spec=spec,
        scenarios=scenarios,
        proportions=counts.to_numpy(np.float64) / counts.sum(),
        transformer=transformer,
        hyper=hyper,
        meta=meta,
    )
    t0 = time.perf_counter()
    pm.fit(profiles, seed=seed, progress=progress)  # type: ignore[attr-defined]
    if pm.hyper.get("calibrate"):
        pm.fit_calibration(
            profiles, seed=seed, samples_per_scenario=int(pm.hyper.get("calibrate_samples", 50_000))
        )
    pm.meta["fit_seconds"] = time.perf_counter() - t0
    return pm


def load_population(path: str | Path) -> PopulationModel:
    """Load a model saved with `PopulationModel.save`; samples match the saved model's exactly."""
    return PopulationModel.load(path)
