"""Logs of the DAG federation in edgetwin's log contract, so that a twin can be learned from them.

One row per ``(episode, t, agent)``: ``t`` is the t-th arriving job of the episode, ``agent`` a data
centre (the platform's decision is per centre: ``action.assign`` = 1 for the centre that gets the
job, 0 for the others), ``scenario`` = ``"datacentre"``, ``site`` = ``"federation"``.

* ``profile.*``: the centre's constants (servers, mean speed, W per unit of work, idle W, cooling
  ratios, energy type);
* ``state.*``: its waits, cooling in force, grid intensity now, share of the federation's energy,
  and the arriving job (tasks, largest task, total work, time to its deadline) with the hour of day;
* ``response.*``: what running (or not running) the job cost there: energy, carbon, the job's wait
  and whether it missed its deadline (all 0 where ``assign`` = 0);
* ``reward``: `erlfc_reward`, ``assign · (ref − cost)``: the job's cost relative to what it
  would cost on an average centre (so that a per-centre reward ranks centres; summed over a
  tick's centres it is the env's reward plus a term no action changes).

`centre_rows` builds the same ``[profile.*, state.*]`` rows from a live `ErlfcEnv`, which is how a
policy trained in the twin (acting per centre) is run on the emulator: `TwinScorePolicy` sends the
job to the centre its policy scores highest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import Feature, TwinSpec
from edgetwin.emulator.dag.datacentres import ENERGY_TYPES
from edgetwin.emulator.dag.env import ErlfcConfig, ErlfcEnv

PROFILE = (
    ("servers", "continuous", 1.0, 1000.0, "servers"),
    ("mean_speed", "continuous", 0.05, 10.0, "x reference"),
    ("w_per_work", "continuous", 0.0, 2000.0, "W per unit speed"),
    ("idle_w", "continuous", 0.0, 1000.0, "W"),
    ("cr_air", "continuous", 0.0, 3.0, "cooling/IT"),
    ("cr_liquid", "continuous", 0.0, 3.0, "cooling/IT"),
    ("energy_type", "categorical", 0.0, float(len(ENERGY_TYPES) - 1), "code"),
)
STATE = (
    ("min_wait_s", "heavy_tailed", 0.0, None, "s"),
    ("max_wait_s", "heavy_tailed", 0.0, None, "s"),
    ("liquid", "binary", 0.0, 1.0, ""),
    ("intensity", "continuous", 0.0, 3000.0, "gCO2eq/kWh"),
    ("energy_share", "continuous", 0.0, 1.0, ""),
    ("job_tasks", "heavy_tailed", 1.0, 10000.0, "tasks"),
    ("job_max_task_s", "heavy_tailed", 0.0, None, "s"),
    ("job_work_s", "heavy_tailed", 0.0, None, "s"),
    ("job_slack_s", "heavy_tailed", 0.0, None, "s"),
    ("hour_sin", "continuous", -1.0, 1.0, ""),
    ("hour_cos", "continuous", -1.0, 1.0, ""),
)
ACTION = (("assign", "binary", 0.0, 1.0, ""),)
RESPONSE = (
    ("energy_kwh", "heavy_tailed", 0.0, None, "kWh"),
    ("carbon_kg", "heavy_tailed", 0.0, None, "kgCO2eq"),
    ("wait_s", "heavy_tailed", 0.0, None, "s"),
    ("missed", "binary", 0.0, 1.0, ""),
)
REWARD_FUNCTION = "edgetwin.emulator.dag.logs:erlfc_reward"


def _features(role: str, table: tuple[tuple[str, str, float, float | None, str], ...]) -> list[Feature]:
    out = []
    for name, kind, low, high, unit in table:
        values = tuple(float(v) for v in range(int(low), int(high or 0) + 1)) if kind == "categorical" else None
        out.append(Feature(name=f"{role}.{name}", kind=kind, low=low, high=high, values=values, unit=unit))  # type: ignore[arg-type]
    return out


def erlfc_spec() -> TwinSpec:
    """The twin spec of the DAG federation's logs (reward: `erlfc_reward`)."""
    feats = _features("profile", PROFILE) + _features("state", STATE) + _features("action", ACTION)
    feats += _features("response", RESPONSE)
    return TwinSpec(
        features=tuple(feats),
        name="erlfc-dag-federation",
        step_seconds=1.0,
        reward_function=REWARD_FUNCTION,
        scenarios=("datacentre",),
    )


@lru_cache(maxsize=1)
def _scales() -> tuple[float, float, float, float]:
    """(E_0 kWh, G_0 kg, ref kWh per s of work, ref kg per s of work) of the default federation."""
    env = ErlfcEnv(ErlfcConfig())
    mean_work = env.config.workload.jobs.mean_work_s()
    e0, g0 = env.energy_scale_j / 3.6e6, env.carbon_scale_g / 1000.0
    return e0, g0, e0 / mean_work, g0 / mean_work


