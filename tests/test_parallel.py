"""Independent work in parallel (`edgetwin.twin.parallel`): the same twin serially, on a process
pool and on a local Ray instance; the fast BC batches are imitation's DataLoader batches."""

from __future__ import annotations

import importlib.abc
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch as th
from pool_tasks import square_plus  # light: a pool worker imports the module of its task's function

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


def test_run_tasks_orders_results_and_resolves_workers() -> None:
    """Serially, in task order, every result reported once; on a pool: the next test (one pool start
    there, not one here too: each spawned worker imports torch, ~4 CPU s)."""
    seen: list[int] = []
    assert run_tasks(square_plus, [(1, k) for k in range(4)], workers=1, on_result=lambda i, _: seen.append(i)) == [
        1,
        2,
        5,
        10,
    ]
    assert seen == [0, 1, 2, 3]
    assert run_tasks(square_plus, [(k,) for k in range(5)], workers=1, shared=(0,)) == [0, 1, 4, 9, 16]
    assert resolve_workers(None, 100) == available_cores()
    assert resolve_workers(0, 1) == 1
    assert resolve_workers(8, 3) == 3
    with pytest.raises(InputError, match="workers"):
        resolve_workers(-1, 3)


def test_pool_tasks_get_the_shared_arguments_and_the_pool_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every pool task receives the shared arguments (they travel through one temporary file, not
    as bytes with every task, which kept a pickled copy of a large log beside its table in every
    process), the results come back in task order and every one is reported once (in completion
    order), and the temporary directory is left as it was, also when a task fails."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen: list[int] = []
    assert run_tasks(square_plus, [(k,) for k in range(5)], workers=2, shared=(100,),
                     on_result=lambda i, _: seen.append(i)) == [100, 101, 104, 109, 116]  # fmt: skip
    assert sorted(seen) == [0, 1, 2, 3, 4]
    with pytest.raises(TypeError):
        run_tasks(square_plus, [(1,), (2,)], workers=2, shared=(1, 2))  # one argument too many
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # the default run's 10-minute budget; pool determinism stays in the default run: test_evaluate_gives_the_same_kpis_serially_and_on_a_pool, tests/test_demo48_beside.py
def test_same_twin_serially_and_on_a_pool(small_log: tuple[Any, Any], tmp_path: Path) -> None:
    df, spec = small_log
    serial = Twin.fit(df, spec, seed=3, workers=1, **FIT).save(tmp_path / "serial")
    pooled = Twin.fit(df, spec, seed=3, workers=2, **FIT).save(tmp_path / "pool")
    a, b = twin_content(serial), twin_content(pooled)
    assert a == b
    # and a different seed gives a different twin (the comparison can fail)
    other = Twin.fit(df, spec, seed=4, workers=1, **FIT).save(tmp_path / "other")
    assert twin_content(other)["member_1/client_0.safetensors"] != a["member_1/client_0.safetensors"]


@pytest.mark.slow  # the default run's 10-minute budget; a real Ray instance stays in the default run: test_evaluate_gives_the_same_kpis_on_ray
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


# ------------------------------------------------------------------------------------ evaluate / whatif
EVAL = ["--episodes", "3", "--agents", "10", "--episode-steps", "4", "--json"]


def _cli_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    from edgetwin.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    return json.loads(capsys.readouterr().out)


