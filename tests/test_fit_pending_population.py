"""The population model fitted beside the members (`edgetwin.twin.pending_population`): a member
draws what it would have drawn from the fitted model, its own random numbers untouched, and a failed
population fit is reported, not waited for."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch as th

from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs
from edgetwin.generative import agent_profiles, fit_population
from edgetwin.imitation.layout import Layout
from edgetwin.twin.pending_population import PendingPopulationSampler, PopulationInBackground
from edgetwin.twin.twin import PopulationSampler


@pytest.fixture(scope="module")
def log() -> tuple[Any, Any]:
    return generate_logs(ClusterConfig(n_agents=20, steps=4), episodes=2, seed=0)


def test_a_pending_sampler_draws_what_the_fitted_model_draws(log: tuple[Any, Any]) -> None:
    df, spec = log
    profile = Layout.fit(df, spec).profile

    def fit() -> Any:
        return fit_population(agent_profiles(df, spec), spec, model="gan-smmsg", seed=1, steps=5, calibrate=False)

    with PopulationInBackground(fit, profile) as background:
        pending = background.sampler()
        assert isinstance(pending, PendingPopulationSampler)
        background.population()  # the fit is done (its thread draws from torch's global generator too)
        scenario = sorted(df["scenario"].unique())[0]
        th.manual_seed(11)
        drawn = pending(7, scenario, 3)
        after_load = th.rand(3)  # loading the model did not move torch's global generator
    th.manual_seed(11)
    assert th.equal(after_load, th.rand(3))
    fitted = background.population()
    np.testing.assert_array_equal(drawn, PopulationSampler(fitted, profile)(7, scenario, 3))
    assert not background.directory.exists()  # the saved copy is removed with the block


def test_a_failed_population_fit_is_raised_and_not_waited_for() -> None:
    def fit() -> Any:
        raise ValueError("no profiles")

    with (
        pytest.raises(ValueError, match="no profiles"),
        PopulationInBackground(fit, ["profile.x"]) as background,
        pytest.raises(RuntimeError, match="population model's fit failed: ValueError: no profiles"),
    ):
        background.sampler()(1, "a", 0)