def erlfc_reward(columns: Mapping[str, np.ndarray], miss_penalty: float = 10.0) -> np.ndarray:
    """Per-centre reward ``assign · (ref − cost)`` over a step's columns, ``(N,)``.

    ``cost = (energy / E_0 + carbon / G_0) / 2 + miss_penalty · missed`` is the env's per-job cost
    (`ErlfcEnv.cost`) and ``ref`` the cost of the job's work on an average server of the default
    federation at its mean intensity; both in units of an average job.
    """
    e0, g0, e_per_s, g_per_s = _scales()
    assign = np.asarray(columns["action.assign"], dtype=np.float64)
    work = np.asarray(columns["state.job_work_s"], dtype=np.float64)
    ref = 0.5 * (work * e_per_s / e0 + work * g_per_s / g0)
    cost = 0.5 * (np.asarray(columns["response.energy_kwh"]) / e0 + np.asarray(columns["response.carbon_kg"]) / g0)
    cost = cost + miss_penalty * np.asarray(columns["response.missed"], dtype=np.float64)
    return assign * (ref - cost)


def centre_rows(env: ErlfcEnv) -> np.ndarray:
    """``(C, P+S)`` raw ``[profile.*, state.*]`` of every centre for the env's current job."""
    fed, job = env.fed, env.job
    now = job.arrival_s
    lo, hi = fed.waits(now)
    e = fed.energy_j
    hour = 2 * np.pi * ((fed.start_hour + now / 3600.0) % 24.0) / 24.0
    rows = []
    for k, c in enumerate(fed.centres):
        rows.append(
            [
                len(c.servers), float(c.speed.mean()), float(np.mean(c.p_peak / c.speed)), float(c.p_idle.mean()),
                c.cooling.cr_air, c.cooling.cr_liquid, float(ENERGY_TYPES.index(c.energy_type)),
                lo[k], hi[k], float(fed.liquid[k]), float(fed.intensity(now, k)), float(e[k] / max(e.sum(), 1e-9)),
                float(job.n_tasks), job.max_task_s, job.total_work_s, job.deadline_s - now, np.sin(hour), np.cos(hour),
            ]
        )
    return np.asarray(rows, dtype=np.float64)


def generate_dag_logs(
    config: ErlfcConfig,
    episodes: int,
    policy: str | Callable[[ErlfcEnv, np.ndarray], int] = "random",
    seed: int = 0,
) -> tuple[pd.DataFrame, TwinSpec]:
    """Run the federation under a logging policy and return ``(log, spec)`` in the contract.

    Args:
        config: the environment (workload variant, centres, carbon source).
        episodes: job streams to log (each ``config.workload.n_jobs`` jobs).
        policy: ``"random"`` (uniform centre: every centre is seen with and without the job),
            ``"round-robin"``, or ``fn(env, obs) -> centre``.
        seed: the same seed gives the same log.
    """
    if int(episodes) < 1:
        raise InputError(f"episodes must be >= 1, got {episodes}", "--episodes")
    if isinstance(policy, str) and policy not in ("random", "round-robin"):
        raise InputError(f"logging policy must be 'random' or 'round-robin', got {policy!r}", "--policy")
    spec = erlfc_spec()
    env = ErlfcEnv(config, seed=seed)
    rng = np.random.default_rng(seed)
    names = [c.name for c in env.fed.centres]
    blocks = []
    for ep in range(int(episodes)):
        obs, _ = env.reset(seed=seed * 1000 + ep)
        done, t = False, 0
        while not done:
            x = centre_rows(env)
            if policy == "random":
                a = int(rng.integers(env.fed.n))
            elif policy == "round-robin":
                a = t % env.fed.n
            else:
                a = int(policy(env, obs))  # type: ignore[operator]
            obs, _, done, _, info = env.step(a)
            p = info["placement"]
            assign = (np.arange(env.fed.n) == a).astype(np.float64)
            resp = np.outer(assign, [p.energy_j / 3.6e6, p.carbon_g / 1000.0, p.wait_s, float(p.missed)])
            blocks.append((ep, t, x, assign, resp))
            t += 1
    n_c = len(names)
    prof = [f"profile.{f[0]}" for f in PROFILE] + [f"state.{f[0]}" for f in STATE]
    x = np.concatenate([b[2] for b in blocks])
    df = pd.DataFrame(x, columns=prof)
    df.insert(0, "episode", np.repeat([f"ep{b[0]}" for b in blocks], n_c))
    df.insert(1, "t", np.repeat([b[1] for b in blocks], n_c).astype(np.int64))
    df.insert(2, "agent", np.tile(names, len(blocks)))
    df.insert(3, "scenario", "datacentre")
    df.insert(4, "site", "federation")
    df["action.assign"] = np.concatenate([b[3] for b in blocks])
    resp = np.concatenate([b[4] for b in blocks])
    for i, f in enumerate(RESPONSE):
        df[f"response.{f[0]}"] = resp[:, i]
    df["reward"] = erlfc_reward({c: df[c].to_numpy() for c in df.columns if "." in c}, config.miss_penalty)
    return df, spec


class TwinScorePolicy:
    """Run a per-centre platform policy (trained in a twin of these logs) on the emulator.

    ``score(rows (C, P+S)) -> (C,)`` is the policy's (unclipped) ``action.assign`` per centre; the
    job goes to the highest-scoring centre (ties to the lowest index).
    """

    def __init__(self, score: Callable[[np.ndarray], np.ndarray]) -> None:
        self.score = score

    def __call__(self, env: ErlfcEnv, obs: np.ndarray) -> int:  # noqa: ARG002
        return int(np.argmax(np.asarray(self.score(centre_rows(env).astype(np.float32))).reshape(-1)))
