"""PFRL-DM (seed 000): α of eq. 15 after a global model arrives, the attention's scale, the benchmark's measurement."""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch as th

from edgetwin.federation.aggregation import AttentionAggregator, attention_weights
from edgetwin.policies.dual_critic import DualCriticPPO

th.set_num_threads(1)
BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _bench():
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module("pfrl_dm")
    finally:
        sys.path.remove(str(BENCH))


class Drift(gym.Env):
    """2-d observation, 1-d action; reward = -|a - o0| (a value function worth learning)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        self.o = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self.o, {}

    def step(self, a):
        r = -abs(float(a[0]) - float(self.o[0]))
        self.t += 1
        self.o = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self.o, r, False, self.t >= 16, {}


def test_alpha_is_re_evaluated_when_a_global_model_is_installed() -> None:
    """Algorithm 1 line 9: after lines 7-8, α = eq. 15 on the rollout still in the buffer."""
    model = DualCriticPPO("MlpPolicy", Drift(), n_steps=64, batch_size=32, n_epochs=2, seed=0, device="cpu")
    p = model.policy
    assert p.buffer_returns() is None  # nothing collected yet: α stays as it is
    model.learn(128)
    obs, returns = p.buffer_returns()
    assert obs.shape == (64, 2) and returns.shape == (64,)
    # A public critic that is off by 3 everywhere: the local critic (the old public one) must win.
    bad = {k: v.clone() for k, v in p.public_critic_parameters().items()}
    bad["head.bias"] += 3.0
    model.load_public_critic(bad)
    loss_local, loss_public = p.critic_losses(obs, returns)
    assert loss_public > loss_local + 1.0
    want = math.exp(-loss_local) / (math.exp(-loss_local) + math.exp(-loss_public))
    assert float(p.alpha) == pytest.approx(want, rel=1e-5)
    assert float(p.alpha) > 0.7
    # and the next update re-evaluates it on its fresh rollout (logged); the public critic is
    # still the worse one there
    model.learn(64, reset_num_timesteps=False)
    assert model.logger.name_to_value["train/alpha"] > 0.5


def test_attention_logits_are_cosine_similarities() -> None:
    """Two clients: centred critics are exact opposites, so the head-mean logits are ±1/T."""
    rng = np.random.default_rng(3)
    theta = rng.normal(size=(2, 300))
    for temperature in (1.0, 2.0):
        w = attention_weights(theta, num_heads=4, d_model=64, temperature=temperature, seed=1)
        # per head the self logit is cos/T times a head-dependent norm that averages to 1
        assert w[0, 0] == pytest.approx(1.0 / (1.0 + math.exp(-2.0 / temperature)), abs=0.08)
    # Four heterogeneous clients, two alike: real sharing, more with the similar client.
    a, b, c = rng.normal(size=(3, 400))
    theta = np.stack([a, a + 0.1 * rng.normal(size=400), b, c])
    w = attention_weights(theta, num_heads=4, d_model=64, seed=0)
    assert 0.3 < w[0, 0] < 0.7 and w[2, 2] < 0.75
    assert w[0, 1] > 2 * max(w[0, 2], w[0, 3])
    # eq. 21 with these weights: every personalised critic is a convex mix of the others
    res = AttentionAggregator(seed=0).aggregate_params(["a", "a2", "b", "c"], theta)
    np.testing.assert_allclose(res.personalized["b"], (w[2] @ theta).astype(np.float32), atol=1e-5)


def test_episodes_to_threshold_and_interval() -> None:
    bench = _bench()
    curve = np.array([0.0, 0.0, 3.0, 6.0, 9.0, 10.0, 10.0])
    # smoothed: 0, 0, 1, 3, 6, 8.33, 9.67 -> 95 % of 0..10 (9.5) first at index 6
    assert bench.episodes_to(curve, 0.0, 10.0, episodes=2) == 12
    assert bench.episodes_to(curve, 0.0, 20.0, episodes=2) is None
    assert bench.episodes_to(curve, 5.0, 5.0, episodes=2) is None
    np.testing.assert_allclose(bench.smooth(np.array([1.0, 3.0, 5.0, 7.0])), [1.0, 2.0, 3.0, 5.0])
    m, h = bench.mean_ci([1.0, 2.0, 3.0])
    assert m == pytest.approx(2.0) and h == pytest.approx(4.302653 / math.sqrt(3), rel=1e-5)


def test_benchmark_run_measures_on_fixed_episodes() -> None:
    """A 2-site, 2-round PFRL-DM run through the agents: held-out scores, α and attention recorded."""
    bench = _bench()
    from edgetwin.federation.sites import heterogeneous_sites

    sites = heterogeneous_sites(2, seed=0, n_agents=3, steps=6)
    out = bench.run_method(bench.METHODS[bench.PFRL], sites, rounds=2, episodes=1, seed=0, n_eval=1)
    assert out["eval"].shape == (2, 2) and out["train"].shape == (2, 2)
    assert np.isfinite(out["eval"]).all() and 0.0 < out["alpha"] < 1.0
    assert 0.5 <= out["self_attention"] < out["self_attention_layernorm"] <= 1.0
    # the evaluation is deterministic: the same policy scores the same on the same episodes
    learner = bench.make_learners({**bench.PPO, "federate": "none", "episodes_per_round": 1, "model_seed": 0}, sites[:1], 2)[0]
    assert learner.evaluate() == learner.evaluate()
    metrics = learner.train()
    assert metrics["eval_reward"] == learner.evals[0] and "reward" in metrics


def test_benchmark_runs_on_seed_000s_scheduling_mdp() -> None:
    """`--env vm`: the same measurement on seed 000's own MDP, through the agents."""
    bench = _bench()
    from edgetwin.emulator.vm_scheduling import vm_sites
    from edgetwin.federation.sites import SiteSpec

    vm = vm_sites(2, seed=0, decisions=16)
    sites = [SiteSpec(name=c.name, seed=10 + i) for i, c in enumerate(vm)]
    ppo = {"net_arch": [16]}
    out = bench.run_method(bench.METHODS[bench.PFRL], sites, rounds=2, episodes=1, seed=0, n_eval=1, ppo=ppo, vm=vm)
    assert out["eval"].shape == (2, 2) and np.isfinite(out["eval"]).all() and 0.0 < out["alpha"] < 1.0
    fedavg = bench.run_method(bench.METHODS["FedAvg (PPO, actor + critic)"], sites, 2, 1, 0, 1, ppo, vm)
    assert fedavg["uplink"] > out["uplink"] > 0  # PFRL-DM sends only the public critic
    learner = bench.make_learners({**bench.PPO, "federate": "none", "episodes_per_round": 1, "net_arch": [16]}, sites[:1], 2, vm[:1])[0]
    assert learner.evaluate() == learner.evaluate()
