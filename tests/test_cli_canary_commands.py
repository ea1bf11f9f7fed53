"""`edgetwin canary start / stop / collect` on the in-process bus (a named broker: every command of
this process is a client of it): a start is signed, names the candidate's registry version and
digest, the plan's slice, margins, hours, α, pre-ticks and the run, and verifies under the
operator's key only; a trained network kept beside a safe candidate (``policy.trained``) can be the
candidate; bad input is one line and exit 2 with nothing published; collect writes each
``<run>-<seq>`` once, refuses a segment a site ships as another's, and names the missing sequence
numbers."""

from __future__ import annotations

import asyncio
import io
import json
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from edgetwin.cli import main
from edgetwin.contract.spec import Feature, TwinSpec
from edgetwin.edge.bus import make_bus
from edgetwin.edge.canary_command import (
    CanaryStart,
    CanaryStop,
    CommandRefused,
    command_subject,
    verify_command,
)
from edgetwin.edge.messages import Envelope
from edgetwin.edge.registry import metadata_from_policy_dir, open_registry
from edgetwin.edge.signing import Signer, TrustStore, save_private_key
from edgetwin.policies.candidates import ConstantPolicy
from edgetwin.policies.export import export_policy


def _spec() -> TwinSpec:
    return TwinSpec((Feature("state.q", "continuous", 0.0, 9.0), Feature("action.a", "continuous", 0.0, 1.0),
                     Feature("kpi.late", "continuous", 0.0, None)), name="tiny")  # fmt: skip


def _run(*args: str) -> int:
    try:
        main(list(args))
    except SystemExit as e:
        return int(e.code or 0)
    return 0


@pytest.fixture()
def op(tmp_path: Path) -> dict[str, object]:
    spec = _spec()
    signer = Signer.generate()
    save_private_key(signer.private_key, tmp_path / "key.pem")
    for name, a in (("current", 0.3), ("cand", 0.9), ("policy.trained", 0.7)):
        export_policy(ConstantPolicy(spec, [a]), tmp_path / name, spec)
    with open_registry(str(tmp_path / "reg")) as reg:
        for v, name in (("v1", "current"), ("v2", "cand")):
            reg.publish(tmp_path / name, {**metadata_from_policy_dir(tmp_path / name), "name": name, "version": v}, signer)
        reg.set_current("global", "v1", expected=None)
    plan = {
        "candidate": "cand", "baseline": "current",
        "slice": {"agents": [f"g{i}" for i in range(6)], "treat_share": 0.5, "seed": 3}, "hours": 2.0,
        "margins": [{"kpi": "kpi.late", "max_regression": 0.05, "higher_is_better": False}], "kpis": [],
        "n_groups": 6, "fleet_groups": 30, "share": 0.2, "budget": {}, "decides": True, "why": ["test"],
        "loss_budget": {"kpi.late": 0.01}, "loss_levels": {"kpi.late": 2.0},
    }  # fmt: skip
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    return {"d": tmp_path, "signer": signer, "bus": f"memory://op-{uuid.uuid4().hex}"}


def _commands(bus_url: str) -> list[Envelope]:
    async def read() -> list[Envelope]:
        got: list[Envelope] = []

        async def h(rcv) -> None:  # type: ignore[no-untyped-def]
            got.append(rcv.envelope)

        async with make_bus(bus_url) as bus:
            sub = await bus.subscribe_durable(command_subject(), f"read-{uuid.uuid4().hex[:6]}", h)
            await asyncio.sleep(0.2)
            await sub.unsubscribe()
        return got

    return asyncio.run(read())


def _start(o: dict[str, object], *extra: str) -> int:
    d = o["d"]
    return _run("canary", "start", str(d / "plan.json"), "--registry", str(d / "reg"), "--key", str(d / "key.pem"),  # type: ignore[operator]
                "--bus", str(o["bus"]), *extra)  # fmt: skip


