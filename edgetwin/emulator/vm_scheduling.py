"""Seed 000's cloud task-scheduling MDP: a queue of tasks placed one at a time onto a site's VMs.

PFRL-DM (seed 000 §4.1-4.2) is evaluated on its own environment, not on service groups: a cloud
with up to ``L`` VMs of ``d = 2`` resource types (vCPU, memory GB), tasks that arrive over time with
known requests, and a scheduler that at every decision either puts the task at the head of the
waiting queue on one VM or waits. This module is that environment, as a `gymnasium.Env`:

- **State** (eq. 1), all in [-1, 1]: ``S^VM`` the remaining capacity of every VM slot per resource
  (remaining / the largest VM's amount; void slots -1), ``S^vCPU`` the progress of the task on every
  vCPU of every VM slot (0 free, (0, 1] busy, -1 for vCPUs the VM does not have), ``S^Queue`` the
  requests of the first ``Q`` waiting tasks (0 for empty queue positions). Run times are *not* in
  the state (the paper: the agent perceives them through the progress).
- **Action** (eq. 2): ``Discrete(L + 1)``; ``0 … L-1`` a VM slot for the head task, ``L`` = wait
  (the paper's ``-1``).
- **Reward** (eqs. 3-9): a placement earns ``ρ e^{run/res} + (1 - ρ) R_Load`` with ``R_Load = 1``
  when the placement does not worsen the load balance (eq. 4, std of the VMs' remaining shares,
  weighted over resources) and ``Load_c`` (the increase) otherwise, exactly as eq. 8 is written; a
  placement on a VM the task does not fit is denied and costs ``-e^{Σ w_i util_i}`` of that VM
  (eq. 9; a void slot counts as full); waiting while some VM could take the head task costs
  ``wait_penalty`` ("a larger negative constant"); waiting when none can costs nothing.

Time: every decision is one time step (seed 000 Fig. 6 shows the state "at time step 6"): after it,
running tasks progress, finished ones free their vCPUs and memory, and Poisson arrivals join the
queue; an empty queue lets time pass until a task arrives. So at most one task starts per step, and
a denied placement costs a step as well as its penalty. An episode is ``decisions`` scheduling
decisions (a truncation: the system keeps running).

Heterogeneity as in seed 000 Table 3: every site has its own VM fleet (the paper's machine specs
per client) and its own task distribution (a different workload per client), from a real trace
(`edgetwin.emulator.traces`) or one of four built-in archetypes. The arrival rate is set so that the
offered load is ``load`` of the site's vCPUs; where that would need more than ``max_arrivals``
tasks per step (more than one scheduler can start), the run times are stretched instead, so that
the queue stays stable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from edgetwin.contract.errors import InputError

#: seed 000 Table 3: (vCPU, memory GB, count) of each client's VMs, and the client's workload data set
PAPER_CLIENTS: tuple[tuple[tuple[tuple[int, int, int], ...], str], ...] = (
    (((8, 64, 1), (16, 128, 4), (64, 512, 2)), "Google"),
    (((8, 64, 3), (32, 128, 3), (64, 512, 1)), "Alibaba-2017"),
    (((8, 64, 3), (32, 256, 2), (64, 512, 2)), "Alibaba-2018"),
    (((8, 64, 2), (32, 256, 3), (40, 256, 2)), "HPC-KS"),
    (((8, 64, 1), (48, 256, 2), (64, 512, 3)), "HPC-HF"),
    (((16, 128, 1), (32, 256, 3), (40, 256, 3)), "HPC-WZ"),
    (((16, 128, 1), (40, 256, 3), (32, 200, 3)), "KVM-2019"),
    (((16, 128, 4), (64, 512, 1)), "KVM-2020"),
    (((8, 64, 2), (16, 128, 2), (64, 512, 1)), "CERIT-SC"),
    (((8, 128, 2), (16, 128, 4)), "K8S"),
)

#: Built-in task archetypes (lognormal medians and log-sds of vCPU, memory GB, run slots), one per
#: kind of workload in seed 000 §3 (Figs. 2-5: requests and run times differ by data set).
TASK_ARCHETYPES: dict[str, dict[str, tuple[float, float]]] = {
    "web": {"vcpu": (2.0, 0.6), "mem": (6.0, 0.7), "slots": (4.0, 0.8)},  # many small, short tasks
    "batch": {"vcpu": (6.0, 0.5), "mem": (24.0, 0.6), "slots": (10.0, 0.7)},
    "hpc": {"vcpu": (16.0, 0.5), "mem": (48.0, 0.5), "slots": (16.0, 0.6)},  # few large, long jobs
    "vm": {"vcpu": (4.0, 0.8), "mem": (48.0, 0.6), "slots": (12.0, 1.0)},  # memory-heavy, long-tailed
}


@dataclass(frozen=True)
class TaskDistribution:
    """What a site's tasks request and how long they run, as pools of values sampled independently.

    Attributes:
        name: a label (archetype or trace).
        vcpu: (n,) whole vCPUs requested per task, >= 1.
        mem_gb: (n,) memory requested per task, GB, > 0.
        slots: (n,) run time in time slots, >= 1.
    """

    name: str
    vcpu: np.ndarray
    mem_gb: np.ndarray
    slots: np.ndarray

    @classmethod
    def archetype(cls, name: str, seed: int = 0, n: int = 20_000) -> TaskDistribution:
        """One of `TASK_ARCHETYPES` as a pool of ``n`` draws."""
        if name not in TASK_ARCHETYPES:
            raise InputError(f"unknown task archetype {name!r}; known: {sorted(TASK_ARCHETYPES)}", where="tasks")
        rng = np.random.default_rng(seed)
        a = TASK_ARCHETYPES[name]

        def draw(key: str) -> np.ndarray:
            median, sd = a[key]
            return median * np.exp(sd * rng.standard_normal(n))

        return cls(name, np.maximum(1, np.round(draw("vcpu"))), draw("mem"), np.maximum(1, np.round(draw("slots"))))

    @classmethod
    def from_trace(
        cls, trace: Any, fallback: str = "batch", medians: tuple[float, float, float] = (4.0, 16.0, 8.0), seed: int = 0
    ) -> TaskDistribution:
        """The shapes of a real trace (a `TraceSample`), rescaled to this environment's units.

        Each column keeps the trace's distribution shape (values divided by the trace's median) and is
        put at ``medians`` (vCPU, memory GB, slots); a column the trace lacks comes from the
        ``fallback`` archetype. The trace's columns are not row-aligned in every format, so they are
        resampled independently (the joint shape is lost; the marginals are the trace's).
        """
        base = cls.archetype(fallback, seed=seed)

        def shape(x: np.ndarray | None, median: float, default: np.ndarray) -> np.ndarray:
            if x is None:
                return default
            x = np.asarray(x, np.float64)
            x = x[np.isfinite(x) & (x > 0)]
            if x.size < 10:
                return default
            return x / np.median(x) * median

        vcpu = shape(trace.cpu, medians[0], base.vcpu)
        mem = shape(trace.memory, medians[1], base.mem_gb)
        slots = shape(trace.durations_s, medians[2], base.slots)
        return cls(
            str(trace.name),
            np.maximum(1, np.round(vcpu)),
            np.maximum(0.25, mem),
            np.maximum(1, np.round(np.minimum(slots, 50 * medians[2]))),
        )

    def sample(self, rng: np.random.Generator, fleet: VMFleet) -> tuple[int, float, int]:
        """One task ``(vcpu, mem_gb, slots)`` that fits the fleet's largest VM."""
        v = int(min(self.vcpu[rng.integers(len(self.vcpu))], fleet.vcpu.max()))
        m = float(min(self.mem_gb[rng.integers(len(self.mem_gb))], fleet.mem_gb.max()))
        s = int(self.slots[rng.integers(len(self.slots))])
        return v, m, s

    def mean_work(self, fleet: VMFleet) -> float:
        """Mean vCPU-slots of a task (what sets the arrival rate for a load)."""
        return float(np.mean(np.minimum(self.vcpu, fleet.vcpu.max())) * np.mean(self.slots))


@dataclass(frozen=True)
class VMFleet:
    """A site's VMs: ``vcpu (n,)`` and ``mem_gb (n,)``, one entry per VM."""

    vcpu: np.ndarray
    mem_gb: np.ndarray

    @classmethod
    def from_specs(cls, specs: Sequence[tuple[int, float, int]]) -> VMFleet:
        """From ``(vCPU, memory GB, count)`` rows as in seed 000 Table 3."""
        rows = [(int(c), float(m)) for c, m, k in specs for _ in range(int(k))]
        if not rows or any(c < 1 or m <= 0 for c, m in rows):
            raise InputError(f"a fleet needs VMs with >= 1 vCPU and > 0 GB, got {list(specs)}", where="vms")
        return cls(np.array([r[0] for r in rows], np.int64), np.array([r[1] for r in rows], np.float64))

    def __len__(self) -> int:
        return len(self.vcpu)


@dataclass
class VMSchedulingConfig:
    """One site's scheduling system.

    Attributes:
        fleet: its VMs.
        tasks: its workload.
        load: offered load, mean busy vCPUs / total vCPUs (sets the Poisson arrival rate).
        decisions: scheduling decisions per episode.
        max_vms: ``L``, VM slots in the observation and action (the same at every site so that
            federated models fit; a fleet smaller than this leaves void slots).
        max_vcpu, max_mem_gb: ``U^vcpu``, ``U^mem`` (the observation's scale).
        queue_len: ``Q``, waiting tasks shown.
        rho: ``ρ`` of eq. 6.
        weights: ``w_i`` of eqs. 4 and 9 (vCPU, memory).
        wait_penalty: cost of waiting while a VM could take the head task.
        max_arrivals: the most tasks per step the arrival rate may need (the run times of ``tasks``
            are stretched to reach ``load`` below it).
    """

    fleet: VMFleet
    tasks: TaskDistribution
    load: float = 0.85
    decisions: int = 256
    max_vms: int = 8
    max_vcpu: int = 64
    max_mem_gb: float = 512.0
    queue_len: int = 5
    rho: float = 0.5
    weights: tuple[float, float] = (0.5, 0.5)
    wait_penalty: float = 3.0
    max_arrivals: float = 0.6
    name: str = "site"
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        f = self.fleet
        if len(f) > self.max_vms:
            raise InputError(f"{len(f)} VMs but max_vms={self.max_vms}", where=f"site {self.name}")
        if f.vcpu.max() > self.max_vcpu or f.mem_gb.max() > self.max_mem_gb:
            raise InputError(
                f"a VM exceeds max_vcpu={self.max_vcpu} / max_mem_gb={self.max_mem_gb}", where=f"site {self.name}"
            )
        if not 0.0 < self.load < 2.0 or self.decisions < 1 or self.queue_len < 1 or not 0.0 <= self.rho <= 1.0:
            raise InputError(
                f"need 0 < load < 2, decisions >= 1, queue_len >= 1, 0 <= rho <= 1; got load={self.load}, "
                f"decisions={self.decisions}, queue_len={self.queue_len}, rho={self.rho}",
                where=f"site {self.name}",
            )
        stretch = self.load * float(f.vcpu.sum()) / self.tasks.mean_work(f) / self.max_arrivals
        if stretch > 1.0:
            t = self.tasks
            self.tasks = TaskDistribution(t.name, t.vcpu, t.mem_gb, np.round(t.slots * stretch))
            self.meta["run_time_stretch"] = stretch

    @property
    def arrival_rate(self) -> float:
        """Mean task arrivals per slot."""
        return self.load * float(self.fleet.vcpu.sum()) / self.tasks.mean_work(self.fleet)


class VMSchedulingEnv(gym.Env):
    """Seed 000's task-scheduling MDP for one site (see the module docstring).

    Observation ``(L·2 + L·U^vcpu + Q·2,)`` float32 in [-1, 1]; action ``Discrete(L + 1)``.
    ``info`` after a step: ``placed`` (bool), ``response_slots`` (of the placed task, else nan),
    ``denied`` (bool), ``slot`` (the clock).
    """

    metadata = {"render_modes": []}  # noqa: RUF012 - gymnasium's convention

    def __init__(self, config: VMSchedulingConfig) -> None:
        super().__init__()
        self.config = c = config
        L, U, Q = c.max_vms, c.max_vcpu, c.queue_len
        self.n_vms = len(c.fleet)
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2 * L + L * U + 2 * Q,), np.float32)
        self.action_space = gym.spaces.Discrete(L + 1)
        self.wait_action = L
        self._w = np.asarray(c.weights, np.float64)
        self._cap = np.stack([c.fleet.vcpu.astype(np.float64), c.fleet.mem_gb], axis=1)  # (n, 2)
        self._rng = np.random.default_rng()

    # --- state ------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._rng = self.np_random
        n, U = self.n_vms, self.config.max_vcpu
        self.free = self._cap.copy()  # (n, 2) remaining vCPU, GB
        self.cores = np.full((n, U), -1.0)  # progress per vCPU; -1 = the VM has no such vCPU
        for i, v in enumerate(self.config.fleet.vcpu):
            self.cores[i, :v] = 0.0
        self.running: list[list[Any]] = []  # [vm, core indices, mem, slots, done slots]
        self.queue: list[tuple[int, float, int, int]] = []  # (vcpu, mem, slots, arrival slot)
        self.slot, self.decided = 0, 0
        self.responses: list[float] = []
        self.util_sum, self.bal_sum, self.slots_seen = 0.0, 0.0, 0
        self._arrive()
        self._until_work()
        return self._obs(), {"slot": self.slot}

    def _arrive(self) -> None:
        for _ in range(int(self._rng.poisson(self.config.arrival_rate))):
            v, m, s = self.config.tasks.sample(self._rng, self.config.fleet)
            self.queue.append((v, m, s, self.slot))

    def _advance(self) -> None:
        """One time slot: tasks progress, finished ones free their resources, new tasks arrive."""
        self.util_sum += float(self._utilisation().mean())
        self.bal_sum += self._load_balance(self.free)
        self.slots_seen += 1
        still = []
        for task in self.running:
            vm, cores, mem, slots, done = task
            done += 1
            if done >= slots:
                self.cores[vm, cores] = 0.0
                self.free[vm] += (len(cores), mem)
            else:
                task[4] = done
                self.cores[vm, cores] = done / slots
                still.append(task)
        self.running = still
        self.slot += 1
        self._arrive()

    def _until_work(self) -> None:
        # an empty queue has nothing to decide: let time pass (bounded: arrivals are Poisson > 0)
        for _ in range(10_000):
            if self.queue:
                return
            self._advance()
        raise RuntimeError("no task arrived in 10,000 slots: arrival rate is ~0")

    def _utilisation(self) -> np.ndarray:
        """(n,) weighted used share per VM."""
        return ((1.0 - self.free / self._cap) * self._w).sum(axis=1)

    def _load_balance(self, free: np.ndarray) -> float:
        """Eq. 4: weighted std over VMs of the remaining share per resource."""
        share = free / self._cap
        return float((self._w * share.std(axis=0)).sum())

    def fits(self, vm: int) -> bool:
        """Whether the head task fits VM slot ``vm`` now."""
        if not self.queue or vm >= self.n_vms:
            return False
        v, m, _, _ = self.queue[0]
        return bool(self.free[vm, 0] >= v and self.free[vm, 1] >= m - 1e-9)

    def action_masks(self) -> np.ndarray:
        """``(L + 1,)`` bool: the VM slots the head task fits, and wait (for MaskablePPO / heuristics)."""
        mask = np.zeros(self.config.max_vms + 1, bool)
        for i in range(self.n_vms):
            mask[i] = self.fits(i)
        mask[-1] = True
        return mask

    def _obs(self) -> np.ndarray:
        c = self.config
        L, Q = c.max_vms, c.queue_len
        vm = -np.ones((L, 2))
        vm[: self.n_vms] = self.free / np.array([c.max_vcpu, c.max_mem_gb])
        cores = -np.ones((L, c.max_vcpu))
        cores[: self.n_vms] = self.cores
        q = np.zeros((Q, 2))
        for i, (v, m, _, _) in enumerate(self.queue[:Q]):
            q[i] = (v / c.max_vcpu, m / c.max_mem_gb)
        return np.concatenate([vm.ravel(), cores.ravel(), q.ravel()]).astype(np.float32)

    # --- dynamics -----------------------------------------------------------------------------------
    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        a = int(action)
        if not 0 <= a <= self.wait_action:
            raise InputError(f"action {a} outside 0..{self.wait_action}", where="VMSchedulingEnv.step")
        c = self.config
        info: dict[str, Any] = {"placed": False, "denied": False, "response_slots": float("nan")}
        if a == self.wait_action:
            reward = -c.wait_penalty if any(self.fits(i) for i in range(self.n_vms)) else 0.0
        elif not self.fits(a):
            # eq. 9: denied, penalised by the VM's utilisation (a void slot counts as full)
            util = float(self._utilisation()[a]) if a < self.n_vms else float(self._w.sum())
            reward = -float(np.exp(util))
            info["denied"] = True
        else:
            v, m, slots, arrived = self.queue.pop(0)
            before = self._load_balance(self.free)
            self.free[a] -= (v, m)
            cores = np.flatnonzero(self.cores[a] == 0.0)[:v]
            self.cores[a, cores] = 1e-6  # busy, no progress yet
            self.running.append([a, cores, m, slots, 0])
            wait = self.slot - arrived
            response = slots + wait  # eq. 3, in slots
            load_c = self._load_balance(self.free) - before
            r_load = 1.0 if load_c <= 0 else load_c  # eq. 8 as written
            reward = c.rho * float(np.exp(slots / response)) + (1.0 - c.rho) * r_load  # eqs. 6-7
            self.responses.append(float(response))
            info.update(placed=True, response_slots=float(response))
        self._advance()
        self._until_work()
        self.decided += 1
        info["slot"] = self.slot
        truncated = self.decided >= c.decisions
        return self._obs(), float(reward), False, truncated, info

    def metrics(self) -> dict[str, float]:
        """Seed 000's metrics of the episode so far: mean response (slots, eq. 23), utilisation (eq. 24),
        load balance (eq. 25), tasks placed, tasks still waiting."""
        n = max(self.slots_seen, 1)
        return {
            "response_slots": float(np.mean(self.responses)) if self.responses else float("nan"),
            "utilisation": self.util_sum / n,
            "load_balance": self.bal_sum / n,
            "placed": float(len(self.responses)),
            "waiting": float(len(self.queue)),
        }


