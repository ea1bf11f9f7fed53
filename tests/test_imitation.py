"""MAIL-MMSG and its baselines on a small toy system written here (not the emulated cluster).

The toy system (`toy_log`) is an edge site where service groups with a demand and a tier share
capacity: the platform chooses a share of capacity and a boost per group, a group's wait grows
with its queue and with the site's load. Its column names and counts differ from the cluster's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import Feature, TwinSpec
from edgetwin.imitation.baselines import ClonedPlatformPolicy, SupervisedResponseModel
from edgetwin.imitation.layout import ColumnScaler, Layout
from edgetwin.imitation.mail import (
    ClientVecEnv,
    GaussianModel,
    MailConfig,
    behaviour_clone,
    fit_engines,
    fit_mail,
    fit_transition,
    gaussian_policy,
)
from edgetwin.imitation.steps import build_steps
from edgetwin.imitation.world import Composition, InitialStates, World

torch.set_num_threads(1)


def toy_spec() -> TwinSpec:
    feats = (
        Feature("profile.demand", "heavy_tailed", 0.0, None),
        Feature("profile.tier", "discrete", values=(0.0, 1.0, 2.0)),
        Feature("state.queue", "continuous", 0.0, 50.0),
        Feature("state.credit", "continuous", 0.0, 1.0),
        Feature("state.phase", "continuous", -1.0, 1.0),
        Feature("action.share", "continuous", 0.0, 1.0),
        Feature("action.boost", "binary"),
        Feature("response.wait", "continuous", 0.0, None),
        Feature("kpi.drop", "continuous", 0.0, None),
    )
    return TwinSpec(feats, name="toy", step_seconds=3600.0, reward_weights={"response.wait": -1.0, "kpi.drop": -2.0})


def toy_log(episodes: int = 6, agents: int = 8, steps: int = 12, seed: int = 0, policy=None) -> pd.DataFrame:
    """Log of the toy system under ``policy`` (default: uniform random actions)."""
    rng = np.random.default_rng(seed)
    rows: list[dict] = []
    for e in range(episodes):
        scen = rng.choice(["a", "b"], size=agents)
        demand = np.where(scen == "a", rng.lognormal(0, 0.5, agents), rng.lognormal(1, 0.3, agents))
        tier = rng.integers(0, 3, agents).astype(float)
        q, c = rng.uniform(0, 5, agents), rng.uniform(0, 1, agents)
        for t in range(steps):
            ph = np.sin(2 * np.pi * t / 24)
            obs = np.stack([demand, tier, q, c, np.full(agents, ph)], 1)
            if policy is None:
                a = np.stack([rng.uniform(0, 1, agents), rng.integers(0, 2, agents)], 1).astype(float)
            else:
                a = np.asarray(policy.act(obs), dtype=float)
            load = (a[:, 0] * demand).mean()
            served = a[:, 0] * (1 + tier) * (1 + a[:, 1]) * 2.0 / (1 + load)
            wait = np.maximum(0, q + demand - served) * (1 + 0.5 * load) + rng.normal(0, 0.1, agents).clip(0)
            drop = np.maximum(0, q + demand - served - 10)
            for i in range(agents):
                rows.append(
                    {
                        "episode": f"e{e}", "t": t, "agent": f"g{i}", "scenario": scen[i], "site": f"s{e % 2}",
                        "profile.demand": demand[i], "profile.tier": tier[i], "state.queue": q[i],
                        "state.credit": c[i], "state.phase": ph, "action.share": a[i, 0], "action.boost": a[i, 1],
                        "response.wait": wait[i], "kpi.drop": drop[i], "reward": -wait[i] - 2 * drop[i],
                    }
                )
            q = np.clip(q + demand - served, 0, 50)
            c = np.clip(0.9 * c + 0.1 * a[:, 1], 0, 1)
    return pd.DataFrame(rows)


def profile_sampler(df: pd.DataFrame, layout: Layout):
    pools = {s: df[df["scenario"] == s][layout.profile].to_numpy() for s in layout.scenarios}

    def sample(n: int, scenario: str, seed: int) -> np.ndarray:
        p = pools[scenario]
        return p[np.random.default_rng(seed).integers(len(p), size=n)]

    return sample


@pytest.fixture(scope="module")
def toy() -> tuple[pd.DataFrame, TwinSpec, Layout]:
    df, spec = toy_log(), toy_spec()
    return df, spec, Layout.fit(df, spec)


# ------------------------------------------------------------------------------------ harness
def test_scaler_round_trips_and_legalises() -> None:
    spec = toy_spec()
    df = toy_log(episodes=2)
    cols = ["profile.demand", "profile.tier"]
    sc = ColumnScaler.fit(df[cols], [spec.feature(c) for c in cols])
    assert sc.log.tolist() == [True, False]  # heavy-tailed and non-negative -> log1p
    raw = df[cols].to_numpy()
    assert np.allclose(sc.inverse(sc.transform(raw)), raw, atol=1e-4)
    z = np.array([[-50.0, 0.4], [0.0, 9.0]], dtype=np.float32)
    back = sc.inverse(z)
    assert back[0, 0] >= 0.0  # clipped to the bound
    assert set(back[:, 1]) <= {0.0, 1.0, 2.0}  # snapped to allowed values


def test_layout_roles_and_widths(toy) -> None:
    df, spec, lay = toy
    assert lay.profile == ["profile.demand", "profile.tier"]
    assert lay.outputs == ["response.wait", "kpi.drop", "reward"]
    assert lay.learn_transition and lay.n_model_outputs == 3 + 3
    assert lay.scenarios == ["a", "b"] and lay.horizon == 12
    assert lay.n_client_inputs == 2 + 3 + 2 + 3 + (2 + 3) + 1 + 2 + 2  # + site means of z(profile)


def test_build_steps_site_aggregates_and_next_state(toy) -> None:
    df, spec, lay = toy
    st = build_steps(df, lay)
    f = st.frame
    zs = lay.scalers["state"].transform(f[lay.state].to_numpy())
    # site mean of z(state) at t, for a row of episode e1 at t=3
    i = int(np.flatnonzero((f["episode"] == "e1") & (f["t"] == 3))[0])
    same = np.flatnonzero((f["episode"] == "e1") & (f["t"] == 3) & (f["site"] == f["site"][i]))
    s0 = 2 + 3 + 2
    assert np.allclose(st.x_client[i, s0 : s0 + 3], zs[same].mean(axis=0), atol=1e-5)
    # lagged site mean of z(action) at t-1
    prev = np.flatnonzero((f["episode"] == "e1") & (f["t"] == 2) & (f["site"] == f["site"][i]))
    za = lay.scalers["action"].transform(f[lay.action].to_numpy())
    assert np.allclose(st.x_client[i, s0 + 3 : s0 + 5], za[prev].mean(axis=0), atol=1e-5)
    # t=0 rows see zero lags; the last step has no next row
    assert np.allclose(st.x_client[f["t"].to_numpy() == 0, s0 + 3 : s0 + 8], 0.0)
    # site mean of z(profile) at t, after the log site size
    zp = lay.scalers["profile"].transform(f[lay.profile].to_numpy())
    assert np.allclose(st.x_client[i, s0 + 9 : s0 + 11], zp[same].mean(axis=0), atol=1e-5)
    assert not st.has_next[f["t"].to_numpy() == 11].any() and st.has_next[f["t"].to_numpy() < 11].all()
    # Δstate target = z(next state) - z(state)
    j = int(np.flatnonzero(st.has_next)[5])
    assert np.allclose(st.y_client[j, 3:], zs[st.next_index[j]] - zs[j], atol=1e-5)


def test_build_steps_rejects_duplicate_rows(toy) -> None:
    df, spec, lay = toy
    with pytest.raises(InputError, match="duplicate"):
        build_steps(pd.concat([df, df.iloc[:1]]), lay)


def test_world_is_causal_per_agent(toy) -> None:
    df, spec, lay = toy
    rng = np.random.default_rng(0)
    comp = Composition.fit(df, lay)
    scen, site = comp.sample(rng, 20)
    assert len(scen) == 20
    prof = profile_sampler(df, lay)(20, "a", 1)
    init = InitialStates.fit(df, lay)
    w = World(lay, scen, site, prof, init.sample(lay, scen, prof, rng), np.zeros((site.max() + 1, lay.n_lag)))
    a = rng.uniform(0, 1, (20, 2))
    full = w.client_inputs(a)
    part = w.client_inputs(a[[3, 7]], rows=np.array([3, 7]))
    assert np.allclose(full[[3, 7]], part)  # an agent's inputs need no other agent's action


# ------------------------------------------------------------------------------------ learning
def test_behaviour_clone_learns_a_mapping() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 3)).astype(np.float32)
    y = np.stack([x[:, 0] * 0.8 - x[:, 1] * 0.5, np.tanh(x[:, 2])], 1).astype(np.float32)
    torch.manual_seed(0)
    pol = gaussian_policy(3, 2, [32, 32])
    before = float(((GaussianModel(pol).mean(x) - y) ** 2).mean())
    fit = behaviour_clone(x, y, pol, epochs=40, seed=0)
    assert fit["mse"] < 0.05 < before


def test_behaviour_clone_carries_adams_state_between_calls() -> None:
    """A federated site's short rounds (`FitOptions.keep_optimizer`): the second call resumes Adam
    (its step count and moments) instead of starting fresh, so it moves the weights differently."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 3)).astype(np.float32)
    y = np.stack([x[:, 0] - x[:, 1], np.tanh(x[:, 2])], 1).astype(np.float32)

    def two_rounds(state: dict | None) -> np.ndarray:  # type: ignore[type-arg]
        torch.manual_seed(0)
        pol = gaussian_policy(3, 2, [16, 16])
        for r in range(2):
            behaviour_clone(x, y, pol, epochs=1, seed=r, max_steps=5, optimizer_state=state)
        return torch.cat([p.detach().flatten() for p in pol.parameters()]).numpy()

    state: dict = {}  # type: ignore[type-arg]
    kept = two_rounds(state)
    steps = {float(v["step"]) for v in state["state"].values()}
    assert steps == {10.0}  # 2 rounds x 5 minibatches, every parameter the loss trains
    fresh = two_rounds(None)
    assert not np.allclose(kept, fresh)
    assert np.array_equal(kept, two_rounds({}))  # and deterministic


