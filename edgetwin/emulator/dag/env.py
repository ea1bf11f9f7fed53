"""Seed 002's ERLFC environment: choose the data centre of each arriving DAG job (Gymnasium).

One step = one job. The agent sees the federation and the job as seed 002's state
``S = (minWT_i, maxWT_i, TE_i, CT_i, TEN, TEM, ET, ER, CNT, CMET)``, with one machine room per
data centre (so a room's ``TE_i`` is its centre's ``TEN``). Per centre ``i``, in this order:

==========  ===================================================================================
min_wait    time until the first of its servers is free, ``/ wait_scale_s``, clipped to [0, 10]
max_wait    time until the last of its servers is free, same scale
energy      its energy so far (``TE_i = TEN``) as a share of the federation's
liquid      cooling method in force (``CT_i``): 1 liquid, 0 air
emissions   its emissions so far (``TEM``) as a share of the federation's
energy_type ``ET`` code / 5 (`ENERGY_TYPES`)
emission    ``ER``: the grid's carbon intensity now, gCO2eq/kWh / 1000
==========  ===================================================================================

then the job: ``CNT`` and ``CMET`` (task count and largest task time) normalised as in seed 002's
eqs. 15-16, by the largest seen so far (1 = never seen this large); beyond seed 002, the time
left to its deadline and its critical path (both ``/ wait_scale_s``; without them no policy can
tell which jobs a queue will make late), and the hour of the day (sin, cos) so that a policy can
anticipate the solar and wind shapes of the carbon series.

The action is the data centre (``Discrete(C)``); HEFT then places the job's subtasks on its
servers (`Federation.place`). The reward is dense and per job:
``-(E / E_0 + G / G_0) / 2 - miss_penalty · missed``, where ``E_0`` is an average job's energy on
the federation's mean server with its mean cooling and ``G_0 = E_0 ×`` the grids' mean intensity
over the year: constants, so an episode's return is minus its total energy and emissions (in
units of an average job) and its deadline misses. Seed 002 instead pays the episode's energy and emission savings over a
round-robin+HEFT run at the end; a per-job reward carries the same signal with less variance,
and the deadline term is ours: without it the cleanest grid wins however long the queue grows
(the issue: "a carbon saving that doubles makespan is not a saving").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import gymnasium as gym
import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.emulator.dag.datacentres import ENERGY_TYPES, DataCentre, Federation, Placement, default_centres
from edgetwin.emulator.dag.jobs import DagJob, JobConfig, critical_path_s, generate_jobs

CENTRE_FEATURES: tuple[str, ...] = ("min_wait", "max_wait", "energy", "liquid", "emissions", "energy_type", "emission")
JOB_FEATURES: tuple[str, ...] = ("cnt", "cmet", "slack", "critical_path", "hour_sin", "hour_cos")


@dataclass(frozen=True)
class Workload:
    """A workload variant: how many jobs, how loaded the federation is, and their shapes.

    Attributes:
        name: label.
        n_jobs: jobs per episode.
        load: offered load = arrival rate × mean job work / total server speed.
        jobs: the DAG generator's settings.
    """

    name: str
    n_jobs: int
    load: float
    jobs: JobConfig = field(default_factory=JobConfig)


#: Three variants, like seed 002's three data sets of growing size: more jobs, more load, and
#: (heavy) larger and deeper DAGs.
WORKLOADS: dict[str, Workload] = {
    "light": Workload("light", 150, 0.2),
    "medium": Workload("medium", 300, 0.35),
    "heavy": Workload("heavy", 500, 0.5, JobConfig(depth_exponent=0.6, extra_parents=1.0)),
}


def arrival_rate(workload: Workload, centres: Sequence[DataCentre]) -> float:
    """Jobs per second that offer ``workload.load`` to the federation's total server speed."""
    capacity = float(sum(c.speed.sum() for c in centres))
    return workload.load * capacity / workload.jobs.mean_work_s()


@dataclass(frozen=True)
class ErlfcConfig:
    """The environment's settings.

    Attributes:
        workload: the variant (`WORKLOADS`).
        centres: the federation (default `default_centres`).
        carbon_source: hourly carbon series (None: built-in real profiles; a directory of the
            Electricity Maps files for the full series).
        miss_penalty: cost of a job that misses its deadline, in average jobs' energy+carbon
            (10: ten average jobs; with 3, PPO and A2C missed 25-34 points more deadlines than round-robin).
        wait_scale_s: waits are divided by this in the observation.
        random_start: start each episode at a random hour of the year (else hour 0).
    """

    workload: Workload = field(default_factory=lambda: WORKLOADS["medium"])
    centres: tuple[DataCentre, ...] = field(default_factory=default_centres)
    carbon_source: Any = None
    miss_penalty: float = 10.0
    wait_scale_s: float = 600.0
    random_start: bool = True

    def with_workload(self, name: str) -> ErlfcConfig:
        if name not in WORKLOADS:
            raise InputError(f"unknown workload {name!r}; expected one of {sorted(WORKLOADS)}", "--workload")
        return replace(self, workload=WORKLOADS[name])


