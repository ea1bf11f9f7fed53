"""Messages (frame, validation, rejection) and the in-memory bus (pub/sub, request/reply, durable)."""

from __future__ import annotations

import asyncio
import json
import struct

import numpy as np
import pytest

from edgetwin.contract.errors import InputError
from edgetwin.edge.bus import (
    InMemoryBus,
    MemoryBroker,
    NatsBus,
    NatsConfig,
    NoResponders,
    Received,
    Subjects,
    make_bus,
    subject_matches,
)
from edgetwin.edge.messages import Envelope, MessageRejected, decode, encode
from edgetwin.federation.compression import UpdateCodec, decode_update, model_update


def run(coro, timeout: float = 60.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def intent(site="s1", backlog=3.0, **extra):
    payload = {"site": site, "cluster": "c0", "predicted_backlog": backlog, "migrations": [], **extra}
    return Envelope("intent", f"esa/{site}", 1, payload)


async def until(cond, timeout=30.0):
    async def poll():
        while not cond():
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), timeout)


# ------------------------------------------------------------------------------ messages
def test_frame_round_trip_with_tensors():
    env = Envelope(
        "decision_request",
        "client",
        7,
        {"site": "s1", "deadline_ms": 20},
        {"obs": np.arange(12, dtype=np.float32).reshape(3, 4), "mask": np.array([True, False]), "i8": np.array([-3, 4], np.int8)},
    )
    out = decode(encode(env))
    assert (out.kind, out.sender, out.round, out.payload, out.msg_id) == (env.kind, env.sender, 7, env.payload, env.msg_id)
    for k, v in env.tensors.items():
        np.testing.assert_array_equal(out.tensors[k], v)
        assert out.tensors[k].dtype == v.dtype


def test_model_update_is_compact_binary():
    delta = np.random.default_rng(0).normal(size=50_000).astype(np.float32)
    enc = UpdateCodec(0.1, 8).encode("s1", delta)
    env = model_update("esa/s1", 3, enc, num_samples=128, level="site", group="c0", base_round=2)
    frame = encode(env)
    assert len(frame) < enc.encoded_nbytes + 400  # raw bytes, no base64 / text numbers
    back = decode(frame)
    np.testing.assert_array_equal(decode_update(back), UpdateCodec.decode(enc))
    assert back.payload["base_round"] == 2 and back.payload["num_samples"] == 128


def _frame(header: dict, v: int = 1, tail: bytes = b"") -> bytes:
    hb = json.dumps(header).encode()
    return struct.pack("<2sBI", b"ET", v, len(hb)) + hb + tail


GOOD_HEADER = {"kind": "intent", "sender": "x", "round": 0, "ts": 0.0, "id": "1", "tensors": [],
               "payload": {"site": "s", "cluster": "c", "predicted_backlog": 1.0, "migrations": []}}


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b"\x00" * 3, "malformed"),
        (b"garbage-garbage", "malformed"),
        (_frame(GOOD_HEADER)[:-5], "malformed"),
        (_frame(GOOD_HEADER, tail=b"xx"), "malformed"),
        (struct.pack("<2sBI", b"ET", 1, 5) + b"{nope", "malformed"),
        (_frame({**GOOD_HEADER, "tensors": [["t", "object", [2]]]}), "malformed"),
        (_frame({**GOOD_HEADER, "tensors": [["t", "float32", [1000]]]}, tail=b"\x00" * 8), "malformed"),
        (_frame({**GOOD_HEADER, "round": "one"}), "malformed"),
        (_frame(GOOD_HEADER, v=99), "unknown_version"),
        (_frame({**GOOD_HEADER, "kind": "telepathy"}), "unknown_kind"),
        (_frame({**GOOD_HEADER, "payload": {"site": "s"}}), "invalid_payload"),
        (_frame({**GOOD_HEADER, "payload": {**GOOD_HEADER["payload"], "predicted_backlog": "lots"}}), "invalid_payload"),
        (_frame({**GOOD_HEADER, "payload": {**GOOD_HEADER["payload"], "migrations": [{"service": 1}]}}), "invalid_payload"),
        (_frame({**GOOD_HEADER, "payload": {**GOOD_HEADER["payload"], "predicted_backlog": True}}), "invalid_payload"),
        (_frame(GOOD_HEADER).replace(b'"predicted_backlog": 1.0', b'"predicted_backlog": NaN'), "malformed"),
    ],
)
def test_bad_frames_are_rejected_with_a_reason(frame, reason):
    with pytest.raises(MessageRejected) as e:
        decode(frame)
    assert e.value.reason == reason


