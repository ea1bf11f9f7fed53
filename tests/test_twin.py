"""The Twin: fit, save/load, environments, rollouts, uncertainty, on toy systems written here."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from pettingzoo.test import parallel_api_test
from stable_baselines3 import PPO
from stable_baselines3.common.env_checker import check_env
from test_imitation import toy_log, toy_spec

from edgetwin.contract.errors import InputError
from edgetwin.contract.logs import ordered_columns
from edgetwin.contract.policy import FunctionPolicy, RandomPolicy
from edgetwin.contract.spec import Feature, TwinSpec
from edgetwin.twin.intervals import Calibration
from edgetwin.twin.twin import Twin

torch.set_num_threads(1)

@pytest.fixture(autouse=True)
def _allow_spec_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """The specs here name functions of these modules: allowed, as a user would (docs/log-format.md)."""
    monkeypatch.setenv("EDGETWIN_ALLOW_CODE", "test_twin")


TINY = {"bc_epochs": 15, "rounds": 1, "world_agents": 16, "n_steps": 12, "demo_batch_size": 64}


@pytest.fixture(scope="module")
def twin() -> Twin:
    return Twin.fit(
        toy_log(episodes=10), toy_spec(), members=2, seed=0, progress=False, population_model="empirical", **TINY
    )


# ------------------------------------------------------------------------------------ rollouts
def test_rollout_is_a_log_in_the_contract(twin: Twin) -> None:
    spec = twin.spec
    df = twin.rollout(RandomPolicy(spec, 0), episodes=2, seed=1)
    assert list(df.columns) == ordered_columns(spec, ["reward"])
    assert df.groupby("episode")["t"].max().eq(twin.layout.horizon - 1).all()
    assert df[spec.names("action")].apply(lambda c: c.between(0, 1)).all().all()
    assert set(df["action.boost"]) <= {0.0, 1.0}
    assert (df["response.wait"] >= 0).all() and df.notna().all().all()
    # the reward is the spec's reward over the step's columns
    assert np.allclose(df["reward"], -df["response.wait"] - 2 * df["kpi.drop"])
    sup = df.attrs["support"]
    assert 0.0 <= sup["out_of_support"] <= 1.0 and sup["disagreement"] > 0.0


def test_rollout_summary_carries_a_90_percent_interval(twin: Twin) -> None:
    df = twin.rollout(RandomPolicy(twin.spec, 0), episodes=3, seed=4, n_agents=20, steps=6, all_members=True)
    summ = df.attrs["summary"]
    assert set(summ) == {"reward", "response.wait", "kpi.drop"}
    r = summ["reward"]
    assert r["mean"] == pytest.approx(df["reward"].mean())  # every run has the same agent-steps
    assert r["low"] < r["mean"] < r["high"] and r["level"] == 0.9 and not r["calibrated"]
    # a calibration widens it by the twin's measured relative error, on each side
    cal = Calibration(quantile={"reward": 0.5})
    wide = twin.rollout(RandomPolicy(twin.spec, 0), episodes=3, seed=4, n_agents=20, steps=6, all_members=True,
                        calibration=cal)
    w = wide.attrs["summary"]["reward"]
    assert w["calibrated"] and w["low"] == pytest.approx(r["low"] - 0.5 * abs(r["mean"]))
    assert w["high"] == pytest.approx(r["high"] + 0.5 * abs(r["mean"]))


def test_rollout_same_seed_same_table(twin: Twin) -> None:
    pol = RandomPolicy(twin.spec, 0)
    a = twin.rollout(pol, episodes=1, seed=5, n_agents=30, steps=4)
    b = twin.rollout(RandomPolicy(twin.spec, 0), episodes=1, seed=5, n_agents=30, steps=4)
    c = twin.rollout(RandomPolicy(twin.spec, 0), episodes=1, seed=6, n_agents=30, steps=4)
    pd.testing.assert_frame_equal(a, b)
    assert len(a) == 30 * 4 and not a.equals(c)


def test_twin_learned_the_response_to_actions(twin: Twin) -> None:
    """More capacity share -> shorter wait, in the real toy system and in the twin."""
    full = FunctionPolicy(lambda o: np.stack([np.ones(len(o)), np.ones(len(o))], 1))
    none = FunctionPolicy(lambda o: np.stack([np.full(len(o), 0.05), np.zeros(len(o))], 1))
    real_full = toy_log(episodes=4, seed=9, policy=full)["response.wait"].mean()
    real_none = toy_log(episodes=4, seed=9, policy=none)["response.wait"].mean()
    twin_full = twin.rollout(full, episodes=4, seed=2, stochastic=False)["response.wait"].mean()
    twin_none = twin.rollout(none, episodes=4, seed=2, stochastic=False)["response.wait"].mean()
    assert real_full < real_none and twin_full < twin_none


def test_out_of_support_grows_off_the_logs(twin: Twin) -> None:
    spec = twin.spec
    logged = twin.rollout(RandomPolicy(spec, 0), episodes=2, seed=3, stochastic=False)
    # the logs never hold an action pinned at one corner for everyone
    corner = FunctionPolicy(lambda o: np.stack([np.zeros(len(o)), np.ones(len(o))], 1))
    off = twin.rollout(corner, episodes=2, seed=3, stochastic=False)
    assert off.attrs["support"]["median_distance"] > logged.attrs["support"]["median_distance"]


def test_rollout_over_all_members_averages_the_ensemble(twin: Twin) -> None:
    pol = RandomPolicy(twin.spec, 0)
    df = twin.rollout(pol, episodes=2, seed=7, all_members=True, n_agents=10, steps=4)
    assert df["episode"].nunique() == 2 * twin.n_members
    assert sorted(df["episode"].unique())[:2] == ["twin-7-0-m0", "twin-7-0-m1"]
    # a run is that member's own rollout from the episode's population seed (the first run sees
    # the policy fresh; the policy's generator then moves on)
    m0 = df[df["episode"] == "twin-7-0-m0"].reset_index(drop=True)
    sim = twin.simulation(n_agents=10, seed=int(np.random.default_rng([7, 0]).integers(2**31)), member=0)
    alone = sim.run(RandomPolicy(twin.spec, 0), steps=4, episode="twin-7-0-m0").frame
    pd.testing.assert_frame_equal(m0[alone.columns], alone)
    # the members share the population but not the responses
    m1 = df[df["episode"] == "twin-7-0-m1"].reset_index(drop=True)
    assert np.allclose(m0[twin.layout.profile], m1[twin.layout.profile])
    assert not np.allclose(m0["response.wait"], m1["response.wait"])


def test_logging_policy_picks_each_rows_scenario_engine(twin: Twin) -> None:
    from edgetwin.imitation.mail import GaussianModel

    lay = twin.layout
    pol = twin.logging_policy(stochastic=False)
    sim = twin.simulation(n_agents=40, seed=1)
    obs = sim.obs()
    act = pol.act(obs)
    x = np.concatenate(
        [lay.scalers["profile"].transform(obs[:, : len(lay.profile)]), lay.scalers["state"].transform(obs[:, len(lay.profile) :])],
        axis=1,
    )
    guessed = pol.scenario_of.predict(x[:, : len(lay.profile)])
    assert (guessed == sim.world.scenario).mean() > 0.8  # the toy's scenarios differ in demand
    for s in (0, 1):
        rows = guessed == s
        want = lay.scalers["action"].inverse(GaussianModel(twin.members[0].engines[s]).mean(x[rows]))
        assert np.allclose(act[rows], want)


# ------------------------------------------------------------------------------------ persistence
def test_save_load_round_trip(twin: Twin, tmp_path: Path) -> None:
    twin.save(tmp_path / "tw")
    back = Twin.load(tmp_path / "tw")
    assert back.meta["data_sha256"] == twin.meta["data_sha256"] and len(back.meta["data_sha256"]) == 64
    assert "torch" in back.meta["versions"] and back.spec.hash() == twin.spec.hash()
    pol = RandomPolicy(twin.spec, 0)
    a = twin.rollout(pol, episodes=1, seed=4)
    b = back.rollout(RandomPolicy(twin.spec, 0), episodes=1, seed=4)
    pd.testing.assert_frame_equal(a, b)
    pd.testing.assert_frame_equal(twin.sample_population(7, "a", seed=2), back.sample_population(7, "a", seed=2))


def test_site_transition_twin_round_trips(tmp_path: Path) -> None:
    tw = Twin.fit(
        toy_log(episodes=4), toy_spec(), members=1, seed=0, progress=False, population_model="empirical",
        transition_model="site", **{**TINY, "rounds": 0},
    )
    assert tw.members[0].transition is not None and tw.meta["transition_model"] == "site"
    back = Twin.load(tw.save(tmp_path / "tw"))
    assert back.members[0].transition is not None
    pol = RandomPolicy(tw.spec, 0)
    pd.testing.assert_frame_equal(tw.rollout(pol, seed=2), back.rollout(RandomPolicy(tw.spec, 0), seed=2))


def test_load_rejects_a_non_twin(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a twin"):
        Twin.load(tmp_path)


def test_fit_rejects_bad_options() -> None:
    df, spec = toy_log(episodes=2), toy_spec()
    with pytest.raises(InputError, match="members"):
        Twin.fit(df, spec, members=0, progress=False)
    with pytest.raises(InputError, match="unknown hyper"):
        Twin.fit(df, spec, members=1, progress=False, warp_speed=9)
    with pytest.raises(InputError, match="response model"):
        Twin.fit(df, spec, members=1, progress=False, response_model="oracle")
    with pytest.raises(InputError, match="transition model"):
        Twin.fit(df, spec, members=1, progress=False, transition_model="oracle")


def test_checkpoints_resume_finished_members(tmp_path: Path) -> None:
    df, spec = toy_log(episodes=4), toy_spec()
    kw = dict(members=2, seed=1, progress=False, population_model="empirical", checkpoint_dir=tmp_path, **TINY)
    kw["rounds"] = 0
    first = Twin.fit(df, spec, **kw)
    (tmp_path / "member_1" / "DONE").unlink()  # as if interrupted during member 1
    stamp = (tmp_path / "member_0" / "engine_0.safetensors").stat().st_mtime_ns
    again = Twin.fit(df, spec, **kw)
    assert (tmp_path / "member_0" / "engine_0.safetensors").stat().st_mtime_ns == stamp  # reused, not refitted
    pol = RandomPolicy(spec, 0)
    pd.testing.assert_frame_equal(first.rollout(pol, seed=1), again.rollout(RandomPolicy(spec, 0), seed=1))
    with pytest.raises(InputError, match="different fit"):
        Twin.fit(df, spec, **{**kw, "seed": 2})


# ------------------------------------------------------------------------------------ envs
def test_gym_env_passes_check_env(twin: Twin) -> None:
    env = twin.make_env(n_agents=5, steps=3)
    check_env(env)
    obs, info = env.reset(seed=0)
    n = info["n_agents"]
    steps = 0
    truncated = False
    while not truncated:
        obs, r, term, truncated, info = env.step(env.action_space.sample())
        steps += 1
    assert steps == n * 3


def test_per_agent_env_matches_the_batched_env(twin: Twin) -> None:
    """Causal per agent: acting one agent at a time gives the batched VecEnv's rewards."""
    venv = twin.make_vec_env(n_agents=12, steps=3, stochastic=False, seed=0)
    venv.reset()
    env = twin.make_env(n_agents=12, steps=3, stochastic=False)
    env.reset(seed=0)
    # put the single-agent env in the same world (same agents, states and ensemble member)
    sim = copy.copy(venv.sim)
    sim.world = copy.deepcopy(venv.sim.world)
    sim._pending_y, sim._pending_a = sim._pending_y.copy(), sim._pending_a.copy()
    env.sim, env._obs = sim, sim.obs()
    rng = np.random.default_rng(0)
    for _ in range(3):
        acts = rng.uniform(0, 1, (12, 2)).astype(np.float32)
        _, rv, _, _ = venv.step(acts)
        rs = [env.step(acts[i])[1] for i in range(12)]
        assert np.allclose(rv, rs, atol=1e-4)


