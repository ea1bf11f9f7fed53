"""Score a policy on a system (the emulated cluster or a twin): KPIs with their intervals.

A *system* is anything batched over agents with ``reset(seed) -> obs (N, O)`` and
``step(actions (N, A)) -> (obs, reward (N,), done, columns)`` where ``columns`` maps spec column
names to ``(N,)`` arrays for that step (:class:`BatchSystem`). Two adapters are here:
:class:`TwinSystem` (a twin's simulation) and :class:`ArraySystem` (anything that reports a step's
responses and KPIs as arrays in spec order, as the emulated cluster does).

KPIs per episode (seeds 001, 003, 004): return (per agent), offload ratio, revenue, mean / p95 /
p99 completion time (request-weighted), SLO violation rate, energy per request (J), carbon (g and
g/request), Jain's fairness index over agents, utilisation. Which column is which comes from a
:class:`KpiColumns` in the spec's names; a KPI whose column is not given is left out. Episodes use
independent seeds. On a real system (or the emulated cluster) the interval is Student's t over
episodes. On a twin (`evaluate_on_twin`) every ensemble member plays the same episodes, and each
KPI carries the 90 % two-level bootstrap interval over members x episodes that every other number
the twin reports carries (`edgetwin.twin.intervals`), and the share of agent-steps outside the
logs' support.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
from scipy import stats
from tqdm.auto import tqdm

from edgetwin.contract.errors import InputError
from edgetwin.contract.policy import PlatformPolicy
from edgetwin.contract.spec import RewardFn, Role, TwinSpec
from edgetwin.policies.rewards import jain_index


class BatchSystem(Protocol):
    """A system stepped for all agents at once (see the module docstring)."""

    spec: TwinSpec

    def reset(self, seed: int) -> np.ndarray: ...

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool, dict[str, np.ndarray]]: ...


@dataclass(frozen=True)
class KpiColumns:
    """Which spec column holds each quantity (per agent and step); None leaves the KPI out.

    Attributes:
        offload: share of the agent's tasks offloaded. revenue: money per step.
        completion_time: mean completion time of the agent's tasks (any unit; reported as is).
        slo_violation: share of its tasks over the SLO. energy: joules. carbon: grams CO2-eq.
        requests: tasks of the agent in the step, or a rate when ``requests_are_rate`` (times
            ``spec.step_seconds``); weights the completion time and violation rate, divides energy.
        utilisation: in [0, 1]. fairness: per-agent quantity whose Jain index is reported
            (``1 - x`` when ``fairness_one_minus``, e.g. for a violation rate).
    """

    offload: str | None = None
    revenue: str | None = None
    completion_time: str | None = None
    slo_violation: str | None = None
    energy: str | None = None
    carbon: str | None = None
    requests: str | None = None
    requests_are_rate: bool = True
    utilisation: str | None = None
    fairness: str | None = None
    fairness_one_minus: bool = False

    def check(self, spec: TwinSpec) -> None:
        names = {f.name for f in spec.features}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, str) and v not in names:
                raise InputError(f"KPI column {f.name}={v!r} is not a feature of the spec", "--kpis")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> KpiColumns:
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise InputError(
                f"unknown KPI fields {sorted(unknown)}; known: {[f.name for f in fields(cls)]}", "--kpis"
            )
        return cls(**d)


# ------------------------------------------------------------------------------------ systems


class TwinSystem:
    """A twin's `Simulation` as a `BatchSystem` (columns: profile, state, action, outputs)."""

    def __init__(
        self,
        twin: Any,
        n_agents: int | None = None,
        steps: int | None = None,
        stochastic: bool = True,
        member: int | None = None,
        track_support: bool = False,
    ) -> None:
        """``member``: simulate with that ensemble member only (default: the simulation's own
        choice). ``track_support``: count the agent-steps outside the logs' support
        (`out_of_support`)."""
        self.twin = twin
        self.spec = twin.spec
        self.n_agents = n_agents
        self.steps = twin.layout.horizon if steps is None else int(steps)
        self.stochastic = stochastic
        self.member = member
        self.track_support = track_support
        self.sim: Any = None
        self._t = 0
        self._outside = 0.0
        self._rows = 0

    @property
    def agent_steps(self) -> int:
        """Agent-steps simulated since construction (counted with ``track_support``)."""
        return self._rows

    @property
    def out_of_support(self) -> float:
        """Share of the agent-steps simulated since construction outside the logs' support."""
        return self._outside / self._rows if self._rows else 0.0

    def reset(self, seed: int) -> np.ndarray:
        self.sim = self.twin.simulation(
            n_agents=self.n_agents, seed=int(seed), stochastic=self.stochastic, member=self.member
        )
        self._t = 0
        return self.sim.obs().astype(np.float64)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool, dict[str, np.ndarray]]:
        lay = self.sim.layout
        res = self.sim.step(np.asarray(actions, dtype=np.float64), with_disagreement=False)
        cols: dict[str, np.ndarray] = {}
        obs_cols = lay.profile + lay.state
        for j, c in enumerate(obs_cols):
            cols[c] = np.asarray(res.obs[:, j], dtype=np.float64)
        for j, c in enumerate(lay.action):
            cols[c] = res.action[:, j]
        for j, c in enumerate(lay.outputs):
            cols[c] = res.outputs[:, j]
        self._t += 1
        if self.track_support:
            n = len(res.action)
            self._outside += n * self.sim.support_of(pd.DataFrame(cols))["out_of_support"]
            self._rows += n
        return (
            self.sim.obs().astype(np.float64),
            np.asarray(res.reward, dtype=np.float64),
            self._t >= self.steps,
            cols,
        )


