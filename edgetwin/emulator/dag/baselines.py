"""Seed 002's baselines for the data-centre choice, and running any policy over an episode.

* round-robin: centres in turn (seed 002's "RR"; with one room per centre its room round-robin is
  the same);
* random: a uniform centre per job;
* greedy lowest-carbon: the centre whose grid is cleanest when the job arrives;
* HEFT-everywhere: no data-centre choice at all, HEFT over the union of every centre's servers,
  paying WAN transfers between centres (`Federation.place_everywhere`).

A policy is ``fn(env, obs) -> centre``; `run_episode` plays one and returns the episode's totals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.emulator.dag.env import CENTRE_FEATURES, ErlfcEnv

Policy = Callable[[ErlfcEnv, np.ndarray], int]
BASELINES: tuple[str, ...] = ("round-robin", "random", "greedy-carbon", "heft-everywhere")


def round_robin() -> Policy:
    def act(env: ErlfcEnv, obs: np.ndarray) -> int:  # noqa: ARG001
        return len(env.placements) % env.fed.n

    return act


def uniform_random(seed: int) -> Policy:
    rng = np.random.default_rng(seed)

    def act(env: ErlfcEnv, obs: np.ndarray) -> int:  # noqa: ARG001
        return int(rng.integers(env.fed.n))

    return act


def greedy_carbon() -> Policy:
    k = CENTRE_FEATURES.index("emission")
    width = len(CENTRE_FEATURES)

    def act(env: ErlfcEnv, obs: np.ndarray) -> int:
        return int(np.argmin(obs[k : env.fed.n * width : width]))

    return act


def sb3_policy(model: Any) -> Policy:
    """A trained SB3 model on `ErlfcEnv`'s observation (deterministic action)."""

    def act(env: ErlfcEnv, obs: np.ndarray) -> int:  # noqa: ARG001
        return int(np.asarray(model.predict(obs, deterministic=True)[0]).reshape(-1)[0])

    return act


def run_episode(env: ErlfcEnv, policy: Policy | str, seed: int) -> dict[str, float]:
    """Play one episode (the env's job stream for ``seed``) and return `ErlfcEnv.episode_metrics`
    plus ``return`` (the summed reward).

    ``policy`` is a `Policy` or ``"heft-everywhere"``.
    """
    obs, _ = env.reset(seed=seed)
    done, ret = False, 0.0
    info: dict[str, Any] = {}
    while not done:
        if policy == "heft-everywhere":
            obs, r, done, _, info = env.step_everywhere()
        elif callable(policy):
            obs, r, done, _, info = env.step(policy(env, obs))
        else:
            raise InputError(f"unknown policy {policy!r}; expected a callable or 'heft-everywhere'", "policy")
        ret += r
    return {**info["episode_metrics"], "return": ret}


def baseline(name: str, seed: int = 0) -> Policy | str:
    """One of `BASELINES` by name."""
    if name == "round-robin":
        return round_robin()
    if name == "random":
        return uniform_random(seed)
    if name == "greedy-carbon":
        return greedy_carbon()
    if name == "heft-everywhere":
        return "heft-everywhere"
    raise InputError(f"unknown baseline {name!r}; expected one of {BASELINES}", "--baseline")
