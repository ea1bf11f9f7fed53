"""HEFT against the hand-worked example of Topcuoglu, Hariri & Wu (IEEE TPDS 2002), Fig. 2-4.

The paper's 10-task DAG on 3 processors: Fig. 2 gives the computation costs (table) and the edge
communication costs; Table of upward ranks and the HEFT schedule of Fig. 4(a) (length 80).
Tasks are 0-based here (paper's n1 = 0).
"""

from __future__ import annotations

import numpy as np
import pytest

from edgetwin.contract.errors import InputError
from edgetwin.emulator.dag.heft import heft, upward_ranks

#: Fig. 2(b): cost of n1..n10 on P1, P2, P3.
COST = np.array(
    [[14, 16, 9], [13, 19, 18], [11, 13, 19], [13, 8, 17], [12, 13, 10],
     [13, 16, 9], [7, 15, 11], [5, 11, 14], [18, 12, 20], [21, 7, 16]],
    dtype=float,
)
#: Fig. 2(a): edges (paper numbering) with their communication costs.
EDGES = {(1, 2): 18, (1, 3): 12, (1, 4): 9, (1, 5): 11, (1, 6): 14, (2, 8): 19, (2, 9): 16, (3, 7): 23,
         (4, 8): 27, (4, 9): 23, (5, 9): 13, (6, 8): 15, (7, 10): 17, (8, 10): 11, (9, 10): 13}


def _graph() -> tuple[list[list[int]], np.ndarray]:
    succ: list[list[int]] = [[] for _ in range(10)]
    comm = np.zeros((10, 10))
    for (a, b), c in EDGES.items():
        succ[a - 1].append(b - 1)
        comm[a - 1, b - 1] = c
    return succ, comm


def test_upward_ranks_match_the_paper() -> None:
    succ, comm = _graph()
    rank = upward_ranks(COST, succ, comm)
    # The paper's table of rank_u values for n1..n10.
    paper = [108.000, 77.000, 80.000, 80.000, 69.000, 63.333, 42.667, 35.667, 44.333, 14.667]
    np.testing.assert_allclose(rank, paper, atol=1e-3)


def test_schedule_matches_fig4a() -> None:
    succ, comm = _graph()
    s = heft(COST, succ, comm=comm)
    # Order in the paper: n1, n3, n4, n2, n5, n6, n9, n7, n8, n10.
    assert [i + 1 for i in s.order] == [1, 3, 4, 2, 5, 6, 9, 7, 8, 10]
    assert s.makespan == 80.0
    # Fig. 4(a), worked by hand from the paper's rules (P1..P3 -> 0..2; EFT ties to the lower P):
    # n1 P3 0-9, n3 P3 9-28, n4 P2 18-26, n2 P1 27-40, n5 P3 28-38, n6 P2 26-42, n9 P2 56-68,
    # n7 P3 38-49, n8 P1 57-62, n10 P2 73-80. (n9's 56-68 and n8's 57-62 sit after data arrive.)
    expect = {1: (2, 0, 9), 3: (2, 9, 28), 4: (1, 18, 26), 2: (0, 27, 40), 5: (2, 28, 38),
              6: (1, 26, 42), 9: (1, 56, 68), 7: (2, 38, 49), 8: (0, 57, 62), 10: (1, 73, 80)}
    for task, (p, st, fi) in expect.items():
        assert (s.proc[task - 1], s.start[task - 1], s.finish[task - 1]) == (p, st, fi), task


def test_precedence_and_no_overlap_hold() -> None:
    succ, comm = _graph()
    s = heft(COST, succ, comm=comm)
    for i, js in enumerate(succ):
        for j in js:
            lag = 0.0 if s.proc[i] == s.proc[j] else comm[i, j]
            assert s.start[j] >= s.finish[i] + lag - 1e-9
    for p in range(3):
        iv = sorted((s.start[i], s.finish[i]) for i in range(10) if s.proc[i] == p)
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(iv, iv[1:], strict=False))


def test_ready_and_release_shift_the_schedule() -> None:
    succ, comm = _graph()
    base = heft(COST, succ, comm=comm)
    late = heft(COST, succ, comm=comm, ready=np.array([100.0, 100.0, 100.0]))
    assert late.makespan == pytest.approx(base.makespan + 100.0)
    rel = heft(COST, succ, comm=comm, release=50.0)
    assert rel.start.min() >= 50.0


def test_cycle_is_refused() -> None:
    with pytest.raises(InputError):
        heft(np.ones((2, 1)), [[1], [0]])


def test_a_complete_dag_listed_in_descending_order_is_not_a_cycle() -> None:
    """Every i -> j with i < j, successors listed from the last: the old guard (a walk's stack
    longer than 2n) called this a cycle at 6 tasks. Listing order changes nothing."""
    n = 6
    rng = np.random.default_rng(0)
    cost = rng.uniform(1, 10, (n, 3))
    comm = np.triu(rng.uniform(1, 5, (n, n)), 1)
    desc = [list(range(n - 1, i, -1)) for i in range(n)]
    asc = [list(range(i + 1, n)) for i in range(n)]
    a, b = heft(cost, desc, comm=comm), heft(cost, asc, comm=comm)
    assert a.order == b.order == tuple(range(n))  # a chain through every task: only one order
    assert np.array_equal(a.rank_u, b.rank_u) and np.array_equal(a.finish, b.finish)
    for i in range(n):
        for j in asc[i]:
            assert a.start[j] >= a.finish[i] - 1e-9


@pytest.mark.parametrize(
    "succ, match",
    [
        ([[1], [2], [3], [1]], r"cycle \(not a DAG\): (1 -> 2 -> 3 -> 1|2 -> 3 -> 1 -> 2|3 -> 1 -> 2 -> 3)"),
        ([[0]], r"cycle \(not a DAG\): 0 -> 0"),
        ([[5], []], r"task 0 has successor 5, which is not a task 0..1"),
        ([[-1], []], r"successor -1"),
    ],
)
def test_a_graph_that_is_not_a_dag_is_refused_naming_why(succ: list[list[int]], match: str) -> None:
    with pytest.raises(InputError, match=match):
        heft(np.ones((len(succ), 2)), succ)


def test_a_zero_cost_task_still_runs_before_its_successor() -> None:
    """A zero-cost task ties in rank with its successor; with the successor at the lower index the
    plain sort by (rank, index) put it first and the schedule refused the valid DAG."""
    s = heft(np.array([[2.0, 3.0], [0.0, 0.0], [1.0, 1.0]]), [[], [0], [1]])
    assert s.order == (2, 1, 0)
    assert s.start[1] >= s.finish[2] and s.start[0] >= s.finish[1]