class ArraySystem:
    """Wraps ``sim.reset(seed) -> obs`` and ``sim.step(a) -> (obs, reward, done, info)`` whose ``info``
    holds ``responses (N, R)`` and ``kpis (N, K)`` in spec order (the emulated cluster's contract)."""

    def __init__(self, sim: Any, spec: TwinSpec) -> None:
        self.sim = sim
        self.spec = spec
        self._obs: np.ndarray | None = None

    def reset(self, seed: int) -> np.ndarray:
        self._obs = np.asarray(self.sim.reset(seed=int(seed)), dtype=np.float64)
        return self._obs

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool, dict[str, np.ndarray]]:
        assert self._obs is not None, "reset() first"
        spec = self.spec
        obs, reward, done, info = self.sim.step(np.asarray(actions, dtype=np.float64))
        cols = {c: self._obs[:, j] for j, c in enumerate(spec.observation_columns)}
        a = np.asarray(actions, dtype=np.float64)
        cols.update({c: a[:, j] for j, c in enumerate(spec.action_columns)})
        outputs: tuple[tuple[Role, str], ...] = (("response", "responses"), ("kpi", "kpis"))
        for role, key in outputs:
            arr = info.get(key)
            if arr is not None:
                cols.update({c: np.asarray(arr)[:, j] for j, c in enumerate(spec.names(role))})
        self._obs = np.asarray(obs, dtype=np.float64)
        return self._obs, np.asarray(reward, dtype=np.float64), bool(done), cols


# ------------------------------------------------------------------------------------ scoring


def _weighted_quantile(x: np.ndarray, w: np.ndarray, q: float) -> float:
    order = np.argsort(x)
    x, w = x[order], w[order]
    cw = np.cumsum(w)
    if cw[-1] <= 0:
        return float(np.quantile(x, q))
    return float(x[np.searchsorted(cw, q * cw[-1], side="left").clip(0, len(x) - 1)])


