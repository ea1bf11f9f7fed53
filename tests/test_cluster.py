"""The emulated edge-cloud cluster: API, contract, exactness of the per-agent view, behaviour, drift."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import FIXTURES, shared_data
from gymnasium.utils.env_checker import check_env

from edgetwin.contract.errors import InputError
from edgetwin.contract.logs import ordered_columns
from edgetwin.contract.policy import FunctionPolicy
from edgetwin.contract.spec import KEY_COLUMNS, TwinSpec
from edgetwin.emulator.cluster import ACT_HIGH, ACT_LOW, ClusterConfig, EdgeCluster, cluster_spec
from edgetwin.emulator.energy import CarbonSeries, Cooling, PowerModel, load_specpower
from edgetwin.emulator.envs import EdgeClusterEnv, EdgeClusterVecEnv
from edgetwin.emulator.logs import SLOAwarePolicy, generate_logs, plot_overview
from edgetwin.emulator.population import SCENARIOS, Drift, sample_profiles
from edgetwin.emulator.traces import read_trace

torch.set_num_threads(1)

SMALL = ClusterConfig(n_agents=60, steps=24)


def constant(edge_share: float, capacity: float, price: float) -> FunctionPolicy:
    return FunctionPolicy(lambda obs: np.tile([edge_share, capacity, price], (len(obs), 1)), name="constant")


# ------------------------------------------------------------------------------------ envs
def test_check_env_passes() -> None:
    env = EdgeClusterEnv(ClusterConfig(n_agents=4, steps=3))
    check_env(env, skip_render_check=True)


def test_per_agent_env_is_exact() -> None:
    """Round-robin per-agent stepping gives the batch simulator's rewards, responses and KPIs."""
    cfg = ClusterConfig(n_agents=7, steps=5)
    actions = np.random.default_rng(0).uniform(ACT_LOW, ACT_HIGH, size=(5, 7, 3))
    env = EdgeClusterEnv(cfg)
    env.reset(seed=11)
    per_agent, kpis, ends = [], [], []
    for t in range(5):
        for j in range(7):
            _, r, term, trunc, info = env.step(actions[t, j].astype(np.float32))
            per_agent.append(r)
            kpis.append(info["kpis"])
            ends.append(trunc)
            assert not term
    assert ends[-1] and not any(ends[:-1])

    ref = EdgeClusterEnv(cfg)
    ref.reset(seed=11)  # same population and noise
    batch, batch_kpis = [], []
    for t in range(5):
        # float32 round trip as in the env, then the batch step
        _, r, done, info = ref.cluster.step(actions[t].astype(np.float32))
        batch.extend(r)
        batch_kpis.extend(info["kpis"])
    assert done
    np.testing.assert_allclose(per_agent, batch, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.array(kpis), np.array(batch_kpis), rtol=1e-12)


def test_vecenv_steps_and_autoresets() -> None:
    vec = EdgeClusterVecEnv(ClusterConfig(n_agents=6, steps=3), seed=5)
    obs = vec.reset()
    assert obs.shape == (6, 25) and obs.dtype == np.float32
    assert vec.observation_space.contains(obs[0])
    first_ids = vec.cluster.agent_ids.copy()
    for t in range(3):
        obs, reward, dones, infos = vec.step(np.tile(np.float32([0.5, 1.0, 0.3]), (6, 1)))
        assert reward.shape == (6,) and np.isfinite(reward).all()
        assert dones.all() == (t == 2)
    assert all("terminal_observation" in i and i["TimeLimit.truncated"] for i in infos)
    assert infos[0]["terminal_observation"].shape == (25,)
    assert not np.array_equal(first_ids, vec.cluster.agent_ids)  # a fresh population after the reset
    assert vec.cluster.t == 0


def test_vecenv_trains_with_sb3() -> None:
    from stable_baselines3 import PPO

    vec = EdgeClusterVecEnv(ClusterConfig(n_agents=8, steps=6), seed=0)
    model = PPO("MlpPolicy", vec, n_steps=8, batch_size=32, n_epochs=1, seed=0, device="cpu")
    model.learn(total_timesteps=128)
    action, _ = model.predict(vec.reset(), deterministic=True)
    assert action.shape == (8, 3)


