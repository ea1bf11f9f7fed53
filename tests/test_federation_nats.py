"""MA-FL robustness against a real nats-server (started by the `nats_server` fixture on a free port).

- a federation over NATS, with malformed / oversized / unknown-version frames injected on the wire;
- an ESA process killed mid-round (SIGKILL): the round closes on its quorum within its timeout,
  the ESA restarts from its checkpoint, finishes the round it was in and its stale update is
  mixed in later with a smaller weight;
- the server restarted mid-training: agents reconnect, every update stored by JetStream reaches
  its aggregator, the training finishes;
- 20 % Byzantine clients sending scaled updates: the coordinate median keeps the final reward
  within 10 % of the clean run, plain FedAvg does not.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from test_agents import learners_for

from edgetwin.edge.bus import Subjects, make_bus
from edgetwin.edge.message_auth import KEYS_ENV, FederationKeys, write_keys
from edgetwin.federation.agents import EdgeServiceAgent
from edgetwin.federation.runner import (
    agent_command,
    build_federation,
    federation_identities,
    make_federation_config,
    run_federation,
)

pytestmark = pytest.mark.nats
torch.set_num_threads(1)


def fast_bus(url: str):
    """NATS clients that reconnect quickly (the server restarts within a second in these tests)."""

    def factory(name: str):
        return make_bus(
            url, name=name, reconnect_backoff_s=0.05, reconnect_backoff_max_s=0.5, fetch_timeout_s=0.5
        )

    return factory


async def _stop(fed) -> None:
    for a in [*fed.esas, *fed.coas, fed.gca]:
        await a.stop()
    for b in fed.buses:
        await b.close()


def test_federation_over_nats_rejects_bad_frames_and_counts_bytes(nats_server):
    cfg = make_federation_config(
        sites=4, rounds=3, clusters=2, strategy="fedavg", global_strategy="fedavgm", timeout_s=60.0, seed=0
    )

    async def scenario():
        fed = await build_federation(cfg, fast_bus(nats_server.url), learners=learners_for(cfg))
        coa = next(c for c in fed.coas if c.node.name == "cluster-0")
        async with make_bus(nats_server.url, name="intruder") as intruder:
            frames = [
                b"garbage",
                b"ET\x01\xff\xff\xff\x7f{",
                b"ET\x09\x02\x00\x00\x00{}",
                b"\0" * (800 << 10),
            ]
            for f in frames:
                # the update subject is a JetStream subject: the COA's durable consumer fetches these
                await intruder.publish_raw(Subjects.update("site", "cluster-0"), f)
                await intruder.publish_raw(Subjects.intent("cluster-0", "site-0"), f)
            await intruder.flush()
        try:
            recs = await fed.gca.run(cfg.rounds)
            await asyncio.sleep(0.5)
        finally:
            await _stop(fed)
        return recs, coa, fed

    recs, coa, fed = asyncio.run(scenario())
    assert [r.reason for r in recs] == ["complete"] * 3 and all(r.aggregated for r in recs)
    rejected = coa.bus.stats.rejected
    # 4 frames on each of 2 subjects; 800 KiB is under the 1 MiB limit so it is malformed, not oversized
    assert rejected["malformed"] == 6 and rejected["unknown_version"] == 2, dict(rejected)
    assert coa.bus.stats.handler_errors == 0
    # bytes per level: ESA uplinks reach the COAs, COA uplinks the GCA
    for r in coa.records:
        assert r.bytes_up > 0 and r.bytes_down > 0
    assert all(r.bytes_up > 0 for r in fed.gca.records)
    assert len(fed.gca.versions) == 3 and fed.gca.versions[-1]["version"] == 3


def test_oversized_frames_over_nats_are_rejected(nats_server):
    async def scenario():
        got = []
        async with (
            make_bus(nats_server.url, name="small", max_bytes=64 << 10) as small,
            make_bus(nats_server.url, name="big") as big,
        ):

            async def handler(rcv):
                got.append(rcv)

            await small.subscribe(Subjects.intent("c", "s"), handler)
            await small.flush()
            await big.publish_raw(Subjects.intent("c", "s"), b"ET" + b"\0" * (100 << 10))
            await big.flush()
            await asyncio.sleep(0.3)
            return got, dict(small.stats.rejected)

    got, rejected = asyncio.run(scenario())
    assert got == [] and rejected == {"oversized": 1}


def _spawn_esa(cfg_path: Path, url: str, site: str, state: Path, log: Path, keys: Path) -> subprocess.Popen:
    """An `edgetwin agent esa` process with the federation's keys directory (an agent on NATS refuses
    to start without one)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", KEYS_ENV: str(keys)}
    return subprocess.Popen(
        agent_command("esa", cfg_path, url, site, state_dir=state),
        stdout=subprocess.PIPE,
        stderr=log.open("ab"),
        env=env,
        text=True,
    )


