"""Environments over a twin (`edgetwin.twin.twin.Twin`): Gymnasium, SB3 VecEnv and PettingZoo.

Every environment shows the platform the same per-agent layout as the real system: observation
``[profile.*, state.*]`` (raw units, spec order), action ``action.*`` (raw units). The reward is the
spec's reward over the step's columns (``spec.reward_fn()``), minus ``disagreement_penalty`` times
the ensemble's disagreement (mean std of the members' standardised predictions).

* `TwinEnv` (gymnasium.Env): one agent per `step`, round-robin over the agents of a tick, like the
  emulated cluster's ``EdgeClusterEnv``. The client model is causal per agent (others' actions
  enter lagged by a tick), so each step returns that agent's own reward at once, and with
  ``stochastic=False`` the per-agent env and the batched `TwinVecEnv` give identical rewards.
* `TwinVecEnv` (SB3 VecEnv): one sub-env per agent, all agents of a tick in one batch; each
  sub-env gets its own agent's reward. This is the fast path for training.
* `TwinParallelEnv` (PettingZoo ParallelEnv): one platform agent per scenario, acting on all of
  that scenario's service groups at once (observation ``(n_s, P+S)``, action ``(n_s, A)``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv
from stable_baselines3.common.vec_env import VecEnv

from edgetwin.contract.errors import InputError
from edgetwin.twin.simulation import SimulatedTwin, Simulation


def _spaces(twin: SimulatedTwin) -> tuple[gym.spaces.Box, gym.spaces.Box]:
    lay = twin.layout
    p_lo, p_hi = twin.spec.bounds("profile")
    s_lo, s_hi = twin.spec.bounds("state")
    keep_p = [twin.spec.names("profile").index(c) for c in lay.profile]
    keep_s = [twin.spec.names("state").index(c) for c in lay.state]
    low = np.concatenate([p_lo[keep_p], s_lo[keep_s]]).astype(np.float32)
    high = np.concatenate([p_hi[keep_p], s_hi[keep_s]]).astype(np.float32)
    obs_space = gym.spaces.Box(low, high, (len(low),), np.float32)
    act_space = gym.spaces.Box(
        twin.action_low.astype(np.float32),
        twin.action_high.astype(np.float32),
        (len(lay.action),),
        np.float32,
    )
    return obs_space, act_space


def _check_steps(steps: int | None, twin: SimulatedTwin) -> int:
    steps = twin.layout.horizon if steps is None else int(steps)
    if steps < 1:
        raise InputError(f"steps must be >= 1, got {steps}", "steps")
    return steps


class TwinEnv(gym.Env):
    """The twin as a single-agent Gymnasium env: the platform acts for one agent per step.

    Args:
        twin: the twin.
        n_agents: agents per episode (default: one logged site unit's worth, redrawn per reset).
        steps: ticks per episode (default: the logs' typical length); truncation after that.
        disagreement_penalty: reward -= k * ensemble disagreement.
        stochastic: sample client responses (else their means).
        seed: default seed of the first reset.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        twin: SimulatedTwin,
        n_agents: int | None = None,
        steps: int | None = None,
        disagreement_penalty: float = 0.0,
        stochastic: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.twin = twin
        self.n_agents = n_agents
        self.steps = _check_steps(steps, twin)
        self.penalty = float(disagreement_penalty)
        self.stochastic = stochastic
        self.observation_space, self.action_space = _spaces(twin)
        self._seed = seed
        self.sim: Simulation | None = None
        self._obs = np.zeros((0, self.observation_space.shape[0]), np.float32)
        self._i = 0
        self._tick = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        s = int(self.np_random.integers(2**31)) if seed is not None or self.sim is not None else self._seed
        self.sim = Simulation(self.twin, n_agents=self.n_agents, seed=s, stochastic=self.stochastic)
        self._obs = self.sim.obs()
        self._i, self._tick = 0, 0
        return self._obs[0].copy(), {"agent": 0, "tick": 0, "n_agents": self.sim.n}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        assert self.sim is not None, "call reset() first"
        j = self._i
        out, r, dis = self.sim.respond(np.array([j]), np.asarray(action).reshape(1, -1), self.penalty > 0)
        reward = float(r[0] - self.penalty * dis[0])
        info: dict[str, Any] = {
            "agent": j,
            "tick": self._tick,
            "outputs": out[0],
            "disagreement": float(dis[0]),
        }
        self._i += 1
        if self._i == self.sim.n:
            self.sim.end_tick()
            self._obs = self.sim.obs()
            self._i = 0
            self._tick += 1
        truncated = self._tick >= self.steps
        return self._obs[self._i].copy(), reward, False, truncated, info


class TwinVecEnv(VecEnv):
    """The twin as an SB3 VecEnv: sub-env ``i`` is agent ``i``; a tick is one batched step.

    The agent count is fixed for the env's lifetime (SB3 needs a fixed ``num_envs``); each reset
    draws a new population of that size. Episodes last ``steps`` ticks and all end together.

    Args:
        twin: the twin.
        n_agents: number of agents = sub-envs (default: one logged site unit's worth).
        steps, disagreement_penalty, stochastic, seed: as in `TwinEnv`.
    """

    render_mode = None

    def __init__(
        self,
        twin: SimulatedTwin,
        n_agents: int | None = None,
        steps: int | None = None,
        disagreement_penalty: float = 0.0,
        stochastic: bool = True,
        seed: int = 0,
    ) -> None:
        self.twin = twin
        self.steps = _check_steps(steps, twin)
        self.penalty = float(disagreement_penalty)
        self.rng = np.random.default_rng(seed)
        self.sim = Simulation(
            twin, n_agents=n_agents, seed=int(self.rng.integers(2**31)), stochastic=stochastic
        )
        self.n_agents = self.sim.n
        obs_space, act_space = _spaces(twin)
        super().__init__(self.n_agents, obs_space, act_space)
        self._pending: np.ndarray | None = None
        self._tick = 0
        self._ep_return = np.zeros(self.n_agents)

    def _resample(self) -> np.ndarray:
        self.sim.n_agents = self.n_agents
        return self.sim.reset(seed=int(self.rng.integers(2**31)))

    def reset(self) -> np.ndarray:
        seeds = getattr(self, "_seeds", None)
        if seeds and seeds[0] is not None:  # set by VecEnv.seed(); applies to this reset only
            self.rng = np.random.default_rng(seeds[0])
        self._reset_seeds()
        self._tick = 0
        self._ep_return[:] = 0.0
        return self._resample()

    def step_async(self, actions: np.ndarray) -> None:
        self._pending = np.asarray(actions)

    def step_wait(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        assert self._pending is not None
        res = self.sim.step(self._pending, with_disagreement=self.penalty > 0)
        reward = (res.reward - self.penalty * res.disagreement).astype(np.float32)
        self._tick += 1
        self._ep_return += reward
        obs = self.sim.obs()
        if self._tick >= self.steps:
            infos: list[dict[str, Any]] = [
                {
                    "terminal_observation": obs[i],
                    "TimeLimit.truncated": True,
                    "episode": {"r": float(self._ep_return[i]), "l": self._tick},
                }
                for i in range(self.num_envs)
            ]
            self._tick = 0
            self._ep_return[:] = 0.0
            obs = self._resample()
            return obs, reward, np.ones(self.num_envs, bool), infos
        return obs, reward, np.zeros(self.num_envs, bool), [{} for _ in range(self.num_envs)]

    def close(self) -> None:
        pass

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        return [getattr(self, attr_name)] * len(self._idx(indices))

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        setattr(self, attr_name, value)

    def env_method(self, method_name: str, *args: Any, indices: Any = None, **kwargs: Any) -> list[Any]:
        return [getattr(self, method_name)(*args, **kwargs) for _ in self._idx(indices)]

    def env_is_wrapped(self, wrapper_class: type, indices: Any = None) -> list[bool]:
        return [False] * len(self._idx(indices))

    def _idx(self, indices: Any) -> list[int]:
        if indices is None:
            return list(range(self.num_envs))
        return [indices] if isinstance(indices, int) else list(indices)


class TwinParallelEnv(ParallelEnv):
    """The twin as a PettingZoo ParallelEnv: one platform agent per scenario.

    The population (and so each scenario agent's number of service groups ``n_s``) is drawn once
    at construction with ``seed`` and kept for the env's lifetime, so spaces are fixed; resets
    redraw initial states and response noise. Scenario agent ``s`` observes ``(n_s, P+S)`` and
    acts ``(n_s, A)``; its reward is the mean reward of its service groups.

    Args:
        twin: the twin.
        n_agents: service groups in total (default: one logged site unit's worth).
        steps, disagreement_penalty, stochastic, seed: as in `TwinEnv`.
    """

    metadata = {"render_modes": [], "name": "edgetwin_twin_v0"}

    def __init__(
        self,
        twin: SimulatedTwin,
        n_agents: int | None = None,
        steps: int | None = None,
        disagreement_penalty: float = 0.0,
        stochastic: bool = True,
        seed: int = 0,
    ) -> None:
        self.twin = twin
        self.steps = _check_steps(steps, twin)
        self.penalty = float(disagreement_penalty)
        self.sim = Simulation(twin, n_agents=n_agents, seed=seed, stochastic=stochastic)
        self._world0 = self.sim.world
        lay = twin.layout
        present = sorted(set(self.sim.world.scenario.tolist()))
        self.possible_agents = [lay.scenarios[s] for s in present]
        self._rows = {lay.scenarios[s]: np.flatnonzero(self.sim.world.scenario == s) for s in present}
        obs1, act1 = _spaces(twin)
        self._obs_spaces = {
            a: gym.spaces.Box(
                np.broadcast_to(obs1.low, (len(r), obs1.shape[0])),
                np.broadcast_to(obs1.high, (len(r), obs1.shape[0])),
                (len(r), obs1.shape[0]),
                np.float32,
            )
            for a, r in self._rows.items()
        }
        self._act_spaces = {
            a: gym.spaces.Box(
                np.broadcast_to(act1.low, (len(r), act1.shape[0])),
                np.broadcast_to(act1.high, (len(r), act1.shape[0])),
                (len(r), act1.shape[0]),
                np.float32,
            )
            for a, r in self._rows.items()
        }
        self.agents: list[str] = []
        self._tick = 0
        self._seed = seed

    def observation_space(self, agent: str) -> gym.spaces.Box:
        return self._obs_spaces[agent]

    def action_space(self, agent: str) -> gym.spaces.Box:
        return self._act_spaces[agent]

    def _observe(self) -> dict[str, np.ndarray]:
        obs = self.sim.obs()
        lo, hi = self._obs_spaces, self._obs_spaces
        return {a: np.clip(obs[r], lo[a].low, hi[a].high) for a, r in self._rows.items()}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        lay = self.twin.layout
        rng = np.random.default_rng(self._seed if seed is None else seed)
        self._seed = int(rng.integers(2**31))
        w = self._world0
        # same service groups, fresh initial states (the spaces' shapes stay fixed)
        state = self.twin.initial.sample(lay, w.scenario, w.profile, rng)
        self.sim.place(type(w)(lay, w.scenario, w.site, w.profile.copy(), state, np.zeros_like(w.lag)))
        self.sim.rng = rng
        self.agents = list(self.possible_agents)
        self._tick = 0
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, np.ndarray]) -> tuple[dict, dict, dict, dict, dict]:
        full = np.zeros((self.sim.n, len(self.twin.layout.action)))
        full[:] = (self.twin.action_low + self.twin.action_high) / 2.0
        for a, act in actions.items():
            full[self._rows[a]] = np.asarray(act, dtype=np.float64).reshape(len(self._rows[a]), -1)
        res = self.sim.step(full, with_disagreement=self.penalty > 0)
        r = res.reward - self.penalty * res.disagreement
        self._tick += 1
        done = self._tick >= self.steps
        obs = self._observe()
        rewards = {a: float(r[self._rows[a]].mean()) for a in self.agents}
        terms = {a: False for a in self.agents}
        truncs = {a: done for a in self.agents}
        infos = {a: {"disagreement": float(res.disagreement[self._rows[a]].mean())} for a in self.agents}
        obs = {a: obs[a] for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, terms, truncs, infos