# ------------------------------------------------------------------------------------ logs
def test_logs_follow_the_contract() -> None:
    log, spec = generate_logs(ClusterConfig(n_agents=12, steps=8), episodes=2, seed=3)
    assert list(log.columns) == ordered_columns(spec, ["reward", "policy", "propensity"])
    assert (log["policy"] == "random").all() and np.allclose(log["propensity"], log["propensity"].iloc[0])
    assert spec.transition is None and spec.reward_weights
    assert not log.duplicated(list(KEY_COLUMNS)).any()
    assert len(log) == 2 * 8 * 12
    for (_, _), g in log.groupby(["episode", "agent"]):
        assert g["t"].tolist() == list(range(8))
    assert set(log["scenario"]) <= set(SCENARIOS)
    assert log["site"].str.startswith("edge-").all()
    # Every feature within its spec bounds; discrete ones take allowed values.
    for f in spec.features:
        col = log[f.name].to_numpy()
        assert np.isfinite(col).all(), f.name
        if f.low is not None:
            assert (col >= f.low).all(), f.name
        if f.high is not None:
            assert (col <= f.high).all(), f.name
        if f.allowed_values() is not None:
            assert set(np.unique(col)) <= set(f.allowed_values()), f.name
    # The reward column is the spec's reward of the logged columns.
    cols = {c: log[c].to_numpy() for c in log.columns if "." in c}
    np.testing.assert_allclose(spec.reward_fn()(cols), log["reward"].to_numpy())
    # Profiles are static within an episode.
    prof = spec.names("profile")
    assert (log.groupby(["episode", "agent"])[prof].nunique() == 1).all().all()


def test_spec_round_trips(tmp_path: Path) -> None:
    spec = cluster_spec(SMALL)
    again = TwinSpec.load(spec.save(tmp_path / "log.spec.toml"))
    assert again.hash() == spec.hash()
    assert len(spec.observation_columns) == 25 and spec.action_columns == [
        "action.edge_share",
        "action.capacity",
        "action.price",
    ]
    kinds = {f.kind for f in spec.by_role("profile")}
    assert kinds == {"heavy_tailed", "continuous", "discrete", "binary", "categorical"}


def test_same_seed_same_log() -> None:
    a, _ = generate_logs(SMALL, episodes=1, policy="random", seed=7)
    b, _ = generate_logs(SMALL, episodes=1, policy="random", seed=7)
    c, _ = generate_logs(SMALL, episodes=1, policy="random", seed=8)
    pd.testing.assert_frame_equal(a, b)
    assert not np.allclose(a["response.offload_ratio"], c["response.offload_ratio"])


def test_bad_input_is_input_error() -> None:
    with pytest.raises(InputError, match="--agents"):
        ClusterConfig(n_agents=0)
    with pytest.raises(InputError, match="--drift"):
        ClusterConfig(drift="2y")
    with pytest.raises(InputError, match="--policy"):
        generate_logs(SMALL, episodes=1, policy="greedy")
    cluster = EdgeCluster(SMALL)
    cluster.reset(seed=0)
    with pytest.raises(InputError, match="actions"):
        cluster.step(np.zeros((3, 3)))
    with pytest.raises(InputError, match="NaN"):
        cluster.step(np.full((60, 3), np.nan))


# ------------------------------------------------------------------------------------ behaviour
def test_response_depends_on_the_action() -> None:
    """Free + edge + reserved capacity gets more offload than expensive + cloud + none."""
    cfg = ClusterConfig(n_agents=120, steps=24)
    good, _ = generate_logs(cfg, 1, constant(1.0, 1.0, 0.0), seed=1)
    bad, _ = generate_logs(cfg, 1, constant(0.0, 0.0, 1.0), seed=1)
    cheap, _ = generate_logs(cfg, 1, constant(0.5, 1.0, 0.0), seed=1)
    dear, _ = generate_logs(cfg, 1, constant(0.5, 1.0, 1.0), seed=1)
    # Same seed -> the same population and noise; only the action differs.
    assert (good["profile.demand_rate"].to_numpy() == bad["profile.demand_rate"].to_numpy()).all()
    assert good["response.offload_ratio"].mean() - bad["response.offload_ratio"].mean() > 0.2
    assert cheap["response.offload_ratio"].mean() - dear["response.offload_ratio"].mean() > 0.1
    assert cheap["response.demand"].mean() > dear["response.demand"].mean()
    # iov groups value the edge far more than iot groups do at day 0.
    edge, _ = generate_logs(cfg, 1, constant(1.0, 1.0, 0.3), seed=2)
    cloud, _ = generate_logs(cfg, 1, constant(0.0, 1.0, 0.3), seed=2)
    gain = edge.groupby("scenario")["response.offload_ratio"].mean() - cloud.groupby("scenario")[
        "response.offload_ratio"
    ].mean()
    assert gain["iov"] - gain["iot"] > 0.2