def test_vec_env_trains_ppo_and_penalty_lowers_reward(twin: Twin) -> None:
    venv = twin.make_vec_env(n_agents=40, steps=6, seed=0)
    model = PPO("MlpPolicy", venv, n_steps=6, batch_size=80, n_epochs=1, device="cpu", seed=0)
    model.learn(480)
    pen = twin.make_vec_env(n_agents=40, steps=6, seed=0, disagreement_penalty=5.0, stochastic=False)
    raw = twin.make_vec_env(n_agents=40, steps=6, seed=0, stochastic=False)
    pen.reset(), raw.reset()
    a = np.full((40, 2), 0.5, np.float32)
    assert (pen.step(a)[1] < raw.step(a)[1]).all()


def test_parallel_env_passes_the_api_test(twin: Twin) -> None:
    penv = twin.make_parallel_env(n_agents=20, steps=5)
    parallel_api_test(penv, num_cycles=20)
    obs, _ = penv.reset(seed=1)
    assert set(obs) == set(penv.possible_agents) <= {"a", "b"}
    assert sum(o.shape[0] for o in obs.values()) == 20


# ------------------------------------------------------------------------------------ any system
def second_transition(state: np.ndarray, action: np.ndarray, response: np.ndarray) -> np.ndarray:
    """Known dynamics of the second toy system (named in its spec)."""
    return np.stack([np.clip(0.7 * state[:, 0] + response[:, 0], 0, 20), state[:, 1] * 0.5 + action[:, 0], state[:, 2]], 1)


