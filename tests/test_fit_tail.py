"""`Twin.fit` computes its support index and episode hashes while the last members run on a pool
(issue 47: the 1M-row fit's wall time): `_fit_members` says when a worker has nothing left to
start, and not before."""

from __future__ import annotations

from typing import Any

import pandas as pd

import edgetwin.twin.twin as tw


def test_a_free_worker_is_announced_once_no_member_is_left_to_start(monkeypatch: Any) -> None:
    seen: list[tuple[int, int]] = []  # (members finished, idle calls) at each idle call

    def fake_run_tasks(fn: Any, tasks: Any, workers: Any, on_result: Any, **_: Any) -> None:
        for i in range(len(tasks)):  # members finish one by one on a pool of ``workers``
            on_result(i, f"member {i}")

    monkeypatch.setattr(tw, "run_tasks", fake_run_tasks)
    fitted: dict[int, Any] = {}
    tasks = [(m, None, m) for m in range(5)]

    def idle() -> None:
        seen.append((len(fitted), len(seen) + 1))

    data = (pd.DataFrame({"episode": ["a"], "t": [0]}),)
    tw._fit_members(fitted, tasks, None, workers=2, ray_address=None, progress=False, data=data, options=(),
                    on_idle=idle)
    # 5 members on 2 workers: after the 4th finishes, one runs and the other worker is free
    assert fitted == {m: f"member {m}" for m in range(5)} and seen[0] == (4, 1)
    seen.clear()
    fitted.clear()
    tw._fit_members(fitted, tasks, None, workers=1, ray_address=None, progress=False, data=data, options=(),
                    on_idle=idle)
    assert seen == []  # serially there is no other core to use