def _wait_line(proc: subprocess.Popen, event: str, timeout: float) -> dict:
    import select

    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        line = proc.stdout.readline()
        if not line:
            break
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        if ev.get("event") == event:
            return ev
    raise AssertionError(f"no {event!r} from the ESA process within {timeout}s")


def _kill_config(rounds: int, grace_s: float = 0.3):
    return make_federation_config(
        sites=4,
        rounds=rounds,
        hierarchy=False,
        strategy="fedavg",
        quorum=3,
        grace_s=grace_s,
        timeout_s=15.0,
        staleness={"exponent": 1.0, "max_staleness": rounds},
        compression=False,
        model_wait_s=1.0,
        seed=0,
        learner={"kind": "forecast", "local_epochs": 40},  # ~0.2-0.5 s of local training per round
    )


async def _wait_pending(ckpt: Path, round_: int, run: asyncio.Task, timeout: float = 120) -> None:
    """Until the ESA's checkpoint says it is training ``round_`` (written just before training)."""
    deadline = time.monotonic() + timeout
    while True:
        doc = json.loads(ckpt.read_text()) if ckpt.is_file() else {}
        if doc.get("pending") == [round_, round_]:
            return
        assert not run.done() and time.monotonic() < deadline, f"round {round_} never started: {doc}"
        await asyncio.sleep(0.005)


def _check_rejoin(recs, victim: str, killed_round: int, rounds: int) -> None:
    killed = recs[killed_round]
    assert killed.missing == [victim] and killed.reason == "quorum+grace", (killed.reason, killed.missing)
    assert killed.elapsed_s < 15.0 and killed.aggregated
    assert all(r.aggregated for r in recs) and len(recs) == rounds
    # Under load the victim's update of an earlier round may itself arrive late (before the kill);
    # the update this test is about is the restarted ESA's, which can only land after the killed round.
    late = [r for r in recs if victim in r.late and r.round > killed_round]
    seen = [(r.round, sorted(r.on_time), sorted(r.late), r.missing, r.reason) for r in recs]
    assert late, f"the restarted ESA's update of the round it was killed in never arrived: {seen}"
    rec = late[0]
    assert rec.late[victim] >= 1 and rec.round > killed_round
    # staleness-aware mixing, (1 + s)^-1 with equal sample counts: at most half an on-time weight
    assert rec.weights[victim] <= 0.5 * min(w for c, w in rec.weights.items() if c != victim) + 1e-6
    # after that it is a normal participant again
    assert any(victim in r.on_time for r in recs if r.round > rec.round)


def test_esa_crashed_mid_round_rejoins_and_its_stale_update_is_discounted(nats_server, tmp_path):
    """The ESA's task and connection die mid-training; a new ESA on the same checkpoint rejoins."""
    # While the victim is away each round waits out the grace (1 s): that leaves the restarted ESA
    # several seconds to finish the killed round and land its late update before the run ends,
    # even on a loaded machine (with 0.3 s and 8 rounds it once missed the last round).
    victim, cfg = "site-3", _kill_config(rounds=10, grace_s=1.0)

    async def scenario():
        fed = await build_federation(
            cfg, fast_bus(nats_server.url), learners=learners_for(cfg), state_dir=tmp_path
        )
        run = asyncio.create_task(fed.gca.run(cfg.rounds))
        old = next(e for e in fed.esas if e.site.name == victim)
        await _wait_pending(tmp_path / victim / "esa.json", 2, run)
        await old.stop()  # crash: its tasks and its connection go away, the round goes on
        await old.bus.close()
        fed.esas.remove(old)
        deadline = time.monotonic() + 60
        while fed.gca._current_round < 3:
            assert time.monotonic() < deadline, "round 2 never closed"
            await asyncio.sleep(0.02)
        # restart: a fresh learner and connection; the checkpoint says round 2 was under way
        bus = fast_bus(nats_server.url)(f"esa-{victim}-restarted")
        bus.auth = old.bus.auth  # the restarted site signs with its own key, as before the crash
        await bus.connect()
        fed.buses.append(bus)
        site = next(s for s in cfg.site_specs() if s.name == victim)
        new = EdgeServiceAgent(
            bus,
            site,
            learners_for(cfg)[3],
            parent=old.parent,
            run=cfg.run,
            peers=old.peers,
            codec=cfg.make_codec(),
            state_dir=tmp_path / victim,
            model_wait_s=cfg.model_wait_s,
        )
        await new.start()
        fed.esas.append(new)
        try:
            recs = await asyncio.wait_for(run, 180)
        finally:
            await _stop(fed)
        return recs, new

    recs, new = asyncio.run(scenario())
    assert new.records[0]["round"] == 2 and new.records[0]["base"] == 2  # it finished the round it was in
    _check_rejoin(recs, victim, 2, cfg.rounds)


