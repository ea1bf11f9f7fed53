"""`edgetwin serve` in its own process, driven over a real nats-server only: a canary start signed
by a stranger is refused (one log line, a /metrics count), a signed one runs, the system's outcome
reports are joined, the process is killed mid-run and the next `serve` on the same cache directory
resumes the run, and a signed stop ends it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import free_port
from test_decision_wire_nats import ppo_policy_dir

from edgetwin.edge.bus import NatsBus, NatsConfig
from edgetwin.edge.canary_command import (
    CanaryStart,
    CanaryStatus,
    CanaryStop,
    command_subject,
    outcome_envelope,
    outcome_subject,
    sign_start,
    sign_stop,
    status_request,
    status_subject,
)
from edgetwin.edge.canary_slice import CanarySlice
from edgetwin.edge.kpi_watch import KPIMargin
from edgetwin.edge.message_auth import Keyring, MessageAuth
from edgetwin.edge.registry import FileRegistry, metadata_from_policy_dir
from edgetwin.edge.signing import Signer, save_public_key
from edgetwin.emulator.cluster import ClusterConfig, cluster_spec

pytestmark = [pytest.mark.nats, pytest.mark.slow]

SITE = "s1"
GROUPS = [f"g{i}" for i in range(6)]


def _serve(url: str, tmp: Path, metrics_port: int, log_name: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "edgetwin.cli", "serve", "--site", SITE, "--registry", str(tmp / "registry"),
           "--bus", url, "--trust", str(tmp / "trust"), "--reporters", str(tmp / "reporters"),
           "--cache-dir", str(tmp / "cache"), "--poll", "0.5", "--no-kpi-watch", "--log-level", "INFO",
           "--metrics-port", str(metrics_port)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=(tmp / log_name).open("w"), text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "edgetwin serve:" in line, (line, (tmp / log_name).read_text()[-2000:])
    return proc


def test_serve_runs_a_signed_canary_over_nats_and_resumes_it_after_a_kill(nats_server, tmp_path: Path) -> None:
    operator, stranger, system = Signer.generate(), Signer.generate(), Signer.generate()
    (tmp_path / "trust").mkdir()
    save_public_key(operator.public_key, tmp_path / "trust" / "operator.pub.pem")
    (tmp_path / "reporters").mkdir()
    save_public_key(system.public_key, tmp_path / "reporters" / "system--s1.pub.pem")  # identity system/s1
    reg = FileRegistry(tmp_path / "registry")
    d = ppo_policy_dir(tmp_path)
    for v in ("v1", "v2"):
        reg.publish(d, {**metadata_from_policy_dir(d), "name": "ppo", "version": v}, operator)
    reg.set_current(f"site/{SITE}", "v1", expected=None)
    cmd = CanaryStart(run="run1", candidate="v2", sha256=reg.manifest("v2").sha256, current="v1",
                      slice=CanarySlice(sites=(SITE,)), hours=24.0, margins=(KPIMargin("kpi.slo_violation"),),
                      pre_ticks=1)  # fmt: skip
    port = free_port()
    proc = _serve(nats_server.url, tmp_path, port, "serve-1.log")

    async def status(op: NatsBus) -> CanaryStatus:
        return CanaryStatus.from_dict((await op.request(status_subject(SITE), status_request("run1"), timeout=10)).payload)

    async def until(cond: Any, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not await cond():
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.1)

    async def tick(op: NatsBus, reporter: NatsBus, t: int, width: int) -> None:
        import nats

        nc = await nats.connect(nats_server.url)
        body = json.dumps({"obs": [[0.5] * width] * len(GROUPS), "agents": GROUPS, "t": t}).encode()
        reply = json.loads((await nc.request(f"edgetwin.decision.{SITE}", body, timeout=10,
                                             headers={"Content-Type": "application/json"})).data)  # fmt: skip
        await nc.close()
        assert len(reply["arms"]) == len(GROUPS)
        rows = pd.DataFrame({"agent": GROUPS, "kpi.slo_violation": 0.1})
        await reporter.publish_durable(outcome_subject(SITE), outcome_envelope(SITE, t, rows, "system/s1"))

    async def main() -> None:
        nonlocal proc
        op = NatsBus(NatsConfig(servers=[nats_server.url], name="op"))
        reporter = NatsBus(NatsConfig(servers=[nats_server.url], name="sys"))
        reporter.auth = MessageAuth(Keyring(), {"system/s1": system})
        await op.connect()
        await reporter.connect()
        await op.publish_durable(command_subject(), sign_start(cmd, stranger))
        await op.publish_durable(command_subject(), sign_start(cmd, operator))
        await until(lambda: _phase(op, "pre"))
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert 'edgetwin_canary_commands_refused_total{reason="untrusted_key",site="s1"} 1.0' in page
        width = len(cluster_spec(ClusterConfig(n_agents=4)).observation_columns)  # ppo_policy_dir's spec
        for t in range(3):
            await tick(op, reporter, t, width)
            await until(lambda n=t + 1: _ticks(op, n))
        proc.send_signal(signal.SIGKILL)  # dies mid-run: no graceful end
        proc.wait(30)
        proc = _serve(nats_server.url, tmp_path, free_port(), "serve-2.log")
        st = await status(op)
        assert (st.run, st.phase, st.ticks) == ("run1", "running", 3)  # resumed from the spool
        await tick(op, reporter, 3, width)
        await until(lambda: _ticks(op, 4))
        await op.publish_durable(command_subject(), sign_stop(CanaryStop("run1"), operator))
        await until(lambda: _phase(op, "stopped"))
        st = await status(op)
        assert st.stop_reason == "operator" and st.segments == 4
        await op.close()
        await reporter.close()

    async def _phase(op: NatsBus, phase: str) -> bool:
        try:
            return (await status(op)).phase == phase
        except Exception:
            return False

    async def _ticks(op: NatsBus, n: int) -> bool:
        return (await status(op)).ticks == n

    try:
        asyncio.run(asyncio.wait_for(main(), timeout=240))
    finally:
        proc.terminate()
        proc.wait(30)
    lines = [ln for ln in (tmp_path / "serve-1.log").read_text().splitlines() if "canary command refused" in ln]
    assert len(lines) == 1 and "untrusted_key" in lines[0]