class _NoRay(importlib.abc.MetaPathFinder):
    """A finder ahead of all others that fails any import of Ray (`_cli_json_without_ray`)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "ray" or name.startswith("ray."):
            raise AssertionError(f"{name} imported by a command without --ray")


def _cli_json_without_ray(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """`_cli_json` on a fresh import of edgetwin, failing if anything imports Ray meanwhile.

    Ray's modules already loaded (by an earlier test of this process) and edgetwin's own are hidden
    for the call, and `_NoRay` stands first on the import path: edgetwin's modules are imported
    again (a module-level ``import ray`` in any of them, the CLI's included, reaches `_NoRay`) and
    any ``import ray`` of the command does too (the command's one-line error: exit 1, and
    `_cli_json` fails). Afterwards this process's modules are back as they were. In this process,
    not in a fresh interpreter: that cost ~5 s of CPU importing torch and the evaluation's libraries
    only to read ``sys.modules``."""
    ours = {m: mod for m, mod in sys.modules.items() if m.split(".")[0] in ("ray", "edgetwin")}
    for name in ours:
        del sys.modules[name]
    monkeypatch.setattr(sys, "meta_path", [_NoRay(), *sys.meta_path])
    try:
        from edgetwin.cli import main  # edgetwin's modules anew

        with pytest.raises(SystemExit) as e:
            main(argv)
    finally:  # no copy made here outlives the call (a later test's InputError is this process's class)
        for name in [m for m in sys.modules if m.split(".")[0] in ("ray", "edgetwin")]:
            del sys.modules[name]
        sys.modules.update(ours)
    assert e.value.code == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_evaluate_gives_the_same_kpis_serially_and_on_a_pool(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A policy that samples (random) gets its own seed per episode, so the episodes are
    independent tasks: the pool gives the serial numbers; without --ray nothing imports Ray."""
    argv = ["evaluate", "random", "--on", "cluster", "--seed", "5", *EVAL]
    serial = _cli_json([*argv, "--workers", "1"], capsys)
    pooled = _cli_json_without_ray([*argv, "--workers", "2"], capsys, monkeypatch)
    assert pooled["per_episode"] == serial["per_episode"]
    assert len(serial["per_episode"]["return"]) == 3
    # the episodes differ from each other and another seed gives other numbers (the check can fail)
    assert len(set(serial["per_episode"]["return"])) == 3
    other = _cli_json(["evaluate", "random", "--on", "cluster", "--seed", "6", *EVAL], capsys)
    assert other["per_episode"]["return"] != serial["per_episode"]["return"]


def test_evaluate_gives_the_same_kpis_on_ray(capsys: pytest.CaptureFixture[str]) -> None:
    ray = pytest.importorskip("ray", reason='Ray is an optional extra (pip install -e ".[ray]")')
    argv = ["evaluate", "random", "--on", "cluster", "--seed", "5", *EVAL]
    serial = _cli_json(argv, capsys)
    # one CPU: Ray starts one worker process (each imports the evaluation's modules, seconds of CPU);
    # the episodes still run as Ray tasks, away from this process
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = _cli_json([*argv, "--ray", "local"], capsys)
    finally:
        ray.shutdown()
    assert on_ray["per_episode"] == serial["per_episode"]


@pytest.mark.slow  # a twin fit and two pools of spawned workers: ~2-3 min on the loaded 2-core machine
def test_twin_evaluate_and_whatif_give_the_same_numbers_on_a_pool(
    small_log: tuple[Any, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a twin: evaluate's episodes and the what-if cells (a policy built per episode, and one
    exported policy object used in every episode) on a 2-process pool give the serial numbers."""
    from edgetwin.policies.export import export_policy
    from edgetwin.policies.heuristics import UniformRandom

    df, spec = small_log
    twin_dir = tmp_path / "twin"
    Twin.fit(df, spec, seed=3, workers=1, **{**FIT, "members": 2}).save(twin_dir)
    argv = ["evaluate", "random", str(twin_dir), "--on", "twin", "--seed", "2", *EVAL]
    serial = _cli_json([*argv, "--workers", "1"], capsys)
    pooled = _cli_json([*argv, "--workers", "2"], capsys)
    assert pooled["per_episode"] == serial["per_episode"]

    exported = export_policy(UniformRandom(spec, seed=9), tmp_path / "rnd", spec)  # samples across episodes
    docs = []
    for w in ("1", "2"):
        out = tmp_path / f"whatif{w}"
        _cli_json(["whatif", str(twin_dir), "--policy", "random", "--policy", str(exported), "--episodes", "2",
                   "--seeds", "1", "--steps", "4", "--agents", "12", "--out", str(out), "--workers", w, "--json"],
                  capsys)  # fmt: skip
        docs.append(json.loads((out / "whatif.json").read_text()))
    assert docs[0] == docs[1]


def test_evaluate_and_whatif_refuse_a_ray_address_nobody_answers(tmp_path: Path) -> None:
    """``--ray`` at a closed port on evaluate and whatif: one line naming the flag, exit 2."""
    import contextlib
    import io
    import socket

    from edgetwin.cli import main

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    runs = [
        ["evaluate", "random", "--on", "cluster", *EVAL, "--ray", f"127.0.0.1:{port}"],
        ["whatif", str(tmp_path / "no-twin"), "--policy", "random", "--out", str(tmp_path / "w"), "--ray", f"127.0.0.1:{port}"],
    ]
    for argv in runs:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        assert "--ray" in err.getvalue() and "Traceback" not in err.getvalue()
