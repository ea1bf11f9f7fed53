"""HEFT: Heterogeneous Earliest Finish Time list scheduling (Topcuoglu, Hariri & Wu, IEEE TPDS 2002).

Seed 002 (ERLFC) places the subtasks of a DAG job on the servers of the data centre its agent
chose with HEFT. This module is HEFT as the paper defines it, on its own:

1. **upward rank** (paper eq. 8): ``rank_u(i) = w̄_i + max_{j ∈ succ(i)} (c̄_ij + rank_u(j))``,
   where ``w̄_i`` is task i's mean computation cost over the processors and ``c̄_ij`` the mean
   communication cost of edge (i, j) (0 between two tasks on the same processor);
2. tasks in decreasing ``rank_u`` (a topological order); ties keep the lower task index first
   among the tasks whose predecessors are placed (`priority_order`; the graph is checked to be a
   DAG by `topological_order`);
3. each task goes to the processor that gives it the **earliest finish time**, with the
   insertion-based policy: it may start in an idle gap between two tasks already placed there
   when the gap is long enough (paper eqs. 3-4).

Extensions used by the emulator, both of which reduce to the paper's algorithm at their defaults:
``ready`` (a processor cannot start before this time: it is busy with earlier jobs) and ``release``
(no task of this DAG starts before its arrival). Communication is a matrix ``comm[i, j]`` of mean
costs (paper) or, via ``comm_fn``, a cost that depends on the pair of processors (e.g. 0 inside a
data centre and a WAN transfer between two).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from graphlib import CycleError, TopologicalSorter

import numpy as np

from edgetwin.contract.errors import InputError

#: comm_fn(i, j, p, q) -> time to send task i's output to task j when i ran on p and j runs on q.
CommFn = Callable[[int, int, int, int], float]


@dataclass(frozen=True)
class HeftSchedule:
    """A HEFT schedule of one DAG.

    Attributes:
        proc: (n,) processor of each task.
        start: (n,) start time of each task.
        finish: (n,) finish time of each task.
        order: the task order HEFT used (decreasing upward rank).
        rank_u: (n,) upward ranks.
    """

    proc: np.ndarray
    start: np.ndarray
    finish: np.ndarray
    order: tuple[int, ...]
    rank_u: np.ndarray

    @property
    def makespan(self) -> float:
        """Finish of the last task (the paper's schedule length when release = ready = 0)."""
        return float(self.finish.max()) if len(self.finish) else 0.0


def _check(cost: np.ndarray, succ: Sequence[Sequence[int]]) -> None:
    if cost.ndim != 2 or cost.shape[0] != len(succ) or cost.shape[1] < 1:
        raise InputError(f"cost must be (tasks, processors) with one row per task, got {cost.shape}", "heft")
    if not np.isfinite(cost).all() or (cost < 0).any():
        raise InputError("computation costs must be finite and >= 0", "heft")


def topological_order(succ: Sequence[Sequence[int]]) -> list[int]:
    """The tasks in an order where every edge ``i -> j`` has ``i`` before ``j``.

    `graphlib.TopologicalSorter` (the standard library's, Kahn's algorithm): it decides a cycle
    from the graph alone. (The depth-first walk it replaces called a stack longer than ``2n`` a
    cycle, which a complete 6-task DAG listed in descending order reaches without one.)

    Raises:
        InputError: a successor that is not a task, or a cycle (named by its tasks).
    """
    n = len(succ)
    graph: TopologicalSorter[int] = TopologicalSorter()
    for i, js in enumerate(succ):
        graph.add(i)
        for j in js:
            if not (isinstance(j, int | np.integer) and 0 <= j < n):
                raise InputError(f"task {i} has successor {j!r}, which is not a task 0..{n - 1}", "heft")
            graph.add(int(j), i)
    try:
        return list(graph.static_order())
    except CycleError as e:
        raise InputError(f"the task graph has a cycle (not a DAG): {' -> '.join(map(str, e.args[1]))}", "heft") from None


def priority_order(rank: np.ndarray, succ: Sequence[Sequence[int]], pred: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """HEFT's task order: decreasing upward rank, ties to the lower index, among the tasks whose
    predecessors are all placed.

    With positive costs a task's rank exceeds each successor's, so this is the paper's plain sort
    by rank. A zero-cost task ties with its successor, and the plain sort could put the
    successor first (a later index wins no tie); picking only among ready tasks keeps the order
    topological and otherwise changes nothing (the sorted order, when topological, is what this
    picks step by step).
    """
    key = [(-round(float(r), 9), i) for i, r in enumerate(rank)]
    waiting = [len(p) for p in pred]
    ready = [key[i] for i in range(len(rank)) if waiting[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for j in succ[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, key[j])
    return tuple(order)


def upward_ranks(cost: np.ndarray, succ: Sequence[Sequence[int]], comm_mean: np.ndarray | None = None) -> np.ndarray:
    """Upward rank of every task (paper eq. 8), ``(n,)``.

    Args:
        cost: (n, P) computation cost of task i on processor p.
        succ: successors of each task (the DAG's edges i -> j).
        comm_mean: (n, n) mean communication cost of edge (i, j); None = no communication.
    """
    cost = np.asarray(cost, dtype=np.float64)
    _check(cost, succ)
    w_mean = cost.mean(axis=1)
    rank = np.zeros(len(succ))
    # successors before their predecessors: a task's rank needs its successors' ranks
    for i in reversed(topological_order(succ)):
        tail = max((rank[j] + (comm_mean[i, j] if comm_mean is not None else 0.0) for j in succ[i]), default=0.0)
        rank[i] = w_mean[i] + tail
    return rank


def heft(
    cost: np.ndarray,
    succ: Sequence[Sequence[int]],
    comm: np.ndarray | None = None,
    comm_fn: CommFn | None = None,
    ready: np.ndarray | None = None,
    release: float = 0.0,
    insertion: bool = True,
    comm_mean: np.ndarray | None = None,
) -> HeftSchedule:
    """Schedule a DAG on heterogeneous processors with HEFT.

    Args:
        cost: (n, P) computation cost (time) of task i on processor p.
        succ: successors of each task.
        comm: (n, n) communication cost of edge (i, j) between two different processors (the
            paper's ``c_ij``); zero when both tasks run on the same processor.
        comm_fn: instead of ``comm``, the cost as a function of the two tasks and processors.
            Ranks then use the mean of ``comm_fn`` over processor pairs ``p != q``.
        ready: (P,) time from which each processor is free (default 0).
        release: no task starts before this time (the job's arrival).
        insertion: use idle gaps between scheduled tasks (the paper's policy).
        comm_mean: (n, n) mean communication costs for the ranks when ``comm_fn`` is given and
            the caller knows them in closed form (else averaged over all processor pairs).

    Returns:
        The schedule (processor, start and finish of every task, order, ranks).
    """
    cost = np.asarray(cost, dtype=np.float64)
    _check(cost, succ)
    n, n_proc = cost.shape
    if comm is not None and comm_fn is not None:
        raise InputError("give comm or comm_fn, not both", "heft")
    if comm is not None:
        comm = np.asarray(comm, dtype=np.float64)
        comm_mean = comm
        fixed = comm

        def comm_fn(i: int, j: int, p: int, q: int) -> float:  # noqa: ARG001
            return 0.0 if p == q else float(fixed[i, j])

    elif comm_fn is not None and comm_mean is None:
        comm_mean = np.zeros((n, n))
        pairs = [(p, q) for p in range(n_proc) for q in range(n_proc) if p != q]
        if pairs:
            for i in range(n):
                for j in succ[i]:
                    comm_mean[i, j] = float(np.mean([comm_fn(i, j, p, q) for p, q in pairs]))
    elif comm_fn is None:
        comm_mean = None
    rank = upward_ranks(cost, succ, comm_mean)
    pred: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        for j in succ[i]:
            pred[j].append(i)
    order = priority_order(rank, succ, pred)
    free = np.zeros(n_proc) if ready is None else np.asarray(ready, dtype=np.float64).copy()
    if free.shape != (n_proc,):
        raise InputError(f"ready must have one time per processor ({n_proc}), got {free.shape}", "heft")
    busy: list[list[tuple[float, float]]] = [[] for _ in range(n_proc)]  # sorted (start, finish)
    proc = np.full(n, -1, dtype=np.int64)
    start = np.zeros(n)
    finish = np.zeros(n)
    local_only = comm_fn is None
    for i in order:
        assert all(proc[k] >= 0 for k in pred[i]), "priority_order is topological"
        if local_only:
            # No communication: the data are ready at the same time on every processor.
            dr = max([release] + [float(finish[k]) for k in pred[i]])
            est_all = np.maximum(free, dr)
        else:
            assert comm_fn is not None
            est_all = np.array(
                [
                    max([release, float(free[p])] + [float(finish[k]) + comm_fn(k, i, int(proc[k]), p) for k in pred[i]])
                    for p in range(n_proc)
                ]
            )
        for p in range(n_proc):
            if busy[p]:
                est_all[p] = _earliest_start(busy[p], float(est_all[p]), float(cost[i, p]), insertion, float(free[p]))
        eft_all = est_all + cost[i]
        p = int(np.argmin(eft_all))
        proc[i], start[i], finish[i] = p, est_all[p], eft_all[p]
        busy[p].append((float(est_all[p]), float(eft_all[p])))
        busy[p].sort()
    return HeftSchedule(proc=proc, start=start, finish=finish, order=order, rank_u=rank)


def _earliest_start(slots: list[tuple[float, float]], ready: float, duration: float, insertion: bool, floor: float) -> float:
    """Earliest start >= ready on a processor whose busy slots are ``slots`` (sorted)."""
    if not slots:
        return ready
    if insertion:
        prev_end = floor
        for s, f in slots:
            begin = max(ready, prev_end)
            if begin + duration <= s + 1e-12:
                return begin
            prev_end = max(prev_end, f)
        return max(ready, prev_end)
    return max(ready, slots[-1][1])
