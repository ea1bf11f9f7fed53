"""Reward components against hand-computed values on fixed inputs (seeds 000, 001, 002, 003)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import Feature, TwinSpec
from edgetwin.policies import rewards as R


def test_wa3c_components_by_hand() -> None:
    # eq. 3 and T_exec = C / (f (1 - θ)): 6 Gcycles at 2.5 GHz with θ = 0.2 -> 3 s
    assert R.execution_time(6.0, 2.5) == pytest.approx(3.0)
    assert R.job_latency(1.0, 2.0, 3.0) == pytest.approx(6.0)
    # eq. 2: 1 - 6/10
    assert R.qos_reward(6.0, 10.0) == pytest.approx(0.4)
    # eq. 6: 1.5*0.3 + 0.5*0.7 = 0.8 ; eq. 5: (100 + 0.5*0.8*100) * 10 s = 1400 J
    iota = R.performance_coefficient(1.5, 0.5)
    assert iota == pytest.approx(0.8)
    assert R.energy_j(0.5, 10.0, iota) == pytest.approx(1400.0)
    assert R.power_w(1.0) == pytest.approx(200.0) and R.power_w(0.0) == pytest.approx(100.0)
    # eq. 4, 7, 8, 9
    assert R.energy_reward(0.7, alpha=2.0) == pytest.approx(-1.4)
    assert R.priority_reward(0.8, 0.25) == pytest.approx(0.6)
    assert R.fairness_reward([0.2, 0.4, 0.6], lam=3.0) == pytest.approx(-3.0 * (0.08 / 3))
    assert R.dismissal_reward(4) == pytest.approx(-2.0)  # μ = 0.5


def test_jain_index() -> None:
    assert R.jain_index([1, 1, 1, 1]) == pytest.approx(1.0)
    assert R.jain_index([1, 0, 0, 0]) == pytest.approx(0.25)
    assert R.jain_index([1, 2, 3]) == pytest.approx(36 / (3 * 14))
    assert R.jain_index([0, 0]) == 1.0


def test_multi_objective_reward_matches_hand_sum() -> None:
    cols = {
        "kpi.lat": np.array([2.0, 8.0]),
        "kpi.util": np.array([0.5, 1.0]),
        "profile.prio": np.array([1.0, 0.5]),
        "kpi.drop": np.array([0.0, 2.0]),
    }
    mapping = R.RewardColumns(
        latency="kpi.lat",
        latency_max=10.0,
        cpu_util="kpi.util",
        busy_s=1.0,
        energy_scale_j=200.0,
        priority="profile.prio",
        utilisation="kpi.util",
        dismissed="kpi.drop",
    )
    reward = R.MultiObjectiveReward(mapping)
    got = reward(cols)
    # by hand, agent 0: qos 0.8, energy -(150/200)=-0.75, prio 1*(1-0.2)=0.8, fair -var([.5,1])=-0.0625, dis 0
    # agent 1: qos 0.2, energy -(200/200)=-1, prio 0.5*(1-0.8)=0.1, fair -0.0625, dis -1
    want0 = 0.25 * 0.8 + 0.2 * -0.75 + 0.25 * 0.8 + 0.15 * -0.0625 + 0.15 * 0.0
    want1 = 0.25 * 0.2 + 0.2 * -1.0 + 0.25 * 0.1 + 0.15 * -0.0625 + 0.15 * -1.0
    np.testing.assert_allclose(got, [want0, want1])
    comps = reward.components(cols)
    np.testing.assert_allclose(comps["energy"], [-0.75, -1.0])
    assert sum(R.RewardWeights().as_dict().values()) == pytest.approx(1.0)


def test_modes_change_weights_and_sum_to_one() -> None:
    for mode in R.MODES.values():
        assert sum(mode.weights.as_dict().values()) == pytest.approx(1.0), mode.name
        assert 0.10 <= mode.slo_margin <= 0.15
    mapping = R.RewardColumns(energy="kpi.e", energy_scale_j=1.0, latency="kpi.lat", latency_max=1.0)
    cols = {"kpi.e": np.array([1.0]), "kpi.lat": np.array([0.5])}
    saver = R.MultiObjectiveReward(mapping, mode="energy-saver")(cols)
    burst = R.MultiObjectiveReward(mapping, mode="burst-absorber")(cols)
    assert saver[0] == pytest.approx(0.15 * 0.5 - 0.35 * 1.0)
    assert burst[0] == pytest.approx(0.30 * 0.5 - 0.05 * 1.0)
    with pytest.raises(InputError, match="mode"):
        R.MultiObjectiveReward(mapping, mode="turbo")


def test_carbon_and_cooling_by_hand() -> None:
    # 3.6 MJ = 1 kWh at 400 g/kWh
    assert R.emissions_g(3.6e6, 400.0) == pytest.approx(400.0)
    # 2 servers: (10 s * 200 W + 5 s * 80 W) + (0 + 15 s * 80 W) = 3600 J, cooling ratio 0.5 -> 5400 + start
    assert R.room_energy_j([10, 0], [5, 15], 200.0, 80.0, 0.5, start_j=100.0) == pytest.approx(5500.0)
    assert R.cooling_switch(10, 200.0, 1500.0, "air", 50.0, 80.0) == (80.0, "liquid")
    assert R.cooling_switch(5, 200.0, 1500.0, "liquid", 50.0, 80.0) == (50.0, "air")
    assert R.cooling_switch(5, 200.0, 1500.0, "air", 50.0, 80.0) == (0.0, "air")
    assert R.erlfc_reward(100.0, 90.0, 50.0, 40.0, gain=10.0) == pytest.approx((0.1 + 0.2) * 10)


def test_pfrl_components_by_hand() -> None:
    assert R.response_time(3.0, 1.0) == pytest.approx(4.0)
    assert R.response_reward(3.0, 4.0) == pytest.approx(math.exp(0.75))
    loads = np.array([[0.2, 0.4], [0.6, 0.4]])  # std per type: 0.2, 0.0
    assert R.load_balance(loads, [0.7, 0.3]) == pytest.approx(0.14)
    assert R.load_reward(0.3, 0.2) == 1.0 and R.load_reward(0.2, 0.5) == pytest.approx(0.3)
    assert R.rejection_penalty([0.5, 1.0], [0.5, 0.5]) == pytest.approx(-math.exp(0.75))
    assert R.pfrl_reward(2.0, 1.0, rho=0.25) == pytest.approx(1.25)


def test_make_reward_by_name() -> None:
    spec = TwinSpec(
        features=(Feature("state.q"), Feature("action.x"), Feature("kpi.lat")),
        reward_weights={"kpi.lat": -2.0},
    )
    cols = {"state.q": np.array([1.0]), "action.x": np.array([0.0]), "kpi.lat": np.array([3.0])}
    assert R.make_reward("spec", spec=spec)(cols)[0] == pytest.approx(-6.0)
    fn = R.make_reward("burst-absorber", {"latency": "kpi.lat", "latency_max": 6.0}, spec=spec)
    assert fn(cols)[0] == pytest.approx(0.30 * 0.5 + 0.25 * 0.0)
    assert R.make_reward("edgetwin.policies.rewards:jain_index") is R.jain_index
    with pytest.raises(InputError, match="not a feature"):
        R.make_reward("wa3c", {"latency": "kpi.nope"}, spec=spec)
    with pytest.raises(InputError, match="unknown reward"):
        R.make_reward("nope")
    R.register_reward("mine", lambda columns, spec, scale=1.0: lambda c: scale * c["kpi.lat"])
    assert R.make_reward("mine", scale=2.0)(cols)[0] == pytest.approx(6.0)


def test_latency_ratio_cap() -> None:
    cols = {"kpi.lat": np.array([5.0, 500.0])}
    capped = R.MultiObjectiveReward(R.RewardColumns(latency="kpi.lat", latency_max=10.0, latency_ratio_cap=3.0))
    np.testing.assert_allclose(capped.components(cols)["qos"], [0.5, -2.0])
    raw = R.MultiObjectiveReward(R.RewardColumns(latency="kpi.lat", latency_max=10.0))
    np.testing.assert_allclose(raw.components(cols)["qos"], [0.5, -49.0])


def test_carbon_component_from_intensity_or_grams() -> None:
    cols = {"kpi.e": np.array([3.6e6]), "state.ci": np.array([200.0]), "kpi.g": np.array([50.0])}
    via_ci = R.MultiObjectiveReward(R.RewardColumns(energy="kpi.e", carbon_intensity="state.ci", carbon_scale_g=100.0))
    via_g = R.MultiObjectiveReward(R.RewardColumns(carbon_g="kpi.g", carbon_scale_g=100.0))
    assert via_ci.components(cols)["carbon"][0] == pytest.approx(-2.0)
    assert via_g.components(cols)["carbon"][0] == pytest.approx(-0.5)
