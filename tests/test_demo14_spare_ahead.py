"""Issue 48 (the demo's time): what the demo's spare core does while this process fits the twin's
population model (the log's overlap report, `Twin.fit`'s with ``beside``; a tiny twin fit that warms
the worker, `edgetwin.demo._warm_twin_fit`) leaves the twin as this process alone fits it."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch as th

from edgetwin import demo
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs
from edgetwin.imitation.overlap import overlap_report
from edgetwin.twin.parallel import _init_worker
from edgetwin.twin.twin import Twin
from tests.test_parallel import twin_content

FIT = {"members": 2, "rounds": 1, "bc_epochs": 2, "population_hyper": {"steps": 30}, "progress": False}


class _Recording(ProcessPoolExecutor):
    """The demo's one spawned worker (`edgetwin.demo._SpareCore`), naming every function it is given."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                         initargs=(th.get_num_threads(),))  # fmt: skip
        self.ran: list[str] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.ran.append(getattr(fn, "__name__", "?"))
        return super().submit(fn, *args, **kwargs)


@pytest.fixture(scope="module")
def spare() -> Iterator[_Recording]:
    pool = _Recording()
    yield pool
    pool.shutdown(wait=True)


@pytest.mark.slow  # ~40 s (two twin fits): the default run's 10-minute budget; the spare worker's fit against the serial
# one stays in it: tests/test_demo48_beside.py::test_the_same_twin_with_a_member_on_the_spare_worker
def test_the_spare_cores_overlap_report_and_warm_up_leave_the_twin_as_it_was(spare: _Recording, tmp_path: Path) -> None:
    df, spec = generate_logs(ClusterConfig(n_agents=30, steps=12), episodes=3, seed=0)
    serial = Twin.fit(df, spec, seed=3, workers=1, **FIT)
    assert spare.submit(demo._warm_twin_fit).result() > 0  # as the demo does, before the twin
    beside = Twin.fit(df, spec, seed=3, workers=1, beside=spare, **FIT)
    assert spare.ran[:2] == ["_warm_twin_fit", "overlap_report"]  # the report on the spare core
    assert beside.meta["overlap"] == serial.meta["overlap"] and beside.meta["response_model"] == "mail"
    a, b = twin_content(serial.save(tmp_path / "serial")), twin_content(beside.save(tmp_path / "beside"))
    assert a == b
    # the comparison can fail: the overlap report of another day's log differs (its seed alone
    # does not, at this size: every row is used), as does another seed's member
    other_df, _ = generate_logs(ClusterConfig(n_agents=30, steps=12), episodes=3, seed=1)
    assert overlap_report(other_df, spec, seed=3).to_dict() != serial.meta["overlap"]
    assert a["member_1/client_0.safetensors"] != twin_content(
        Twin.fit(df, spec, seed=4, workers=1, **{**FIT, "population_hyper": {"steps": 1}}).save(tmp_path / "other")
    )["member_1/client_0.safetensors"]


@pytest.mark.slow  # ~19 s quiet (a real spare process, a twin fit): the default run's 10-minute budget; the spare worker's
# fit against the serial one stays in it: tests/test_demo48_beside.py::test_the_same_twin_with_a_member_on_the_spare_worker
def test_with_a_checkpoint_the_overlap_report_is_made_here(spare: _Recording, tmp_path: Path) -> None:
    """A checkpoint is stamped with the resolved response model before the population is fitted."""
    df, spec = generate_logs(ClusterConfig(n_agents=10, steps=8), episodes=2, seed=0)
    spare.ran.clear()
    Twin.fit(df, spec, seed=3, workers=1, beside=spare, checkpoint_dir=tmp_path / "ckpt", **FIT)
    assert "overlap_report" not in spare.ran and '"response_model": "mail"' in (tmp_path / "ckpt" / "fit.json").read_text()