def test_behaviour_clone_ends_with_the_maximum_likelihood_noise_per_output() -> None:
    # a sampled twin must draw each output with the logged residual spread, not SB3's initial std 1:
    # on a log1p column a std several times too wide inflates the raw mean (log-normal bias)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 2)).astype(np.float32)
    noise_sd = np.array([0.05, 0.4])
    y = (np.stack([x[:, 0], -x[:, 1]], 1) + noise_sd * rng.normal(size=(2000, 2))).astype(np.float32)
    torch.manual_seed(0)
    pol = gaussian_policy(2, 2, [32, 32])
    fit = behaviour_clone(x, y, pol, epochs=30, seed=0)
    model = GaussianModel(pol)
    resid_rms = np.sqrt(((y - model.mean(x)) ** 2).mean(axis=0))
    np.testing.assert_allclose(model.std, resid_rms, rtol=1e-5)  # the closed-form optimum given the mean
    # one std per output, near the logged noise (the mean is not fitted exactly in 30 epochs)
    assert model.std[0] < 0.5 * model.std[1] and abs(model.std[1] - noise_sd[1]) < 0.1
    # the reported likelihood is that of the final (mean, std)
    nll = 0.5 * np.log(2 * np.pi * model.std**2).sum() + 0.5 * (((y - model.mean(x)) / model.std) ** 2).sum(1).mean()
    assert fit["neglogp"] == pytest.approx(nll, rel=1e-3)


