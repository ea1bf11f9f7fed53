"""`LoadedPolicy.act` computes a PPO / A2C policy's deterministic action directly (no SB3 `predict`):
the same numbers as `predict`, for one observation and for a batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gymnasium.wrappers import RescaleAction

from edgetwin.emulator.cluster import ClusterConfig, EdgeCluster, cluster_spec
from edgetwin.emulator.envs import EdgeClusterEnv
from edgetwin.policies.export import ActionTransform, export_policy, load_policy


def _export(algo: str, out: Path, obs_norm: bool) -> Path:
    import stable_baselines3 as sb3

    cfg = ClusterConfig(n_agents=4, steps=8)
    spec = cluster_spec(cfg)
    env = RescaleAction(EdgeClusterEnv(cfg), -1.0, 1.0)
    kw = {"n_steps": 16} if algo in ("PPO", "A2C") else {"learning_starts": 8, "buffer_size": 64}
    if algo == "PPO":
        kw["batch_size"] = 16
    model = getattr(sb3, algo)("MlpPolicy", env, seed=0, device="cpu", **kw)
    if algo != "SAC":
        model.learn(32)  # moved away from the initial weights (and log_std), still seconds
    low, high = spec.bounds("action")
    norm = None
    if obs_norm:
        obs = EdgeCluster(ClusterConfig(n_agents=50, steps=4)).reset(seed=0)
        norm = {"mean": obs.mean(0), "var": obs.var(0) + 1e-6, "clip": 10.0, "epsilon": 1e-8}
    return export_policy(
        model, out, spec, metadata={"metrics": {}}, obs_norm=norm,
        action_transform=ActionTransform("box", [float(x) for x in low], [float(x) for x in high]),
    )  # fmt: skip


@pytest.mark.parametrize(("algo", "obs_norm"), [("PPO", True), ("A2C", False)])
def test_direct_forward_gives_predicts_actions(tmp_path: Path, algo: str, obs_norm: bool) -> None:
    pol = load_policy(_export(algo, tmp_path / algo, obs_norm))
    assert pol._actor is not None  # the direct path is the one under test
    slow = load_policy(tmp_path / algo)
    slow._actor = None  # SB3's predict
    rng = np.random.default_rng(1)
    obs = EdgeCluster(ClusterConfig(n_agents=256, steps=4)).reset(seed=3)
    for n in (1, 7, 256):
        x = obs[:n] * rng.uniform(0.5, 2.0, size=obs[:n].shape)  # also outside the normaliser's range
        fast_a, slow_a = pol.act(x), slow.act(x)
        assert fast_a.dtype == slow_a.dtype and fast_a.shape == slow_a.shape == (n, len(pol.spec.action_columns))
        np.testing.assert_array_equal(fast_a, slow_a)
    # the actions depend on the observation (a constant output would pass the equality trivially)
    assert np.ptp(pol.act(obs), axis=0).max() > 0


def test_other_algorithms_keep_predict(tmp_path: Path) -> None:
    pol = load_policy(_export("SAC", tmp_path / "sac", False))
    assert pol._actor is None
    assert pol.act(np.zeros((2, len(pol.spec.observation_columns)))).shape == (2, len(pol.spec.action_columns))


def test_the_same_observations_give_the_same_bits_whatever_their_memory_layout(tmp_path: Path) -> None:
    """A request whose columns came in another order is reindexed (often into a Fortran-ordered
    array); a strided view is another layout again. `act` copies into one C-contiguous layout first,
    so the network's GEMM sees the same strides and the decisions do not depend on the layout."""
    policy = load_policy(_export("PPO", tmp_path / "ppo", obs_norm=True))
    obs = np.random.default_rng(3).uniform(0.0, 2.0, size=(257, len(policy.spec.observation_columns)))
    want = policy.act(np.ascontiguousarray(obs))
    order = np.random.default_rng(4).permutation(obs.shape[1])
    shuffled = obs[:, order]  # the columns as a client sent them
    reindexed = shuffled[:, np.argsort(order)]  # back in the spec's order: not C-contiguous
    assert not reindexed.flags.c_contiguous or not np.asfortranarray(obs).flags.c_contiguous
    for layout in (np.asfortranarray(obs), reindexed, np.repeat(obs, 2, axis=0)[::2]):
        np.testing.assert_array_equal(policy.act(layout), want)
    # the cause, checked on any CPU: the network only ever sees C-contiguous rows
    seen: list[bool] = []
    actor = policy._actor
    assert actor is not None

    def recording(x: np.ndarray) -> np.ndarray:
        seen.append(bool(x.flags.c_contiguous))
        return actor(x)

    policy._actor = recording  # type: ignore[assignment]
    for layout in (np.asfortranarray(obs), reindexed, np.repeat(obs, 2, axis=0)[::2]):
        policy.act(layout)
    assert seen == [True, True, True]