@pytest.mark.slow
def test_esa_process_killed_mid_round_rejoins_and_its_stale_update_is_discounted(nats_server, tmp_path):
    """The same with a real `edgetwin agent esa` process and SIGKILL (slow: the restart imports torch)."""
    victim, cfg = "site-3", _kill_config(rounds=40)
    cfg_path = cfg.save(tmp_path / "fed.json")
    state = tmp_path / "state"
    log = tmp_path / "esa.log"
    keys = write_keys(tmp_path / "keys", federation_identities(cfg))
    proc = _spawn_esa(cfg_path, nats_server.url, victim, state, log, keys)
    restarted: subprocess.Popen | None = None
    try:
        _wait_line(proc, "ready", 120)

        async def scenario():
            nonlocal restarted
            here = [i for i in federation_identities(cfg) if i != f"esa/{victim}"]
            fed = await build_federation(
                cfg, fast_bus(nats_server.url), learners=learners_for(cfg), exclude_sites=[victim],
                keys=FederationKeys.load(keys, own=here),
            )
            run = asyncio.create_task(fed.gca.run(cfg.rounds))
            await _wait_pending(state / "esa.json", 2, run)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            while fed.gca._current_round < 3:
                await asyncio.sleep(0.02)
            restarted = await asyncio.to_thread(_spawn_esa, cfg_path, nats_server.url, victim, state, log, keys)
            try:
                recs = await asyncio.wait_for(run, 600)
            finally:
                await _stop(fed)
            return recs

        recs = asyncio.run(scenario())
        assert restarted is not None
        _wait_line(restarted, "done", 120)
        assert restarted.wait(30) == 0
    finally:
        for p in (proc, restarted):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    _check_rejoin(recs, victim, 2, cfg.rounds)


def test_server_restart_mid_training_loses_no_durable_update(nats_server):
    cfg = make_federation_config(
        sites=4,
        rounds=6,
        clusters=2,
        strategy="fedavg",
        global_strategy="fedavg",
        grace_s=0.3,
        # rounds close on their quorum; the timeout is only the bound for a lost update. At 8 s a
        # loaded 2-core machine timed the last global round out with nothing lost (seen once in 2
        # runs at load 10): generous, so that only a real loss fails the test
        timeout_s=60.0,
        model_wait_s=1.0,
        compression=False,
        seed=0,
        learner={"kind": "forecast", "local_epochs": 100},
    )

    async def scenario():
        fed = await build_federation(cfg, fast_bus(nats_server.url), learners=learners_for(cfg))
        run = asyncio.create_task(fed.gca.run(cfg.rounds))
        deadline = time.monotonic() + 120
        while fed.gca._current_round < 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # the ESAs are training round 2
        await asyncio.to_thread(nats_server.restart)
        try:
            recs = await asyncio.wait_for(run, 180)
            # stragglers published across the restart: give them a moment to be delivered
            published = {i for e in fed.esas for i in e.published_ids}
            for _ in range(100):
                received = set().union(*(c.received_ids for c in fed.coas))
                if published <= received:
                    break
                await asyncio.sleep(0.1)
        finally:
            await _stop(fed)
        return recs, fed, published, received

    recs, fed, published, received = asyncio.run(scenario())
    assert len(recs) == cfg.rounds and recs[-1].aggregated
    assert all(b.stats.reconnects >= 1 for b in fed.buses)
    assert published and published <= received, f"{len(published - received)} durable updates lost"
    # the training went on after the restart: every ESA trained in the last rounds
    assert all(max(r["round"] for r in e.records) >= cfg.rounds - 2 for e in fed.esas)


def test_byzantine_scaled_updates_over_nats_median_holds_fedavg_does_not(nats_server):
    byz = {"site-0": {"kind": "scaled", "scale": -10.0}, "site-5": {"kind": "scaled", "scale": -10.0}}
    out = {}
    for name, strategy, attacks in [
        ("clean", "fedavg", {}),
        ("fedavg", "fedavg", byz),
        ("median", "median", byz),
    ]:
        cfg = make_federation_config(
            sites=10,
            rounds=15,
            hierarchy=False,
            strategy=strategy,
            attacks=attacks,
            compression=False,
            timeout_s=20.0,
            seed=0,
        )
        res = run_federation(
            cfg, bus=nats_server.url, learners=learners_for(cfg), share_bus="cluster", progress=False
        )
        assert all(r["reason"] == "complete" for r in res.rounds)
        out[name] = float(np.mean([v for k, v in res.final_rewards.items() if k not in byz]))
    clean = out["clean"]
    assert clean > 0.5
    assert abs(out["median"] - clean) <= 0.1 * clean, out
    assert out["fedavg"] < 0.9 * clean, out


@pytest.mark.slow
def test_cli_federate_as_subprocesses_over_nats(nats_server, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "res.json"
    cp = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgetwin.cli",
            "federate",
            "--sites",
            "3",
            "--rounds",
            "3",
            "--clusters",
            "1",
            "--bus",
            nats_server.url,
            "--processes",
            "--out",
            str(out),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert cp.returncode == 0, cp.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert len(doc["rounds"]) == 3 and all(r["aggregated"] for r in doc["rounds"])
