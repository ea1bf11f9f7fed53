"""The emulated cluster as environments: the per-agent Gymnasium `EdgeClusterEnv` and the batched SB3
`EdgeClusterVecEnv` (one sub-env per service group).

`EdgeClusterVecEnv` is built on first use: importing stable-baselines3 pulls in torch (seconds),
which `edgetwin logs generate` and the simulator itself do not need.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from edgetwin.emulator.cluster import ACT_HIGH, ACT_LOW, OBS_HIGH, OBS_LOW, ClusterConfig, EdgeCluster
from edgetwin.emulator.logs import episode_seed

__all__ = ["EdgeClusterEnv"]  # and EdgeClusterVecEnv, built on first use (`__getattr__`)


class EdgeClusterEnv(gym.Env):
    """Per-agent Gymnasium view of the cluster: each ``step(action)`` is one service group's decision.

    Agents act round-robin within a tick; after the last agent of a tick the cluster advances. The
    reward is that agent's reward (its outcome is known at once because the coupling is causal). An
    episode ends (``truncated=True``) after the last agent of the last tick.

    Observation: Box (O,) float32 ``[profile.*, state.*]`` in the spec's bounds; action: Box (A,)
    float32 ``[edge_share, capacity, price]``.
    """

    metadata = {"render_modes": []}

    def __init__(self, config: ClusterConfig | None = None) -> None:
        super().__init__()
        self.cluster = EdgeCluster(config or ClusterConfig(n_agents=16, steps=24))
        self.spec_ = self.cluster.spec
        self.observation_space = spaces.Box(OBS_LOW.astype(np.float32), OBS_HIGH.astype(np.float32), dtype=np.float32)
        self.action_space = spaces.Box(ACT_LOW.astype(np.float32), ACT_HIGH.astype(np.float32), dtype=np.float32)
        self._j = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        day = None if options is None else options.get("day")
        self.cluster.reset(seed=int(self.np_random.integers(0, 2**62)), day=day)
        self._j = 0
        return self._obs(), {"agent": 0, "t": 0}

    def _obs(self) -> np.ndarray:
        return self.cluster.observe(np.array([self._j]))[0].astype(np.float32)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        j, t = self._j, self.cluster.t
        out = self.cluster.act_agents(np.array([j]), np.asarray(action, dtype=np.float64).reshape(1, -1))
        info: dict[str, Any] = {"agent": j, "t": t, "responses": out["responses"][0], "kpis": out["kpis"][0]}
        self._j += 1
        done = False
        if self._j == self.cluster.n:
            done, _ = self.cluster.end_tick()
            self._j = 0
        return self._obs(), float(out["reward"][0]), False, bool(done), info


def _build_vecenv_class() -> type:
    """`EdgeClusterVecEnv`, built on first use: importing stable-baselines3 pulls in torch (seconds),
    which `edgetwin logs generate` and the simulator itself do not need."""
    from stable_baselines3.common.vec_env import VecEnv
    from stable_baselines3.common.vec_env.base_vec_env import VecEnvIndices, VecEnvStepReturn

    class EdgeClusterVecEnv(VecEnv):
        """One SB3 sub-environment per service group, all stepped in one batch.

        At the end of an episode the cluster resets itself (with a fresh population) like SB3's
        VecEnvs: ``dones`` are all True, ``infos[i]["terminal_observation"]`` holds the last observation
        and ``infos[i]["TimeLimit.truncated"]`` is True.
        """

        def __init__(self, config: ClusterConfig | None = None, seed: int = 0) -> None:
            self.cluster = EdgeCluster(config or ClusterConfig())
            obs_space = spaces.Box(OBS_LOW.astype(np.float32), OBS_HIGH.astype(np.float32), dtype=np.float32)
            act_space = spaces.Box(ACT_LOW.astype(np.float32), ACT_HIGH.astype(np.float32), dtype=np.float32)
            self.render_mode = None
            super().__init__(self.cluster.n, obs_space, act_space)
            self._base_seed = int(seed)
            self._resets = 0
            self._actions: np.ndarray | None = None
            self.last_info: dict[str, Any] = {}

        def _next_seed(self) -> int:
            s = episode_seed(self._base_seed, self._resets)
            self._resets += 1
            return s

        def _reset_cluster(self) -> np.ndarray:
            cfg = self.cluster.config
            day = cfg.start_day + cfg.drift_days + self._resets  # consecutive days, like generate_logs
            return self.cluster.reset(seed=self._next_seed(), day=day)

        def reset(self) -> np.ndarray:
            if self._seeds and self._seeds[0] is not None:
                self._base_seed, self._resets = int(self._seeds[0]), 0
            self._reset_seeds()
            return self._reset_cluster().astype(np.float32)

        def step_async(self, actions: np.ndarray) -> None:
            self._actions = np.asarray(actions, dtype=np.float64)

        def step_wait(self) -> VecEnvStepReturn:
            if self._actions is None:
                raise RuntimeError("step_async() must be called before step_wait()")
            obs, reward, done, info = self.cluster.step(self._actions)
            self._actions = None
            self.last_info = info
            infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
            if done:
                for i in range(self.num_envs):
                    infos[i]["terminal_observation"] = obs[i].astype(np.float32)
                    infos[i]["TimeLimit.truncated"] = True
                obs = self._reset_cluster()
            dones = np.full(self.num_envs, done, dtype=bool)
            return obs.astype(np.float32), reward.astype(np.float32), dones, infos

        def close(self) -> None:
            pass

        def _indices(self, indices: VecEnvIndices) -> list[int]:
            if indices is None:
                return list(range(self.num_envs))
            if isinstance(indices, int):
                return [indices]
            return list(indices)

        def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
            # Sub-environments share the cluster; VecEnv-level attributes (render_mode) live here.
            owner = self.cluster if hasattr(self.cluster, attr_name) else self
            value = getattr(owner, attr_name)
            return [value for _ in self._indices(indices)]

        def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
            setattr(self.cluster, attr_name, value)

        def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any) -> list[Any]:
            result = getattr(self.cluster, method_name)(*method_args, **method_kwargs)
            return [result for _ in self._indices(indices)]

        def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
            return [False for _ in self._indices(indices)]

    return EdgeClusterVecEnv


def __getattr__(name: str) -> Any:
    if name == "EdgeClusterVecEnv":
        cls = _build_vecenv_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