def test_response_depends_on_own_history() -> None:
    """Same profiles and noise, same action now, different latency histories -> different responses:
    the groups whose offloaded tasks fared worse offload less.

    No reservations in either history (so the honoured capacity is 0 in both), only placement differs:
    the response at the test tick can differ only through the groups' own experience.
    """
    from scipy import stats

    cfg = ClusterConfig(n_agents=150, steps=20, target_util=0.9)
    a, b = EdgeCluster(cfg), EdgeCluster(cfg)
    a.reset(seed=0)
    b.reset(seed=0)
    latency = cluster_spec(cfg).observation_columns.index("state.latency_ms")
    hist_a, hist_b = [], []
    for _ in range(10):
        a.step(np.tile([0.0, 0.0, 0.0], (cfg.n_agents, 1)))  # all to the abundant cloud
        b.step(np.tile([1.0, 0.0, 0.0], (cfg.n_agents, 1)))  # all onto the small edge sites
        hist_a.append(a.observe()[:, latency])
        hist_b.append(b.observe()[:, latency])
    np.testing.assert_array_equal(a.profiles, b.profiles)
    same = np.tile([0.5, 0.0, 0.5], (cfg.n_agents, 1))
    _, _, _, ia = a.step(same)
    _, _, _, ib = b.step(same)
    diff = ia["responses"][:, 0] - ib["responses"][:, 0]
    assert (np.abs(diff) > 1e-4).mean() > 0.5  # relaxed-SLO groups far below their SLO barely react
    worse = np.log(np.mean(hist_b, axis=0) / np.mean(hist_a, axis=0))  # > 0: b's history was worse
    assert stats.spearmanr(worse, diff).statistic > 0.4
    assert diff[worse > np.log(2.0)].mean() > 0.05


def test_residual_offload_is_autocorrelated() -> None:
    """Under i.i.d. random actions, what an i.i.d. model of (profile, action) cannot explain of a group's
    offload is autocorrelated in time: the logs are not i.i.d."""
    from sklearn.linear_model import Ridge

    log, spec = generate_logs(ClusterConfig(n_agents=80, steps=48), 1, "random", seed=0)
    x = log.sort_values(["agent", "t"]).reset_index(drop=True)
    off = x["response.offload_ratio"].to_numpy()
    y = np.log(off) - np.log1p(-off)
    lp = np.log1p(x[spec.names("profile")].to_numpy())
    p = (lp - lp.mean(0)) / (lp.std(0) + 1e-9)
    a = x[spec.names("action")].to_numpy()
    a = np.column_stack([a, np.log(a[:, 1] + 0.05)])
    feats = np.column_stack([p, a, (p[:, :, None] * a[:, None, :]).reshape(len(p), -1)])
    res = pd.Series(y - Ridge(alpha=1.0).fit(feats, y).predict(feats))
    agent = x["agent"].to_numpy()
    res = res - res.groupby(agent).transform("mean")
    lag = res.groupby(agent).shift(1)
    ok = lag.notna()
    assert np.corrcoef(res[ok], lag[ok])[0, 1] > 0.3


def test_heuristic_beats_random_on_offload() -> None:
    cfg = ClusterConfig(n_agents=120, steps=24)
    rnd, _ = generate_logs(cfg, 1, "random", seed=5)
    heu, _ = generate_logs(cfg, 1, "heuristic", seed=5)
    assert heu["response.offload_ratio"].mean() > rnd["response.offload_ratio"].mean() + 0.03
    pol = SLOAwarePolicy(cluster_spec(cfg))
    a = pol.act(rnd[cluster_spec(cfg).observation_columns].to_numpy()[:50])
    assert a.shape == (50, 3) and (a >= ACT_LOW).all() and (a <= ACT_HIGH).all()


