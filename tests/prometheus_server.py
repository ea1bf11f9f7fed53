"""A real Prometheus server for tests: Debian's ``prometheus`` binary on a free loopback port.

Started from the test with its own config and TSDB directory (never the system service), stopped at
the end. `backfill` turns an OpenMetrics file into TSDB blocks with ``promtool tsdb
create-blocks-from openmetrics`` before the server opens the directory. Where the binaries are not
installed (``apt-get install -y prometheus``; ``.ci/run`` does it on Debian as root) the tests that
need them skip with that reason.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port


def binaries() -> tuple[str, str]:
    """``(prometheus, promtool)`` paths, or skip the test saying how to install them."""
    prom, tool = shutil.which("prometheus"), shutil.which("promtool")
    if prom is None or tool is None:
        pytest.skip("needs the prometheus and promtool binaries (Debian: apt-get install -y prometheus; .ci/run does it as root)")
    return prom, tool


def backfill(openmetrics: Path, data_dir: Path) -> None:
    """``promtool tsdb create-blocks-from openmetrics FILE DIR``."""
    _, tool = binaries()
    data_dir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [tool, "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(data_dir)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.fail(f"promtool could not backfill {openmetrics}: {done.stderr.strip()[-2000:]}")


class PrometheusServer:
    """``prometheus`` on 127.0.0.1 with a temporary config and TSDB; ``with`` starts and stops it.

    Args:
        workdir: where the config goes.
        data_dir: the TSDB (backfilled blocks are read from it).
        scrape: ``[(job, "host:port")]`` targets to scrape every ``scrape_interval``.
    """

    def __init__(self, workdir: Path, data_dir: Path, scrape: list[tuple[str, str]] | None = None,
                 scrape_interval: str = "1s") -> None:  # fmt: skip
        self.prom, _ = binaries()
        self.workdir, self.data_dir = workdir, data_dir
        self.config = workdir / "prometheus.yml"
        jobs = [
            {"job_name": job, "scrape_interval": scrape_interval, "static_configs": [{"targets": [target]}]}
            for job, target in (scrape or [])
        ]
        # JSON is YAML: no YAML writer needed
        self.config.write_text(json.dumps({"global": {"scrape_interval": scrape_interval}, "scrape_configs": jobs}))
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> PrometheusServer:
        for _ in range(5):
            self.port = free_port()
            self.proc = subprocess.Popen(
                [self.prom, f"--config.file={self.config}", f"--storage.tsdb.path={self.data_dir}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=100y",
                 "--log.level=warn"],
                stdout=subprocess.DEVNULL, stderr=(self.workdir / "prometheus.log").open("ab"),
            )  # fmt: skip
            if self._ready(timeout=30.0):
                return self
            self.stop()
        pytest.fail(f"prometheus did not start; see {self.workdir / 'prometheus.log'}")

    def _ready(self, timeout: float) -> bool:
        """Our process answers /-/ready and reports our TSDB path (not a stranger on the port)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url + "/api/v1/status/flags", timeout=2) as r:
                    flags = json.loads(r.read())["data"]
                if flags.get("storage.tsdb.path") == str(self.data_dir):
                    with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                        if r.status == 200:
                            return True
            except OSError:
                pass
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def query(self, promql: str) -> list[dict]:
        """An instant query's result vector."""
        body = urllib.parse.urlencode({"query": promql}).encode()
        with urllib.request.urlopen(self.url + "/api/v1/query", data=body, timeout=10) as r:
            return json.loads(r.read())["data"]["result"]