def second_system(episodes: int = 6, seed: int = 0) -> tuple[pd.DataFrame, TwinSpec]:
    """Differently shaped: 1 profile, 3 states, 2 actions (one discrete), 1 response, 1 scenario."""
    feats = (
        Feature("profile.size", "continuous", 0.0, 10.0),
        Feature("state.backlog", "continuous", 0.0, 20.0),
        Feature("state.heat", "continuous", None, None),
        Feature("state.zone", "discrete", values=(0.0, 1.0)),
        Feature("action.speed", "continuous", 0.0, 2.0),
        Feature("action.mode", "discrete", values=(0.0, 1.0, 2.0)),
        Feature("response.jobs", "continuous", 0.0, None),
    )
    spec = TwinSpec(feats, name="second", transition="test_twin:second_transition", reward_weights={"response.jobs": 1.0})
    rng = np.random.default_rng(seed)
    rows = []
    for e in range(episodes):
        n = 5
        size = rng.uniform(1, 9, n)
        st = np.stack([rng.uniform(0, 5, n), rng.normal(0, 1, n), rng.integers(0, 2, n).astype(float)], 1)
        for t in range(8):
            a = np.stack([rng.uniform(0, 2, n), rng.integers(0, 3, n).astype(float)], 1)
            jobs = np.maximum(0, size * 0.3 + a[:, 0] - 0.2 * st[:, 0] + rng.normal(0, 0.1, n))
            for i in range(n):
                rows.append({"episode": e, "t": t, "agent": f"x{i}", "scenario": "only", "site": "dc",
                             "profile.size": size[i], "state.backlog": st[i, 0], "state.heat": st[i, 1],
                             "state.zone": st[i, 2], "action.speed": a[i, 0], "action.mode": a[i, 1],
                             "response.jobs": jobs[i]})
            st = second_transition(st, a, jobs[:, None])
    return pd.DataFrame(rows), spec


