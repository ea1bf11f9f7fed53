"""JSON / Arrow decision requests on the in-process bus: headers carried, errors answered (503
before any policy, 413, 415, bad Arrow), the frame unchanged, and the wire module's parsing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_runtime import SITE, SPEC, SLOAware, obs_batch, promote, publish

from edgetwin.edge import decision_wire as W
from edgetwin.edge.bus import InMemoryBus, MemoryBroker, RawMessage
from edgetwin.edge.messages import decode
from edgetwin.edge.registry import FileRegistry
from edgetwin.edge.runtime import EdgeRuntime, request_decision
from edgetwin.edge.signing import Signer, TrustStore

COLS = list(SPEC.observation_columns)


def arrow_body(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


async def ask(client: InMemoryBus, body: bytes, headers: dict[str, str] | None) -> RawMessage:
    """A raw request with headers over the in-process bus (what nats-py's request does on NATS)."""
    got: asyncio.Future[RawMessage] = asyncio.get_running_loop().create_future()

    async def on_reply(m: RawMessage) -> None:
        if not got.done():
            got.set_result(m)

    inbox = f"_INBOX.test{id(got)}"
    sub = await client.subscribe_raw(inbox, on_reply)
    try:
        await client.publish_raw(f"edgetwin.decision.{SITE}", body, reply=inbox, headers=headers)
        return await asyncio.wait_for(got, 5.0)
    finally:
        await sub.unsubscribe()


def test_runtime_answers_json_and_arrow_on_the_memory_bus_and_refuses_bad_requests(tmp_path: Path) -> None:
    signer = Signer.generate()
    reg = FileRegistry(tmp_path / "registry")
    broker = MemoryBroker()
    obs = obs_batch(6)
    jh = {"Content-Type": W.JSON, "Nats-Msg-Id": "m-1"}

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        rt_bus, client = InMemoryBus(broker, name="rt", max_bytes=64 << 10), InMemoryBus(broker, name="client")
        async with rt_bus, client, EdgeRuntime(SITE, reg, TrustStore([signer.public_key]), bus=rt_bus, kpi_guard=None, poll_interval=60) as rt:
            out["before"] = await ask(client, json.dumps({"obs": obs.tolist()}).encode(), jh)  # nothing promoted yet
            publish(reg, tmp_path, SLOAware(SPEC), "v1", signer)
            promote(reg, "v1")
            assert await rt.refresh()
            out["json"] = await ask(client, json.dumps({"obs": obs.tolist()}).encode(), jh)
            lists = pa.FixedSizeListArray.from_arrays(pa.array(obs.ravel()), len(COLS))
            out["arrow_list"] = await ask(client, arrow_body(pa.record_batch([lists], names=["obs"])), None)  # sniffed
            with_null = pa.record_batch([pa.array([1.0, None])] * len(COLS), names=COLS)
            out["arrow_null"] = await ask(client, arrow_body(with_null), {"Content-Type": W.ARROW})
            out["not_arrow"] = await ask(client, b"\xff\xff\xff\xffgarbage", {"Content-Type": W.ARROW})
            out["too_big"] = await ask(client, json.dumps({"obs": np.zeros((4000, len(COLS))).tolist()}).encode(), jh)
            out["unknown"] = await ask(client, b"<xml/>", None)
            out["bad_frame"] = await ask(client, b"ET\x01\x05\x00\x00\x00{oops", None)  # an edgetwin frame, broken
            out["expected"] = rt.decide(obs)
            out["frame"] = (await request_decision(client, SITE, obs)).actions
            out["stats"] = rt.stats.as_dict()
        return out

    out = asyncio.run(main())
    before = out["before"]
    assert before.headers[W.ERROR_CODE] == "503" and before.headers[W.MSG_ID] == "m-1"
    assert "no verified policy" in json.loads(before.data)["error"]
    good = out["json"]
    assert W.ERROR not in good.headers and good.headers[W.MSG_ID] == "m-1" and good.headers[W.VERSION] == "v1"
    np.testing.assert_array_equal(np.asarray(json.loads(good.data)["actions"]), out["expected"])
    table = pa.ipc.open_stream(out["arrow_list"].data).read_all()
    assert out["arrow_list"].headers[W.CONTENT_TYPE] == W.ARROW and table.column_names == list(SPEC.action_columns)
    np.testing.assert_array_equal(np.column_stack([c.to_numpy() for c in table.columns]), out["expected"])
    np.testing.assert_array_equal(out["frame"], out["expected"])
    for key, code, words in (("arrow_null", "400", "null"), ("not_arrow", "400", "Arrow IPC"),
                             ("too_big", "413", "max_bytes"), ("unknown", "415", "not recognised")):  # fmt: skip
        m = out[key]
        body = json.loads(m.data)
        assert m.headers[W.ERROR_CODE] == code == str(body["code"]), (key, body)
        assert words in body["error"], (key, body)
    bad = decode(out["bad_frame"].data)  # answered in kind: an `error` envelope, not a timeout
    assert bad.kind == "error" and "rejected frame: malformed" in bad.payload["reason"]
    assert out["stats"]["bus_errors"] == 6 and out["stats"]["bus_requests"] == 9


def test_parse_request_checks_what_it_is_given() -> None:
    obs = obs_batch(3)
    h = {"content-type": "application/json; charset=utf-8"}  # header names and parameters as clients send them
    r = W.parse_request(json.dumps({"obs": obs.tolist()}).encode(), h, COLS, SITE)
    assert r.fmt == W.JSON and r.msg_id is None
    np.testing.assert_array_equal(r.obs, obs)
    one = W.parse_request(json.dumps({"obs": [1, 2, 3]}).encode(), {}, None, SITE)  # ints, one row, no spec
    assert one.obs.shape == (1, 3) and one.obs.dtype == np.float64
    with pytest.raises(W.BadDecisionRequest, match="repeated"):
        W.parse_request(json.dumps({"obs": [[1, 2]], "columns": ["a", "a"]}).encode(), {}, ["a", "b"], SITE)
    with pytest.raises(W.BadDecisionRequest, match="another|reached"):
        W.parse_request(json.dumps({"obs": [[1, 2]]}).encode(), {"Edgetwin-Site": "x"}, None, SITE)
    with pytest.raises(W.BadDecisionRequest, match="deadline_ms"):
        W.parse_request(json.dumps({"obs": [[1, 2]], "deadline_ms": "soon"}).encode(), {}, None, SITE)
    with pytest.raises(W.BadDecisionRequest, match="numeric"):
        W.parse_request(arrow_body(pa.record_batch([pa.array(["x"])], names=["a"])), {}, ["a"], SITE)
    with pytest.raises(W.BadDecisionRequest, match="nested"):
        W.parse_request(b'{"obs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", {}, None, SITE)
    with pytest.raises(W.BadDecisionRequest, match="3 dimensions"):
        W.parse_request(json.dumps({"obs": [[[1.0]]]}).encode(), {}, None, SITE)
    null_row = pa.FixedSizeListArray.from_arrays(pa.array([1.0, 2.0, 3.0, 4.0]), 2, mask=pa.array([False, True]))
    with pytest.raises(W.BadDecisionRequest, match="null rows"):
        W.parse_request(arrow_body(pa.record_batch([null_row], names=["obs"])), {}, None, SITE)
    assert W.is_frame(b"ET\x01...", {}) and not W.is_frame(b"ET\x01", {"Content-Type": W.JSON})
    body, headers = W.encode_error(400, "two\nlines", "id-1")
    assert headers[W.ERROR] == "two lines" and json.loads(body) == {"error": "two\nlines", "code": 400}


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["obs", "columns", "site", "x"]), inner, max_size=3),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(raw=st.binary(max_size=200), doc=_json)
def test_any_body_is_parsed_or_refused_with_a_reason(raw: bytes, doc: Any) -> None:
    """Hostile bodies (random bytes, random JSON, an Arrow marker in front of junk) never raise
    anything but `BadDecisionRequest`: the runtime always has a reply to send."""
    bodies = [raw, json.dumps(doc).encode(), b"\xff\xff\xff\xff" + raw, json.dumps({"obs": doc}).encode()]
    for body in bodies:
        for headers in ({}, {"Content-Type": W.JSON}, {"Content-Type": W.ARROW}):
            try:
                r = W.parse_request(body, headers, COLS, SITE)
            except W.BadDecisionRequest as e:
                assert e.reason and e.code in (400, 413, 415)
                continue
            assert r.obs.ndim == 2 and r.obs.dtype == np.float64