def episode_kpis(
    frames: Sequence[Mapping[str, np.ndarray]],
    rewards: Sequence[np.ndarray],
    kpis: KpiColumns,
    step_seconds: float,
) -> dict[str, float]:
    """KPIs of one episode from its steps' columns (each ``(N,)``) and rewards."""
    r = np.stack(rewards)  # (T, N)
    out: dict[str, float] = {"return": float(r.sum(axis=0).mean())}

    def col(name: str | None) -> np.ndarray | None:
        if name is None:
            return None
        return np.stack([np.asarray(f[name], dtype=np.float64) for f in frames])  # (T, N)

    req = col(kpis.requests)
    if req is not None and kpis.requests_are_rate:
        req = req * step_seconds
    w = None if req is None else np.maximum(req, 0.0)
    if (x := col(kpis.offload)) is not None:
        out["offload_ratio"] = float(x.mean())
    if (x := col(kpis.revenue)) is not None:
        out["revenue"] = float(x.sum())
    if (x := col(kpis.completion_time)) is not None:
        ww = np.ones_like(x) if w is None else w
        flat, fw = x.ravel(), ww.ravel()
        out["completion_time_mean"] = (
            float(np.average(flat, weights=fw)) if fw.sum() > 0 else float(flat.mean())
        )
        out["completion_time_p95"] = _weighted_quantile(flat, fw, 0.95)
        out["completion_time_p99"] = _weighted_quantile(flat, fw, 0.99)
    if (x := col(kpis.slo_violation)) is not None:
        out["slo_violation_rate"] = (
            float(np.average(x, weights=w)) if w is not None and w.sum() > 0 else float(x.mean())
        )
    if (x := col(kpis.energy)) is not None:
        out["energy_j"] = float(x.sum())
        if w is not None and w.sum() > 0:
            out["energy_j_per_request"] = float(x.sum() / w.sum())
    if (x := col(kpis.carbon)) is not None:
        out["carbon_g"] = float(x.sum())
        if w is not None and w.sum() > 0:
            out["carbon_g_per_request"] = float(x.sum() / w.sum())
    if (x := col(kpis.utilisation)) is not None:
        out["utilisation"] = float(x.mean())
    if (x := col(kpis.fairness)) is not None:
        per_agent = x.mean(axis=0)
        out["fairness_jain"] = jain_index(1.0 - per_agent if kpis.fairness_one_minus else per_agent)
    return out


#: What a twin's `EvalResult` interval is: the bootstrap over members x episodes, which covers the
#: twin's own mean and not the real system's (no held-out log is replayed here; `edgetwin whatif
#: --log` and `edgetwin train --log` give calibrated ones)
PLAIN_LABEL = "90 % plain bootstrap interval (members x episodes; not calibrated)"


