"""DAG jobs with the shapes of Alibaba's batch workload (cluster-trace-v2017 ``batch_task``).

Seed 002 (ERLFC) schedules DAG jobs: each job is a set of subtasks with precedence constraints, and
the whole job goes to one data centre. This module generates such jobs.

What comes from the real trace (fitted once from ``../shared/data/Workload-Prediction-of-Alibaba-
Cluster-Dataset/batch_task.csv``: 80,553 tasks of 12,951 jobs; `fit_from_batch_task` recomputes
these numbers from the file when it is there, and ``tests/test_erlfc.py`` checks they agree):

* the number of tasks per job: the empirical distribution for 1..30 tasks (`TASK_COUNT_PMF`;
  0.83 % of jobs have more, a tail drawn uniformly in 31..156, the trace's maximum);
* task run times (``end - create`` of Terminated tasks, seconds): log-normal with the trace's
  mean log duration (3.58, i.e. a median of ~36 s) and its spread split into a per-job part (jobs
  differ: 1.35) and a within-job part (1.22, the trace's mean within-job std of log duration),
  clipped at the trace's 99.9th percentile (8,064 s);
* the arrival rate is not taken from the trace: the workload variants set it to reach a target load.

What does **not** come from it: the v2017 ``batch_task`` table has no dependency column (the v2018
trace encodes them in task names, but its ``batch_task`` is not in ``../shared/data``). Fan-in and
fan-out are therefore a shipped *layered* generator, not fitted: tasks are spread over
``≈ n^depth_exponent`` levels (map → reduce → join stages), each task of a level depends on
``1 + Poisson(extra_parents)`` tasks of the level before, and every task that would be a sink
before the last level feeds one task of the next level. Data moved along an edge (for WAN transfer
between data centres) is log-normal around ``edge_gb_median`` GB.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgetwin.contract.errors import InputError

#: P(job has k tasks), k = 1..30, from Alibaba v2017 batch_task (jobs grouped by job_id).
TASK_COUNT_PMF: tuple[float, ...] = (
    0.2367, 0.101, 0.0622, 0.0694, 0.1014, 0.0503, 0.0831, 0.0394, 0.0234, 0.0193,
    0.0896, 0.0332, 0.009, 0.008, 0.0223, 0.0129, 0.0045, 0.0031, 0.004, 0.0021,
    0.0043, 0.0035, 0.002, 0.0008, 0.0005, 0.0012, 0.0018, 0.001, 0.0009, 0.0007,
)
#: Share of jobs with more than 30 tasks, and the trace's largest job.
TAIL_SHARE, MAX_TASKS = 0.00834, 156
#: log-normal task run time (s): mean of ln(duration), per-job and within-job std, clip (p99.9).
LOG_DURATION_MEAN, LOG_DURATION_JOB_STD, LOG_DURATION_TASK_STD, DURATION_CLIP_S = 3.58, 1.35, 1.22, 8064.0


@dataclass(frozen=True)
class DagJob:
    """One DAG job.

    Attributes:
        job_id: its index in the stream.
        arrival_s: arrival time (s from the stream's start).
        work_s: (n,) run time of each task on a reference server (speed 1.0), seconds.
        succ: successors of each task (edges i -> j).
        edge_gb: {(i, j): GB} data sent along each edge (matters only between data centres).
        deadline_s: absolute deadline (s): arrival + slack x critical path at speed 1.
    """

    job_id: int
    arrival_s: float
    work_s: np.ndarray
    succ: tuple[tuple[int, ...], ...]
    edge_gb: dict[tuple[int, int], float]
    deadline_s: float

    @property
    def n_tasks(self) -> int:
        return len(self.work_s)

    @property
    def max_task_s(self) -> float:
        """The largest subtask's run time (seed 002's CMET), s at speed 1."""
        return float(self.work_s.max())

    @property
    def total_work_s(self) -> float:
        return float(self.work_s.sum())


def critical_path_s(work_s: np.ndarray, succ: tuple[tuple[int, ...], ...] | list[list[int]]) -> float:
    """Length of the longest path (s) through the DAG, task run times only (tasks are topo-ordered)."""
    n = len(work_s)
    longest = np.asarray(work_s, dtype=np.float64).copy()
    for i in range(n - 1, -1, -1):
        if succ[i]:
            longest[i] = work_s[i] + max(longest[j] for j in succ[i])
    return float(longest.max()) if n else 0.0


@dataclass(frozen=True)
class JobConfig:
    """How jobs are drawn.

    Attributes:
        task_count_pmf: P(k tasks) for k = 1..len (default: Alibaba v2017).
        tail_share: share of jobs above len(task_count_pmf) tasks (uniform up to ``max_tasks``).
        max_tasks: the largest job.
        log_mean, log_job_std, log_task_std, clip_s: the run-time model (see the module doc).
        duration_scale: multiply every run time (a workload variant knob).
        depth_exponent: levels ≈ n ** depth_exponent (0: all parallel, 1: a chain).
        extra_parents: mean extra parents beyond the first (fan-in - 1).
        edge_gb_median: median data per edge (GB), log-normal with sigma 1.
        slack: (low, high) deadline slack over the critical path, uniform.
    """

    task_count_pmf: tuple[float, ...] = TASK_COUNT_PMF
    tail_share: float = TAIL_SHARE
    max_tasks: int = MAX_TASKS
    log_mean: float = LOG_DURATION_MEAN
    log_job_std: float = LOG_DURATION_JOB_STD
    log_task_std: float = LOG_DURATION_TASK_STD
    clip_s: float = DURATION_CLIP_S
    duration_scale: float = 1.0
    depth_exponent: float = 0.5
    extra_parents: float = 0.6
    edge_gb_median: float = 0.2
    slack: tuple[float, float] = (2.0, 4.0)

    def mean_work_s(self, samples: int = 20000, seed: int = 12345) -> float:
        """Mean total work of a job (s at speed 1), by Monte Carlo (sizes the arrival rate)."""
        rng = np.random.default_rng(seed)
        n = _task_counts(rng, self, samples)
        mu = self.log_mean + self.log_job_std * rng.standard_normal(samples)
        per_task = np.exp(mu + 0.5 * self.log_task_std**2)
        return float(np.mean(n * np.minimum(per_task, self.clip_s)) * self.duration_scale)


def _task_counts(rng: np.random.Generator, cfg: JobConfig, size: int) -> np.ndarray:
    pmf = np.asarray(cfg.task_count_pmf, dtype=np.float64)
    pmf = pmf / pmf.sum() * (1.0 - cfg.tail_share)
    k = len(pmf)
    draw = rng.choice(np.arange(1, k + 2), size=size, p=np.append(pmf, cfg.tail_share))
    tail = draw == k + 1
    draw[tail] = rng.integers(k + 1, max(cfg.max_tasks, k + 1) + 1, size=int(tail.sum()))
    return draw


def _layered_dag(rng: np.random.Generator, n: int, cfg: JobConfig) -> tuple[tuple[int, ...], ...]:
    levels = max(1, min(n, int(round(n ** cfg.depth_exponent))))
    # Every level gets at least one task; the rest are spread at random. Tasks are numbered level
    # by level, so the numbering is a topological order.
    sizes = np.ones(levels, dtype=np.int64) + np.bincount(rng.integers(0, levels, n - levels), minlength=levels)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    succ: list[set[int]] = [set() for _ in range(n)]
    for lv in range(1, levels):
        prev = np.arange(bounds[lv - 1], bounds[lv])
        for j in range(bounds[lv], bounds[lv + 1]):
            k = min(len(prev), 1 + int(rng.poisson(cfg.extra_parents)))
            for i in rng.choice(prev, size=k, replace=False):
                succ[int(i)].add(j)
        for i in prev:
            if not succ[int(i)]:
                succ[int(i)].add(int(rng.integers(bounds[lv], bounds[lv + 1])))
    return tuple(tuple(sorted(s)) for s in succ)


def generate_jobs(n_jobs: int, rate_per_s: float, seed: int, cfg: JobConfig | None = None) -> list[DagJob]:
    """A stream of ``n_jobs`` DAG jobs with Poisson arrivals at ``rate_per_s``.

    The same seed gives the same jobs.
    """
    if n_jobs < 1:
        raise InputError(f"n_jobs must be >= 1, got {n_jobs}", "n_jobs")
    if not rate_per_s > 0:
        raise InputError(f"the arrival rate must be > 0, got {rate_per_s}", "rate_per_s")
    cfg = cfg or JobConfig()
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, n_jobs))
    counts = _task_counts(rng, cfg, n_jobs)
    jobs = []
    for j in range(n_jobs):
        n = int(counts[j])
        mu = cfg.log_mean + cfg.log_job_std * rng.standard_normal()
        work = np.minimum(np.exp(mu + cfg.log_task_std * rng.standard_normal(n)), cfg.clip_s) * cfg.duration_scale
        work = np.maximum(work, 1.0)
        succ = _layered_dag(rng, n, cfg)
        edges = [(i, k) for i in range(n) for k in succ[i]]
        gb = cfg.edge_gb_median * np.exp(rng.standard_normal(len(edges)))
        slack = rng.uniform(*cfg.slack)
        cp = critical_path_s(work, succ)
        jobs.append(
            DagJob(
                job_id=j,
                arrival_s=float(arrivals[j]),
                work_s=work,
                succ=succ,
                edge_gb={e: float(g) for e, g in zip(edges, gb, strict=True)},
                deadline_s=float(arrivals[j] + slack * cp),
            )
        )
    return jobs


def fit_from_batch_task(path: str | Path) -> dict[str, float | list[float]]:
    """Recompute the fitted numbers of this module from an Alibaba v2017 ``batch_task`` file.

    Returns ``task_count_pmf`` (k = 1..30), ``tail_share``, ``max_tasks``, ``log_mean``,
    ``log_total_std``, ``log_task_std`` (mean within-job std) and ``p999_s``.
    """
    import pandas as pd

    from edgetwin.emulator.traces import ALIBABA_BATCH_TASK_COLUMNS, read_alibaba_batch_task

    sample = read_alibaba_batch_task(path)  # validates the file (clear errors on bad rows)
    df = pd.read_csv(path, skipinitialspace=True, usecols=list(range(8)), header=0, names=ALIBABA_BATCH_TASK_COLUMNS)
    counts = df.groupby("job_id").size()
    pmf = counts.value_counts(normalize=True).sort_index()
    done = df[df["status"].astype(str).str.strip() == "Terminated"]
    dur = (done["task_end_time"] - done["task_create_time"]).astype(float)
    keep = dur > 0
    logd = np.log(dur[keep])
    within = logd.groupby(done.loc[keep, "job_id"]).var().dropna()
    assert sample.durations_s is not None
    return {
        "task_count_pmf": [float(pmf.get(k, 0.0)) for k in range(1, 31)],
        "tail_share": float((counts > 30).mean()),
        "max_tasks": float(counts.max()),
        "log_mean": float(logd.mean()),
        "log_total_std": float(logd.std()),
        "log_task_std": float(np.sqrt(within.mean())),
        "p999_s": float(np.quantile(sample.durations_s, 0.999)),
    }