def test_sites_are_coupled() -> None:
    """Everyone at the edge with big reservations congests it: backlog and overcommitment appear."""
    cfg = ClusterConfig(n_agents=80, steps=96)
    crowd, _ = generate_logs(cfg, 1, constant(1.0, 2.0, 0.0), seed=6)
    spread, _ = generate_logs(cfg, 1, constant(0.3, 0.5, 0.0), seed=6)
    assert crowd["state.site_util"].mean() > spread["state.site_util"].mean() + 0.15
    assert crowd["state.site_backlog_s"].max() > 0 and spread["state.site_backlog_s"].max() == 0
    assert crowd["state.site_reserved"].mean() > 1.5
    assert crowd["kpi.slo_violation"].mean() > spread["kpi.slo_violation"].mean()


def test_diurnal_demand_is_observable() -> None:
    log, _ = generate_logs(ClusterConfig(n_agents=80, steps=96), 1, constant(0.5, 1.0, 0.3), seed=1)
    iov = log[log["scenario"] == "iov"]
    by_hour = (iov["response.demand"] / iov["profile.demand_rate"]).groupby((iov["state.day_fraction"] * 24).astype(int)).mean()
    assert by_hour.loc[7:9].mean() > 2.0 * by_hour.loc[1:4].mean()  # commuting peak vs night


# ------------------------------------------------------------------------------------ drift and population
def test_drift_changes_population_and_behaviour() -> None:
    rng0, rng1 = np.random.default_rng(0), np.random.default_rng(0)
    p0, s0, _ = sample_profiles(rng0, 6000, Drift(0.0))
    p1, s1, _ = sample_profiles(rng1, 6000, Drift(30.0))
    iov = SCENARIOS.index("iov")
    assert (s1 == iov).mean() - (s0 == iov).mean() > 0.1
    ps = 6  # price_sensitivity
    assert np.median(p1[:, ps]) > 1.15 * np.median(p0[:, ps])
    assert Drift(1.0).level < 0.15 < Drift(7.0).level < 0.6 < Drift(30.0).level
    d0, _ = generate_logs(ClusterConfig(n_agents=100, steps=24, drift="0d"), 1, "random", seed=9)
    d1, _ = generate_logs(ClusterConfig(n_agents=100, steps=24, drift="1m"), 1, "random", seed=9)
    assert d0["response.offload_ratio"].mean() - d1["response.offload_ratio"].mean() > 0.05


def test_population_is_correlated_heavy_tailed_and_multimodal() -> None:
    p, scen, comp = sample_profiles(np.random.default_rng(1), 8000)
    logt, logcpu = np.log(p[:, 0]), np.log(p[:, 7])
    assert np.corrcoef(logt, logcpu)[0, 1] > 0.3
    assert np.corrcoef(p[:, 4], p[:, 5])[0, 1] < -0.2  # strict SLO <-> high priority
    from scipy import stats

    assert stats.kurtosis(np.log(p[:, 3])) > 0.0  # heavier than log-normal demand
    # Sub-populations differ: mbb video tasks are longer than mbb web tasks.
    mbb = scen == SCENARIOS.index("mbb")
    assert np.median(p[mbb & (comp == 0), 0]) > 2 * np.median(p[mbb & (comp == 1), 0])
    assert set(np.unique(p[:, 5])) == {1.0, 2.0, 3.0} and set(np.unique(p[:, 9])) == {0.0, 1.0}


# ------------------------------------------------------------------------------------ traces, energy
def test_trace_shapes_the_population() -> None:
    trace = read_trace(FIXTURES / "azure_llm_code_head300.csv")
    cfg = ClusterConfig(n_agents=400, steps=2, trace=trace)
    c = EdgeCluster(cfg)
    c.reset(seed=0)
    t = c.profiles[:, 0]
    # Task-time spread comes from the trace: the p90/p50 ratio within each component matches it.
    d = trace.durations_s
    expect = np.quantile(d, 0.9) / np.median(d)
    m = (c.scenario == 0) & (c.component == 0)
    got = np.quantile(t[m], 0.9) / np.median(t[m])
    assert abs(np.log(got / expect)) < 0.35
    assert c._diurnal_grid.shape == (3, 96)
    np.testing.assert_allclose(c._diurnal_grid.mean(axis=1), 1.0)


def test_power_model_is_seed_001_with_a_linear_curve() -> None:
    pm = PowerModel(tuple(np.linspace(100.0, 200.0, 11)), iota=0.8)
    u = np.array([0.0, 0.3, 1.0])
    np.testing.assert_allclose(pm.watts(u), 100.0 + u * 0.8 * (200.0 - 100.0))