@dataclass
class EvalResult:
    """KPIs over episodes: ``per_episode[k]`` lists values, ``mean``/``ci95`` summarise them.

    On a twin (`evaluate_on_twin`) ``per_member[k]`` holds the ``(M, E)`` values of every member
    on the same ``E`` episodes, ``per_episode[k]`` their mean over members, `interval_90` the 90 %
    two-level bootstrap interval over members x episodes and ``out_of_support`` the share of
    agent-steps outside the logs' support.
    """

    policy: str
    system: str
    episodes: int
    seed: int
    per_episode: dict[str, list[float]] = field(default_factory=dict)
    per_member: dict[str, list[list[float]]] | None = None
    out_of_support: float | None = None

    @property
    def mean(self) -> dict[str, float]:
        return {k: float(np.mean(v)) for k, v in self.per_episode.items()}

    @property
    def interval_90(self) -> dict[str, tuple[float, float]]:
        """90 % interval of each KPI's mean: over members x episodes on a twin (two-level
        bootstrap, `edgetwin.twin.intervals.interval`), Student's t over episodes elsewhere."""
        from edgetwin.twin.intervals import interval

        out: dict[str, tuple[float, float]] = {}
        for k, v in self.per_episode.items():
            if self.per_member is not None and k in self.per_member:
                out[k] = interval(np.asarray(self.per_member[k], dtype=np.float64), None, k, seed=self.seed)
                continue
            m, n = float(np.mean(v)), len(v)
            h = 0.0 if n < 2 else float(stats.t.ppf(0.95, n - 1) * np.std(v, ddof=1) / np.sqrt(n))
            out[k] = (m - h, m + h)
        return out

    @property
    def ci95(self) -> dict[str, float]:
        """Half-width of the 95 % Student-t interval of the mean (0 with one episode)."""
        out = {}
        for k, v in self.per_episode.items():
            n = len(v)
            out[k] = 0.0 if n < 2 else float(stats.t.ppf(0.975, n - 1) * np.std(v, ddof=1) / np.sqrt(n))
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.per_member is None:
            d.pop("per_member")
            d.pop("out_of_support")
        d["mean"], d["ci95"] = self.mean, self.ci95
        d["interval_90"] = {k: list(v) for k, v in self.interval_90.items()}
        if self.per_member is not None:
            d["interval_kind"] = PLAIN_LABEL
            d["calibrated"] = False
        return d

    def table(self) -> str:
        """A Markdown table: ``| KPI | mean | ± 95 % CI |``, or on a twin ``| KPI | mean | 90 % interval |``."""
        m = self.mean
        if self.per_member is None:
            c = self.ci95
            rows = ["| KPI | mean | ± 95 % CI |", "|---|---:|---:|"]
            rows += [f"| {k} | {m[k]:.4g} | {c[k]:.2g} |" for k in self.per_episode]
            return "\n".join(rows)
        iv = self.interval_90
        # never calibrated (no held-out log here): say so where the numbers are printed
        rows = [f"| KPI | mean | {PLAIN_LABEL} |", "|---|---:|---:|"]
        rows += [f"| {k} | {m[k]:.4g} | [{iv[k][0]:.4g}, {iv[k][1]:.4g}] |" for k in self.per_episode]
        return "\n".join(rows)


def episode_seeds(seed: int, episodes: int) -> list[int]:
    """Independent, reproducible per-episode seeds."""
    ss = np.random.SeedSequence(int(seed)).spawn(episodes)
    return [int(s.generate_state(1)[0]) for s in ss]


def evaluate_policy(
    policy: PlatformPolicy,
    system: BatchSystem,
    episodes: int = 5,
    seed: int = 0,
    kpis: KpiColumns | None = None,
    reward: RewardFn | None = None,
    max_steps: int | None = None,
    name: str = "policy",
    system_name: str = "system",
    progress: bool = False,
) -> EvalResult:
    """Run ``policy`` for ``episodes`` independent episodes and collect KPIs.

    Args:
        policy: ``act(obs (N, O)) -> (N, A)``; ``reset()`` is called per episode if it has one.
        system: a :class:`BatchSystem`.
        episodes: number of episodes (seeds drawn from ``seed``).
        kpis: which columns are which (default: only the return).
        reward: score steps with this `RewardFn` instead of the system's own reward.
        max_steps: cap on steps per episode (default: until the system says done).
    """
    if episodes < 1:
        raise InputError(f"episodes must be >= 1, got {episodes}", "--episodes")
    kpis = kpis or KpiColumns()
    kpis.check(system.spec)
    res = EvalResult(policy=name, system=system_name, episodes=episodes, seed=seed)
    for ep_seed in tqdm(
        episode_seeds(seed, episodes), desc=f"evaluate {name}", disable=not progress, leave=False
    ):
        for k, v in run_episode(policy, system, ep_seed, kpis, reward, max_steps).items():
            res.per_episode.setdefault(k, []).append(v)
    return res


def run_episode(
    policy: PlatformPolicy,
    system: BatchSystem,
    seed: int,
    kpis: KpiColumns,
    reward: RewardFn | None = None,
    max_steps: int | None = None,
) -> dict[str, float]:
    """One episode of ``policy`` on ``system`` from ``system.reset(seed)``: its KPIs."""
    if hasattr(policy, "reset"):
        policy.reset()
    obs = system.reset(seed)
    frames, rewards = [], []
    done, t = False, 0
    while not done and (max_steps is None or t < max_steps):
        obs, r, done, cols = system.step(np.asarray(policy.act(obs), dtype=np.float64))
        if reward is not None:
            r = np.asarray(reward(cols), dtype=np.float64)
        frames.append(cols)
        rewards.append(np.asarray(r, dtype=np.float64))
        t += 1
    return episode_kpis(frames, rewards, kpis, float(system.spec.step_seconds))