def test_oversized_and_bad_model_updates():
    env = intent()
    frame = encode(env)
    with pytest.raises(MessageRejected, match="oversized"):
        decode(frame, max_bytes=len(frame) - 1)
    with pytest.raises(InputError, match="max_bytes"):
        encode(env, max_bytes=10)
    with pytest.raises(InputError, match="missing field"):
        encode(Envelope("intent", "x", 0, {"site": "s"}))
    bad = model_update("x", 0, UpdateCodec(0.1, 8).encode("x", np.ones(100, np.float32)), num_samples=1, level="site", group="c")
    bad.payload["codec"]["size"] = 5  # the bitmap no longer fits the size
    with pytest.raises(InputError, match="does not decode"):
        encode(bad)


def test_subject_matching():
    assert subject_matches("edgetwin.intent.*.>", "edgetwin.intent.c0.s1")
    assert subject_matches("edgetwin.intent.*.>", "edgetwin.intent.c0.s1.x")
    assert not subject_matches("edgetwin.intent.*.>", "edgetwin.intent.c0")
    assert subject_matches("a.*.c", "a.b.c") and not subject_matches("a.*.c", "a.b.d")
    assert subject_matches(">", "a") and not subject_matches("a.b", "a.b.c")
    with pytest.raises(InputError):
        Subjects.intent("c.0", "s1")


# ------------------------------------------------------------------------------ in-memory bus
def test_pubsub_wildcards_queue_groups_and_isolation():
    async def main():
        broker = MemoryBroker()
        a, b = InMemoryBus(broker, name="a"), InMemoryBus(broker, name="b")
        await a.connect()
        await b.connect()
        got, q1, q2 = [], [], []

        async def h(r: Received):
            got.append((r.subject, r.envelope.payload["site"]))

        await b.subscribe("edgetwin.intent.*.>", h)
        await b.subscribe("edgetwin.intent.c0.*", lambda r: _append(q1, r), queue="workers")
        await b.subscribe("edgetwin.intent.c0.*", lambda r: _append(q2, r), queue="workers")
        for i in range(10):
            await a.publish(Subjects.intent("c0", f"s{i}"), intent(f"s{i}"))
        await a.flush()
        other = InMemoryBus(name="elsewhere")  # its own broker: sees nothing
        await other.connect()
        await other.publish(Subjects.intent("c0", "zz"), intent("zz"))
        await a.flush()
        assert [s for _, s in got] == [f"s{i}" for i in range(10)]
        assert len(q1) + len(q2) == 10 and q1 and q2
        assert a.stats.published == 10 and b.stats.received == 20 and b.stats.bytes_in == a.stats.bytes_out * 2
        await a.close()
        await b.close()

    run(main())


async def _append(lst, r):
    lst.append(r)


def test_request_reply_timeout_no_responders_and_failing_responder():
    async def main():
        async with make_bus("memory") as bus:
            async def double(r):
                return Envelope("decision_reply", "srv", 0, {"policy_version": 3}, {"actions": r.envelope.tensors["obs"] * 2})

            async def broken(r):
                raise RuntimeError("model not loaded")

            async def silent(r):
                return None

            await bus.serve(Subjects.decision("s1"), double)
            await bus.serve(Subjects.decision("s2"), broken)
            await bus.serve(Subjects.decision("s3"), silent)
            req = Envelope("decision_request", "c", 0, {"site": "s1"}, {"obs": np.ones((2, 3), np.float32)})
            rep = await bus.request(Subjects.decision("s1"), req, timeout=2.0)
            assert rep.kind == "decision_reply" and np.all(rep.tensors["actions"] == 2)
            err = await bus.request(Subjects.decision("s2"), req, timeout=2.0)
            assert err.kind == "error" and "model not loaded" in err.payload["reason"]
            with pytest.raises(TimeoutError):
                await bus.request(Subjects.decision("s3"), req, timeout=0.05)
            with pytest.raises(NoResponders):
                await bus.request(Subjects.decision("nobody"), req, timeout=1.0)
            assert bus.stats.handler_errors == 1

    run(main())


def test_rejected_messages_are_counted_and_never_reach_handlers_and_handler_errors_do_not_stop_the_bus():
    async def main():
        async with InMemoryBus(max_bytes=2048) as bus:
            seen = []

            async def h(r):
                if r.envelope.payload["site"] == "boom":
                    raise ValueError("handler bug")
                seen.append(r.envelope.payload["site"])

            await bus.subscribe("edgetwin.intent.>", h)
            subj = Subjects.intent("c0", "s1")
            await bus.publish_raw(subj, b"not a frame")
            await bus.publish_raw(subj, _frame(GOOD_HEADER, v=2))
            await bus.publish_raw(subj, _frame({**GOOD_HEADER, "kind": "nope"}))
            await bus.publish_raw(subj, encode(intent(pad="x" * 5000)))  # larger than this bus accepts
            await bus.publish(subj, intent("boom"))
            await bus.publish(subj, intent("ok"))
            await bus.flush()
            assert seen == ["ok"]
            assert dict(bus.stats.rejected) == {"malformed": 1, "unknown_version": 1, "unknown_kind": 1, "oversized": 1}
            assert bus.stats.handler_errors == 1

    run(main())