def test_supervised_response_model_fits_and_samples(toy) -> None:
    df, spec, lay = toy
    st = build_steps(df, lay)
    rows = st.rows(need_next=True)
    m = SupervisedResponseModel(seed=0).fit(st.x_client[rows], st.y_client[rows])
    pred = m.mean(st.x_client[rows])
    r2 = 1 - ((pred[:, 0] - st.y_client[rows, 0]) ** 2).mean() / st.y_client[rows, 0].var()
    assert r2 > 0.7  # the wait is learnable from the inputs
    a = m.sample(st.x_client[rows[:5]], np.random.default_rng(0))
    b = m.sample(st.x_client[rows[:5]], np.random.default_rng(0))
    assert np.array_equal(a, b)


def test_cloned_platform_policy_recovers_the_logging_policy() -> None:
    class Logging:
        def act(self, obs: np.ndarray) -> np.ndarray:  # share follows demand, boost for tier 2
            return np.stack([np.clip(obs[:, 0] / 4.0, 0, 1), (obs[:, 1] == 2).astype(float)], 1)

    df, spec = toy_log(episodes=8, policy=Logging()), toy_spec()
    lay = Layout.fit(df, spec)
    st = build_steps(df, lay)
    engines = fit_engines(st, lay, MailConfig(bc_epochs=60), seed=0)
    pol = ClonedPlatformPolicy(lay, engines, scenario=st.scenario, stochastic=False)
    obs = st.frame[spec.observation_columns].to_numpy()
    act = pol.act(obs)
    truth = Logging().act(obs)
    assert np.abs(act[:, 0] - truth[:, 0]).mean() < 0.08
    assert (act[:, 1] == truth[:, 1]).mean() > 0.9