#: Builds an episode's policy: ``(policy seed, spec) -> PlatformPolicy`` (picklable for a pool).
PolicyMaker = Callable[[int, TwinSpec], PlatformPolicy]
#: Builds a fresh `BatchSystem` for one episode (picklable for a pool).
SystemMaker = Callable[[], BatchSystem]
#: Builds a fresh `TwinSystem` that simulates one ensemble member and counts its agent-steps
#: outside the logs' support (``track_support``), for one episode (picklable for a pool).
MemberSystemMaker = Callable[[int], "TwinSystem"]


def evaluate_episodes(
    make_policy: PolicyMaker,
    make_system: SystemMaker,
    episodes: int = 5,
    seed: int = 0,
    kpis: KpiColumns | None = None,
    reward: RewardFn | None = None,
    max_steps: int | None = None,
    name: str = "policy",
    system_name: str = "system",
    workers: int | None = 1,
    ray_address: str | None = None,
    progress: bool = False,
) -> EvalResult:
    """As `evaluate_policy`, with every episode an independent task: serially (``workers=1``),
    on a local process pool or on Ray (`edgetwin.twin.parallel.run_tasks`), same result.

    An episode gets a fresh system (``make_system()``) reset with its seed (as in
    `evaluate_policy`) and a policy built for it with its own seed derived from that one
    (``make_policy(policy_seed, spec)``), so that a policy that samples (a random baseline)
    does not carry its generator from one episode into the next: where an episode runs does not
    change its numbers.
    """
    from edgetwin.twin.parallel import run_tasks

    if episodes < 1:
        raise InputError(f"episodes must be >= 1, got {episodes}", "--episodes")
    kpis = kpis or KpiColumns()
    seeds = episode_seeds(seed, episodes)
    tasks = [(s, episode_seeds(s, 1)[0]) for s in seeds]  # (system seed, policy seed)
    results = run_tasks(
        _episode_task, tasks, workers=workers, ray_address=ray_address, progress=progress,
        desc=f"evaluate {name}", shared=(make_policy, make_system, kpis, reward, max_steps),
    )  # fmt: skip
    res = EvalResult(policy=name, system=system_name, episodes=episodes, seed=seed)
    for per in results:
        for k, v in per.items():
            res.per_episode.setdefault(k, []).append(v)
    return res


def _episode_task(
    make_policy: PolicyMaker,
    make_system: SystemMaker,
    kpis: KpiColumns,
    reward: RewardFn | None,
    max_steps: int | None,
    system_seed: int,
    policy_seed: int,
) -> dict[str, float]:
    system = make_system()
    kpis.check(system.spec)
    return run_episode(make_policy(policy_seed, system.spec), system, system_seed, kpis, reward, max_steps)


