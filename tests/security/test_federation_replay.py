"""Replays across federated twin fits (issue 45 item 3), with the CLI's default ``--fit-id twin``
on both days and the same keys:

* yesterday's signed ``done`` task replayed into today's fit does not stop the sites (it carries
  yesterday's run and site nonces; re-signed with a day-old ``ts`` it is stale; and a ``done`` of
  *today's* run signed a day ago is refused on its ``ts`` alone);
* yesterday's site-B updates replayed into today's fit (B down today) never count as B's answers
  (they echo yesterday's run nonce; re-bound to today's run but signed a day ago they are stale).

"Yesterday" is a real fit on its own in-process broker; its frames are replayed verbatim (or
re-signed with the sender's key where the test says so) into today's broker.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from typing import Any

import numpy as np
import pytest
import torch

from edgetwin.edge.bus import InMemoryBus, MemoryBroker, Subjects
from edgetwin.edge.message_auth import FederationKeys
from edgetwin.edge.messages import MAGIC, SCHEMA_VERSION, signing_payload
from edgetwin.edge.signing import Signer
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs
from edgetwin.federation.twin.fit import FitOptions
from edgetwin.federation.twin.runner import COORDINATOR, TwinCoordinator, TwinSiteAgent, split_by_site
from edgetwin.twin.twin import Twin

torch.set_num_threads(1)

#: the CLI's default fit id, both days
FIT_ID = "twin"
DAY_S = 86_400.0
TINY = FitOptions.light(rounds=1, local_epochs=1, em_iters=1, n_components=1, support_centroids=8, bank=50,
                        net_arch=[8], engine_arch=[8], members=1)
_PREFIX_LEN = 7  # "<2sBI": magic, version, header length


def _split(frame: bytes) -> tuple[dict[str, Any], bytes]:
    n = int.from_bytes(frame[3:7], "little")
    return json.loads(frame[_PREFIX_LEN:_PREFIX_LEN + n]), frame[_PREFIX_LEN + n:]


def _resign(frame: bytes, signer: Signer, ts_shift: float = 0.0, **payload: Any) -> bytes:
    """``frame`` as its sender would have signed it ``ts_shift`` seconds later, ``payload`` fields
    replaced (a key holder's message: only the tests hold the keys)."""
    header, blobs = _split(frame)
    header = {k: v for k, v in header.items() if k != "auth"}
    header["ts"] = float(header["ts"]) + ts_shift
    header["payload"] = {**header["payload"], **payload}
    header["auth"] = {"alg": "ed25519", "sig": base64.b64encode(signer.sign(signing_payload(header, blobs))).decode()}
    hb = json.dumps(header, separators=(",", ":")).encode()
    return MAGIC + bytes([SCHEMA_VERSION]) + len(hb).to_bytes(4, "little") + hb + blobs


async def _fit(broker: MemoryBroker, keys: FederationKeys, spec: Any, logs: dict[str, Any], expected: list[str],
               quorum: float | int = 1.0, on_open: Any = None, on_round: Any = None
               ) -> tuple[Twin | BaseException, TwinCoordinator, list[TwinSiteAgent]]:
    """One day's fit on ``broker``: the coordinator expects ``expected``; the sites of ``logs`` run."""
    async def client(name: str, identity: str) -> InMemoryBus:
        b = InMemoryBus(broker, name=name)
        b.auth = keys.auth(identity)
        await b.connect()
        return b

    buses = [await client("coordinator", COORDINATOR)]
    coord = TwinCoordinator(spec, expected, buses[0], TINY, quorum=quorum, grace_s=0.3, timeout_s=15, fit_id=FIT_ID,
                            on_round=(lambda rec: on_round(coord, rec)) if on_round else None)
    await coord.start()
    sites = []
    for name, df in sorted(logs.items()):
        buses.append(await client(f"site-{name}", name))
        s = TwinSiteAgent(name, df, spec, buses[-1], FIT_ID, min_agents=3)  # the logs' scenarios: 3-7 agents
        await s.start()
        sites.append(s)
    watcher = asyncio.create_task(on_open(coord)) if on_open else None
    try:
        result: Twin | BaseException = await coord.run()
    except Exception as e:  # noqa: BLE001 - the test asserts on it
        result = e
    finally:
        if watcher is not None:
            watcher.cancel()
        for s in sites:
            await s.stop()
        await coord.stop()
        for b in buses:
            await b.close()
    return result, coord, sites


@pytest.fixture(scope="module")
def yesterday() -> tuple[Any, dict[str, Any], FederationKeys, list[tuple[str, bytes]]]:
    df, spec = generate_logs(ClusterConfig(n_agents=18, steps=10), episodes=2, seed=3)
    parts = split_by_site(df)
    a, b = sorted(parts)[:2]
    logs = {a: parts[a], b: parts[b]}
    keys = FederationKeys.generate([COORDINATOR, a, b])
    broker = MemoryBroker()
    twin, _, _ = asyncio.run(_fit(broker, keys, spec, logs, sorted(logs)))
    assert isinstance(twin, Twin), twin
    return spec, logs, keys, [(e.subject, e.data) for e in broker.log]


def test_yesterdays_done_task_replayed_into_todays_fit_does_not_stop_the_sites(yesterday):
    spec, logs, keys, frames = yesterday
    tasks = Subjects.model("twin", FIT_ID)
    done = next(d for s, d in frames if s == tasks and _split(d)[0]["payload"].get("final"))
    coordinator_key = keys.private[COORDINATOR]
    today = MemoryBroker()
    today.append(tasks, done, uuid.uuid4().hex)  # in the stream before today's sites subscribe

    def after_hello(coord: TwinCoordinator, rec: dict[str, Any]) -> None:
        if rec["phase"] != "hello":
            return
        today.append(tasks, done, uuid.uuid4().hex)  # verbatim, again mid-fit
        today.append(tasks, _resign(done, coordinator_key, -DAY_S), uuid.uuid4().hex)
        # today's run and site nonces, but signed a day ago: refused on its ts alone
        today.append(tasks, _resign(done, coordinator_key, -DAY_S, run=getattr(coord, "run_nonce", "0" * 32),
                                    sites=getattr(coord, "_site_nonces", {})), uuid.uuid4().hex)

    twin, coord, sites = asyncio.run(_fit(today, keys, spec, logs, sorted(logs), on_round=after_hello))
    assert isinstance(twin, Twin), f"today's fit did not complete: {twin!r}"
    assert all(rec["sites"] == sorted(logs) for rec in coord.report.rounds), coord.report.rounds
    for s in sites:
        assert s.replays["other_run"] >= 2, s.replays  # yesterday's done, before and after today's hello
        assert s.replays["stale"] >= 2, s.replays  # the day-old signatures


def test_yesterdays_site_b_updates_replayed_today_do_not_count(yesterday):
    spec, logs, keys, frames = yesterday
    a, b = sorted(logs)
    updates = Subjects.update("twin", FIT_ID)
    by_round: dict[int, list[bytes]] = {}
    for s, d in frames:
        h = _split(d)[0]
        if s == updates and h["sender"] == b:
            by_round.setdefault(int(h["round"]), []).append(d)
    assert 1 in by_round and len(by_round) >= 5  # yesterday B answered hello .. residual
    today = MemoryBroker()
    b_key = keys.private[b]

    async def replay_each_round(coord: TwinCoordinator) -> None:
        seen: set[int] = set()
        while True:
            for r in [r for r in list(coord._collectors) if r not in seen]:
                seen.add(r)
                for d in by_round.get(r, []):
                    today.append(updates, d, uuid.uuid4().hex)
                    # bound to today's run, but signed a day ago
                    today.append(updates, _resign(d, b_key, -DAY_S, run=getattr(coord, "run_nonce", "0" * 32)),
                                 uuid.uuid4().hex)
            await asyncio.sleep(0.01)

    # B is down today: only A runs; one answer is a quorum
    twin, coord, _ = asyncio.run(_fit(today, keys, spec, {a: logs[a]}, [a, b], quorum=1, on_open=replay_each_round))
    assert isinstance(twin, Twin), twin
    counted = [rec["sites"] for rec in coord.report.rounds]
    assert all(sites == [a] for sites in counted), counted
    assert coord.refused["other_run"] >= len(coord.report.rounds), coord.refused
    assert coord.refused["stale"] >= len(coord.report.rounds), coord.refused


def test_task_and_update_schemas_require_a_run_nonce_and_fresh_ts():
    from edgetwin.contract.errors import InputError
    from edgetwin.edge.messages import encode
    from edgetwin.federation.twin.messages import CLOCK_SKEW_S, is_fresh, make_task, make_update, new_nonce

    with pytest.raises(InputError, match="run"):
        encode(make_task(COORDINATOR, FIT_ID, 1, "hello", 0, 0))
    with pytest.raises(InputError, match="run"):
        encode(make_update("s", FIT_ID, 1, "hello", 0, 0, np.ones(1, np.float32), 1.0, run="yesterday"))
    with pytest.raises(InputError, match="site nonce"):  # only a hello carries the site's nonce
        encode(make_update("s", FIT_ID, 2, "stats1", 0, 0, np.ones(1, np.float32), 1.0, run=new_nonce(),
                           nonce=new_nonce()))
    assert new_nonce() != new_nonce()
    env = make_task(COORDINATOR, FIT_ID, 1, "hello", 0, 0, run=new_nonce())
    now = float(env.ts)
    assert is_fresh(env, now - 10, now)
    assert not is_fresh(env, now + CLOCK_SKEW_S + 1, now)  # signed before the round it answers opened
    assert not is_fresh(env, now - 10, now - CLOCK_SKEW_S - 1)  # from a clock too far ahead
