"""Scale (issue 22): behaviour cloning's budget on large logs, and a twin tick's fast path.

A fit of ``bc_epochs`` passes costs rows x epochs; `MailConfig.bc_max_steps` caps each behaviour-
cloning fit's gradient steps so that a million-row log does not cost 35 times a 29k-row one. These
tests count the optimiser's real steps (a global post-step hook), check that a cap above a fit's
size changes nothing (the tests' and quick benchmarks' fits stay bit-identical), and that
`NeglogpLoss` trains the same weights as imitation's own loss calculator.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Iterator
from contextlib import contextmanager

import numexpr
import numpy as np
import pandas as pd
import pytest
import torch
from imitation.algorithms import bc
from test_imitation import toy_log, toy_spec
from torch.optim.optimizer import register_optimizer_step_post_hook

import edgetwin.imitation.mail as mail
from edgetwin.contract.dynamics import Expression, _reduce
from edgetwin.contract.policy import RandomPolicy
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs
from edgetwin.imitation.layout import ColumnScaler, Layout, _forward_log
from edgetwin.imitation.mail import MailConfig, bc_steps, behaviour_clone, fit_engines, gaussian_policy
from edgetwin.imitation.steps import build_steps, client_features
from edgetwin.twin.twin import Twin

torch.set_num_threads(1)


@contextmanager
def counted_steps() -> Iterator[list[int]]:
    """Counts every optimiser step taken inside the block (any optimiser)."""
    count = [0]

    def hook(*_: object) -> None:
        count[0] += 1

    handle = register_optimizer_step_post_hook(hook)
    try:
        yield count
    finally:
        handle.remove()


def data(n: int = 1500, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 6)).astype(np.float32)
    y = np.stack([np.tanh(x[:, 0]) + 0.5 * x[:, 1], x[:, 2] * x[:, 3]], 1).astype(np.float32)
    return x, y + 0.1 * rng.standard_normal(y.shape).astype(np.float32)


def weights(pol: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in pol.parameters()]


def fit(x: np.ndarray, y: np.ndarray, epochs: int, max_steps: int | None) -> tuple[list[torch.Tensor], int, dict]:
    torch.manual_seed(0)
    pol = gaussian_policy(x.shape[1], y.shape[1], [16, 16])
    with counted_steps() as n:
        res = behaviour_clone(x, y, pol, epochs, seed=0, max_steps=max_steps)
    return weights(pol), n[0], res


def test_bc_steps_counts_full_batches_and_applies_the_cap() -> None:
    assert bc_steps(1500, 4, 256) == 4 * 5  # the partial last batch is dropped
    assert bc_steps(1500, 4, 256, max_steps=7) == 7
    assert bc_steps(1500, 4, 256, max_steps=0) == 20  # 0: no cap
    assert bc_steps(1500, 0, 256) == 5  # at least one pass
    assert bc_steps(100, 3, 256) == 3  # fewer rows than a batch: one batch per pass
    # the default cap leaves 20 epochs alone up to 64,000 rows of a scenario and binds above
    cap = MailConfig().bc_max_steps
    assert bc_steps(64_000, 20, 256, cap) == 20 * 250
    assert bc_steps(1_000_000, 20, 256, cap) == cap


def test_a_cap_below_the_epochs_budget_takes_exactly_that_many_optimiser_steps() -> None:
    x, y = data()
    w_full, n_full, r_full = fit(x, y, epochs=4, max_steps=None)
    w_cap, n_cap, r_cap = fit(x, y, epochs=4, max_steps=7)
    assert (n_full, r_full["steps"]) == (20, 20)
    assert (n_cap, r_cap["steps"]) == (7, 7)
    assert any(not torch.equal(a, b) for a, b in zip(w_full, w_cap, strict=True))
    # a cap spanning a partial pass: one full pass (5 batches) and 3 batches of the next
    assert fit(x, y, epochs=4, max_steps=8)[1] == 8


def test_a_cap_at_or_above_the_epochs_budget_changes_nothing() -> None:
    x, y = data()
    w_none, n_none, _ = fit(x, y, epochs=3, max_steps=None)
    for cap in (15, MailConfig().bc_max_steps):
        w, n, _ = fit(x, y, epochs=3, max_steps=cap)
        assert n == n_none == 15
        assert all(torch.equal(a, b) for a, b in zip(w_none, w, strict=True))


def test_the_cap_reaches_every_behaviour_cloning_fit_of_a_twin() -> None:
    df, spec = toy_log(episodes=6), toy_spec()
    lay = Layout.fit(df, spec)
    st = build_steps(df, lay)
    with counted_steps() as n:
        fit_engines(st, lay, MailConfig(bc_epochs=50, bc_max_steps=3), seed=0)
    assert n[0] == 3 * len(lay.scenarios)
    with counted_steps() as n:
        fit_engines(st, lay, MailConfig(bc_epochs=2, bc_max_steps=3), seed=0)
    per_scenario = [bc_steps(len(st.rows(s)), 2, 256) for s in range(len(lay.scenarios))]
    assert n[0] == sum(min(3, k) for k in per_scenario)


def test_the_lean_loss_trains_the_same_weights_as_imitations(monkeypatch) -> None:
    x, y = data(n=2000, seed=3)
    w_lean, _, r_lean = fit(x, y, epochs=3, max_steps=None)
    monkeypatch.setattr(mail, "NeglogpLoss", lambda: bc.BehaviorCloningLossCalculator(ent_weight=0.0, l2_weight=0.0))
    w_imit, _, r_imit = fit(x, y, epochs=3, max_steps=None)
    assert all(torch.equal(a, b) for a, b in zip(w_lean, w_imit, strict=True))
    assert r_lean == r_imit


# ------------------------------------------------------------------ the twin's tick (throughput)
# A tick of `Simulation.step` works on whole arrays (no row index); these tests hold it to the
# row-subset path and to the plain formulas it replaced, bit for bit: a faster tick must not move
# a rollout (benchmarks/scale.py compares rollouts of the code before and after the same way).


@pytest.fixture(scope="module")
def cluster_twin(tiny_cluster_twin: Twin) -> Twin:
    """A tiny twin of the emulated cluster: declared dynamics, site-level state, a clock, echoes."""
    return copy.deepcopy(tiny_cluster_twin)  # the session's fit (conftest), this file's own copy


def test_a_tick_of_every_agent_is_the_tick_of_its_parts(cluster_twin: Twin) -> None:
    whole = cluster_twin.simulation(n_agents=150, seed=3, stochastic=False, member=1)
    parts = cluster_twin.simulation(n_agents=150, seed=3, stochastic=False, member=1)
    pol = RandomPolicy(cluster_twin.spec, 1)
    halves = (np.arange(0, 150, 2), np.arange(1, 150, 2))
    for t in range(6):
        a = pol.act(whole.obs())
        if t == 2:
            a = np.asarray(a, np.float64) * 3.0 - 1.0  # outside the bounds: clipped the same way
        r = whole.step(a, with_disagreement=True)
        out, rew, dis = np.zeros_like(r.outputs), np.zeros_like(r.reward), np.zeros_like(r.disagreement)
        for h in halves:
            out[h], rew[h], dis[h] = parts.respond(h, a[h], with_disagreement=True)
        nxt = parts.end_tick()
        for got, want in ((out, r.outputs), (rew, r.reward), (dis, r.disagreement), (nxt, r.next_state)):
            assert got.tobytes() == want.tobytes()
    assert parts.world.lag.tobytes() == whole.world.lag.tobytes() and dis.max() > 0


def test_a_step_keeps_nothing_it_hands_out(cluster_twin: Twin) -> None:
    """The arrays of a `StepResult` are its own: a later tick (whole or in parts) does not change them."""
    sim = cluster_twin.simulation(n_agents=40, seed=0)
    pol = RandomPolicy(cluster_twin.spec, 0)
    r = sim.step(pol.act(sim.obs()))
    kept = {k: getattr(r, k).copy() for k in ("obs", "action", "outputs", "next_state", "reward")}
    sim.respond(np.arange(5), pol.act(sim.obs())[:5])
    sim.override_outputs(np.arange(3), np.zeros((3, len(cluster_twin.layout.outputs))))
    sim.end_tick()
    sim.step(pol.act(sim.obs()))
    for k, v in kept.items():
        assert getattr(r, k).tobytes() == v.tobytes(), k


def test_kept_scaler_rows_give_the_same_bits_as_broadcasting() -> None:
    rng = np.random.default_rng(0)
    specials = np.array([0.0, -0.0, 1e-300, -1e-300, 7.0, -3.5, 1e12])
    sc = ColumnScaler(["a", "b", "c"], np.array([True, False, True]), np.array([0.5, -2.0, 1e-3]),
                      np.array([1.5, 0.25, 3.0]), np.array([0.0, -np.inf, 0.0]), np.array([np.inf, 4.0, 1e6]),
                      [None, None, None])
    for n in (10, 64, 500, 3000):  # below and inside the rows it keeps
        raw = np.where(rng.random((n, 3)) < 0.2, rng.choice(specials, (n, 3)), rng.lognormal(0, 2, (n, 3)))
        z = rng.standard_normal((n, 3)).astype(np.float32) * 4
        plain_t = ((_forward_log(raw, sc.log) - sc.mean) / sc.std).astype(np.float32)
        x = z.astype(np.float64) * sc.std + sc.mean
        x[:, sc.log] = np.expm1(np.clip(x[:, sc.log], -50.0, 50.0))
        plain_i = np.clip(x, sc.low, sc.high)
        for _ in range(2):  # the second time from the kept rows
            assert sc.transform(raw).tobytes() == plain_t.tobytes()
            assert sc.inverse(z).tobytes() == plain_i.tobytes()
    assert pickle.loads(pickle.dumps(sc))._tiles == {}  # the kept rows do not travel


def test_client_inputs_of_one_tick_take_its_time_once() -> None:
    """``t`` as ``(1,)`` (a world's tick) gives the same inputs as ``t`` repeated per row."""
    log = toy_log(episodes=2)
    lay = Layout.fit(log, toy_spec())
    rng = np.random.default_rng(1)
    n, p, s, a = 37, len(lay.profile), len(lay.state), len(lay.action)
    codes = rng.integers(0, 5, n)
    args = (rng.standard_normal((n, p)), rng.standard_normal((n, s)), rng.standard_normal((n, a)), codes, 5,
            rng.standard_normal((n, lay.n_lag)))
    for t in (0, 7, 23, 1000):
        one = client_features(lay, *args, np.full(1, t))
        every = client_features(lay, *args, np.full(n, t))
        assert one.dtype == np.float32 and one.tobytes() == every.tobytes()


def test_compiled_declared_expressions_are_numexprs_numbers() -> None:
    rng = np.random.default_rng(2)
    site = rng.integers(0, 7, 500)
    cols = {"kpi.x": rng.lognormal(0, 1, 500), "profile.cap": rng.uniform(1, 9, 500), "state.bg": rng.random(500)}
    for text in ("sum(kpi.x) / profile.cap + state.bg", "max(kpi.x * dt) - 1", "1", "state.bg ** 2 / (dt + 1)"):
        e = Expression.compile(text, "test")
        got = e.evaluate(cols, site, 7, 900.0)
        # the same through numexpr.evaluate itself
        local = {k.replace(".", "__"): v for k, v in cols.items()} | {"dt": np.float64(900.0)}
        for k, (op, inner) in enumerate(e.aggregates):
            per = np.broadcast_to(np.asarray(numexpr.evaluate(inner, local_dict=dict(local)), np.float64), (500,))
            local[f"_agg{k}"] = _reduce(op, per, site, 7)[site]
        want = np.broadcast_to(np.asarray(numexpr.evaluate(e.outer, local_dict=local), np.float64), (500,))
        assert got.tobytes() == np.ascontiguousarray(want).tobytes(), text


def test_a_members_bootstrap_of_a_sorted_log_is_sorted_so_its_step_table_copies_nothing() -> None:
    """`bootstrap_episodes` hands `build_steps` its draw already in (episode, t, agent) order, so
    the step table's frame is the draw itself, not one more copy of a million-row log in each pool
    worker; the draw is the same rows as drawing the episodes in their drawn order."""
    from edgetwin.twin.twin import bootstrap_episodes

    df, spec = generate_logs(ClusterConfig(n_agents=12, steps=4), episodes=11, seed=2)
    df = df.sort_values(["episode", "t", "agent"], kind="stable").reset_index(drop=True)
    episodes = df["episode"].unique()
    pick = np.random.default_rng(5).choice(len(episodes), size=len(episodes), replace=True)
    draw = bootstrap_episodes(df, episodes, pick)
    steps = build_steps(draw, Layout.fit(df, spec))
    assert np.shares_memory(steps.frame["t"].to_numpy(), draw["t"].to_numpy())
    in_draw_order = pd.concat(
        [df[df["episode"] == episodes[e]].assign(episode=f"{episodes[e]}#{k}") for k, e in enumerate(pick)]
    ).sort_values(["episode", "t", "agent"], kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(draw, in_draw_order, check_dtype=False)
    assert draw["episode"].nunique() == len(pick)


def test_a_model_run_in_chunks_gives_the_bits_of_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """`GaussianModel.mean` and `log_likelihood` cut a large batch into `CHUNK_ROWS`-row passes
    (so that behaviour cloning's final pass over a million rows does not hold every activation at
    once); each row's numbers must be those of one pass over all rows, and the log-likelihood
    that of SB3's `evaluate_actions`."""
    torch.manual_seed(0)
    pol = gaussian_policy(9, 4, [16, 16])
    with torch.no_grad():
        pol.log_std.copy_(torch.tensor([0.3, -0.2, 0.1, -0.5]))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2_500, 9)).astype(np.float32)
    y = rng.standard_normal((2_500, 4)).astype(np.float32)
    whole = mail.GaussianModel(pol).mean(x)
    with torch.no_grad():
        _, sb3_logp, _ = pol.evaluate_actions(torch.as_tensor(x.copy()), torch.as_tensor(y.copy()))
    assert torch.equal(mail.log_likelihood(pol, x, y), sb3_logp)
    monkeypatch.setattr(mail, "CHUNK_ROWS", 1_000)  # three passes, the last partial
    chunked = mail.GaussianModel(pol).mean(x)
    assert np.array_equal(chunked.view(np.uint32), whole.view(np.uint32))
    assert torch.equal(mail.log_likelihood(pol, x, y), sb3_logp)
    assert float(-mail.log_likelihood(pol, x, y).mean()) == float(-sb3_logp.mean())
    # and the check can fail: another row's input changes that row's output only
    x2 = x.copy()
    x2[1_500] += 1.0
    moved = np.flatnonzero((mail.GaussianModel(pol).mean(x2) != whole).any(axis=1))
    assert moved.tolist() == [1_500]