def test_client_vec_env_steps_the_shared_world(toy) -> None:
    df, spec, lay = toy
    st = build_steps(df, lay)
    cfg = MailConfig(bc_epochs=2)
    engines = {s: GaussianModel(p) for s, p in fit_engines(st, lay, cfg, 0).items()}
    clients = {s: GaussianModel(gaussian_policy(lay.n_client_inputs, lay.n_model_outputs, [16])) for s in (0, 1)}
    scen = np.array([0, 0, 1, 1, 1, 0])
    site = np.array([0, 0, 0, 1, 1, 1])
    env = ClientVecEnv(lay, 1, scen, site, profile_sampler(df, lay), InitialStates.fit(df, lay), engines, clients, 3, 0)
    assert env.num_envs == 3
    obs = env.reset()
    assert obs.shape == (3, lay.n_client_inputs)
    for _ in range(3):
        env.step_async(np.zeros((3, lay.n_model_outputs), np.float32))
        obs, rew, done, infos = env.step_wait()
        assert obs.shape == (3, lay.n_client_inputs) and np.isfinite(obs).all()
    assert done.all() and "terminal_observation" in infos[0]


def test_fit_mail_trains_and_is_reproducible(toy) -> None:
    df, spec, lay = toy
    st = build_steps(df, lay)
    comp, init = Composition.fit(df, lay), InitialStates.fit(df, lay)
    cfg = MailConfig(bc_epochs=4, rounds=2, world_agents=16, n_steps=12, demo_batch_size=64)
    runs = [fit_mail(st, lay, profile_sampler(df, lay), init, comp, cfg, seed=3) for _ in range(2)]
    hist = runs[0].history
    assert set(hist["round"]) == {0, 1, 2}
    assert hist.loc[hist["round"] > 0, "disc_acc"].between(0, 1).all()
    x = st.x_client[:20]
    for s in (0, 1):
        a, b = (GaussianModel(r.clients[s]).mean(x) for r in runs)
        assert np.allclose(a, b, atol=1e-6)
    # GAIL moved the client away from its BC initialisation
    bc_only = fit_mail(st, lay, profile_sampler(df, lay), init, comp, MailConfig(bc_epochs=4, rounds=0), seed=3)
    assert not np.allclose(GaussianModel(bc_only.clients[0]).mean(x), GaussianModel(runs[0].clients[0]).mean(x))


