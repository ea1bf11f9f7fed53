"""The NATS bus against a real nats-server: pub/sub, request/reply, JetStream durability across
restarts, reconnects, rejection counting, and token / user-password / NKey / TLS authentication."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
from pathlib import Path

import numpy as np
import pytest
from conftest import NatsServer, free_port

from edgetwin.edge.bus import NatsBus, NatsConfig, Subjects
from edgetwin.edge.messages import Envelope, encode
from edgetwin.federation.compression import UpdateCodec, model_update

pytestmark = pytest.mark.nats


def run(coro, timeout: float = 30.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def config(url: str, **kw) -> NatsConfig:
    opts = {"servers": [url], "reconnect_backoff_s": 0.05, "reconnect_backoff_max_s": 0.5, "fetch_timeout_s": 0.5,
            "ack_wait_s": 5.0, "connect_timeout_s": 2.0, "durable_publish_timeout_s": 20.0, **kw}
    return NatsConfig(**opts)


async def until(cond, timeout=10.0):
    async def poll():
        while not cond():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


def intent(site="s1"):
    return Envelope("intent", f"esa/{site}", 1, {"site": site, "cluster": "c0", "predicted_backlog": 2.5, "migrations": []})


def update(r: int, site: str = "s1"):
    enc = UpdateCodec(0.1, 8).encode(site, np.random.default_rng(r).normal(size=256).astype(np.float32))
    return model_update(f"esa/{site}", r, enc, num_samples=10 + r, level="site", group="c0")


async def _append(lst, x):
    lst.append(x)


def test_pubsub_and_request_reply(nats_server):
    async def main():
        async with NatsBus(config(nats_server.url, name="a")) as a, NatsBus(config(nats_server.url, name="b")) as b:
            got = []
            await b.subscribe("edgetwin.intent.*.>", lambda r: _append(got, r.envelope.payload["site"]))

            async def policy(r):
                obs = r.envelope.tensors["obs"]
                return Envelope("decision_reply", "b", 0, {"policy_version": 1}, {"actions": obs.sum(axis=1, keepdims=True)})

            await b.serve(Subjects.decision("s1"), policy)
            await b.flush()
            for i in range(5):
                await a.publish(Subjects.intent("c0", f"s{i}"), intent(f"s{i}"))
            req = Envelope("decision_request", "a", 0, {"site": "s1"}, {"obs": np.ones((4, 3), np.float32)})
            rep = await a.request(Subjects.decision("s1"), req, timeout=2.0)
            np.testing.assert_array_equal(rep.tensors["actions"], np.full((4, 1), 3.0, np.float32))
            await until(lambda: len(got) == 5)
            assert got == [f"s{i}" for i in range(5)]

    run(main())


def test_a_responder_is_reachable_as_soon_as_serve_returns(nats_server):
    # nats-py lets a PING overtake a queued SUB; before the bus waited properly, 169 of 300 requests
    # sent right after subscribing got NoResponders (9 of 300 after one plain flush).
    async def main():
        async with NatsBus(config(nats_server.url, name="a")) as a, NatsBus(config(nats_server.url, name="b")) as b:

            async def echo(r):
                return Envelope("decision_reply", "b", r.envelope.round, {"policy_version": 1}, {"actions": r.envelope.tensors["obs"]})

            for i in range(100):
                await b.serve(Subjects.decision(f"s{i}"), echo)
                req = Envelope("decision_request", "a", i, {"site": f"s{i}"}, {"obs": np.ones((1, 3), np.float32)})
                rep = await a.request(Subjects.decision(f"s{i}"), req, timeout=5.0)
                assert rep.round == i

    run(main(), timeout=120.0)


def test_no_responders_is_reported(nats_server):
    from edgetwin.edge.bus import NoResponders

    async def main():
        async with NatsBus(config(nats_server.url)) as a:
            req = Envelope("decision_request", "a", 0, {"site": "s1"}, {"obs": np.ones((1, 3), np.float32)})
            with pytest.raises(NoResponders):
                await a.request(Subjects.decision("nobody"), req, timeout=5.0)
            await a.serve(Subjects.decision("slow"), lambda r: asyncio.sleep(10))
            await a.flush()
            with pytest.raises(TimeoutError):
                await a.request(Subjects.decision("slow"), req, timeout=0.2)

    run(main())


def test_jetstream_updates_survive_a_server_restart(nats_server):
    n = 20

    async def main():
        subj = Subjects.update("site", "c0")
        async with NatsBus(config(nats_server.url, name="esa")) as pub:
            seqs = [await pub.publish_durable(subj, update(r)) for r in range(n)]
            assert seqs == list(range(1, n + 1))
            await asyncio.to_thread(nats_server.restart)
            # the publisher reconnects by itself and keeps publishing durably
            await pub.publish_durable(subj, update(n))
            assert pub.stats.reconnects >= 1 and pub.stats.disconnects >= 1
        # a consumer created only after the restart still gets every message, in order
        async with NatsBus(config(nats_server.url, name="coa")) as con:
            got = []
            await con.subscribe_durable(subj, "coa-c0", lambda r: _append(got, r.envelope.round))
            await until(lambda: len(got) == n + 1, timeout=15.0)
            await asyncio.sleep(0.3)
            assert got == list(range(n + 1))  # none lost, none duplicated
            assert con.stats.durable_acked == n + 1

    run(main(), timeout=60.0)


def test_subscriptions_and_durable_consumers_continue_after_restart(nats_server):
    async def main():
        subj = Subjects.update("site", "c1")
        async with NatsBus(config(nats_server.url, name="sub")) as sub, NatsBus(config(nats_server.url, name="pub")) as pub:
            core, durable = [], []
            await sub.subscribe("edgetwin.intent.>", lambda r: _append(core, r.envelope.payload["site"]))
            await sub.subscribe_durable(subj, "coa-c1", lambda r: _append(durable, r.envelope.round))
            await pub.publish(Subjects.intent("c0", "before"), intent("before"))
            await pub.publish_durable(subj, update(0))
            await until(lambda: core == ["before"] and durable == [0])
            await asyncio.to_thread(nats_server.restart)
            await until(lambda: sub.stats.reconnects >= 1 and pub.stats.reconnects >= 1, timeout=15.0)
            await pub.publish_durable(subj, update(1))  # waits for JetStream to be back
            await sub.flush()
            await pub.publish(Subjects.intent("c0", "after"), intent("after"))
            await until(lambda: "after" in core and durable == [0, 1], timeout=15.0)

    run(main(), timeout=60.0)


def test_durable_publish_rides_out_a_server_outage(nats_server):
    async def main():
        subj = Subjects.update("site", "c2")
        async with NatsBus(config(nats_server.url, name="esa")) as pub:
            await pub.publish_durable(subj, update(0))
            await asyncio.to_thread(nats_server.stop)
            pending = asyncio.create_task(pub.publish_durable(subj, update(1)))
            await asyncio.sleep(0.5)
            assert not pending.done()  # held back, not lost and not failed
            await asyncio.to_thread(nats_server.start)
            assert await asyncio.wait_for(pending, 20.0) == 2
        async with NatsBus(config(nats_server.url, name="coa")) as con:
            got = []
            await con.subscribe_durable(subj, "coa-c2", lambda r: _append(got, r.envelope.round))
            await until(lambda: len(got) == 2)
            assert got == [0, 1]

    run(main(), timeout=60.0)


def test_malformed_oversized_unknown_version_rejected_and_counted(nats_server):
    async def main():
        subj = Subjects.intent("c0", "s1")
        dsubj = Subjects.update("site", "c3")
        async with NatsBus(config(nats_server.url, name="rx", max_bytes=4096)) as rx, NatsBus(config(nats_server.url, name="tx")) as tx:
            seen, dseen, failing = [], [], []
            await rx.subscribe("edgetwin.intent.>", lambda r: _append(seen, r.envelope.payload["site"]))

            async def durable_handler(r):
                if r.envelope.round == 7 and not failing:
                    failing.append(1)
                    raise RuntimeError("transient failure")  # nak -> redelivered
                dseen.append(r.envelope.round)

            await rx.subscribe_durable(dsubj, "rx-c3", durable_handler)
            await rx.flush()
            good = encode(intent("ok"))
            await tx.publish_raw(subj, b"\x00\x01garbage")
            await tx.publish_raw(subj, good[:2] + bytes([9]) + good[3:])  # schema version 9
            await tx.publish_raw(subj, encode(Envelope("intent", "tx", 0, {**intent().payload, "pad": "x" * 10_000})))
            await tx.publish(subj, intent("ok"))
            # a poison message in the durable stream is rejected and terminated, not redelivered forever
            await tx.js.publish(dsubj, b"not a frame")
            await tx.publish_durable(dsubj, update(7))
            await until(lambda: seen == ["ok"] and dseen == [7])
            await asyncio.sleep(0.3)
            assert dict(rx.stats.rejected) == {"malformed": 2, "unknown_version": 1, "oversized": 1}
            assert rx.stats.handler_errors == 1 and rx.stats.redelivered == 1 and dseen == [7]

    run(main())


# ------------------------------------------------------------------------------ authentication
def _server(tmp_path: Path, args: list[str]) -> NatsServer:
    s = NatsServer(port=free_port(), store=tmp_path / "js", extra_args=args)
    s.start()
    return s


async def _roundtrip(cfg: NatsConfig) -> bool:
    async with NatsBus(cfg) as bus:
        got = []
        await bus.subscribe("edgetwin.summary.*", lambda r: _append(got, 1))
        await bus.flush()
        await bus.publish(Subjects.summary("c0"), Envelope("summary", "coa", 0, {"cluster": "c0", "stats": {}}))
        await bus.publish_durable(Subjects.policy_version(), Envelope("policy_version", "gca", 0, {"version": 1, "uri": "x", "sha256": "0" * 64}))
        await until(lambda: got == [1])
        return True


def _refused(cfg: NatsConfig) -> bool:
    with pytest.raises(ConnectionError):
        run(NatsBus(cfg).connect())
    return True


def test_token_auth(tmp_path):
    s = _server(tmp_path, ["--auth", "s3cret"])
    try:
        assert run(_roundtrip(config(s.url, token="s3cret")))
        assert _refused(config(s.url, token="wrong", connect_attempts=1))
        assert _refused(config(s.url, connect_attempts=1))
    finally:
        s.stop()


def test_user_password_auth(tmp_path):
    s = _server(tmp_path, ["--user", "edge", "--pass", "pw-123"])
    try:
        assert run(_roundtrip(config(s.url, user="edge", password="pw-123")))
        assert _refused(config(s.url, user="edge", password="nope", connect_attempts=1))
    finally:
        s.stop()


def test_nkey_auth(tmp_path):
    nkeys = pytest.importorskip("nkeys")
    seed = nkeys.encode_seed(bytes(range(32)), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(seed).public_key.decode()
    (tmp_path / "user.nk").write_bytes(seed)
    other = nkeys.encode_seed(bytes(range(1, 33)), nkeys.PREFIX_BYTE_USER)
    (tmp_path / "other.nk").write_bytes(other)
    conf = tmp_path / "server.conf"
    conf.write_text(f'authorization {{ users = [ {{ nkey: "{public}" }} ] }}\n')
    s = _server(tmp_path, ["-c", str(conf)])
    try:
        assert run(_roundtrip(config(s.url, nkey_seed_file=str(tmp_path / "user.nk"))))
        assert _refused(config(s.url, nkey_seed_file=str(tmp_path / "other.nk"), connect_attempts=1))
    finally:
        s.stop()


def _self_signed(tmp_path: Path) -> tuple[Path, Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edgetwin test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = tmp_path / "ca.pem", tmp_path / "server.pem", tmp_path / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths


def test_tls(tmp_path):
    ca, cert, key = _self_signed(tmp_path)
    s = _server(tmp_path, ["--tls", "--tlscert", str(cert), "--tlskey", str(key), "--auth", "tls-token"])
    try:
        url = f"tls://127.0.0.1:{s.port}"
        assert run(_roundtrip(config(url, tls_ca=str(ca), token="tls-token")))
        # a client that does not trust the CA refuses the server
        assert _refused(config(url, token="tls-token", connect_attempts=1))
    finally:
        s.stop()