def test_twin_fits_a_differently_shaped_system() -> None:
    df, spec = second_system()
    tw = Twin.fit(df, spec, members=1, seed=0, progress=False, population_model="empirical", **TINY)
    assert not tw.layout.learn_transition and tw.layout.n_model_outputs == 1
    out = tw.rollout(RandomPolicy(spec, 1), episodes=1, seed=0, n_agents=7, steps=5)
    assert list(out.columns) == ordered_columns(spec, ["reward"])
    assert set(out["action.mode"]) <= {0.0, 1.0, 2.0} and set(out["state.zone"]) <= {0.0, 1.0}
    # the known transition was used: next backlog = clip(0.7 backlog + jobs)
    g = out[out["agent"] == "agent0"].sort_values("t")
    expect = np.clip(0.7 * g["state.backlog"].to_numpy()[:-1] + g["response.jobs"].to_numpy()[:-1], 0, 20)
    assert np.allclose(g["state.backlog"].to_numpy()[1:], expect)
    check_env(tw.make_env(steps=2))


# ------------------------------------------------------------------------------------ fidelity + CLI
def test_growth_exponent_recovers_a_power_law() -> None:
    from edgetwin.twin.fidelity import growth_exponent

    h = np.arange(1, 50)
    assert abs(growth_exponent(h, 0.1 * h**0.7) - 0.7) < 1e-6
    assert np.isnan(growth_exponent(h[:2], h[:2]))


