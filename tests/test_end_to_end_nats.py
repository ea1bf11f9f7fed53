"""The path to production end to end, over a real nats-server (issue 7's acceptance test).

fit a twin of the emulated cluster -> train a policy in it -> what-if report -> promote through the
gate into the JetStream registry -> an edge runtime serves the cluster over NATS request/reply ->
a deliberately bad policy is promoted with the gate overridden -> the runtime rolls back by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nats
import numpy as np
import pytest
import torch

from edgetwin.contract.logs import write_table
from edgetwin.contract.spec import spec_path_for
from edgetwin.demo import DemoSizes, _fit_twin
from edgetwin.edge.bus import NatsBus, NatsConfig
from edgetwin.edge.kpi_watch import KPIGuard, KPIMargin
from edgetwin.edge.message_auth import Keyring
from edgetwin.edge.messages import Envelope
from edgetwin.edge.registry import NatsRegistry
from edgetwin.edge.runtime import (
    EdgeRuntime,
    kpi_report,
    kpi_subject,
    request_decision,
    rollback_subject,
    signed_frame,
)
from edgetwin.edge.signing import Signer, TrustStore, save_private_key, save_public_key
from edgetwin.emulator.cluster import ClusterConfig, EdgeCluster
from edgetwin.emulator.logs import generate_logs
from edgetwin.policies.candidates import ConstantPolicy
from edgetwin.policies.export import export_policy, load_policy
from edgetwin.policies.train import train_policy
from edgetwin.twin.report import write_report
from edgetwin.twin.whatif import builtin_policy, fixed_policy, load_scenarios, run_whatif

pytestmark = pytest.mark.nats
SITE = "edge-e2e"
SCOPE = f"site/{SITE}"
DATA = Path(__file__).resolve().parents[1] / "edgetwin" / "data" / "whatif"
SCENARIOS, KPIS = DATA / "emulated_cluster.toml", DATA / "emulated_kpis.toml"


def promote_cli(policy: Path, url: str, key: Path, twin: Path, log: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "edgetwin.cli", "promote", str(policy), "--registry", url, "--key", str(key),
           "--twin", str(twin), "--log", str(log), "--scope", SCOPE, "--episodes", "1", "--out", str(out), *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def promote_here(capsys: pytest.CaptureFixture[str], policy: Path, url: str, key: Path, twin: Path, log: Path,
                 out: Path, *extra: str) -> tuple[int, str]:
    """`edgetwin promote` through the CLI's entry point in this process: (exit code, stderr).

    The gate's two decisions before the runtime starts run here, as tests/test_gate.py runs the
    command; a fresh interpreter would import torch and the twin again (~10 s of CPU each). The forced
    promotion while the runtime serves stays a separate process (`promote_cli`), as an operator's is."""
    from edgetwin.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["promote", str(policy), "--registry", url, "--key", str(key), "--twin", str(twin), "--log", str(log),
              "--scope", SCOPE, "--episodes", "1", "--out", str(out), *extra])
    return int(e.value.code or 0), capsys.readouterr().err


