"""Shared fixtures: paths to ../shared data, and a real nats-server on a free loopback port."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(autouse=True, scope="session")
def _sb3_log_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Keep SB3's default per-`learn()` log folders out of the system temp dir during tests."""
    mp = pytest.MonkeyPatch()
    mp.setenv("SB3_LOGDIR", str(tmp_path_factory.mktemp("sb3")))
    yield
    mp.undo()


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