class ErlfcEnv(gym.Env):
    """Data-centre choice per arriving DAG job; HEFT inside the chosen centre (seed 002).

    ``info`` of every step holds the `Placement` (energy J, carbon g, wait, finish, missed); the
    last step's ``info["episode_metrics"]`` has the episode's totals (`episode_metrics`).
    """

    metadata = {"render_modes": []}

    def __init__(self, config: ErlfcConfig | None = None, seed: int = 0) -> None:
        super().__init__()
        self.config = config or ErlfcConfig()
        self.fed = Federation(self.config.centres, carbon_source=self.config.carbon_source)
        c = self.fed.n
        n_obs = c * len(CENTRE_FEATURES) + len(JOB_FEATURES)
        low = np.zeros(n_obs, np.float32)
        low[-2:] = -1.0
        self.observation_space = gym.spaces.Box(low, np.full(n_obs, 10.0, np.float32), (n_obs,), np.float32)
        self.action_space = gym.spaces.Discrete(c)
        self._rate = arrival_rate(self.config.workload, self.fed.centres)
        # Reward scales: an average job on the federation's mean server and cooling, at the mean
        # intensity of its grids over the year (constants, so the episode return is the total).
        w_per_work = float(np.mean(np.concatenate([x.p_peak / x.speed for x in self.fed.centres])))
        cr = float(self.fed.cooling_ratio().mean())
        self.energy_scale_j = self.config.workload.jobs.mean_work_s() * w_per_work * (1.0 + cr)
        mean_ci = float(np.mean([s.hourly.mean() for s in self.fed.carbon]))
        self.carbon_scale_g = self.energy_scale_j / 3.6e6 * mean_ci
        self._seed = seed
        self.jobs: list[DagJob] = []
        self.placements: list[Placement] = []
        self._k = 0
        self._max_cnt = 1.0
        self._max_cmet = 1.0

    # --- episode --------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if seed is None and not self.jobs:
            self.np_random, _ = gym.utils.seeding.np_random(self._seed)
        s = int(self.np_random.integers(2**31))
        wl = self.config.workload
        self.jobs = generate_jobs(wl.n_jobs, self._rate, seed=s, cfg=wl.jobs)
        start = float(self.np_random.integers(0, 364 * 24)) if self.config.random_start else 0.0
        self.fed.reset(start)
        self.placements = []
        self._k = 0
        self._max_cnt = 1.0
        self._max_cmet = 1.0
        return self._obs(), {"job": 0}

    @property
    def job(self) -> DagJob:
        return self.jobs[min(self._k, len(self.jobs) - 1)]

    def _obs(self) -> np.ndarray:
        job = self.job
        now = job.arrival_s
        self._max_cnt = max(self._max_cnt, float(job.n_tasks))
        self._max_cmet = max(self._max_cmet, job.max_task_s)
        lo, hi = self.fed.waits(now)
        scale = self.config.wait_scale_s
        e, g = self.fed.energy_j, self.fed.carbon_g
        ci = np.array([float(self.fed.intensity(now, k)) for k in range(self.fed.n)])
        per = np.stack(
            [
                np.clip(lo / scale, 0, 10),
                np.clip(hi / scale, 0, 10),
                e / max(e.sum(), 1e-9),
                self.fed.liquid.astype(np.float64),
                g / max(g.sum(), 1e-9),
                np.array([ENERGY_TYPES.index(c.energy_type) / (len(ENERGY_TYPES) - 1) for c in self.fed.centres]),
                np.clip(ci / 1000.0, 0, 10),
            ],
            axis=1,
        )
        hour = 2 * np.pi * ((self.fed.start_hour + now / 3600.0) % 24.0) / 24.0
        jobf = [
            job.n_tasks / self._max_cnt,
            job.max_task_s / self._max_cmet,
            min((job.deadline_s - now) / scale, 10.0),
            min(critical_path_s(job.work_s, job.succ) / scale, 10.0),
            np.sin(hour),
            np.cos(hour),
        ]
        return np.concatenate([per.ravel(), jobf]).astype(np.float32)

    def cost(self, p: Placement) -> float:
        """The per-job cost that the reward negates (see the module doc)."""
        e, g = p.energy_j / self.energy_scale_j, p.carbon_g / self.carbon_scale_g
        return 0.5 * (e + g) + self.config.miss_penalty * float(p.missed)

    def step(self, action: int | np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        if not self.jobs:
            raise InputError("call reset() before step()", "ErlfcEnv")
        a = int(np.asarray(action).reshape(-1)[0])
        if not self.action_space.contains(a):
            raise InputError(f"action must be a data centre index 0..{self.fed.n - 1}, got {action!r}", "action")
        job = self.job
        p = self.fed.place(job, a)
        return self._after(job, p, self.cost(p))

    def step_everywhere(self) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Place the current job by HEFT over every centre's servers (the HEFT-everywhere baseline)."""
        job = self.job
        p = self.fed.place_everywhere(job)
        return self._after(job, p, self.cost(p))

    def _after(self, job: DagJob, p: Placement, cost: float) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.placements.append(p)
        self._k += 1
        done = self._k >= len(self.jobs)
        info: dict[str, Any] = {"placement": p, "job": job.job_id}
        if done:
            info["episode_metrics"] = self.episode_metrics()
        return self._obs(), -float(cost), done, False, info

    def episode_metrics(self) -> dict[str, float]:
        """Totals of the placements so far: energy (kWh), carbon (kg), makespan (h), misses, waits."""
        ps = self.placements
        if not ps:
            return {}
        first = self.jobs[0].arrival_s
        return {
            "jobs": float(len(ps)),
            "energy_kwh": float(sum(p.energy_j for p in ps) / 3.6e6),
            "carbon_kg": float(sum(p.carbon_g for p in ps) / 1000.0),
            "makespan_h": float((max(p.finish_s for p in ps) - first) / 3600.0),
            "deadline_miss_rate": float(np.mean([p.missed for p in ps])),
            "mean_wait_s": float(np.mean([p.wait_s for p in ps])),
            "wan_gb": float(sum(p.wan_gb for p in ps)),
        }
