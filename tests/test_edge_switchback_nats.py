"""A site-level switchback run by `edgetwin serve` in its own process over a real nats-server: the
operator's `canary start --design switchback` (a signed command on JetStream), the system asking
for decisions on the JSON, Arrow and envelope wires and reporting signed outcomes, the site serving
every group the arm of the block of each decision's tick, then `canary collect` from the stream and
`canary verdict --design switchback` on the collected log (the same operator and system as
`tests/test_edge_switchback.py`, whose fixture this reuses)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from test_edge_switchback import GROUPS, LATE, PLAN, SITE, _run, _served_arm, _start_cli, fleet  # noqa: F401

from edgetwin.edge import decision_wire as W
from edgetwin.edge.bus import NatsBus, NatsConfig
from edgetwin.edge.canary_command import (
    CanaryStatus,
    outcome_envelope,
    outcome_subject,
    status_request,
    status_subject,
)
from edgetwin.edge.message_auth import Keyring, MessageAuth
from edgetwin.edge.runtime import request_decision
from edgetwin.edge.signing import Signer, save_public_key

pytestmark = [pytest.mark.nats, pytest.mark.slow]


def _serve(url: str, d: Path, tmp: Path) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "edgetwin.cli", "serve", "--site", SITE, "--registry", str(d / "reg"), "--bus", url,
           "--trust", str(tmp / "trust"), "--reporters", str(tmp / "reporters"), "--cache-dir", str(tmp / "cache"),
           "--poll", "0.5", "--no-kpi-watch", "--log-level", "INFO"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=(tmp / "serve.log").open("w"), text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "edgetwin serve:" in line, (line, (tmp / "serve.log").read_text()[-2000:])
    return proc


async def _ask(nc: Any, wire: str, obs: np.ndarray, t: int) -> list[str]:
    """The arms of one tick's decision request on the JSON or Arrow wire (nats-py, as any client)."""
    if wire == "json":
        body = json.dumps({"obs": obs.tolist(), "agents": GROUPS, "t": t}).encode()
        msg = await nc.request(f"edgetwin.decision.{SITE}", body, timeout=10, headers={"Content-Type": W.JSON})
        return list(json.loads(msg.data)["arms"])
    schema = pa.schema([("profile.size", pa.float64()), ("state.backlog", pa.float64()), ("agent", pa.string())],
                       metadata={"t": str(t)})  # fmt: skip
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as w:
        w.write_batch(pa.record_batch([pa.array(obs[:, 0]), pa.array(obs[:, 1]), pa.array(GROUPS)], schema=schema))
    msg = await nc.request(f"edgetwin.decision.{SITE}", sink.getvalue().to_pybytes(), timeout=10,
                           headers={"Content-Type": W.ARROW})  # fmt: skip
    return list(pa.ipc.open_stream(pa.py_buffer(msg.data)).read_all().column("arm").to_pylist())


def test_serve_follows_a_switchback_over_nats_and_collect_and_verdict_judge_it(
    nats_server: Any, fleet: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    import nats

    d = fleet["d"]
    system = Signer.generate()
    (tmp_path / "trust").mkdir()
    save_public_key(fleet["signer"].public_key, tmp_path / "trust" / "operator.pub.pem")
    (tmp_path / "reporters").mkdir()
    save_public_key(system.public_key, tmp_path / "reporters" / f"system--{SITE}.pub.pem")  # identity system/hall
    proc = _serve(nats_server.url, d, tmp_path)
    ticks = PLAN.start_tick + PLAN.ticks
    arms: dict[int, list[str]] = {}
    try:
        assert _start_cli(fleet, nats_server.url, "sb-nats", "v2") == 0

        async def main() -> None:
            op = NatsBus(NatsConfig(servers=[nats_server.url], name="op"))
            reporter = NatsBus(NatsConfig(servers=[nats_server.url], name="sys"))
            reporter.auth = MessageAuth(Keyring(), {f"system/{SITE}": system})
            await op.connect()
            await reporter.connect()
            nc = await nats.connect(nats_server.url)

            async def status() -> CanaryStatus:
                env = await op.request(status_subject(SITE), status_request("sb-nats"), timeout=10)
                return CanaryStatus.from_dict(env.payload)

            async def until(cond: Any, timeout: float = 60.0) -> None:
                deadline = time.monotonic() + timeout
                while True:
                    try:
                        if cond(await status()):
                            return
                    except Exception:  # noqa: BLE001 - the site may not answer yet
                        pass
                    assert time.monotonic() < deadline, "timed out"
                    await asyncio.sleep(0.05)

            await until(lambda s: s.phase in ("pre", "running"))
            sizes = np.random.default_rng(21).uniform(1, 5, len(GROUPS))
            rng = np.random.default_rng(22)
            backlog = rng.uniform(0, 2, len(GROUPS))
            for t in range(ticks):
                obs = np.column_stack([sizes, backlog])
                wire = ("envelope", "json", "arrow")[t % 3]
                if wire == "envelope":
                    dec = await request_decision(op, SITE, obs, agents=GROUPS, t=t, timeout=10)
                    speed, arms[t] = np.asarray(dec.actions)[:, 0], list(dec.arms or ())
                else:
                    arms[t] = await _ask(nc, wire, obs, t)
                    speed = np.where(np.asarray(arms[t]) == "candidate", 1.0, 0.4)
                work = backlog + sizes
                done = np.clip(np.minimum(work, 6.0 * speed + rng.normal(0, 0.2, len(GROUPS))), 0, None)
                rows = pd.DataFrame({"agent": GROUPS, "scenario": "weekday", "response.done": done, LATE: work - done,
                                     "reward": done - work})  # fmt: skip
                await reporter.publish_durable(outcome_subject(SITE), outcome_envelope(SITE, t, rows, f"system/{SITE}"))
                await until(lambda s, n=t + 1: s.ticks >= n or s.phase == "stopped")
                backlog = np.clip(0.5 * (work - done), 0, 40)
            await until(lambda s: s.phase == "stopped" and s.shipped == s.segments)
            st = await status()
            assert st.stop_reason == "completed" and st.segments == ticks
            await nc.close()
            await op.close()
            await reporter.close()

        asyncio.run(asyncio.wait_for(main(), timeout=300))
    finally:
        proc.terminate()
        proc.wait(30)
    for t in range(ticks):
        assert arms[t] == [_served_arm(PLAN, t)] * len(GROUPS), t
    out = tmp_path / "sb.parquet"
    capsys.readouterr()
    code = _run("canary", "collect", "sb-nats", "--bus", nats_server.url, "--out", str(out), "--idle", "1",
                "--timeout", "60", "--json")  # fmt: skip
    got = capsys.readouterr()
    assert code == 0 and got.out, got
    assert json.loads(got.out)["rows"] == ticks * len(GROUPS), got
    code = _run("canary", "verdict", str(d / "twin"), "--canary-log", str(out), "--fleet-log", str(d / "fleet.parquet"),
                "--plan", str(d / "plan.json"), "--current", str(d / "v1"), "--candidate", str(d / "v2"),
                "--design", "switchback", "--json")  # fmt: skip
    got = capsys.readouterr()
    assert got.out, got.err
    verdict = json.loads(got.out)
    assert code == 0 and verdict["verdict"] == "promote", got