@pytest.mark.slow  # the default run's 10-minute budget; the fidelity report stays in the default run: test_cli_fit_and_fidelity
def test_fidelity_report_and_two_way_validation(twin: Twin, tmp_path: Path) -> None:
    from edgetwin.twin.fidelity import fidelity_report, replay_errors, two_way_validation

    held = toy_log(episodes=3, seed=11)
    rep = fidelity_report(twin, held, episodes=2, max_horizon=20, out_dir=tmp_path)
    assert set(rep["kl"]) == {"response.wait", "kpi.drop", "reward"}
    assert all(v >= 0 for v in rep["kl"].values())
    assert len(rep["time_slices"]["response.wait"]["real"]) == 12
    assert [r["h"] for r in rep["replay"]] == list(range(1, 13))  # episodes are 12 steps long
    assert {Path(p).name for p in rep["figures"]} == {
        "fidelity_kl.png", "fidelity_time_slices.png", "fidelity_compounding.png"}
    # a twin that ignores its inputs does worse at one step than the fitted one
    errs = replay_errors(twin, held, max_horizon=1)
    assert errs["outputs"].iloc[0] < 0.8  # standardised units: well below the spread of the data
    two = two_way_validation(toy_log(episodes=6, seed=12), toy_spec(), episodes=1, max_horizon=5,
                             members=1, progress=False, population_model="empirical", **{**TINY, "rounds": 0})
    assert len(two["folds"]) == 2 and np.isfinite(two["mean_kl"])


def test_cli_fit_and_fidelity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from edgetwin.cli import main

    log = tmp_path / "toy.csv"
    toy_log(episodes=4).to_csv(log, index=False)
    toy_spec().save(tmp_path / "toy.spec.toml")
    with pytest.raises(SystemExit) as ex:
        main(["fit", str(log), "--out", str(tmp_path / "tw"), "--members", "1", "--rounds", "0", "--bc-epochs", "3",
              "--population-model", "empirical", "--json"])
    assert ex.value.code == 0
    assert json.loads(capsys.readouterr().out)["members"] == 1
    assert (tmp_path / "tw" / "checkpoint" / "member_0" / "DONE").is_file()
    assert not list((tmp_path / "tw").rglob("site_model.safetensors"))  # opt-in only
    with pytest.raises(SystemExit) as ex:
        main(["fit", str(log), "--out", str(tmp_path / "tw-site"), "--members", "1", "--rounds", "0",
              "--bc-epochs", "3", "--population-model", "empirical", "--json", "--site-model"])
    assert ex.value.code == 0
    capsys.readouterr()
    assert list((tmp_path / "tw-site").rglob("site_model.safetensors"))
    held = tmp_path / "held.csv"
    toy_log(episodes=2, seed=3).to_csv(held, index=False)
    with pytest.raises(SystemExit) as ex:
        main(["fidelity", str(tmp_path / "tw"), str(held), "--spec", str(tmp_path / "toy.spec.toml"),
              "--json", "--episodes", "1", "--horizon", "5", "--out", str(tmp_path / "fid")])
    assert ex.value.code == 0
    rep = json.loads(capsys.readouterr().out)
    assert "response.wait" in rep["kl"] and (tmp_path / "fid" / "fidelity_kl.png").is_file()
    with pytest.raises(SystemExit) as ex:
        main(["fit", str(log), "--out", str(tmp_path / "tw2"), "--members", "0"])
    assert ex.value.code == 2
    with pytest.raises(SystemExit) as ex:  # not a site-level column of this log
        main(["fit", str(log), "--out", str(tmp_path / "tw3"), "--members", "1", "--site-columns", "state.nope"])
    assert ex.value.code == 2
    assert "state.nope" in capsys.readouterr().err
    with pytest.raises(SystemExit) as ex:
        main(["fidelity", str(tmp_path / "nope"), str(held)])
    assert ex.value.code == 2


def test_twin_with_a_generative_population_round_trips(tmp_path: Path) -> None:
    df, spec = toy_log(episodes=4), toy_spec()
    tw = Twin.fit(df, spec, members=1, seed=0, progress=False, population_model="gmm",
                  population_hyper={"n_components": 2}, **{**TINY, "rounds": 0})
    pop = tw.sample_population(50, scenario="b", seed=1)
    assert (pop["scenario"] == "b").all() and set(pop["profile.tier"]) <= {0.0, 1.0, 2.0}
    with pytest.raises(InputError, match="unknown scenario"):
        tw.sample_population(5, scenario="zzz")
    back = Twin.load(tw.save(tmp_path / "tw"))
    pd.testing.assert_frame_equal(back.sample_population(50, scenario="b", seed=1), pop)
    pd.testing.assert_frame_equal(back.rollout(RandomPolicy(spec, 0), seed=2), tw.rollout(RandomPolicy(spec, 0), seed=2))