def test_freeze_gc_freezes_what_is_alive_after_a_load(tmp_path: Path) -> None:
    """`EdgeRuntime(freeze_gc=True)` (what `edgetwin serve` uses) moves what is alive after a load out
    of the collector's reach; off by default (it is process-wide)."""
    import gc

    signer = Signer.generate()
    reg = FileRegistry(tmp_path / "registry")
    publish(reg, tmp_path, SLOAware(SPEC), "v1", signer)
    promote(reg, "v1")
    gc.unfreeze()
    try:

        async def main(freeze: bool) -> int:
            async with EdgeRuntime(SITE, reg, TrustStore([signer.public_key]), kpi_guard=None, freeze_gc=freeze,
                                   cache_dir=tmp_path / f"cache-{freeze}") as rt:  # fmt: skip
                assert rt.version == "v1"
                return gc.get_freeze_count()

        assert asyncio.run(main(False)) == 0
        assert asyncio.run(main(True)) > 1000
    finally:
        gc.unfreeze()


# ------------------------------------------------------------------ issue 46, issue 43 item 2
def test_a_reordered_request_reaches_the_policy_in_the_served_layout_with_the_same_bits() -> None:
    """Columns sent in another order are reordered into a fresh C-contiguous float64 array: the
    policy then sees the very array (layout and bits) it sees for the request in its own order, so
    a matrix product takes the same BLAS path and decisions do not depend on the column order."""
    cols = [f"c{j}" for j in range(7)]
    obs = np.random.default_rng(0).normal(size=(33, 7))
    rev = list(reversed(range(7)))
    same = W.parse_request(json.dumps({"obs": obs.tolist()}).encode(), {"Content-Type": W.JSON}, cols, "s")
    body = json.dumps({"obs": obs[:, rev].tolist(), "columns": [cols[j] for j in rev]}).encode()
    other = W.parse_request(body, {"Content-Type": W.JSON}, cols, "s")
    table = pa.record_batch([pa.array(obs[:, j]) for j in rev], names=[cols[j] for j in rev])
    arrow = W.parse_request(arrow_body(table), {"Content-Type": W.ARROW}, cols, "s")
    for req in (same, other, arrow):
        assert req.obs.flags["C_CONTIGUOUS"] and req.obs.dtype == np.float64
        assert req.obs.tobytes() == obs.tobytes()
    w = np.random.default_rng(1).normal(size=(7, 5))
    assert (other.obs @ w).tobytes() == (same.obs @ w).tobytes() == (arrow.obs @ w).tobytes()