async def wait_for(cond: Any, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        await asyncio.sleep(0.02)
    return bool(cond())

async def close_all(*conns: Any) -> None:
    """Close buses and NATS connections, each bounded: a slow close must not hang the test."""
    for c in conns:
        closer = c.drain() if hasattr(c, "drain") else c.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(closer, timeout=10)



def test_fit_train_whatif_promote_serve_and_roll_back_over_nats(
    nats_server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.set_num_threads(1)
    # the reward this path's refusal was written against (offload minus SLO violations: the all-cloud,
    # full-price policy below loses its return), kept when the cluster's default became the operator's
    # multi-objective (issue 44), under which the same policy's revenue makes up for it
    config = ClusterConfig(n_agents=20, steps=96, reward_weights={"response.offload_ratio": 1.0, "kpi.slo_violation": -0.5})
    df, spec = generate_logs(config, episodes=2, policy="random", seed=11)
    log_path = write_table(df, tmp_path / "logs.parquet")
    spec.save(spec_path_for(log_path))

    # tiny, but with enough behaviour cloning that the twin sees offloading fall with the price
    # (with 2 epochs it does not, and the gate below would have nothing to refuse)
    twin = _fit_twin(log_path, spec, seed=11, sizes=dataclasses.replace(DemoSizes.tiny(), bc_epochs=10))
    twin_dir = twin.save(tmp_path / "twin")
    trained = train_policy(twin, algo="ppo", steps=1_000, seed=11, out=tmp_path / "policy")

    policies = [builtin_policy("logging", twin), fixed_policy("trained", load_policy(trained.path))]
    result = run_whatif(twin, policies, load_scenarios(SCENARIOS), baseline="logging", episodes=1, seeds=1, seed=11,
                        log=df, progress=False)
    report = write_report(result, tmp_path / "whatif")
    assert Path(report["html"]).is_file()

    signer = Signer.generate()
    sensor = Signer.generate()  # the cluster's KPI sensor: reports are signed (issue 45 item 8)
    (tmp_path / "keys").mkdir()
    key = save_private_key(signer.private_key, tmp_path / "keys" / "pub.key.pem")
    save_public_key(signer.public_key, tmp_path / "keys" / "pub.pub.pem")
    trust = TrustStore([signer.public_key])

    # the gate replays recent traffic the twin was not fitted on (its training log is refused, exit 2)
    recent, _ = generate_logs(config, episodes=2, policy="random", seed=12)
    recent_path = write_table(recent, tmp_path / "recent.parquet")
    spec.save(spec_path_for(recent_path))

    def named(name: str) -> Path:  # the gate config naming the policy in the registry
        (tmp_path / f"{name}.toml").write_text(f'name = "{name}"\n')
        return tmp_path / f"{name}.toml"
    # the gate with wide margins on two KPIs (the spec's own margins, 2-5 %, are not what a 1,000-step
    # policy is expected to meet): not to be catastrophic; the bad policy below is promoted with the gate overridden
    good_code, good_err = promote_here(capsys, Path(trained.path), nats_server.url, key, Path(twin_dir), recent_path, tmp_path / "gate-good",
                       "--max-regression", "return=100%", "--max-regression", "kpi.slo_violation=100%",
                       "--gate-config", str(named("trained")), "--max-out-of-support", "1", "--json",
                       "--level", "50%")  # one replayed episode supports 50 % (at 90 % the gate abstains)
    assert good_code == 0, good_err[-2000:]
    bad_dir = export_policy(ConstantPolicy(spec, [0.0, 0.05, 1.0]), tmp_path / "bad", spec)
    refused_code, refused_err = promote_here(capsys, bad_dir, nats_server.url, key, Path(twin_dir), recent_path, tmp_path / "gate-bad",
                          "--gate-config", str(named("bad")), "--kpis", str(KPIS), "--max-regression", "return=10%",
                          "--max-out-of-support", "1", "--level", "50%")  # a corner of the box: else the gate abstains (exit 3)
    # the gate refuses a policy that sends all to the cloud at the full price: on the cluster its
    # return is 0.01 against the trained policy's 0.43, in this twin about half the trained one's
    assert refused_code == 1, refused_err[-2000:]
    assert "return fell" in refused_err

    guard = KPIGuard(margins=(KPIMargin("kpi.task_time_ms", max_regression=0.25),), window=5, grace=1, patience=2)
    kpi_cols = spec.names("kpi")
    cluster = EdgeCluster(config)
    notices: list[Envelope] = []

    async def main() -> None:
        nc = await nats.connect(nats_server.url)
        reg = NatsRegistry(nc)
        good_version = await reg.current(SCOPE)
        assert good_version is not None
        cfg = {"servers": [nats_server.url], "reconnect_backoff_s": 0.05, "reconnect_backoff_max_s": 0.5}
        bus, edge = NatsBus(NatsConfig(name="rt", **cfg)), NatsBus(NatsConfig(name="cluster", **cfg))
        await bus.connect()
        await edge.connect()

        async def on_notice(rcv: Any) -> None:
            notices.append(rcv.envelope)

        await edge.subscribe(rollback_subject(SITE), on_notice)
        served: list[str] = []

        async def drive(steps: int, obs: np.ndarray) -> np.ndarray:
            for _ in range(steps):
                d = await request_decision(edge, SITE, obs, timeout=30.0)
                served.append(d.version)
                obs, _, done, info = cluster.step(d.actions)
                kpis = dict(zip(kpi_cols, info["kpis"].mean(axis=0), strict=True))
                await edge.publish_raw(kpi_subject(SITE), signed_frame(kpi_report(SITE, kpis, version=d.version, sender="sensor"), sensor))
                await asyncio.sleep(0.01)
                if done:
                    obs = cluster.reset(seed=7)
            return obs

        async with EdgeRuntime(SITE, reg, trust, bus=bus, kpi_guard=guard, poll_interval=0.1,
                               reporters=Keyring({"sensor": sensor.public_key})) as rt:
            obs = await drive(12, cluster.reset(seed=5))
            assert rt.version == good_version
            forced = await asyncio.to_thread(
                promote_cli, bad_dir, nats_server.url, key, Path(twin_dir), recent_path, tmp_path / "gate-forced",
                "--gate-config", str(named("bad")), "--force",
            )
            assert forced.returncode == 0, forced.stderr[-2000:]
            bad_version = await reg.current(SCOPE)
            assert bad_version != good_version
            assert await wait_for(lambda: rt.version == bad_version)
            n0 = len(served)
            obs = await drive(25, obs)
            assert await wait_for(lambda: bool(notices) and rt.version == good_version)
            assert await wait_for(lambda: rt.status()["pending_rollback"] is None)
            assert await reg.current(SCOPE) == good_version
            after = served[n0:]
            assert bad_version in after and after[-1] == good_version
        assert notices[0].payload["to_version"] == good_version
        await close_all(bus, edge, nc)

    asyncio.run(asyncio.wait_for(main(), timeout=300))  # a hang fails the test, not CI