# ------------------------------------------------------------------------------------ site-level state
def three_site_log(
    episodes: int,
    seed: int,
    site_column: str,
    tick: Callable[[np.random.Generator, np.ndarray, float], tuple[dict[str, np.ndarray], float]],
) -> pd.DataFrame:
    """A log of 3 sites x 12 agents (one scenario, a ``profile.load`` each) x 24 ticks per episode,
    with one site-level state column starting at 0: ``tick(rng, load, site value)`` returns the
    tick's per-agent action and response columns and the site column's next value."""
    rng = np.random.default_rng(seed)
    frames = []
    for e in range(episodes):
        for k in range(3):
            load = rng.uniform(0.5, 3.0, 12)
            value = 0.0
            for t in range(24):
                columns, nxt = tick(rng, load, value)
                frames.append(pd.DataFrame({
                    "episode": e, "t": t, "agent": [f"a{k}-{i}" for i in range(12)], "scenario": "only",
                    "site": f"s{k}", "profile.load": load, site_column: value, **columns,
                }))
                value = nxt
    return pd.concat(frames, ignore_index=True)


def pooled_system(episodes: int = 8, seed: int = 0) -> tuple[pd.DataFrame, TwinSpec]:
    """A site property that follows the whole site's action: the pool an agent's site reserved at
    t-1 is the site mean of ``reserve x load``; each agent's served work falls as the pool
    overcommits. Logged under uniformly random reservations, so a site's mean reservation barely
    varies (the case where a model of single agents cannot learn how the pool follows it)."""
    feats = (
        Feature("profile.load", "continuous", 0.5, 3.0),
        Feature("state.pool", "continuous", 0.0, 10.0),
        Feature("action.reserve", "continuous", 0.0, 2.0),
        Feature("response.served", "continuous", 0.0, None),
    )
    spec = TwinSpec(feats, name="pooled", reward_weights={"response.served": 1.0})

    def tick(rng: np.random.Generator, load: np.ndarray, pool: float) -> tuple[dict[str, np.ndarray], float]:
        a = rng.uniform(0.0, 2.0, len(load))
        served = load * np.minimum(1.0, a / max(1.0, pool)) + rng.normal(0, 0.05, len(load))
        return {"action.reserve": a, "response.served": np.maximum(0.0, served)}, float(
            np.mean(a * load) + rng.normal(0, 0.02)
        )

    return three_site_log(episodes, seed, "state.pool", tick), spec


@pytest.mark.slow  # the default run's 10-minute budget; the site-state model stays in the default run: test_site_state_follows_a_product_of_action_and_response
def test_site_state_follows_the_whole_sites_action() -> None:
    df, spec = pooled_system()
    tw = Twin.fit(df, spec, members=1, seed=0, progress=False, population_model="empirical",
                  response_model="bc", bc_epochs=30, site_model=True)
    assert tw.layout.site_state == [True] and tw.members[0].site_model is not None
    pools = {}
    for c in (0.3, 1.7):
        pol = FunctionPolicy(lambda o, c=c: np.full((len(o), 1), c), name=f"reserve {c}")
        out = tw.rollout(pol, episodes=2, seed=0, n_agents=24, steps=12, stochastic=False)
        pools[c] = out.loc[out["t"] >= 2, "state.pool"].mean()
    truth = {c: c * 1.75 for c in pools}  # reserve x mean load
    # the logged site means of `reserve` stay near 1; the twin must carry the shift into the pool
    assert pools[1.7] - pools[0.3] > 0.6 * (truth[1.7] - truth[0.3])
    # and it survives save/load
    assert pickle_roundtrip_pool(tw, 1.7) == pytest.approx(pools[1.7])


@pytest.mark.slow  # the default run's 10-minute budget; the site model stays in the default run: test_site_state_follows_a_product_of_action_and_response
def test_site_model_columns_are_chosen_by_name_and_checked() -> None:
    df, spec = pooled_system(episodes=3)
    with pytest.raises(InputError, match=r"state\.nope.*not site-level"):
        Twin.fit(df, spec, members=1, seed=0, progress=False, population_model="empirical",
                 response_model="bc", bc_epochs=1, site_model=["state.nope"])
    tw = Twin.fit(df, spec, members=1, seed=0, progress=False, population_model="empirical",
                  response_model="bc", bc_epochs=1, site_model=["state.pool"])
    model = tw.members[0].site_model
    assert model is not None and [tw.layout.state[c] for c in model.columns] == ["state.pool"]
    assert model.val_r2.shape == (1,) and model.val_r2[0] > 0.5  # the pool is a clean function of the tick