def test_group_ids_and_the_tick_on_the_json_and_arrow_wire() -> None:
    cols = ["a", "b"]
    obs = np.array([[1.0, 2.0], [3.0, 4.0]])
    body = json.dumps({"obs": obs.tolist(), "agents": ["g1", "g2"], "scenarios": ["iot", "mbb"], "t": 7}).encode()
    req = W.parse_request(body, {"Content-Type": W.JSON}, cols, "s")
    assert (req.agents, req.sites, req.scenarios, req.t) == (("g1", "g2"), None, ("iot", "mbb"), 7)
    batch = pa.record_batch([pa.array(obs[:, 1]), pa.array(["g1", "g2"]), pa.array(obs[:, 0]), pa.array(["s", "s"])],
                            names=["b", "agent", "a", "site"]).replace_schema_metadata({"t": "3"})  # fmt: skip
    req = W.parse_request(arrow_body(batch), {"Content-Type": W.ARROW}, cols, "s")
    assert (req.agents, req.sites, req.t) == (("g1", "g2"), ("s", "s"), 3) and req.obs.tolist() == obs.tolist()
    req = W.parse_request(json.dumps({"obs": obs.tolist()}).encode(), {"Content-Type": W.JSON, W.TICK: "9"}, cols, "s")
    assert req.agents is None and req.t == 9
    for bad in ({"agents": ["g1"]}, {"agents": ["g1", 2]}, {"t": -1}, {"t": True}, {"sites": ["s", "s"]}):
        with pytest.raises(W.BadDecisionRequest):
            W.parse_request(json.dumps({"obs": obs.tolist(), **bad}).encode(), {"Content-Type": W.JSON}, cols, "s")
    body, _ = W.encode_reply(W.JSON, obs, ["x", "y"], version="v1", scope="global", revision=1,
                             policies=["v1", "v2"], arms=["control", "candidate"], propensity=np.array([np.nan, 1.0]))  # fmt: skip
    doc = json.loads(body)
    assert (doc["policies"], doc["arms"], doc["propensity"]) == (["v1", "v2"], ["control", "candidate"], [None, 1.0])


def test_a_request_naming_no_groups_during_a_canary_is_served_by_the_current_policy_and_counted(tmp_path: Path) -> None:
    from edgetwin.edge.canary import CanaryConfig
    from edgetwin.edge.canary_slice import CanarySlice
    from edgetwin.edge.kpi_watch import KPIMargin

    signer = Signer.generate()
    reg = FileRegistry(tmp_path / "registry")
    publish(reg, tmp_path, SLOAware(SPEC), "v1", signer)
    publish(reg, tmp_path, SLOAware(SPEC), "v2", signer)
    promote(reg, "v1")
    obs = obs_batch(6)

    async def main() -> None:
        broker = MemoryBroker()
        bus, client = InMemoryBus(broker, name="rt"), InMemoryBus(broker, name="client")
        async with bus, client, EdgeRuntime(SITE, reg, TrustStore([signer.public_key]), bus=bus, kpi_guard=None,
                                            poll_interval=60) as rt:  # fmt: skip
            await rt.start_canary(CanaryConfig("v2", CanarySlice(sites=(SITE,)), 2.0, (KPIMargin("kpi.slo_violation"),),
                                               pre_ticks=0))  # fmt: skip
            reply = await client.request_raw(f"edgetwin.decision.{SITE}", json.dumps({"obs": obs.tolist()}).encode(), 10)
            assert json.loads(reply)["version"] == "v1" and "arms" not in json.loads(reply)
            agents = [f"g{i}" for i in range(len(obs))]
            named = json.loads(await client.request_raw(
                f"edgetwin.decision.{SITE}", json.dumps({"obs": obs.tolist(), "agents": agents}).encode(), 10))
            assert set(named["arms"]) <= {"candidate", "control"} and len(named["policies"]) == len(obs)
            assert all(p == ("v2" if a == "candidate" else "v1") for p, a in zip(named["policies"], named["arms"], strict=True))
            d = await request_decision(client, SITE, obs, agents=agents)
            assert d.arms is not None and list(d.arms) == named["arms"]
            await request_decision(client, SITE, obs)  # the frame, no groups
            assert rt.stats.unrouted == 2

    asyncio.run(asyncio.wait_for(main(), timeout=60))
