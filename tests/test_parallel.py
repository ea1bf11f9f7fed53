"""Independent work in parallel (`edgetwin.twin.parallel`): the same twin serially, on a process
pool and on a local Ray instance; the fast BC batches are imitation's DataLoader batches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch as th

from edgetwin.contract.errors import InputError
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs
from edgetwin.imitation.mail import ShuffledBatches
from edgetwin.twin.parallel import available_cores, resolve_workers, run_tasks
from edgetwin.twin.twin import Twin

#: a fit small enough for a default test run (~10 s serially on 2 loaded cores), 3 members
FIT = {"members": 3, "rounds": 1, "bc_epochs": 2, "population_hyper": {"steps": 30}, "progress": False}


@pytest.fixture(scope="module")
def small_log() -> tuple[Any, Any]:
    return generate_logs(ClusterConfig(n_agents=30, steps=12), episodes=3, seed=0)


def twin_content(path: Path) -> dict[str, str]:
    """The sealed twin's manifest hashes, with the two JSON files that record wall times
    (meta.json's ``fit_seconds``, the population's ``*_seconds``) compared without them."""
    files = json.loads((path / "MANIFEST.json").read_text())["files"]

    def strip(o: Any) -> Any:
        return {k: strip(v) for k, v in o.items() if not k.endswith("_seconds")} if isinstance(o, dict) else o

    out = dict(files)
    for name in ("meta.json", "population/population.json"):
        assert name in files, name
        out[name] = json.dumps(strip(json.loads((path / name).read_text())), sort_keys=True)
    return out


def test_shuffled_batches_are_the_dataloaders() -> None:
    """`ShuffledBatches` yields imitation's DataLoader batches and leaves torch's global generator
    where the DataLoader leaves it: a BC fit gives the same weights as with imitation's loader."""
    from imitation.algorithms.base import make_data_loader
    from imitation.data import types as itypes

    rng = np.random.default_rng(0)
    x = rng.normal(size=(103, 4)).astype(np.float32)
    y = rng.normal(size=(103, 2)).astype(np.float32)
    demos = itypes.Transitions(obs=x, acts=y, next_obs=x, dones=np.zeros(103, bool), infos=np.array([{}] * 103))

    def batches(loader: Any) -> tuple[list[np.ndarray], float]:
        th.manual_seed(7)
        got = [np.asarray(b["obs"]) for _ in range(3) for b in loader]
        got += [np.asarray(b["acts"]) for b in loader]
        return got, float(th.rand(1))

    ref, ref_next = batches(make_data_loader(demos, 16))
    ours, ours_next = batches(ShuffledBatches(x, y, 16))
    assert len(ref) == len(ours) == 4 * (103 // 16)
    for a, b in zip(ref, ours, strict=True):
        np.testing.assert_array_equal(a, b)
    assert ref_next == ours_next


def _square(offset: int, k: int) -> int:
    return k * k + offset


def test_run_tasks_orders_results_and_resolves_workers() -> None:
    seen: list[int] = []
    assert run_tasks(_square, [(k,) for k in range(5)], workers=1, shared=(0,)) == [0, 1, 4, 9, 16]
    assert run_tasks(_square, [(1, k) for k in range(4)], workers=2, on_result=lambda i, _: seen.append(i)) == [
        1,
        2,
        5,
        10,
    ]
    assert sorted(seen) == [0, 1, 2, 3]
    assert resolve_workers(None, 100) == available_cores()
    assert resolve_workers(0, 1) == 1
    assert resolve_workers(8, 3) == 3
    with pytest.raises(InputError, match="workers"):
        resolve_workers(-1, 3)


def test_same_twin_serially_and_on_a_pool(small_log: tuple[Any, Any], tmp_path: Path) -> None:
    df, spec = small_log
    serial = Twin.fit(df, spec, seed=3, workers=1, **FIT).save(tmp_path / "serial")
    pooled = Twin.fit(df, spec, seed=3, workers=2, **FIT).save(tmp_path / "pool")
    a, b = twin_content(serial), twin_content(pooled)
    assert a == b
    # and a different seed gives a different twin (the comparison can fail)
    other = Twin.fit(df, spec, seed=4, workers=1, **FIT).save(tmp_path / "other")
    assert twin_content(other)["member_1/client_0.pt"] != a["member_1/client_0.pt"]


def test_same_twin_on_ray(small_log: tuple[Any, Any], tmp_path: Path) -> None:
    ray = pytest.importorskip("ray", reason='Ray is an optional extra (pip install -e ".[ray]")')
    df, spec = small_log
    serial = Twin.fit(df, spec, seed=3, workers=1, **FIT).save(tmp_path / "serial")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = Twin.fit(df, spec, seed=3, ray_address="local", **FIT).save(tmp_path / "ray")
    finally:
        ray.shutdown()
    assert twin_content(serial) == twin_content(on_ray)


def test_fit_cli_refuses_a_ray_address_nobody_answers(small_log: tuple[Any, Any], tmp_path: Path) -> None:
    """``--ray`` at a closed port: one line naming the flag, exit 2, before any fitting; the CLI's
    ``--workers`` rejects a negative count the same way."""
    import contextlib
    import io
    import socket

    from edgetwin.cli import main

    df, spec = small_log
    df.to_parquet(tmp_path / "log.parquet")
    spec.save(tmp_path / "log.spec.toml")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for extra, flag in ((["--ray", f"127.0.0.1:{port}"], "--ray"), (["--workers", "-1"], "--workers")):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e:
            main(["fit", str(tmp_path / "log.parquet"), "--out", str(tmp_path / "tw"), *extra])
        assert e.value.code == 2
        assert flag in err.getvalue() and "Traceback" not in err.getvalue()
    assert not (tmp_path / "tw" / "MANIFEST.json").exists()