def offload_system(episodes: int = 8, seed: int = 0) -> tuple[pd.DataFrame, TwinSpec]:
    """A site load that is a *product* of what the platform did and how the agent responded: the
    edge load at t is the site mean of ``load x offload x share`` at t-1, where ``share`` (the
    platform's action) sends offloaded work to the edge and ``offload`` (the agent's response)
    falls with the ``price`` it is asked. Logged under site-wide regimes (each site's actions are
    drawn around a centre redrawn every tick), so the site means span their range."""
    feats = (
        Feature("profile.load", "continuous", 0.5, 3.0),
        Feature("state.edge_load", "continuous", 0.0, 10.0),
        Feature("action.share", "continuous", 0.0, 1.0),
        Feature("action.price", "continuous", 0.0, 1.0),
        Feature("response.offload", "continuous", 0.0, 1.0),
    )
    spec = TwinSpec(feats, name="offload", reward_weights={"response.offload": 1.0})

    def tick(rng: np.random.Generator, load: np.ndarray, edge: float) -> tuple[dict[str, np.ndarray], float]:
        n = len(load)
        share = np.clip(rng.uniform(0, 1) + rng.uniform(-0.2, 0.2, n), 0, 1)
        price = np.clip(rng.uniform(0, 1) + rng.uniform(-0.2, 0.2, n), 0, 1)
        offload = np.clip(1.0 - price + rng.normal(0, 0.03, n), 0, 1)
        nxt = max(0.0, float(np.mean(load * offload * share)) + rng.normal(0, 0.02))
        return {"action.share": share, "action.price": price, "response.offload": offload}, nxt

    return three_site_log(episodes, seed, "state.edge_load", tick), spec


def test_site_state_follows_a_product_of_action_and_response() -> None:
    """A site model linear in each agent's action and response puts a quarter of the mean load on
    the edge for both "all to the edge, nothing offloaded" and "none to the edge, all offloaded";
    the truth is zero for both."""
    df, spec = offload_system()
    # 15 BC epochs: the edge loads below are within 0.07 of their truths as at 40 (tolerance 0.26)
    tw = Twin.fit(df, spec, members=1, seed=0, progress=False, population_model="empirical",
                  response_model="bc", bc_epochs=15, site_model=True)
    model = tw.members[0].site_model
    assert model is not None and model.val_r2[0] > 0.9
    mean_load = 1.75
    for share, price, truth in ((1.0, 0.0, mean_load), (1.0, 1.0, 0.0), (0.0, 0.0, 0.0), (0.5, 0.5, mean_load / 4)):
        pol = FunctionPolicy(lambda o, a=(share, price): np.tile(a, (len(o), 1)), name=f"{share}/{price}")
        out = tw.rollout(pol, episodes=2, seed=0, n_agents=24, steps=12, stochastic=False)
        edge = out.loc[out["t"] >= 2, "state.edge_load"].mean()
        assert edge == pytest.approx(truth, abs=0.15 * mean_load), (share, price)


def pickle_roundtrip_pool(tw: Twin, c: float) -> float:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        back = Twin.load(tw.save(Path(d) / "t"))
        assert back.members[0].site_model is not None
        pol = FunctionPolicy(lambda o: np.full((len(o), 1), c), name="r")
        out = back.rollout(pol, episodes=2, seed=0, n_agents=24, steps=12, stochastic=False)
        return float(out.loc[out["t"] >= 2, "state.pool"].mean())


class _HalfFar:
    """A population model that puts every other agent far outside the logged profiles."""

    def __init__(self, base: object, columns: list[str]) -> None:
        self.base, self.columns = base, columns

    def sample(self, n: int, scenario: str | None = None, seed: int = 0) -> pd.DataFrame:
        out = self.base.sample(n, scenario=scenario, seed=seed).copy()  # type: ignore[attr-defined]
        far = np.random.default_rng(seed).random(n) < 0.5
        out.loc[far, self.columns] = out.loc[far, self.columns].to_numpy() * 50.0 + 100.0
        return out