# ------------------------------------------------------------------------------------ transition
def test_layout_finds_site_level_and_persistent_state(toy) -> None:
    df, spec, lay = toy
    # the toy's phase is one value per site and tick (a clock); queue and credit are per agent
    assert lay.site_state == [False, False, True]
    # a column is modelled by its next value unless it changes by less than PERSISTENT_RATIO of its
    # variance per tick; build a log where one column is a slow clock and one is redrawn every tick
    slow = df.copy()
    slow["state.phase"] = slow["t"] / 1000.0
    slow["state.credit"] = np.random.default_rng(0).uniform(0, 1, len(slow))
    lay2 = Layout.fit(slow, spec)
    assert lay2.state_absolute[lay2.state.index("state.phase")] is False
    assert lay2.state_absolute[lay2.state.index("state.credit")] is True
    back = Layout.from_dict(lay.to_dict())
    assert back.site_state == lay.site_state and back.state_absolute == lay.state_absolute


def test_transition_model_sees_the_sites_actions_of_the_tick(toy) -> None:
    df, spec, lay = toy
    st = build_steps(df, lay)
    models = fit_transition(st, lay, MailConfig(bc_epochs=30), seed=0)
    assert models is not None and set(models) == {0, 1}
    # it learned the next state: R^2 of the next queue (standardised), one step ahead
    ny = lay.n_outputs
    rows = st.rows(need_next=True)
    x = np.concatenate([st.x_client[rows], st.y_client[rows, :ny], st.site_now[rows]], axis=1)
    zs = st.x_client[rows, len(lay.profile) : len(lay.profile) + len(lay.state)]
    truth = zs + st.y_client[rows, ny:]
    pred = np.zeros_like(truth)
    for s in (0, 1):
        m = st.scenario[rows] == s
        pred[m] = GaussianModel(models[s]).mean(x[m])
    pred = np.where(np.asarray(lay.state_absolute), pred, zs + pred)  # changes -> next values
    q = lay.state.index("state.queue")
    assert 1 - ((pred[:, q] - truth[:, q]) ** 2).mean() / truth[:, q].var() > 0.7

    rng = np.random.default_rng(0)
    scen, site = np.array([0, 1, 0, 1, 0, 1]), np.array([0, 0, 0, 1, 1, 1])
    prof = profile_sampler(df, lay)(6, "a", 1)
    init = InitialStates.fit(df, lay).sample(lay, scen, prof, rng)
    wrapped = {s: GaussianModel(m) for s, m in models.items()}
    y = np.zeros((6, lay.n_model_outputs), np.float32)

    def next_state(action: np.ndarray) -> np.ndarray:
        w = World(lay, scen, site, prof, init.copy(), np.zeros((2, lay.n_lag)))
        return w.apply(action, y, wrapped)[1]

    a = np.tile([0.5, 0.0], (6, 1))
    base = next_state(a)
    a2 = a.copy()
    a2[0] = [1.0, 1.0]  # agent 0 (site 0) changes its action
    moved = next_state(a2)
    assert not np.allclose(base[1], moved[1])  # its site-mate's next state follows it
    assert np.allclose(base[3:], moved[3:])  # the other site's agents do not
    ph = lay.state.index("state.phase")
    assert np.ptp(base[:3, ph]) < 1e-9 and np.ptp(base[3:, ph]) < 1e-9  # one phase per site