def test_cooling_switches_by_load() -> None:
    cool = Cooling(mode="air", air_peak_w=1000.0)
    liquid, cr, sw = cool.step(np.array([False, False]), np.array([500.0, 1500.0]))
    assert liquid.tolist() == [False, True] and sw[0] == 0 and sw[1] == cool.liquid_start_j
    assert cr[1] == cool.cr_liquid < cr[0] == cool.cr_air


def test_builtin_carbon_profile_and_real_series() -> None:
    nl = CarbonSeries.builtin("NL")
    assert len(nl.hourly) == 365 * 24
    assert nl.at(12.0) < nl.at(19.0)  # solar noon dip
    path = shared_data("opendc-traces/carbon/traces/electricity_maps/NL_2021-2024.parquet")
    real = CarbonSeries.from_file(path)
    assert len(real.hourly) == 8760
    np.testing.assert_allclose(real.hourly.mean(), np.mean(nl.hourly), rtol=0.05)


def test_real_carbon_series_is_deterministic_per_seed_and_day(tmp_path: Path) -> None:
    folder = shared_data("opendc-traces/carbon/traces/electricity_maps")
    cfg = ClusterConfig(n_agents=4, steps=3, carbon=folder)
    check_env(EdgeClusterEnv(cfg), skip_render_check=True)  # includes reset(seed) determinism
    log, _ = generate_logs(ClusterConfig(n_agents=5, steps=4, carbon=folder), episodes=2, seed=0)
    ci = log.groupby("episode")["state.carbon_g_per_kwh"].mean()
    assert ci[0] != ci[1]  # consecutive episodes play consecutive days of the real series
    png = plot_overview(log, tmp_path / "overview.png")
    assert png.stat().st_size > 10_000


def test_specpower_file_reader(tmp_path: Path) -> None:
    path = shared_data("cloudsimplus-examples/src/main/resources/power-specs/PowerModelSpecPowerIbmX3550XeonX5670.txt")
    assert load_specpower(path)[0] == 66 and load_specpower(path)[-1] == 247
    bad = tmp_path / "bad.txt"
    bad.write_text("10 20 thirty\n")
    with pytest.raises(InputError, match="bad.txt:1"):
        load_specpower(bad)


# ------------------------------------------------------------------------------------ CLI
def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from edgetwin.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    captured = capsys.readouterr()
    return int(exit_.value.code or 0), captured.out, captured.err


def test_cli_logs_generate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "log.parquet"
    code, stdout, err = _cli(capsys, "logs", "generate", "--out", str(out), "--agents", "10", "--episodes", "1",
                             "--steps", "4", "--policy", "heuristic", "--seed", "3", "--json")
    assert code == 0, err
    assert json.loads(stdout)["rows"] == 40
    log = pd.read_parquet(out)
    assert len(log) == 40 and (tmp_path / "log.spec.toml").is_file()
    assert TwinSpec.load(tmp_path / "log.spec.toml").hash() == cluster_spec(ClusterConfig(steps=4)).hash()
    again, _ = generate_logs(ClusterConfig(n_agents=10, steps=4), 1, "heuristic", seed=3)
    pd.testing.assert_frame_equal(log, again)
    for flag, value in (("--drift", "2y"), ("--policy", "greedy"), ("--agents", "0"), ("--trace", "nope.csv")):
        code, _, err = _cli(capsys, "logs", "generate", "--out", str(tmp_path / "x.parquet"), flag, value)
        assert code == 2 and flag in err, (flag, err)


