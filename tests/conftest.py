"""Shared fixtures: paths to ../shared data, and a real nats-server on a free loopback port."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "fixtures"

#: The default run's 40 longest test files (paths under tests/), longest first: 86% of its test time.
#: The numbers are each file's default tests' seconds summed from the junit XML of one full default run
#: (`python3 -m pytest -q -p no:cacheprovider --durations=0 --junitxml=...`) on tests48's branch (merged at
#: e4123ad) under load (~2x a quiet machine's), less the cuts measured since (tests14: the Prometheus
#: importer's cases, the pooled evaluate and the keyless agents in process, the canary world fitted
#: once per run; tests16: test_benchmark_docs and test_claims_inline_commands, a few seconds now, dropped).
#: `pytest_collection_modifyitems` hands them out first. Why: xdist's `--dist loadfile` gives a free
#: worker the next whole file, by default the files with the most tests first, so that files of one
#: long test (the NATS end-to-end, the demo) came last and one worker ran them while the other had
#: nothing left (the run's tail). Longest first leaves the short files for the end, where they fill
#: both workers. A file missing from this list only loses its place; tests/test_tests48_order.py
#: checks that every name is a test file.
LONG_FILES_FIRST: tuple[str, ...] = (
    "test_parallel.py",  # 135
    "test_demo.py",  # 134
    "test_federated_twin.py",  # 130
    "test_end_to_end_nats.py",  # 123
    "test_gate.py",  # 108
    "test_twin.py",  # 104
    "test_canary.py",  # 84
    "security/test_federation.py",  # 74
    "test_demo48_beside.py",  # 73
    "test_generative.py",  # 65
    "test_canary_loop.py",  # 62
    "test_hostile_inputs.py",  # 56
    "security/test_prometheus_importer.py",  # 55
    "security/test_artifacts.py",  # 44
    "test_federation_nats.py",  # 43
    "test_twin_update.py",  # 41
    "test_causal_twin.py",  # 40
    "test_demo48_whatif_ahead.py",  # 40
    "test_federated_causal.py",  # 39
    "test_switchback.py",  # 38
    "test_canary_plan.py",  # 36
    "test_whatif.py",  # 33
    "test_overlap.py",  # 32
    "test_runtime_nats.py",  # 29
    "test_policies.py",  # 26
    "test_imitation.py",  # 25
    "test_causal_settled.py",  # 24
    "test_gate_evidence.py",  # 24
    "test_edge_switchback.py",  # 23
    "test_reset_draws.py",  # 23
    "test_loop_thin_driver.py",  # 21
    "test_agents.py",  # 21
    "test_prometheus.py",  # 20
    "test_plan_design.py",  # 19
    "test_policies_algorithms.py",  # 18
    "test_cli_help.py",  # 15
    "test_validate.py",  # 14
    "test_cluster.py",  # 14
)


#: Test files that share a per-worker session fixture too costly to build twice (fixture name: the files
#: under tests/ that use it): xdist gets them as one work unit (`pytest_xdist_make_scheduler`), so one
#: worker runs them all and builds the fixture once. Why: a session fixture is built once per *worker*;
#: `--dist loadfile` handed these files to both workers, and both fitted the tiny twin (~20 CPU s each;
#: the default run at 98668bc: test_fused_noise's setup 19.8 s on one worker, test_fused_tick's 16.9 s
#: on the other). tests/test_tests48_order.py checks that every file named uses its fixture.
SAME_WORKER: dict[str, tuple[str, ...]] = {
    "tiny_cluster_twin": ("test_fused_noise.py", "test_fused_tick.py", "test_output_noise.py", "test_scale.py",
                          "test_twin_speed.py"),
}


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` (the default run), but the files of each `SAME_WORKER` group are one work
    unit: it is handed out where its first file stands in the collection's order, its tests in that
    order. Any other ``--dist``: xdist's own scheduler."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    unit = {name: f"same worker: {fixture}" for fixture, names in SAME_WORKER.items() for name in names}

    class SharedFixtureFiles(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return unit.get(path.removeprefix("tests/"), path)

    return SharedFixtureFiles(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """Keep the collection's order for `--dist loadfile` (xdist >= 3.6 otherwise reorders the files by
    their number of tests, most first; before 3.6 it kept the order and has no such option)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def long_files_first(items: list[pytest.Item], order: tuple[str, ...] = LONG_FILES_FIRST) -> None:
    """Reorder ``items`` in place: the files named in ``order`` first, in that order, then the rest
    as collected; the tests of one file keep their order (a stable sort by file)."""
    rank = {name: i for i, name in enumerate(order)}
    items.sort(key=lambda item: rank.get(file_key(item), len(rank)))


