"""The decision subject spoken the way NATS users expect: JSON bodies, metadata in headers, error
replies; asked by a client that uses plain nats-py and json (tests/clients/, imports nothing from
edgetwin) against a real nats-server, and Arrow IPC batches asked with pyarrow."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import nats
import numpy as np
import pyarrow as pa
import pytest
import torch

from edgetwin.edge.bus import NatsBus, NatsConfig
from edgetwin.edge.registry import FileRegistry, metadata_from_policy_dir
from edgetwin.edge.runtime import EdgeRuntime, request_decision
from edgetwin.edge.signing import Signer, TrustStore, save_public_key
from edgetwin.emulator.cluster import ClusterConfig, EdgeCluster, cluster_spec
from edgetwin.policies.export import ActionTransform, export_policy

pytestmark = pytest.mark.nats
torch.set_num_threads(1)

SITE = "s1"
SUBJECT = f"edgetwin.decision.{SITE}"
CLIENT = Path(__file__).resolve().parent / "clients" / "plain_nats_decision_client.py"


def ppo_policy_dir(tmp: Path) -> Path:
    """An exported (untrained) SB3 PPO MlpPolicy: real network outputs, not round numbers."""
    from gymnasium.wrappers import RescaleAction
    from stable_baselines3 import PPO

    from edgetwin.emulator.envs import EdgeClusterEnv

    spec = cluster_spec(ClusterConfig(n_agents=4))
    low, high = spec.bounds("action")
    model = PPO("MlpPolicy", RescaleAction(EdgeClusterEnv(ClusterConfig(n_agents=4)), -1.0, 1.0), n_steps=64, seed=0, device="cpu")
    return export_policy(model, tmp / "ppo", spec, action_transform=ActionTransform("box", low.tolist(), high.tolist()))


def plain_client(url: str, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run the plain nats-py + json client in its own interpreter."""
    r = subprocess.run(
        [sys.executable, str(CLIENT), url, SUBJECT], input=json.dumps(cases), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_plain_nats_json_client_gets_the_in_process_decisions(nats_server, tmp_path: Path) -> None:
    signer = Signer.generate()
    save_public_key(signer.public_key, tmp_path / "pub.pem")
    policy_dir = ppo_policy_dir(tmp_path)
    reg = FileRegistry(tmp_path / "registry")
    reg.publish(policy_dir, {**metadata_from_policy_dir(policy_dir), "name": "ppo", "version": "v1"}, signer)
    reg.set_current(f"site/{SITE}", "v1", expected=None)
    obs = EdgeCluster(ClusterConfig(n_agents=5, steps=4)).reset(seed=3)
    bus = NatsBus(NatsConfig(servers=[nats_server.url], name="rt"))
    rt = EdgeRuntime(SITE, reg, TrustStore.from_paths([tmp_path / "pub.pem"]), bus=bus, kpi_guard=None, poll_interval=60)

    async def run() -> tuple[list[dict[str, Any]], list[str], np.ndarray, Any, bytes, dict[str, str]]:
        async with bus, rt:
            cols = rt.active.observation_columns  # type: ignore[union-attr]
            rev = list(reversed(range(len(cols))))
            cases = [
                {"headers": {"Content-Type": "application/json"}, "body": json.dumps({"obs": obs[0].tolist()})},
                {"headers": {"Content-Type": "application/json", "Nats-Msg-Id": "req-42"},
                 "body": json.dumps({"obs": obs.tolist(), "site": SITE})},
                # no Content-Type: sniffed; columns named in another order
                {"headers": None, "body": json.dumps({"obs": obs[:, rev].tolist(), "columns": [cols[j] for j in rev]})},
                {"headers": {"Content-Type": "application/json", "Nats-Msg-Id": "bad-1"}, "body": "{not json"},
                {"headers": {"Content-Type": "application/json"}, "body": json.dumps({"obs": obs[:, :3].tolist()})},
                {"headers": {"Content-Type": "application/json"}, "body": '{"obs": [[NaN, 1.0]]}'},
                {"headers": {"Content-Type": "application/json"}, "body": json.dumps({"obs": [["1"] * len(cols)]})},
                {"headers": {"Content-Type": "application/json"}, "body": json.dumps({"obs": obs.tolist(), "site": "other"})},
                {"headers": {"Content-Type": "application/json"}, "body": json.dumps({"obs": obs.tolist(), "columns": [f"x{j}" for j in range(len(cols))]})},
                {"headers": {"Content-Type": "application/json"}, "body": json.dumps({"observations": obs.tolist()})},
                {"headers": {"Content-Type": "text/plain"}, "body": "1,2,3"},
                {"headers": {"Content-Type": "application/json"}, "body": json.dumps({"obs": obs[1].tolist()})},
            ]  # fmt: skip
            replies = await asyncio.to_thread(plain_client, nats_server.url, cases)
            # the same requests in process (float32 networks give batch-size-dependent last bits)
            expected = {"all": rt.decide(obs), "first": rt.decide(obs[:1]), "second": rt.decide(obs[1:2])}
            # the edgetwin frame keeps working on the same subject, beside the other formats
            client = NatsBus(NatsConfig(servers=[nats_server.url], name="frame-client"))
            async with client:
                framed = await request_decision(client, SITE, obs, timeout=10)
            # Arrow IPC batch: named columns in any order, the reply one column per action
            table = pa.table({c: obs[:, j] for j, c in reversed(list(enumerate(cols)))})
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as w:
                w.write_table(table)
            nc = await nats.connect(nats_server.url)
            try:
                m = await nc.request(SUBJECT, sink.getvalue().to_pybytes(), timeout=10,
                                     headers={"Content-Type": "application/vnd.apache.arrow.stream", "Nats-Msg-Id": "arrow-1"})  # fmt: skip
            finally:
                await nc.close()
            return replies, cols, expected, framed, m.data, dict(m.headers or {})

    replies, cols, expected, framed, arrow_body, arrow_headers = asyncio.run(run())
    ok = [replies[i] for i in (0, 1, 2, 11)]
    for r in ok:
        assert "Nats-Service-Error" not in r["headers"], r
        assert r["headers"]["Content-Type"] == "application/json"
        assert (r["headers"]["Edgetwin-Version"], r["headers"]["Edgetwin-Scope"]) == ("v1", f"site/{SITE}")
        assert r["body"]["version"] == "v1" and r["body"]["policy_version"] == int(r["headers"]["Edgetwin-Policy-Version"])
        assert r["body"]["action_columns"] == cluster_spec(ClusterConfig(n_agents=4)).action_columns
    # JSON floats round-trip exactly: the same float64 decisions as in process, not merely close
    np.testing.assert_array_equal(np.asarray(ok[0]["body"]["actions"]), expected["first"])
    np.testing.assert_array_equal(np.asarray(ok[1]["body"]["actions"]), expected["all"])
    np.testing.assert_array_equal(np.asarray(ok[2]["body"]["actions"]), expected["all"])
    np.testing.assert_array_equal(np.asarray(ok[3]["body"]["actions"]), expected["second"])
    assert ok[1]["headers"]["Nats-Msg-Id"] == "req-42"
    assert len(np.unique(expected["all"].round(6), axis=0)) > 1  # different observations, different actions

    errors = {i: replies[i] for i in range(3, 11)}
    for r in errors.values():
        h, body = r["headers"], r["body"]
        assert h["Nats-Service-Error-Code"] == str(body["code"]), r
        assert h["Nats-Service-Error"] and body["error"], r
    codes = {i: errors[i]["body"]["code"] for i in errors}
    assert codes == {3: 400, 4: 400, 5: 400, 6: 400, 7: 400, 8: 400, 9: 400, 10: 415}
    assert errors[3]["headers"]["Nats-Msg-Id"] == "bad-1" and "not valid JSON" in errors[3]["body"]["error"]
    assert f"(N, {len(cols)})" in errors[4]["body"]["error"] and "(5, 3)" in errors[4]["body"]["error"]
    assert "NaN" in errors[5]["body"]["error"]
    assert "numbers" in errors[6]["body"]["error"]
    assert "'other'" in errors[7]["body"]["error"]
    assert "missing" in errors[8]["body"]["error"] and cols[0] in errors[8]["body"]["error"]
    assert "observations" in errors[9]["body"]["error"]
    assert "text/plain" in errors[10]["body"]["error"]

    np.testing.assert_array_equal(framed.actions, expected["all"])
    assert arrow_headers["Content-Type"] == "application/vnd.apache.arrow.stream" and arrow_headers["Nats-Msg-Id"] == "arrow-1"
    reply = pa.ipc.open_stream(arrow_body).read_all()
    assert reply.column_names == cluster_spec(ClusterConfig(n_agents=4)).action_columns
    assert reply.schema.metadata[b"version"] == b"v1"
    np.testing.assert_array_equal(np.column_stack([reply.column(c).to_numpy() for c in reply.column_names]), expected["all"])
    # 4 good + 8 refused JSON requests, 1 Arrow request, 1 frame request; nothing crashed
    assert rt.stats.bus_requests == 14 and rt.stats.bus_errors == 8
    assert rt.stats.rows == (1 + 5 + 5 + 1) + (5 + 1 + 1) + 5 + 5  # JSON, in-process, frame and Arrow rows