def test_reward_weights_choose_what_the_site_optimises() -> None:
    from edgetwin.contract.errors import InputError
    from edgetwin.emulator.cluster import KPI_NAMES, RESPONSE_NAMES, REWARD_WEIGHTS

    def mean_reward(weights: dict[str, float] | None, capacity: float) -> float:
        env = EdgeClusterVecEnv(ClusterConfig(n_agents=8, steps=24, reward_weights=weights), seed=1)
        env.reset()
        act = np.tile(np.array([0.8, capacity, 0.0], np.float32), (env.num_envs, 1))
        total = 0.0
        for _ in range(24):
            _, r, _, _ = env.step(act)
            k, resp = env.last_info["kpis"], env.last_info["responses"]
            cols = {**{f"response.{n}": resp[:, i] for i, n in enumerate(RESPONSE_NAMES)},
                    **{f"kpi.{n}": k[:, i] for i, n in enumerate(KPI_NAMES)}}
            want = sum(w * cols[c] for c, w in (weights or REWARD_WEIGHTS).items())
            np.testing.assert_allclose(r, want, rtol=1e-6, atol=1e-7)
            total += float(r.mean())
        return total

    cost = {"kpi.utilisation": 1.0, "kpi.slo_violation": -0.5}
    # the default (offload) objective wants capacity, a cost-cap site wants it used: opposite optima
    assert mean_reward(None, 2.0) > mean_reward(None, 0.2)
    assert mean_reward(cost, 0.2) > mean_reward(cost, 2.0)
    assert cluster_spec(ClusterConfig(reward_weights=cost)).reward_weights == cost
    with pytest.raises(InputError, match="kpi.nope"):
        ClusterConfig(reward_weights={"kpi.nope": 1.0})


def test_the_spec_says_what_the_operator_wants_of_revenue_energy_and_carbon() -> None:
    """Issue 44: a KPI with no declared direction is never guarded; the emulated cluster's operator
    wants revenue higher and energy, carbon, task time and SLO violations lower, each with a margin,
    and the gate's default guards follow the spec (not the training reward's weights)."""
    from edgetwin.contract.spec import TwinSpec
    from edgetwin.emulator.cluster import KPI_GOALS, cluster_spec
    from edgetwin.policies.gate import resolve_guards
    from edgetwin.twin.whatif.kpis import default_kpis

    spec = cluster_spec()
    declared = {f.name: (f.better, f.margin) for f in spec.features if f.better is not None}
    assert declared["kpi.revenue"][0] == "higher"
    assert declared["kpi.energy_j"][0] == declared["kpi.carbon_g"][0] == "lower"
    assert declared["kpi.slo_violation"][0] == declared["kpi.task_time_ms"][0] == "lower"
    assert all(m is not None and 0 < m <= 0.05 for _, m in declared.values()) and declared == KPI_GOALS
    guards = {g.kpi: g.max_regression for g, _ in resolve_guards(default_kpis(spec, spec.names("kpi")), None)}
    assert guards["kpi.revenue"] == 0.02 and guards["kpi.energy_j"] == 0.05 and "kpi.utilisation" not in guards
    # guarded although a site's reward does not weigh it (seed 003's cost-cap mode)
    cost = cluster_spec(ClusterConfig(reward_weights={"kpi.utilisation": 1.0, "kpi.slo_violation": -0.5}))
    assert "kpi.revenue" not in cost.reward_weights
    guards = {g.kpi: g.max_regression for g, _ in resolve_guards(default_kpis(cost, cost.names("kpi")), None)}
    assert guards["kpi.revenue"] == 0.02 and guards["kpi.energy_j"] == 0.05
    # the declaration round-trips through the spec's TOML and is checked
    again = TwinSpec.from_dict(spec.to_dict())
    assert {f.name: (f.better, f.margin) for f in again.features if f.better} == declared
    bad = spec.to_dict()
    next(f for f in bad["features"] if f["name"] == "kpi.revenue")["better"] = "more"
    with pytest.raises(InputError, match="better"):
        TwinSpec.from_dict(bad)


def test_training_reward_is_the_operators_multi_objective() -> None:
    """Issue 44: what training maximises weighs every KPI the operator declares a goal for, in the
    declared direction (a positive weight for higher-is-better), so the reward cannot buy one KPI by
    giving another away for free; the gate reads the same directions from the saved spec."""
    from edgetwin.emulator.cluster import KPI_GOALS
    from edgetwin.twin.whatif import default_kpis

    spec = cluster_spec()
    w = dict(spec.reward_weights)
    assert set(KPI_GOALS) <= set(w)
    for col, (better, _margin) in KPI_GOALS.items():
        assert (w[col] > 0) == (better == "higher"), col
    outputs = [f.name for f in spec.features if f.role in ("response", "kpi")]
    directions = {k.name: k.better for k in default_kpis(spec, outputs)}
    assert directions["kpi.revenue"] == "higher" and directions["response.offload_ratio"] == "higher"
    assert all(directions[c] == "lower" for c in ("kpi.energy_j", "kpi.carbon_g", "kpi.task_time_ms"))