def file_key(item: pytest.Item) -> str:
    """The item's file as `LONG_FILES_FIRST` names it: its path under tests/ (``security/test_x.py``)."""
    path = Path(item.path)
    return path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else path.name


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first (`LONG_FILES_FIRST`): every xdist worker collects in this order."""
    long_files_first(items)


@pytest.fixture(autouse=True, scope="session")
def _sb3_log_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Keep SB3's default per-`learn()` log folders out of the system temp dir during tests."""
    mp = pytest.MonkeyPatch()
    mp.setenv("SB3_LOGDIR", str(tmp_path_factory.mktemp("sb3")))
    yield
    mp.undo()


@pytest.fixture(scope="session")
def tiny_cluster_twin() -> Any:
    """The tiny twin of the emulated cluster that several test files fitted each for themselves
    (24 agents x 12 steps x 3 episodes; 2 members, 1 adversarial round; declared dynamics,
    site-level state, a clock, echoes, log-scaled outputs and states, a weighted reward), fitted
    once per test process. Read-only: a test file takes its own `copy.deepcopy` (the fit is
    deterministic for its seed, so the copy is the twin the file fitted before)."""
    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.twin.twin import Twin

    df, spec = generate_logs(ClusterConfig(n_agents=24, steps=12), episodes=3, seed=0)
    return Twin.fit(df, spec, members=2, seed=0, progress=False, population_model="empirical", bc_epochs=2,
                    rounds=1, world_agents=16, n_steps=12, demo_batch_size=64)


def fitted_once(tmp_path_factory: pytest.TempPathFactory, name: str, fit: Callable[[Path], None]) -> Path:
    """A directory that ``fit(directory)`` fills once per test run, for every xdist worker.

    Why: a session fixture is once per *worker*, and `--dist loadfile` may hand two files that need
    the same fitted twin to different workers, each then fitting it. The workers share the run's
    base temp dir (xdist's own recipe): the first to ask fits under a file lock, the others wait for
    it and read what it saved (the longest files go first, so the second file usually asks later)."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's dir, shared by its workers (each has its own popen-gwN below it)
    d = root / name
    with FileLock(str(d) + ".lock"):
        if not (d / "DONE").is_file():
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
            fit(d)
            (d / "DONE").touch()
    return d


@pytest.fixture(scope="session")
def canary_world_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The canary loop's small world, saved once per run (`fitted_once`): ``log.parquet`` (2 random
    episodes of a 40-agent, 24-step cluster), ``spec.toml``, ``twin/`` (2 members, no adversarial
    round, 2 BC epochs, the empirical population) and ``fleet.parquet`` (the next day, seed 5).
    tests/test_canary_loop.py's ``world`` reads it; tests/test_loop_thin_driver.py uses that fixture."""

    def fit(d: Path) -> None:
        import torch

        from edgetwin.emulator.cluster import ClusterConfig
        from edgetwin.emulator.logs import generate_logs
        from edgetwin.twin.twin import Twin

        torch.set_num_threads(1)  # as the files that fitted it each set at import (the fit's numbers depend on it)
        cluster = ClusterConfig(n_agents=40, steps=24)
        log, spec = generate_logs(cluster, 2, "random", seed=0)
        Twin.fit(log, spec, seed=0, members=2, progress=False, rounds=0, bc_epochs=2,
                 population_model="empirical").save(d / "twin")  # fmt: skip
        fleet, _ = generate_logs(cluster, 1, "random", seed=5)
        log.to_parquet(d / "log.parquet")
        fleet.to_parquet(d / "fleet.parquet")
        spec.save(d / "spec.toml")

    return fitted_once(tmp_path_factory, "canary-world", fit)


