"""Seed 000's task-scheduling MDP (`edgetwin.emulator.vm_scheduling`) and its PPO learner."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from edgetwin.contract.errors import InputError
from edgetwin.emulator.traces import TraceSample
from edgetwin.emulator.vm_scheduling import (
    PAPER_CLIENTS,
    TaskDistribution,
    VMFleet,
    VMSchedulingConfig,
    VMSchedulingEnv,
    first_fit,
    least_loaded,
    vm_sites,
)


def _small(**kw) -> VMSchedulingConfig:
    fleet = VMFleet.from_specs([(8, 64, 1), (16, 128, 1)])
    return VMSchedulingConfig(fleet=fleet, tasks=TaskDistribution.archetype("batch", seed=0), max_vms=3, max_vcpu=16,
                              max_mem_gb=128, decisions=64, **kw)


def _episode(env: VMSchedulingEnv, policy, seed: int) -> tuple[float, list[float]]:
    env.reset(seed=seed)
    total, rewards, done = 0.0, [], False
    while not done:
        a = env.action_space.sample() if policy is None else policy(env)
        _, r, term, trunc, _ = env.step(a)
        total, done = total + r, term or trunc
        rewards.append(r)
        # nothing is created or lost: free + what the running tasks hold = every VM's capacity
        held = np.zeros_like(env.free)
        for vm, cores, mem, _, _ in env.running:
            held[vm] += (len(cores), mem)
        np.testing.assert_allclose(env.free + held, env._cap, atol=1e-9)
        assert (env.free >= -1e-9).all()
        assert ((env.cores[: env.n_vms] > 0).sum(axis=1) == held[:, 0]).all()
    return total, rewards


def test_the_environment_passes_gymnasiums_checker_and_is_deterministic_per_seed() -> None:
    env = VMSchedulingEnv(_small())
    check_env(env, skip_render_check=True)
    assert env.observation_space.shape == (3 * 2 + 3 * 16 + 5 * 2,) and env.action_space.n == 4
    a = _episode(env, first_fit, seed=3)
    b = _episode(env, first_fit, seed=3)
    c = _episode(env, first_fit, seed=4)
    assert a == b and a != c


def test_rewards_follow_eqs_6_to_9() -> None:
    cfg = _small()
    env = VMSchedulingEnv(cfg)
    env.reset(seed=0)
    env.queue = [(12, 10.0, 5, env.slot)]  # 12 vCPU: fits only the 16-vCPU VM (slot 1)
    # eq. 9: denied on VM 0 (empty: util 0) costs -e^0; on the void slot 2, a full VM's -e^{Σw}
    _, r, *_ = env.step(0)
    assert r == pytest.approx(-1.0) and env.queue[0][0] == 12
    env.queue.insert(0, (12, 10.0, 5, env.slot))
    _, r, *_ = env.step(2)
    assert r == pytest.approx(-math.e)
    # waiting while VM 1 could take it: the constant
    env.queue.insert(0, (12, 10.0, 5, env.slot))
    _, r, *_ = env.step(env.wait_action)
    assert r == pytest.approx(-cfg.wait_penalty)
    # placed after waiting 2 steps: ρ e^{run/res} + (1-ρ) R_load, R_load = the rise in imbalance
    env.queue.insert(0, (12, 10.0, 5, env.slot - 2))
    before = env._load_balance(env.free)
    free = env.free.copy()
    free[1] -= (12, 10.0)
    load_c = env._load_balance(free) - before
    assert load_c > 0
    _, r, *_ = env.step(1)
    assert r == pytest.approx(0.5 * math.exp(5 / 7) + 0.5 * load_c)
    assert env.responses[-1] == 7


def test_first_fit_beats_random_and_metrics_are_reported() -> None:
    env = VMSchedulingEnv(vm_sites(2, seed=0, decisions=128)[1])
    rand = np.mean([_episode(env, None, s)[0] for s in range(3)])
    ff = np.mean([_episode(env, first_fit, s)[0] for s in range(3)])
    ll = np.mean([_episode(env, least_loaded, s)[0] for s in range(3)])
    assert ff > rand + 100 and ll > rand + 100
    m = env.metrics()
    assert m["placed"] > 0 and 0 < m["utilisation"] <= 1 and m["response_slots"] >= 1


def test_sites_follow_table_3_and_differ() -> None:
    sites = vm_sites(4, seed=0)
    for i, s in enumerate(sites):
        specs, _ = PAPER_CLIENTS[i]
        assert len(s.fleet) == sum(k for _, _, k in specs) <= s.max_vms
        # stable queue: at most `max_arrivals` tasks per step, offered load as configured
        assert s.arrival_rate <= s.max_arrivals * 1.01  # run times are whole steps after stretching
    assert len({s.tasks.name for s in sites}) == 4
    assert len({int(s.fleet.vcpu.sum()) for s in sites}) > 1


def test_a_trace_gives_the_workload_shape() -> None:
    rng = np.random.default_rng(0)
    trace = TraceSample("t", durations_s=rng.lognormal(5, 1, 500), cpu=rng.lognormal(0, 0.5, 500), memory=None,
                        arrivals_s=np.sort(rng.uniform(0, 1e4, 500)))
    d = TaskDistribution.from_trace(trace, medians=(4.0, 16.0, 8.0))
    assert np.median(d.vcpu) == pytest.approx(4, abs=1) and np.median(d.slots) == pytest.approx(8, abs=1)
    assert d.mem_gb is not None and np.median(d.mem_gb) == pytest.approx(24.0, rel=0.15)  # the fallback archetype's


def test_bad_configurations_are_refused() -> None:
    with pytest.raises(InputError, match="max_vms"):
        VMSchedulingConfig(fleet=VMFleet.from_specs([(8, 64, 4)]), tasks=TaskDistribution.archetype("web"), max_vms=3)
    with pytest.raises(InputError, match="fleet"):
        VMFleet.from_specs([(0, 64, 1)])
    with pytest.raises(InputError, match="archetype"):
        TaskDistribution.archetype("nope")


def test_scheduler_learner_federates_the_public_critic_and_learns() -> None:
    from edgetwin.federation.learners import SchedulerLearner

    cfg = vm_sites(1, seed=0, decisions=32)[0]
    a = SchedulerLearner(cfg, seed=1, episodes_per_round=2, net_arch=(16,))
    b = SchedulerLearner(cfg, seed=2, episodes_per_round=2, net_arch=(16,))
    np.testing.assert_array_equal(a.get_params(), b.get_params())  # same model seed: equal start
    m = a.train()
    assert np.isfinite(m["reward"]) and m["episodes"] == 2 and 0.0 < m["alpha"] < 1.0
    assert not np.array_equal(a.get_params(), b.get_params())
    b.set_params(a.get_params())
    np.testing.assert_array_equal(a.get_params(), b.get_params())
    assert 0 <= a.act(VMSchedulingEnv(cfg).reset(seed=0)[0]) <= cfg.max_vms


def test_sampled_actions_are_seeded_and_leave_the_other_streams_alone() -> None:
    import torch

    from edgetwin.federation.learners import SchedulerLearner

    cfg = vm_sites(1, seed=0, decisions=32)[0]
    learner = SchedulerLearner(cfg, seed=1, episodes_per_round=1, net_arch=(16,))
    obs = np.stack([VMSchedulingEnv(cfg).reset(seed=j)[0] for j in range(40)])

    def draws(seed: int) -> list[int]:
        with learner.sampling(seed):
            return [learner.act(o, deterministic=False) for o in obs]

    torch.manual_seed(123)
    before = torch.get_rng_state()
    first, again, other = draws(7), draws(7), draws(8)
    assert torch.equal(torch.get_rng_state(), before)  # the process's stream is untouched
    assert first == again and first != other  # same seed, same draws; another seed, others
    # an untrained policy over L + 1 actions samples more than its single most likely action
    assert len(set(first)) > len({learner.act(o) for o in obs})