# ------------------------------------------------------------------------------------- heuristics
def first_fit(env: VMSchedulingEnv) -> int:
    """The first VM slot the head task fits, else wait."""
    mask = env.action_masks()
    return int(np.flatnonzero(mask)[0])


def least_loaded(env: VMSchedulingEnv) -> int:
    """The fitting VM with the most remaining weighted capacity share (balances load), else wait."""
    mask = env.action_masks()[:-1]
    if not mask.any():
        return env.wait_action
    share = ((env.free / env._cap) * env._w).sum(axis=1)
    return int(np.flatnonzero(mask)[np.argmax(share[mask[: env.n_vms]])])


# ---------------------------------------------------------------------------------------- sites
def vm_sites(
    n: int,
    seed: int = 0,
    traces: Sequence[str] | None = None,
    load: float = 0.85,
    decisions: int = 256,
) -> list[VMSchedulingConfig]:
    """``n`` heterogeneous sites: client ``i`` of seed 000 Table 3 (cycling) for the VMs, and a
    workload per site (the ``i``-th of ``traces`` round-robin, else the ``i``-th built-in archetype).
    """
    from edgetwin.emulator.traces import read_trace

    if n < 1:
        raise InputError(f"need at least one site, got {n}", where="--sites")
    archetypes = list(TASK_ARCHETYPES)
    max_vms = max(sum(k for _, _, k in PAPER_CLIENTS[i % len(PAPER_CLIENTS)][0]) for i in range(n))
    out = []
    for i in range(n):
        specs, dataset = PAPER_CLIENTS[i % len(PAPER_CLIENTS)]
        arche = archetypes[i % len(archetypes)]
        if traces:
            path = traces[i % len(traces)]
            tasks = TaskDistribution.from_trace(read_trace(path), fallback=arche, seed=seed + i)
        else:
            tasks = TaskDistribution.archetype(arche, seed=seed + i)
        out.append(
            VMSchedulingConfig(
                fleet=VMFleet.from_specs(specs),
                tasks=tasks,
                load=load,
                decisions=decisions,
                max_vms=max_vms,
                name=f"site-{i}",
                meta={"paper_client": i % len(PAPER_CLIENTS) + 1, "paper_dataset": dataset},
            )
        )
    return out