@pytest.fixture(scope="module")
def canary_world_gate(canary_world_dir: Path) -> dict[str, Any]:
    """The gate's decision on the canary world (`canary_world_dir`'s twin) for an always-edge candidate
    it cannot judge, against the logging policy, on a fresh 40-agent, 24-step day (seed 7), with a 25 %
    share for 24 h: what a real `plan_canary` is run on (tests/test_plan14_days.py,
    tests/test_planbase15_real_plan.py). Keys: ``spec``, ``twin``, ``log``, ``cand``, ``base``,
    ``decision``, ``budget``, ``kdefs`` (the decision's KPI definitions by name)."""
    import numpy as np
    import torch

    from edgetwin.contract.spec import TwinSpec
    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.loop import plan as plan_mod
    from edgetwin.policies.gate import resolve_policy, run_gate
    from edgetwin.twin.twin import Twin
    from edgetwin.twin.whatif import fixed_policy

    torch.set_num_threads(1)
    spec = TwinSpec.load(canary_world_dir / "spec.toml")
    twin = Twin.load(canary_world_dir / "twin")
    log, _ = generate_logs(ClusterConfig(n_agents=40, steps=24), 1, "random", seed=7)

    class Constant:
        def __init__(self, a: list[float]) -> None:
            self.spec, self.a = spec, np.asarray(a, dtype=np.float64)

        def act(self, obs: np.ndarray) -> np.ndarray:
            return np.tile(self.a, (len(obs), 1))

    cand = fixed_policy("always-edge", Constant([1.0, 0.3, 0.2]))
    base = resolve_policy("logging", twin, name="current")
    decision = run_gate(twin, cand, base, log=log, episodes=1, seed=0)
    return {"spec": spec, "twin": twin, "log": log, "cand": cand, "base": base, "decision": decision,
            "budget": plan_mod.PlanBudget(max_share=0.25, hours=24.0), "kdefs": {k.name: k for k in decision.result.kpis}}


def cli_in_process(argv: list[str], unset_env: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``edgetwin ARGV`` through the console script's entry (`edgetwin.cli.main`) in this process,
    its stdout and stderr captured, the variables ``unset_env`` removed meanwhile: its exit code and
    what it printed, as a finished process's. Why in process: a fresh interpreter costs 1-2 s of CPU
    a run; the tests that need the command as its own process keep one."""
    import contextlib
    import io

    from edgetwin.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.MonkeyPatch.context() as mp:
        for var in unset_env:
            mp.delenv(var, raising=False)
        try:
            main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        else:
            code = 0
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def shared_data(relpath: str) -> Path:
    """A file under ../shared/data, or skip the test with the reason when it is absent."""
    p = SHARED_DATA / relpath
    if not p.exists():
        pytest.skip(f"needs ../shared/data/{relpath} (absent: ../shared is not beside this clone)")
    return p


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class NatsServer:
    """A running nats-server with JetStream; `restart()` keeps its port and store."""

    port: int
    store: Path
    extra_args: list[str]
    proc: subprocess.Popen | None = None
    _started: bool = False

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the server and return once *this* server listens.

        Deterministic on a shared machine: `free_port` only proposes a port, and another process
        (another test session's nats-server, say) can take it before ours binds. Checking that
        *something* listens would then connect the test to a stranger's server. Instead we wait
        for the ports file that our server (identified by its pid) writes once it is ready; if it
        exits first, the port was taken and a fresh port is tried (a restart keeps its port, so it
        retries the same one while the old socket is released).
        """
        exe = shutil.which("nats-server")
        if exe is None:
            pytest.fail("nats-server not on PATH: install the test extra (pip install -e '.[test]')")
        keep_port = self.proc is None and self._started  # a restart: clients reconnect to this port
        for _attempt in range(8):
            ports_dir = Path(tempfile.mkdtemp(prefix="nats-ports-"))
            self.proc = subprocess.Popen(
                [exe, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.store),
                 "--ports_file_dir", str(ports_dir), *self.extra_args],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            if self._wait_ready(ports_dir, timeout=30.0):
                self._started = True
                shutil.rmtree(ports_dir, ignore_errors=True)
                return
            shutil.rmtree(ports_dir, ignore_errors=True)
            self.stop()
            if keep_port:
                time.sleep(0.2)  # the old listener's socket is being released
            else:
                self.port = free_port()
        pytest.fail(f"nats-server could not listen on 127.0.0.1 (last port {self.port}) after 8 attempts")

    def _wait_ready(self, ports_dir: Path, timeout: float) -> bool:
        """True once our process wrote its ports file naming our port; False if it exited first."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False  # could not bind (port taken) or failed to start
            for f in ports_dir.glob(f"*_{self.proc.pid}.ports"):
                try:
                    urls = json.loads(f.read_text()).get("nats", [])
                except ValueError:
                    break  # being written
                if any(u.endswith(f":{self.port}") for u in urls):
                    return True
            time.sleep(0.01)
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A real nats-server with JetStream in a temporary directory, on a free loopback port."""
    server = NatsServer(port=free_port(), store=tmp_path / "js", extra_args=[])
    server.start()
    try:
        yield server
    finally:
        server.stop()