def test_out_of_support_profiles_are_redrawn_and_reported(twin: Twin) -> None:
    tw = copy.copy(twin)
    tw.population = _HalfFar(twin.population, twin.layout.profile)
    pol = RandomPolicy(twin.spec, 0)
    tw.profile_retries = 0
    kept = tw.rollout(pol, episodes=2, seed=0, n_agents=40, steps=3)
    assert kept.attrs["support"]["profile_redrawn"] == 0.0
    tw.profile_retries = 8
    redrawn = tw.rollout(pol, episodes=2, seed=0, n_agents=40, steps=3)
    share = redrawn.attrs["support"]["profile_redrawn"]
    assert 0.3 < share < 0.7  # about half were drawn far away
    assert redrawn.attrs["support"]["profile_outside"] < 0.05  # 8 redraws at 1/2 leave ~0.4 %
    assert redrawn.attrs["support"]["out_of_support"] < kept.attrs["support"]["out_of_support"]
    assert twin.profile_retries == 4  # the default


def test_logged_rollout_replays_the_logs_own_population(twin: Twin) -> None:
    """`logged_rollout` runs a policy on a log's agents, sites, profiles and first states."""
    from edgetwin.twin.fidelity import logged_rollout

    lay = twin.layout
    held = toy_log(episodes=2, seed=11)
    held["t"] += 3  # episodes need not start at t = 0
    half = FunctionPolicy(lambda o: np.stack([np.full(len(o), 0.5), np.zeros(len(o))], 1))
    df = logged_rollout(twin, half, held, seed=4)
    assert list(df.columns) == ordered_columns(twin.spec, ["reward"])
    assert sorted(df["episode"].unique()) == ["e0", "e1"] and df["t"].min() == 3
    assert len(df) == len(held) and df.attrs["support"]["profile_redrawn"] == 0.0
    key = ["episode", "t", "agent"]
    a, b = df.sort_values(key).reset_index(drop=True), held.sort_values(key).reset_index(drop=True)
    assert (a[["agent", "scenario", "site"]].to_numpy() == b[["agent", "scenario", "site"]].to_numpy()).all()
    assert np.allclose(a[lay.profile], b[lay.profile])
    first = a["t"] == 3
    assert np.allclose(a.loc[first, lay.state], b.loc[first, lay.state])
    assert not np.allclose(a.loc[~first, "state.queue"], b.loc[~first, "state.queue"])  # the twin's own states
    pd.testing.assert_frame_equal(df, logged_rollout(twin, half, held, seed=4))
    assert not df.equals(logged_rollout(twin, half, held, seed=5))
    assert logged_rollout(twin, half, held, seed=4, all_members=True)["episode"].nunique() == 2 * twin.n_members
    # the replayed population matters: the same agents with 3x the demand wait longer in the twin
    heavy = held.assign(**{"profile.demand": held["profile.demand"] * 3})
    wait = logged_rollout(twin, half, held, seed=4, stochastic=False)["response.wait"].mean()
    heavy_wait = logged_rollout(twin, half, heavy, seed=4, stochastic=False)["response.wait"].mean()
    assert heavy_wait > 1.2 * wait
    with pytest.raises(InputError, match="scenario"):
        logged_rollout(twin, half, held.assign(scenario="zzz"), seed=4)


def test_one_step_outputs_are_teacher_forced(twin: Twin) -> None:
    """Each tick's prediction sees that tick's logged state and nothing the twin predicted before."""
    from edgetwin.twin.fidelity import one_step_outputs

    held = toy_log(episodes=2, seed=12)
    df = one_step_outputs(twin, held, seed=1, stochastic=False)
    assert list(df.columns) == ordered_columns(twin.spec, ["reward"]) and len(df) == len(held)
    key = ["episode", "t", "agent"]
    a, b = df.sort_values(key).reset_index(drop=True), held.sort_values(key).reset_index(drop=True)
    cols = twin.layout.profile + twin.layout.state + twin.layout.action
    assert np.allclose(a[cols], b[cols])
    assert np.allclose(a["reward"], -a["response.wait"] - 2 * a["kpi.drop"])
    # a different logged state at t = 5 changes the predictions of t = 5 only
    moved = held.copy()
    moved.loc[moved["t"] == 5, "state.queue"] += 20.0
    c = one_step_outputs(twin, moved, seed=1, stochastic=False).sort_values(key).reset_index(drop=True)
    at = a["t"].to_numpy()
    assert not np.allclose(a.loc[at == 5, "response.wait"], c.loc[at == 5, "response.wait"])
    assert np.allclose(a.loc[at != 5, "response.wait"], c.loc[at != 5, "response.wait"])
    # sampled responses scatter around the mean ones, seeded
    s1 = one_step_outputs(twin, held, seed=1)
    pd.testing.assert_frame_equal(s1, one_step_outputs(twin, held, seed=1))
    assert not np.allclose(s1["response.wait"], df["response.wait"])