def evaluate_on_twin(
    make_policy: PolicyMaker,
    make_system: MemberSystemMaker,
    members: int,
    episodes: int = 5,
    seed: int = 0,
    kpis: KpiColumns | None = None,
    name: str = "policy",
    workers: int | None = 1,
    ray_address: str | None = None,
    progress: bool = False,
) -> EvalResult:
    """Score a policy in every member of a twin's ensemble on the same ``episodes`` worlds.

    Each (member, episode) is a task (`evaluate_episodes`' rules: serially, on a pool or on Ray,
    same result). The episode's world seed and policy seed are the same for every member, so the
    members' answers are paired, as in a what-if. The result's `EvalResult.interval_90` combines
    what the members disagree on and what varies over episodes; ``out_of_support`` is the share
    of every simulated agent-step outside the logs' support.
    """
    from edgetwin.twin.parallel import run_tasks

    if episodes < 1:
        raise InputError(f"episodes must be >= 1, got {episodes}", "--episodes")
    kpis = kpis or KpiColumns()
    seeds = episode_seeds(seed, episodes)
    tasks = [(m, s, episode_seeds(s, 1)[0]) for m in range(members) for s in seeds]
    results = run_tasks(
        _member_episode_task, tasks, workers=workers, ray_address=ray_address, progress=progress,
        desc=f"evaluate {name} in {members} members", shared=(make_policy, make_system, kpis),
    )  # fmt: skip
    per_member: dict[str, list[list[float]]] = {}
    outside = rows = 0.0
    for j, (per, out, n) in enumerate(results):
        m = j // episodes
        for k, v in per.items():
            lists = per_member.setdefault(k, [[] for _ in range(members)])
            lists[m].append(v)
        outside, rows = outside + out, rows + n
    res = EvalResult(policy=name, system="twin", episodes=episodes, seed=seed, per_member=per_member)
    res.per_episode = {k: [float(x) for x in np.mean(np.asarray(v), axis=0)] for k, v in per_member.items()}
    res.out_of_support = outside / rows if rows else 0.0
    return res


def _member_episode_task(
    make_policy: PolicyMaker,
    make_system: MemberSystemMaker,
    kpis: KpiColumns,
    member: int,
    system_seed: int,
    policy_seed: int,
) -> tuple[dict[str, float], float, int]:
    system = make_system(member)
    kpis.check(system.spec)
    per = run_episode(make_policy(policy_seed, system.spec), system, system_seed, kpis)
    return per, system.out_of_support * system.agent_steps, system.agent_steps


def improvement(policy: EvalResult, baseline: EvalResult, kpi: str = "offload_ratio") -> float:
    """Relative improvement ``(policy - baseline) / |baseline|`` of a KPI's mean (seed 004 Table 2)."""
    b = baseline.mean[kpi]
    return float((policy.mean[kpi] - b) / abs(b)) if b != 0 else float("nan")


def plot_results(
    results: Sequence[EvalResult], path: str | Path, kpis: Sequence[str] | None = None, title: str = ""
) -> Path:
    """Bar charts of the KPIs of several policies, one panel per KPI (PNG): mean ± its 95 % CI, or
    its 90 % interval over members x episodes for a twin's result."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(kpis) if kpis is not None else [k for k in results[0].per_episode]
    cols = min(4, len(keys))
    rows = int(np.ceil(len(keys) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), squeeze=False)
    names = [r.policy for r in results]
    for ax, k in zip(axes.ravel(), keys, strict=False):
        m = np.asarray([r.mean.get(k, np.nan) for r in results])
        # a twin's result: its 90 % interval over members x episodes; elsewhere ± the 95 % Student-t
        lo = [r.interval_90[k][0] if r.per_member is not None and k in r.interval_90 else r.mean.get(k, np.nan) - r.ci95.get(k, 0.0) for r in results]
        hi = [r.interval_90[k][1] if r.per_member is not None and k in r.interval_90 else r.mean.get(k, np.nan) + r.ci95.get(k, 0.0) for r in results]
        err = np.vstack([np.maximum(m - np.asarray(lo), 0.0), np.maximum(np.asarray(hi) - m, 0.0)])
        ax.bar(range(len(results)), m, yerr=err, color="tab:blue", alpha=0.8, capsize=3)
        ax.set_xticks(range(len(results)), names, rotation=45, ha="right", fontsize=7)
        ax.set_title(k, fontsize=9)
    for ax in axes.ravel()[len(keys) :]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = [
    "ArraySystem",
    "BatchSystem",
    "EvalResult",
    "KpiColumns",
    "TwinSystem",
    "episode_kpis",
    "evaluate_episodes",
    "evaluate_on_twin",
    "evaluate_policy",
    "improvement",
    "plot_results",
    "run_episode",
]
