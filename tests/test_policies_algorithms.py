"""The custom algorithm pieces: dual-critic PPO (seed 000), action-norm regulariser (seed 004 eq. 8),
priority-weighted softmax (seed 001 eq. 10), checked on tiny Gymnasium envs written here."""

from __future__ import annotations

import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from sb3_contrib import MaskablePPO
from stable_baselines3 import PPO

from edgetwin.contract.errors import InputError
from edgetwin.policies.dual_critic import DualCriticPPO
from edgetwin.policies.priority import MaskablePriorityWeightedPolicy, PriorityScores, PriorityWeightedPolicy
from edgetwin.policies.regularised import RegularisedActorCriticPolicy

th.set_num_threads(1)


class Reach(gym.Env):
    """Continuous: reward ``-|a - target(s)|``; the target is s itself, in [-1, 1]."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        self.t = 0

    def reset(self, *, seed=None, options=None):  # type: ignore[no-untyped-def]
        super().reset(seed=seed)
        self.t = 0
        self.s = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self.s, {}

    def step(self, a):  # type: ignore[no-untyped-def]
        r = -float(np.abs(np.asarray(a) - self.s).sum())
        self.t += 1
        self.s = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self.s, r, False, self.t >= 16, {}


class JobPick(gym.Env):
    """Discrete: observation = priority of 3 queued jobs; reward = priority of the picked one."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(0, 1, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.t = 0

    def reset(self, *, seed=None, options=None):  # type: ignore[no-untyped-def]
        super().reset(seed=seed)
        self.t = 0
        self.o = self.np_random.random(3).astype(np.float32)
        return self.o, {}

    def step(self, a):  # type: ignore[no-untyped-def]
        r = float(self.o[int(a)])
        self.t += 1
        self.o = self.np_random.random(3).astype(np.float32)
        return self.o, r, False, self.t >= 16, {}

    def action_masks(self) -> np.ndarray:
        return np.array([True, True, False])


def test_dual_critic_alpha_is_eq_15() -> None:
    model = DualCriticPPO("MlpPolicy", Reach(), n_steps=64, batch_size=32, seed=0, device="cpu")
    p = model.policy
    assert p.update_alpha(1.0, 3.0) == pytest.approx(math.exp(-1) / (math.exp(-1) + math.exp(-3)))
    assert p.update_alpha(5000.0, 5003.0) == pytest.approx(1 / (1 + math.exp(-3)))  # stable for large losses
    obs = th.tensor(np.random.default_rng(0).uniform(-1, 1, (5, 2)), dtype=th.float32)
    with th.no_grad():
        want = p.alpha * p.local_value(obs) + (1 - p.alpha) * p.public_value(obs)
        np.testing.assert_allclose(p.predict_values(obs), want, rtol=1e-6)


def test_dual_critic_trains_both_critics_and_federates(tmp_path: Path) -> None:
    model = DualCriticPPO("MlpPolicy", Reach(), n_steps=128, batch_size=64, n_epochs=4, seed=0, device="cpu")
    p = model.policy
    before = {k: v.clone() for k, v in p.public_critic_parameters().items()}
    local_before = p.local_critic_parameters()
    model.learn(1024)
    after = p.public_critic_parameters()
    assert any(not th.equal(before[k], after[k]) for k in before), "the public critic did not learn"
    assert any(not th.equal(local_before[k], v) for k, v in p.local_critic_parameters().items())
    logged = model.logger.name_to_value
    assert 0.0 < logged["train/alpha"] < 1.0 and "train/public_critic_loss" in logged
    # install an aggregated public critic: Algorithm 1 moves the old public critic to the local one
    agg = {k: v + 0.01 for k, v in after.items()}
    model.load_public_critic(agg)
    for k, v in p.public_critic_parameters().items():
        th.testing.assert_close(v, agg[k])
    for k, v in p.local_critic_parameters().items():
        th.testing.assert_close(v, after[k])
    with pytest.raises(ValueError, match="keys differ"):
        model.load_public_critic({"nope": th.zeros(1)})
    model.save(tmp_path / "m.zip")
    again = DualCriticPPO.load(tmp_path / "m.zip", device="cpu")
    assert float(again.policy.alpha) == pytest.approx(float(p.alpha))


def test_action_norm_regulariser_shrinks_actions() -> None:
    """Eq. 8: with a large λ the deterministic actions are pulled towards the centre (0)."""
    obs = np.random.default_rng(1).uniform(-1, 1, (256, 2)).astype(np.float32)
    norms = {}
    for lam in (0.0, 4.0):
        model = PPO(
            RegularisedActorCriticPolicy,
            Reach(),
            n_steps=256,
            batch_size=64,
            n_epochs=5,
            learning_rate=3e-3,
            seed=0,
            device="cpu",
            policy_kwargs={"action_norm_lambda": lam},
        )
        # 1,024 steps (4 updates): λ = 4 leaves ~1 % of λ = 0's squared norm at seeds 0-2 (0.2-1 %
        # at 2,048), so the halving below is not near its edge
        model.learn(1024)
        a, _ = model.predict(obs, deterministic=True)
        norms[lam] = float((a**2).sum(axis=1).mean())
        if lam > 0:
            assert model.logger.name_to_value.get("train/loss") is not None
    assert norms[4.0] < 0.5 * norms[0.0], norms
    # and the regulariser is part of the gradient: the hooked Adam back-propagates it
    policy = model.policy
    assert policy.optimizer.aux_loss_source is not None


def test_priority_softmax_is_eq_10() -> None:
    model = PPO(
        PriorityWeightedPolicy,
        JobPick(),
        seed=0,
        device="cpu",
        n_steps=64,
        policy_kwargs={"priority": PriorityScores(option_columns=(0, 1, 2)), "priority_beta": 2.0},
    )
    obs = th.tensor([[0.0, 1.0, 0.5]])
    with th.no_grad():
        q = model.policy.action_net(
            model.policy.mlp_extractor.forward_actor(model.policy.extract_features(obs))
        )
        got = model.policy.get_distribution(obs).distribution.probs
    want = th.softmax(q + 2.0 * obs, dim=-1)  # exp(Q + β P) / Σ exp(Q + β P)
    th.testing.assert_close(got, want)
    by_job = PriorityScores(job_column=1, option_weights=(0.0, 0.5, 1.0))
    th.testing.assert_close(by_job(obs), th.tensor([[0.0, 0.5, 1.0]]))
    with pytest.raises(InputError, match="Discrete"):
        PPO(
            PriorityWeightedPolicy, Reach(), policy_kwargs={"priority": PriorityScores(option_columns=(0, 1))}
        )


def test_priority_softmax_learns_and_respects_masks() -> None:
    kw = {"priority": PriorityScores(option_columns=(0, 1, 2))}
    model = PPO(PriorityWeightedPolicy, JobPick(), seed=0, device="cpu", n_steps=128, policy_kwargs=kw)
    model.learn(1024)
    rng = np.random.default_rng(0)
    obs = rng.random((200, 3)).astype(np.float32)
    a, _ = model.predict(obs, deterministic=True)
    assert (obs[np.arange(200), a] == obs.max(axis=1)).mean() > 0.8  # picks the most urgent job
    masked = MaskablePPO(
        MaskablePriorityWeightedPolicy, JobPick(), seed=0, device="cpu", n_steps=64, policy_kwargs=kw
    )
    masked.learn(128)
    a, _ = masked.predict(obs, deterministic=True, action_masks=np.tile([True, True, False], (200, 1)))
    assert (a != 2).all()
