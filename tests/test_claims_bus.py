"""docs/bus.md's defaults, checked against the code and, for the JetStream stream, a real nats-server.

The page states the durable subjects, the stream's name, storage, duplicate window and message size,
the reconnect policy, the frame limit and where `/metrics` listens; each test reads the page's
value and checks the behaviour (the stream a default-configured bus creates) or the default.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import typer.main

from edgetwin.cli import app
from edgetwin.contract.errors import InputError
from edgetwin.edge.bus import NatsBus, NatsConfig
from edgetwin.edge.messages import Envelope

DOC = (Path(__file__).resolve().parents[1] / "docs" / "bus.md").read_text()
FLAT = re.sub(r"\s+", " ", DOC)


def _durable_subjects() -> list[str]:
    span = re.search(r"The durable subjects are `NatsConfig.durable_subjects` \(default ([^)]+)\)", FLAT).group(1)  # type: ignore[union-attr]
    return re.findall(r"`([^`]+)`", span)


def test_the_configs_defaults_are_the_pages() -> None:
    cfg = NatsConfig()
    assert cfg.durable_subjects == _durable_subjects() and len(cfg.durable_subjects) == 4
    assert f"`NatsConfig.stream` (default `{cfg.stream}`)" in FLAT and cfg.stream == "EDGETWIN"
    assert "file storage by default" in FLAT and cfg.storage == "file"
    assert "Reconnect: forever by default (`max_reconnect_attempts = -1`)" in FLAT and cfg.max_reconnect_attempts == -1
    assert "`max_bytes` (default 1 MiB" in FLAT and cfg.max_bytes == 1 << 20
    assert "`stream_max_age_s` retention (0: unlimited)" in FLAT and cfg.stream_max_age_s == 0.0


def test_metrics_listen_on_loopback_by_default() -> None:
    assert "the default listens on 127.0.0.1 only" in FLAT
    serve = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    assert next(p for p in serve.params if "--metrics-addr" in p.opts).default == "127.0.0.1"


@pytest.mark.nats
def test_a_default_bus_makes_the_pages_stream(nats_server) -> None:  # type: ignore[no-untyped-def]
    """One durable publish on a default-configured bus creates the stream the page describes, and a
    subject outside the durable ones is refused."""
    window = float(re.search(r"duplicate window (\d+) s", FLAT).group(1))  # type: ignore[union-attr]

    async def main() -> None:
        async with NatsBus(NatsConfig(servers=[nats_server.url], name="claims")) as bus:
            env = Envelope("intent", "esa/s1", 1, {"site": "s1", "cluster": "c0", "predicted_backlog": 1.0, "migrations": []})
            with pytest.raises(InputError, match="not a durable subject"):
                await bus.publish_durable("edgetwin.intent.s1", env)
            await bus.publish_durable("edgetwin.canary.claims", env)
            info = await bus.js.stream_info("EDGETWIN")
            c = info.config
            assert sorted(c.subjects) == sorted(_durable_subjects())
            assert str(getattr(c.storage, "value", c.storage)) == "file"
            assert c.duplicate_window == pytest.approx(window)
            assert c.max_msg_size == 1 << 20
            assert info.state.messages == 1

    asyncio.run(asyncio.wait_for(main(), 30))


def test_the_pages_bus_toml_loads_and_its_refusals_hold(tmp_path: Path) -> None:
    """`NatsConfig.load("bus.toml")` reads the page's example as written; "Unknown keys, a wrong type,
    two authentication methods at once, a user without a password or a TLS certificate without its
    key are refused with an `InputError` naming the file and key"."""
    start = DOC.index("```toml\n[nats]") + len("```toml\n")
    example = DOC[start : DOC.index("```", start)]
    path = tmp_path / "bus.toml"
    path.write_text(example)
    cfg = NatsConfig.load(path)
    assert cfg.servers == ["nats://10.0.0.5:4222", "nats://10.0.0.6:4222"] and cfg.user == "edge"
    assert cfg.durable_subjects == _durable_subjects() and cfg.max_bytes == 1 << 20
    for text, named in (
        (example + 'colour = "blue"\n', "colour"),
        (example.replace("max_deliver = 5", 'max_deliver = "five"'), "max_deliver"),
        (example + 'token = "t"\n', "token"),
        (example + 'tls_cert = "c.pem"\n', "tls_key"),
    ):
        path.write_text(text)
        with pytest.raises(InputError) as err:
            NatsConfig.load(path)
        assert str(path) in str(err.value) and named in str(err.value), str(err.value)
    path.write_text(example.replace('password = "..."\n', ""))
    with pytest.raises(InputError, match="password"):
        NatsConfig.load(path)


def test_a_policy_that_fails_on_valid_observations_is_answered_500_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The decision wire's table: "500 | the policy failed on valid observations (also logged at
    WARNING)"; the runtime answers at once and keeps serving (the next request gets actions)."""
    import json
    import logging

    from test_decision_wire import ask
    from test_runtime import SITE, SPEC, SLOAware, obs_batch, promote, publish

    from edgetwin.edge import decision_wire as W
    from edgetwin.edge.bus import InMemoryBus, MemoryBroker
    from edgetwin.edge.registry import FileRegistry
    from edgetwin.edge.runtime import EdgeRuntime
    from edgetwin.edge.signing import Signer, TrustStore

    row = next(ln for ln in DOC.splitlines() if ln.startswith("| 500 |"))
    assert "the policy failed on valid observations (also logged at WARNING)" in row
    signer, reg, broker = Signer.generate(), FileRegistry(tmp_path / "registry"), MemoryBroker()
    body = json.dumps({"obs": obs_batch(3).tolist()}).encode()
    headers = {"Content-Type": W.JSON}

    async def main() -> tuple[object, object]:
        async with InMemoryBus(broker, name="rt") as rt_bus, InMemoryBus(broker, name="client") as client, \
                EdgeRuntime(SITE, reg, TrustStore([signer.public_key]), bus=rt_bus, kpi_guard=None, poll_interval=60) as rt:
            publish(reg, tmp_path, SLOAware(SPEC), "v1", signer)
            promote(reg, "v1")
            assert await rt.refresh()
            served = rt.decide_with_info

            def broken(obs: object) -> object:
                raise RuntimeError("the network returned NaN")

            rt.decide_with_info = broken  # type: ignore[method-assign]
            failed = await ask(client, body, headers)
            rt.decide_with_info = served  # type: ignore[method-assign]
            return failed, await ask(client, body, headers)

    with caplog.at_level(logging.WARNING):
        failed, ok = asyncio.run(asyncio.wait_for(main(), 30))
    assert failed.headers[W.ERROR_CODE] == "500" and "the network returned NaN" in json.loads(failed.data)["error"]  # type: ignore[attr-defined]
    assert any(r.levelno == logging.WARNING and "the network returned NaN" in r.getMessage() for r in caplog.records)
    assert W.ERROR not in ok.headers  # type: ignore[attr-defined]