def test_start_publishes_a_signed_command_of_the_plan(op, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    assert _start(op, "--candidate", "v2", "--run", "r1", "--pre-ticks", "3", "--alpha", "0.1", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    (env,) = _commands(str(op["bus"]))
    cmd = verify_command(env, TrustStore([op["signer"].public_key]))  # type: ignore[attr-defined]
    assert isinstance(cmd, CanaryStart)
    with open_registry(str(op["d"] / "reg")) as reg:  # type: ignore[operator]
        assert cmd.sha256 == reg.manifest("v2").sha256 == doc["sha256"]
    assert (cmd.run, cmd.candidate, cmd.current, cmd.pre_ticks, cmd.alpha, cmd.hours) == ("r1", "v2", "v1", 3, 0.1, 2.0)
    assert list(cmd.slice.agents) == [f"g{i}" for i in range(6)] and cmd.slice.seed == 3
    assert [(m.kpi, m.max_regression, m.higher_is_better) for m in cmd.margins] == [("kpi.late", 0.05, False)]
    assert dict(cmd.max_loss) == {"kpi.late": 0.01} and cmd.fleet_groups == 30
    # another key's sites refuse it; a changed field breaks the signature
    with pytest.raises(CommandRefused, match="untrusted_key"):
        verify_command(env, TrustStore([Signer.generate().public_key]))
    env.payload["hours"] = 200.0
    with pytest.raises(CommandRefused, match="bad_signature"):
        verify_command(env, TrustStore([op["signer"].public_key]))  # type: ignore[attr-defined]


def test_the_trained_network_beside_a_safe_candidate_can_be_started(op, capsys) -> None:  # type: ignore[no-untyped-def]
    d = op["d"]
    assert _start(op, "--candidate", str(d / "policy.trained"), "--run", "r2", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    with open_registry(str(d / "reg")) as reg:
        assert doc["candidate"] not in ("v1", "v2") and doc["candidate"] in reg.list_versions()
        assert reg.manifest(doc["candidate"]).sha256 == doc["sha256"]
    # the same directory again: the version it already has, nothing republished
    assert _start(op, "--candidate", str(d / "policy.trained"), "--run", "r3", "--json") == 0
    assert json.loads(capsys.readouterr().out)["candidate"] == doc["candidate"]


@pytest.mark.parametrize("case", ["no-plan", "bad-plan", "alpha", "unknown-version", "unsigned", "current", "run-token"])
def test_bad_start_is_one_line_exit_2_and_nothing_is_sent(op, case: str, capsys) -> None:  # type: ignore[no-untyped-def]
    d = op["d"]
    (d / "junk.pem").write_text("not a key")
    args = {
        "no-plan": ("--candidate", "v2"), "bad-plan": ("--candidate", "v2"), "alpha": ("--candidate", "v2", "--alpha", "1.5"),
        "unknown-version": ("--candidate", "v7"), "unsigned": ("--candidate", "v2"), "current": ("--candidate", "v1"),
        "run-token": ("--candidate", "v2", "--run", "a.b"),
    }[case]  # fmt: skip
    if case == "no-plan":
        (d / "plan.json").unlink()
    if case == "bad-plan":
        (d / "plan.json").write_text('{"hours": 1}')
    if case == "unsigned":
        code = _run("canary", "start", str(d / "plan.json"), "--registry", str(d / "reg"), "--key", str(d / "junk.pem"),
                    "--bus", str(op["bus"]), *args)  # fmt: skip
    else:
        code = _start(op, *args)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert _commands(str(op["bus"])) == []


def test_stop_is_signed(op) -> None:  # type: ignore[no-untyped-def]
    assert _run("canary", "stop", "r1", "--key", str(op["d"] / "key.pem"), "--bus", str(op["bus"])) == 0  # type: ignore[operator]
    (env,) = _commands(str(op["bus"]))
    cmd = verify_command(env, TrustStore([op["signer"].public_key]))  # type: ignore[attr-defined]
    assert isinstance(cmd, CanaryStop) and cmd.run == "r1" and cmd.reason == "operator"


def _segment(site: str, run: str, seq: int, n: int) -> Envelope:
    df = pd.DataFrame({"agent": [f"g{i}" for i in range(n)], "site": site, "t": seq, "kpi.late": np.arange(n, dtype=float) + seq,
                       "policy": "v1"})  # fmt: skip
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return Envelope(kind="canary_log", sender=f"runtime/{site}", payload={"site": site, "canary": run, "seq": seq},
                    tensors={"parquet": np.frombuffer(buf.getvalue(), dtype=np.uint8)}, msg_id=f"{run}-{seq}-{site}")  # fmt: skip


def test_collect_writes_each_segment_once_and_names_the_missing(op, capsys) -> None:  # type: ignore[no-untyped-def]
    async def ship() -> None:
        async with make_bus(str(op["bus"])) as bus:
            for site, seq in (("a", 1), ("a", 2), ("a", 4), ("b", 1), ("b", 2)):
                await bus.publish_durable(f"edgetwin.canary.log.{site}", _segment(site, "r1", seq, 3))
            await bus.publish_durable("edgetwin.canary.log.a", _segment("a", "other", 1, 5))  # another run
            # a redelivered segment (same site and seq, another message id)
            again = _segment("a", "r1", 2, 3)
            again.msg_id = "r1-2-again"
            await bus.publish_durable("edgetwin.canary.log.a", again)
            # site b shipping a segment as if it were a's: refused, a's seq 3 stays missing
            forged = _segment("a", "r1", 3, 3)
            forged.sender, forged.msg_id = "runtime/b", "forged"
            await bus.publish_durable("edgetwin.canary.log.a", forged)

    asyncio.run(ship())
    out = op["d"] / "canary.parquet"  # type: ignore[operator]
    code = _run("canary", "collect", "r1", "--bus", str(op["bus"]), "--out", str(out), "--idle", "0.3", "--json")
    doc = json.loads(capsys.readouterr().out)
    assert code == 1  # a segment is missing
    assert doc["rows"] == 15 and doc["missing"] == {"a": [3]} and doc["duplicates"] == 1
    assert doc["refused"] == 1
    df = pd.read_parquet(out)
    assert len(df) == 15 and not df.duplicated(["site", "agent", "t"]).any()
    assert _run("canary", "collect", "nope", "--bus", str(op["bus"]), "--out", str(out), "--idle", "0.2") == 2