def test_a_clock_column_is_rolled_exactly_not_learned() -> None:
    df = toy_log(episodes=4, steps=14)
    df["state.hour"] = (df["t"] * 2.0 + 18.0) % 24.0  # wraps 22 -> 0 inside every episode
    spec = toy_spec()
    spec = TwinSpec((*spec.features, Feature("state.hour", "continuous", 0.0, 24.0)), name=spec.name,
                    step_seconds=spec.step_seconds, reward_weights=spec.reward_weights)
    lay = Layout.fit(df, spec)
    assert dict(zip(lay.state, lay.clock, strict=True)) == {
        "state.queue": None, "state.credit": None, "state.phase": None, "state.hour": pytest.approx(2.0)
    }
    assert Layout.from_dict(lay.to_dict()).clock == lay.clock

    rng = np.random.default_rng(0)
    scen, site = np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1])
    prof = profile_sampler(df, lay)(4, "a", 1)
    start = InitialStates.fit(df, lay).sample(lay, scen, prof, rng)
    h = lay.state.index("state.hour")
    start[:, h] = [0.0, 5.0, 22.0, 23.5]
    w = World(lay, scen, site, prof, start.copy(), np.zeros((2, lay.n_lag)))
    y = np.full((4, lay.n_model_outputs), 0.7, np.float32)  # whatever the model says the change is
    nxt = w.apply(np.tile([0.5, 0.0], (4, 1)), y)[1]
    np.testing.assert_allclose(nxt[:, h], [2.0, 7.0, 0.0, 1.5])
    q = lay.state.index("state.queue")
    assert not np.allclose(nxt[:, q], start[:, q])  # the other columns still follow the model


def test_a_state_that_repeats_last_ticks_response_is_copied_from_the_twins_own_response() -> None:
    df = toy_log(episodes=4, steps=14)
    # "its wait last tick": the previous row's response of the same agent (0 at t = 0)
    df = df.sort_values(["episode", "agent", "t"])
    df["state.last_wait"] = df.groupby(["episode", "agent"])["response.wait"].shift(1).fillna(0.0)
    df = df.sort_index()
    spec = toy_spec()
    spec = TwinSpec((*spec.features, Feature("state.last_wait", "continuous", 0.0, 30.0)), name=spec.name,
                    step_seconds=spec.step_seconds, reward_weights=spec.reward_weights)
    lay = Layout.fit(df, spec)
    wait = lay.outputs.index("response.wait")
    assert dict(zip(lay.state, lay.echo, strict=True)) == {
        "state.queue": None, "state.credit": None, "state.phase": None, "state.last_wait": wait
    }
    assert Layout.from_dict(lay.to_dict()).echo == lay.echo
    # a column that differs from the last response in a single row is not an echo
    off = df.copy()
    off.loc[off.index[(off["t"] == 5).to_numpy()][0], "state.last_wait"] += 1.0
    assert Layout.fit(off, spec).echo[-1] is None

    rng = np.random.default_rng(0)
    scen, site = np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1])
    prof = profile_sampler(df, lay)(4, "a", 1)
    start = InitialStates.fit(df, lay).sample(lay, scen, prof, rng)
    w = World(lay, scen, site, prof, start.copy(), np.zeros((2, lay.n_lag)))
    y = rng.normal(0.0, 1.0, (4, lay.n_model_outputs)).astype(np.float32)
    y[3, wait] = 40.0  # a wait beyond the state column's bound is clipped to it
    out, nxt = w.apply(np.tile([0.5, 0.0], (4, 1)), y)
    last = lay.state.index("state.last_wait")
    np.testing.assert_allclose(nxt[:3, last], out[:3, wait])
    assert nxt[3, last] == 30.0 and out[3, wait] > 30.0


def test_a_site_model_pickled_before_it_had_a_module_of_its_own_still_loads() -> None:
    """Twins saved before the layout split pickled their site model as
    ``edgetwin.imitation.world.SiteStateModel``; `edgetwin.imitation.world` still exports it."""
    import pickle
    import pickletools

    from edgetwin.imitation.site_model import SiteStateModel

    data = (Path(__file__).parent / "fixtures" / "site_model_pickled_in_imitation_world.pkl").read_bytes()
    names = [arg for _, arg, _ in pickletools.genops(data) if isinstance(arg, str)]
    assert names[names.index("edgetwin.imitation.world") + 1] == "SiteStateModel"  # the old path
    model = pickle.loads(data)
    assert type(model) is SiteStateModel
    assert list(model.columns) == [0, 4, 5, 6, 7, 8, 11]
    assert sum(p.numel() for p in model.net.parameters()) > 0