def test_durable_log_delivers_everything_resumes_and_redelivers():
    async def main():
        broker = MemoryBroker(max_deliver=3)
        pub = InMemoryBus(broker, name="esa")
        await pub.connect()
        subj = Subjects.update("site", "c0")
        enc = UpdateCodec(0.1, 8).encode("s", np.ones(64, np.float32))
        envs = [model_update("esa/s", r, enc, num_samples=1, level="site", group="c0") for r in range(5)]
        for e in envs:
            await pub.publish_durable(subj, e)
        assert await pub.publish_durable(subj, envs[0]) == 1  # same message id: stored once
        with pytest.raises(InputError, match="durable"):
            await pub.publish_durable(Subjects.intent("c0", "s"), intent())

        consumer = InMemoryBus(broker, name="coa")  # created after the messages were published
        await consumer.connect()
        got: list[int] = []
        attempts: dict[int, int] = {}

        async def flaky(r):
            rd = r.envelope.round
            attempts[rd] = attempts.get(rd, 0) + 1
            if rd == 2 and attempts[rd] < 2:
                raise RuntimeError("transient")
            got.append(rd)

        sub = await consumer.subscribe_durable(subj, "coa-c0", flaky)
        await until(lambda: len(got) == 5)
        assert got == [0, 1, 2, 3, 4]  # a failed message is retried before the consumer moves on
        assert attempts[2] == 2 and consumer.stats.redelivered == 1 and consumer.stats.durable_acked == 5
        await sub.unsubscribe()
        for r in (5, 6):
            await pub.publish_durable(subj, model_update("esa/s", r, enc, num_samples=1, level="site", group="c0"))
        # the same durable name resumes after what it acknowledged
        later: list[int] = []
        await consumer.subscribe_durable(subj, "coa-c0", lambda r: _append(later, r.envelope.round))
        await until(lambda: len(later) == 2)
        assert later == [5, 6]

        # a handler that always fails: given up after max_deliver, counted
        dead: list[int] = []

        async def always(r):
            dead.append(r.envelope.round)
            raise RuntimeError("poison")

        await consumer.subscribe_durable(subj, "poisoned", always)
        await until(lambda: consumer.stats.dead_letters == 7)
        assert len(dead) == 21
        await consumer.close()
        await pub.close()

    run(main())


def test_named_memory_brokers_connect_clients_in_one_process():
    async def main():
        MemoryBroker.forget("fed-test")
        a, b = make_bus("memory://fed-test"), make_bus("memory://fed-test")
        async with a, b:
            got = []
            await b.subscribe("edgetwin.summary.*", lambda r: _append(got, r))
            await a.publish(Subjects.summary("c0"), Envelope("summary", "coa/c0", 1, {"cluster": "c0", "stats": {"load": 0.5}}))
            await a.flush()
            assert len(got) == 1
        MemoryBroker.forget("fed-test")

    run(main())


# ------------------------------------------------------------------------------ config
def test_make_bus_and_nats_config(tmp_path):
    assert isinstance(make_bus("memory"), InMemoryBus)
    bus = make_bus("nats://127.0.0.1:4222,nats://127.0.0.1:4223", token="t")
    assert isinstance(bus, NatsBus) and bus.config.servers == ["nats://127.0.0.1:4222", "nats://127.0.0.1:4223"]
    with pytest.raises(InputError, match="--bus"):
        make_bus("kafka://x")
    p = tmp_path / "bus.toml"
    p.write_text('[nats]\nservers = "nats://10.0.0.1:4222"\nuser = "u"\npassword = "p"\nmax_bytes = 4096\n')
    cfg = NatsConfig.load(p)
    assert cfg.servers == ["nats://10.0.0.1:4222"] and cfg.user == "u" and cfg.max_bytes == 4096
    (tmp_path / "bus.json").write_text(json.dumps({"servers": ["nats://h:1"], "token": "abc", "reconnect_backoff_s": 1}))
    assert NatsConfig.load(tmp_path / "bus.json").token == "abc"
    for bad, match in [
        ({"servers": ["nats://h:1"], "colour": "red"}, "unknown keys"),
        ({"user": "u"}, "together"),
        ({"token": "t", "user": "u", "password": "p"}, "one authentication"),
        ({"max_bytes": "big"}, "integer"),
        ({"servers": ["h:1"]}, "servers"),
        ({"storage": "tape"}, "storage"),
        ({"tls_cert": "c.pem"}, "tls_key"),
    ]:
        with pytest.raises(InputError, match=match):
            NatsConfig.from_dict(bad)
    (tmp_path / "broken.toml").write_text("[nats\n")
    with pytest.raises(InputError, match="broken.toml"):
        NatsConfig.load(tmp_path / "broken.toml")
    with pytest.raises(InputError, match="nkey_seed_file"):
        NatsBus(NatsConfig(nkey_seed_file=str(tmp_path / "missing.nk")))._connect_options()
