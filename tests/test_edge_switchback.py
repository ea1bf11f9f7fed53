"""A site-level switchback on an operator's fleet (issue 48 item 3), over the in-process bus: the
schedule is one concept (the loop's plan and the edge's design give the same arm at every tick);
`edgetwin canary start --design switchback` publishes a signed command carrying the design; a
runtime (what `edgetwin serve` runs) accepts it, serves every group of its site the arm of the
block of each decision's tick on the three decision wires (envelope, JSON, Arrow), logs policy,
propensity, the arm and its probability; `canary collect` gets the log and `canary verdict --design
switchback` judges it by the blocks; a command whose assignment was changed is refused (a changed
field after signing: ``bad_signature``; a signed assignment that is not its seed's: ``invalid``),
one log line each; the guard stops a regressing candidate and the whole site is back on the
current policy."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from test_cli_canary_commands import _run
from test_cli_canary_verdict import warehouse_day, warehouse_spec

from edgetwin.contract.errors import InputError
from edgetwin.edge import decision_wire as W
from edgetwin.edge.bus import InMemoryBus, RawMessage, make_bus
from edgetwin.edge.canary import read_spool
from edgetwin.edge.canary_command import (
    KIND_START,
    CanaryStart,
    CommandRefused,
    _signed,
    command_subject,
    outcome_envelope,
    outcome_subject,
    sign_start,
    verify_command,
)
from edgetwin.edge.canary_slice import CanarySlice
from edgetwin.edge.canary_switchback import SwitchbackDesign, SwitchbackRouter
from edgetwin.edge.kpi_watch import KPIMargin
from edgetwin.edge.messages import decode, encode
from edgetwin.edge.registry import FileRegistry, metadata_from_policy_dir
from edgetwin.edge.runtime import EdgeRuntime, request_decision
from edgetwin.edge.signing import Signer, TrustStore, save_private_key
from edgetwin.loop.switchback import SwitchbackPlan, block_of, switchback_assignment
from edgetwin.policies.candidates import ConstantPolicy
from edgetwin.policies.export import export_policy
from edgetwin.twin.twin import Twin

torch.set_num_threads(1)
SITE, OTHER = "hall", "yard"
GROUPS = [f"w{i}" for i in range(10)]
LATE = "kpi.late"
#: 2 pre-ticks, then 8 blocks of 3 ticks (1 burned in): 26 ticks
PLAN = SwitchbackPlan(sites=(SITE,), block_ticks=3, carryover_ticks=1, n_blocks=8, seed=5, start_tick=2,
                      episode_ticks=26, tick_seconds=900.0)  # fmt: skip


def _served_arm(plan: Any, t: int) -> str:
    """What the site must serve its groups at tick t: the block's arm, the current policy outside."""
    if block_of(plan, t) is None:
        return "fleet"
    return "candidate" if switchback_assignment(plan, t) == "candidate" else "control"


# ------------------------------------------------------------------------------------ one concept
def test_the_edge_design_is_the_plans_schedule_and_refuses_a_changed_assignment() -> None:
    d = SwitchbackDesign.from_plan(PLAN)
    router = SwitchbackRouter(d, "v2", "v1")
    for t in range(30):
        arms = router.arms(["a", "b"], [SITE, OTHER], t=t)
        want = "candidate" if switchback_assignment(PLAN, t) == "candidate" else "control"
        assert arms.tolist() == [want, "fleet"]
    assert SwitchbackDesign.from_dict(json.loads(json.dumps(d.to_dict()))) == d
    flipped = list(d.assignment)
    flipped[0], flipped[1] = flipped[1], flipped[0]
    with pytest.raises(InputError, match="block 0 is .* seed 5 draws") as e:
        SwitchbackDesign.from_dict({**d.to_dict(), "assignment": flipped})
    assert e.value.where == "assignment"
    with pytest.raises(InputError) as e:  # the loop's plan refuses it the same way
        SwitchbackPlan.from_dict({**PLAN.to_dict(), "assignment": flipped})
    assert e.value.where == "assignment"
    with pytest.raises(InputError, match="not a switchback design"):
        SwitchbackDesign.from_dict({"sites": SITE, "block_ticks": 3})


def _start(**kw: Any) -> CanaryStart:
    d = SwitchbackDesign.from_plan(PLAN)
    base: dict[str, Any] = dict(run="sb1", candidate="v2", sha256="ab" * 32, current="v1",
                                slice=CanarySlice(sites=(SITE,)), hours=PLAN.hours, margins=(KPIMargin(LATE),),
                                pre_ticks=PLAN.start_tick, switchback=d)  # fmt: skip
    base.update(kw)
    return CanaryStart(**base)


def test_a_switchback_start_is_signed_with_its_design_and_a_changed_one_is_refused() -> None:
    key = Signer.generate()
    trust = TrustStore([key.public_key])
    cmd = _start()
    assert cmd.sites == (SITE,)  # a switchback's runtimes are its sites
    got = verify_command(decode(encode(sign_start(cmd, key))), trust)
    assert got == cmd and isinstance(got, CanaryStart) and got.switchback == cmd.switchback
    # changed in transit: the signature covers the design
    env = decode(encode(sign_start(cmd, key)))
    env.payload["switchback"]["assignment"] = [1 - v for v in env.payload["switchback"]["assignment"]]
    with pytest.raises(CommandRefused) as e:
        verify_command(env, trust)
    assert e.value.reason == "bad_signature"
    # signed by the trusted key, but the assignment is not its seed's draw: incoherent, refused
    payload = cmd.to_payload()
    payload["switchback"]["assignment"] = [1 - v for v in payload["switchback"]["assignment"]]
    with pytest.raises(CommandRefused) as e:
        verify_command(decode(encode(_signed(KIND_START, payload, key, "operator"))), trust)
    assert e.value.reason == "invalid" and "assignment" in e.value.detail and "seed 5" in e.value.detail
    # a start that does not make a switchback never leaves the sender
    with pytest.raises(InputError, match="pre_ticks are its start_tick"):
        _start(pre_ticks=4)
    with pytest.raises(InputError, match="slice is its sites"):
        _start(slice=CanarySlice(sites=(OTHER,)))
    with pytest.raises(InputError, match="blocks of 3 ticks are 24"):
        _start(hours=2.0)
    with pytest.raises(InputError, match="not the switchback's"):
        _start(sites=(OTHER,))


# ------------------------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The operator's side: a warehouse twin, a registry (v1 current, v2 faster, v3 slower), a key,
    a canary plan guarding lateness, and the switchback plan beside it."""
    d = tmp_path_factory.mktemp("switchback")
    spec = warehouse_spec()
    train = pd.concat([warehouse_day(lambda i, t, r: r.uniform(0, 1, len(i)), 100 + e, f"d{e}", lambda i: "logging")
                       for e in range(2)], ignore_index=True)  # fmt: skip
    Twin.fit(train, spec, seed=0, members=1, progress=False, rounds=0, bc_epochs=1,
             population_model="empirical").save(d / "twin")  # fmt: skip
    warehouse_day(lambda i, t, r: np.full(len(i), 0.4), 106, "fleet", lambda i: "v1").to_parquet(d / "fleet.parquet")
    signer = Signer.generate()
    save_private_key(signer.private_key, d / "key.pem")
    reg = FileRegistry(d / "reg")
    for v, speed in (("v1", 0.4), ("v2", 1.0), ("v3", 0.05)):
        export_policy(ConstantPolicy(spec, [speed]), d / v, spec)
        reg.publish(d / v, {**metadata_from_policy_dir(d / v), "name": "speed", "version": v}, signer)
    reg.set_current(f"site/{SITE}", "v1", expected=None)
    reg.set_current("global", "v1", expected=None)
    plan = {
        "candidate": "fast", "baseline": "current", "slice": {"agents": GROUPS[:4], "treat_share": 0.5, "seed": 3},
        "hours": 2.0, "margins": [{"kpi": LATE, "max_regression": 0.05, "higher_is_better": False}], "kpis": [],
        "n_groups": 4, "fleet_groups": len(GROUPS), "share": 0.4, "budget": {}, "decides": True, "why": ["test"],
    }  # fmt: skip
    (d / "plan.json").write_text(json.dumps(plan))
    (d / "plan.switchback.json").write_text(json.dumps(PLAN.to_dict()))
    return {"d": d, "signer": signer, "reg": reg, "spec": spec}


async def _raw(client: InMemoryBus, body: bytes, headers: dict[str, str] | None) -> RawMessage:
    got: asyncio.Future[RawMessage] = asyncio.get_running_loop().create_future()

    async def on_reply(m: RawMessage) -> None:
        if not got.done():
            got.set_result(m)

    inbox = f"_INBOX.sb{uuid.uuid4().hex[:8]}"
    sub = await client.subscribe_raw(inbox, on_reply)
    try:
        await client.publish_raw(f"edgetwin.decision.{SITE}", body, reply=inbox, headers=headers)
        return await asyncio.wait_for(got, 5.0)
    finally:
        await sub.unsubscribe()


async def _decide(client: InMemoryBus, wire: str, obs: np.ndarray, t: int) -> tuple[np.ndarray, list[str], list[str]]:
    """One tick's decisions for the site's groups on one wire: (speeds, arms, policies)."""
    if wire == "envelope":
        dec = await request_decision(client, SITE, obs, agents=GROUPS, t=t)
        assert dec.arms is not None and dec.policies is not None
        return np.asarray(dec.actions)[:, 0], list(dec.arms), list(dec.policies)
    if wire == "json":
        body = json.dumps({"obs": obs.tolist(), "agents": GROUPS, "t": t}).encode()
        doc = json.loads((await _raw(client, body, {"Content-Type": W.JSON})).data)
        return np.asarray(doc["actions"])[:, 0], doc["arms"], doc["policies"]
    cols = [pa.array(obs[:, j]) for j in range(obs.shape[1])] + [pa.array(GROUPS)]
    schema = pa.schema([("profile.size", pa.float64()), ("state.backlog", pa.float64()), ("agent", pa.string())],
                       metadata={"t": str(t)})  # fmt: skip
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as w:
        w.write_batch(pa.record_batch(cols, schema=schema))
    reply = await _raw(client, sink.getvalue().to_pybytes(), {"Content-Type": W.ARROW})
    table = pa.ipc.open_stream(pa.py_buffer(reply.data)).read_all()
    return (np.asarray(table.column("action.speed").to_numpy()), table.column("arm").to_pylist(),
            table.column("policy").to_pylist())  # fmt: skip


def _drive(bus_url: str, fleet: dict[str, Any], cache: Path, ticks: int, seed: int) -> dict[str, Any]:
    """The site's runtime and the operator's own system, in one event loop over the named broker:
    every tick the system asks for its groups' decisions (envelope, JSON, Arrow in turn), applies
    them (the warehouse: work done grows with speed, what is left is late and half carries over)
    and reports the tick's outcomes; the site joins them into its switchback log."""
    sizes = np.random.default_rng(seed).uniform(1, 5, len(GROUPS))
    rng = np.random.default_rng(seed + 1)
    seen: dict[str, Any] = {"arms": {}, "policies": {}, "wires": set(), "stopped_at": None}

    async def go() -> None:
        async with make_bus(bus_url) as rt_bus, make_bus(bus_url) as system:
            assert isinstance(system, InMemoryBus)
            rt = EdgeRuntime(SITE, fleet["reg"], TrustStore([fleet["signer"].public_key]), bus=rt_bus, kpi_guard=None,
                             poll_interval=60, cache_dir=cache)  # fmt: skip
            async with rt:
                for _ in range(400):
                    if rt.canary is not None or sum(rt.stats.canary_refused.values()):
                        break
                    await asyncio.sleep(0.01)
                seen["refused"] = dict(rt.stats.canary_refused)
                if rt.canary is None:
                    return
                backlog = rng.uniform(0, 2, len(GROUPS))
                for t in range(ticks):
                    obs = np.column_stack([sizes, backlog])
                    wire = ("envelope", "json", "arrow")[t % 3]
                    speed, arms, policies = await _decide(system, wire, obs, t)
                    seen["arms"][t], seen["policies"][t] = list(arms), list(policies)
                    seen["wires"].add(wire)
                    work = backlog + sizes
                    done = np.clip(np.minimum(work, 6.0 * speed + rng.normal(0, 0.2, len(GROUPS))), 0, None)
                    late = work - done
                    rows = pd.DataFrame({"agent": GROUPS, "scenario": "weekday", "response.done": done, LATE: late,
                                         "reward": -late})  # fmt: skip
                    await system.publish_durable(outcome_subject(SITE), outcome_envelope(SITE, t, rows, "system"))
                    for _ in range(500):
                        if rt.canary.ticks >= t + 1 or not rt.canary.active:
                            break
                        await asyncio.sleep(0.005)
                    if not rt.canary.active and seen["stopped_at"] is None:
                        seen["stopped_at"] = t
                    backlog = np.clip(0.5 * late, 0, 40)
                seen["stop_reason"] = rt.canary.stop_reason
                seen["guard_stop"] = rt.canary.guard_stop
                seen["version"] = rt.version
                for _ in range(200):  # the last segments shipped
                    if not rt.canary.unshipped():
                        break
                    await asyncio.sleep(0.01)
                seen["log"] = read_spool(rt.canary.dir)

    asyncio.run(go())
    return seen


def _start_cli(fleet: dict[str, Any], bus: str, run: str, candidate: str, *extra: str) -> int:
    d = fleet["d"]
    return _run("canary", "start", str(d / "plan.json"), "--registry", str(d / "reg"), "--key", str(d / "key.pem"),
                "--bus", bus, "--candidate", candidate, "--current", "v1", "--run", run, "--design", "switchback",
                *extra)  # fmt: skip


def test_serve_follows_the_blocks_on_every_wire_and_collect_and_verdict_judge_it(
    fleet: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bus = f"memory://sb-{uuid.uuid4().hex}"
    assert _start_cli(fleet, bus, "sb-fast", "v2", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["design"] == "switchback" and doc["switchback"]["assignment"] == list(PLAN.assignment)
    assert doc["sites"] == [SITE] and doc["pre_ticks"] == PLAN.start_tick
    ticks = PLAN.start_tick + PLAN.ticks
    seen = _drive(bus, fleet, tmp_path / "cache", ticks, seed=11)
    assert seen["refused"] == {} and seen["wires"] == {"envelope", "json", "arrow"}
    # the arm served at tick t is the switchback's, for every group, on every wire
    for t in range(ticks):
        want = _served_arm(PLAN, t)
        assert seen["arms"][t] == [want] * len(GROUPS), t
        assert seen["policies"][t] == ["v2" if want == "candidate" else "v1"] * len(GROUPS), t
    assert seen["stop_reason"] == "completed" and seen["guard_stop"] is None
    log = seen["log"]
    assert len(log) == ticks * len(GROUPS)
    inside = log["block"] >= 0
    assert (log.loc[inside, "arm_probability"] == 0.5).all() and (log.loc[~inside, "arm_probability"] == 1.0).all()
    # propensity is the policy's own, as the log contract says: unknown (NaN) for these deterministic
    # policies with a continuous action; the block's assignment probability is arm_probability
    assert (log["tick"] == log["t"]).all() and log["propensity"].isna().all()
    assert set(log.loc[log["arm"] == "candidate", "policy"]) == {"v2"}
    # collect the durable log from the bus, then judge it by the blocks
    out = tmp_path / "sb.parquet"
    assert _run("canary", "collect", "sb-fast", "--bus", bus, "--out", str(out), "--idle", "0.3", "--json") == 0
    collected = json.loads(capsys.readouterr().out)
    assert collected["rows"] == len(log) and collected["missing"] == {}
    d = fleet["d"]
    code = _run("canary", "verdict", str(d / "twin"), "--canary-log", str(out), "--fleet-log", str(d / "fleet.parquet"),
                "--plan", str(d / "plan.json"), "--current", str(d / "v1"), "--candidate", str(d / "v2"),
                "--design", "switchback", "--out", str(tmp_path / "evidence.json"), "--json")  # fmt: skip
    got = capsys.readouterr()
    assert got.out, got.err
    verdict = json.loads(got.out)
    # speed 1.0 against 0.4 leaves far less work late: the blocks' interval lies below the margin
    assert code == 0 and verdict["verdict"] == "promote", verdict
    (check,) = verdict["checks"]
    assert check["kpi"] == LATE and check["interval"][1] < -0.05 and check["n_candidate"] == 4
    assert verdict["candidate_version"] == "v2" and verdict["current_version"] == "v1"
    # the same numbers as the library's estimate over the collected log
    from edgetwin.loop.switchback import estimate_switchback

    est = estimate_switchback(pd.read_parquet(out), PLAN, [LATE])[LATE]
    assert np.allclose(check["interval"], est.interval) and np.isclose(check["change"], est.change)
    # the policy is promoted on the switchback's evidence (a copy of the registry: the fleet's stays on v1)
    shutil.copytree(d / "reg", tmp_path / "reg")
    assert _run("promote", str(d / "v2"), "--registry", str(tmp_path / "reg"), "--twin", str(d / "twin"), "--key",
                str(d / "key.pem"), "--evidence", str(tmp_path / "evidence.json")) == 0  # fmt: skip
    promoted = FileRegistry(tmp_path / "reg")
    assert promoted.current("global") not in (None, "v1")
    assert promoted.manifest(promoted.current("global")).metadata["evidence"]["verdict"] == "promote"


def test_judge_switchback_refuses_a_log_that_is_not_the_switchbacks() -> None:
    from edgetwin.loop.switchback import judge_switchback

    ticks = np.arange(PLAN.start_tick + PLAN.ticks)
    arm = np.array([_served_arm(PLAN, int(t)) for t in ticks])
    rng = np.random.default_rng(0)
    log = pd.DataFrame({"t": np.repeat(ticks, 3), "site": SITE, "agent": np.tile(["a", "b", "c"], len(ticks)),
                        "arm": np.repeat(arm, 3), "policy": np.where(np.repeat(arm, 3) == "candidate", "v2", "v1"),
                        LATE: rng.uniform(1, 2, 3 * len(ticks))})  # fmt: skip
    margins = [KPIMargin(LATE, max_regression=0.05)]
    verdict, checks, _reason, est = judge_switchback(log, PLAN, margins)
    assert verdict in ("promote", "refuse", "undecided") and checks[0].kpi == LATE and est[LATE].n_blocks == 8
    judged = log.index[(log["t"] == PLAN.start_tick + 1)]  # block 0's first judged tick
    flipped = log.copy()
    flipped.loc[judged, "arm"] = np.where(flipped.loc[judged, "arm"] == "candidate", "control", "candidate")
    with pytest.raises(InputError, match="not this switchback's log") as e:
        judge_switchback(flipped, PLAN, margins)
    assert e.value.where == "--canary-log"
    two = log.copy()
    two.loc[two.index[two["arm"] == "candidate"][:3], "policy"] = "v9"
    with pytest.raises(InputError, match="name policies") as e:
        judge_switchback(two, PLAN, margins)
    assert e.value.where == "--canary-log"


def test_the_guard_stops_a_regressing_switchback_and_the_site_is_back_on_current(
    fleet: dict[str, Any], tmp_path: Path
) -> None:
    bus = f"memory://sb-{uuid.uuid4().hex}"
    assert _start_cli(fleet, bus, "sb-slow", "v3") == 0  # speed 0.05: most work late
    ticks = PLAN.start_tick + PLAN.ticks
    seen = _drive(bus, fleet, tmp_path / "cache", ticks, seed=12)
    assert seen["stop_reason"] == "guard" and seen["guard_stop"].kpi == LATE, seen.get("stop_reason")
    assert seen["guard_stop"].unit == "pairs of blocks" and "pairs of blocks" in seen["guard_stop"].reason()
    stop = seen["stopped_at"]
    assert stop is not None and stop < ticks - 1
    # up to the stop: the blocks; after it every group of the site on the current policy
    for t in range(ticks):
        want = _served_arm(PLAN, t) if t <= stop else "fleet"
        assert seen["arms"][t] == [want] * len(GROUPS), t
        if t > stop:
            assert seen["policies"][t] == ["v1"] * len(GROUPS)
    assert seen["version"] == "v1"


def _synthetic_switchback(seed: int, effect: float, spool: Path, groups: int = 10,
                          scheme: str = "paired") -> tuple[str | None, int]:  # fmt: skip
    """One switchback of a synthetic site through `Canary` (what a runtime runs per report): 16
    paired blocks of 3 ticks (1 burned in) after 2 pre-ticks; each group's KPI its own level times a
    daily swing of ±30 % (a period of 48 ticks), times ``1 + effect`` on the candidate's ticks, plus
    noise 0.3; the margin 5 %. Returns (stop reason, ticks reported)."""
    from edgetwin.edge.canary import Canary, CanaryConfig

    d = SwitchbackDesign(("s",), 3, 1, 16, seed=seed, scheme=scheme, start_tick=2)
    cfg = CanaryConfig(candidate="v2", slice=CanarySlice(sites=("s",)), hours=16 * 3 * 0.25,
                       margins=(KPIMargin("kpi.x", max_regression=0.05),), pre_ticks=2, switchback=d,
                       canary_id=f"c{seed}")  # fmt: skip
    c = Canary(cfg, "v1", spool / f"{scheme}-{effect:g}", run_id=f"r{seed}")  # a run of its own (not resumed)
    rng = np.random.default_rng(seed)
    level = rng.uniform(1, 3, groups)
    for t in range(2 + d.ticks):
        on = switchback_assignment(d, t) == "candidate"
        y = level * (1 + 0.3 * np.sin(2 * np.pi * t / 48)) * (1 + (effect if on else 0.0)) + rng.normal(0, 0.3, groups)
        c.record(pd.DataFrame({"episode": "e", "t": t, "agent": [f"g{i}" for i in range(groups)], "site": "s",
                               "policy": "v2" if on else "v1", "propensity": np.nan, "kpi.x": y}))  # fmt: skip
        if not c.active:
            break
    _LAST[0] = c
    return c.stop_reason, c.ticks


_LAST: list[Any] = [None]  # the last synthetic run's `Canary` (to read its guard)


@pytest.mark.parametrize("scheme", ["paired", "complete"])
def test_the_pair_guard_stops_a_clear_regression_before_the_end(tmp_path: Path, scheme: str) -> None:
    got = [_synthetic_switchback(s, 0.6, tmp_path, scheme=scheme) for s in range(6)]
    stopped = sum(r == "guard" and n < 50 for r, n in got)
    # paired: 6 of 6; complete: its k-th candidate and k-th current blocks can be hours apart, so the
    # day's swing is in their difference and the guard is weaker (3 of 6 measured): docs/canary.md
    assert stopped == 6 if scheme == "paired" else stopped >= 2, got
    # without an effect the run completes, each of its 8 pairs fed to the guard once
    assert _synthetic_switchback(99, 0.0, tmp_path, scheme=scheme) == ("completed", 50)
    assert _LAST[0].guard.intervals()["kpi.x"]["observations"] == 8


@pytest.mark.slow
def test_the_pair_guard_false_stop_rate_at_the_margin_is_within_alpha(tmp_path: Path) -> None:
    """docs/canary.md's numbers: at the margin (+5 %) 5 of 200 switchbacks stopped (α = 5 %), A/A 0 of
    200, +20 % 59 of 200 (the seeds are fixed; bounds, not equalities, so a changed float path passes)."""
    at_margin = [_synthetic_switchback(s, 0.05, tmp_path)[0] for s in range(200)]
    assert sum(r == "guard" for r in at_margin) <= 10  # 5 measured; CP95 upper bound 5.7 %
    aa = [_synthetic_switchback(s, 0.0, tmp_path)[0] for s in range(200)]
    assert sum(r == "guard" for r in aa) <= 4  # 0 measured
    regressing = [_synthetic_switchback(s, 0.20, tmp_path)[0] for s in range(200)]
    assert 45 <= sum(r == "guard" for r in regressing) <= 75  # 59 measured: low power, as the docs say


def test_the_wire_benchmark_page_says_what_its_json_holds() -> None:
    """docs/benchmarks/switchback/wire.md and docs/canary.md against wire.json (`benchmarks/switchback.py --wire`)."""
    root = Path(__file__).resolve().parents[1]
    res = json.loads((root / "docs" / "benchmarks" / "switchback" / "wire.json").read_text())
    rows = [r for v in res["results"].values() for r in v]
    assert all(r["same_arms"] and r["max_kpi_gap"] == 0 and not r["missing"] for r in rows)
    assert all(r["wire"][k]["interval"] == r["direct"][k]["interval"] for r in rows for k in r["wire"])
    guard = [r["guard"] for r in rows if "guard" in r]
    stopped = sorted(g["stopped_at"] for g in guard if g["stop_reason"] == "guard")
    assert (len(stopped), len(guard), stopped) == (2, 6, [35, 83])
    assert all(r["wire"]["kpi.slo_violation"]["change"] > 0.05 for r in rows if "guard" in r)
    doc = (root / "docs" / "canary.md").read_text()
    assert "stopped 2 of 6 regressing and\n  edge-hog days, at ticks 35 and 83 of 84" in doc


def test_a_changed_switchback_command_is_refused_by_the_site_with_one_line(
    fleet: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bus = f"memory://sb-{uuid.uuid4().hex}"
    cmd = _start(run="sb-bad", sha256=fleet["reg"].manifest("v2").sha256)
    payload = cmd.to_payload()
    payload["switchback"]["assignment"] = [1 - v for v in payload["switchback"]["assignment"]]

    async def publish() -> None:
        async with make_bus(bus) as op:
            await op.publish_durable(command_subject(), _signed(KIND_START, payload, fleet["signer"], "operator"))

    asyncio.run(publish())
    with caplog.at_level(logging.WARNING, logger="edgetwin.runtime"):
        seen = _drive(bus, fleet, tmp_path / "cache", 0, seed=13)
    assert seen["refused"] == {"invalid": 1} and "log" not in seen
    lines = [r.getMessage() for r in caplog.records if "canary command refused" in r.getMessage()]
    assert len(lines) == 1 and "assignment" in lines[0] and "Traceback" not in lines[0]


def test_a_runtime_that_died_mid_switchback_resumes_it_on_its_blocks(fleet: dict[str, Any], tmp_path: Path) -> None:
    """A restarted runtime on the same cache directory resumes a command-started switchback from its
    spool: the blocks go on by the decision's tick, and the guard has seen each pair once."""
    from edgetwin.edge.bus import MemoryBroker

    cmd = _start(run="sb-resume", sha256=fleet["reg"].manifest("v2").sha256)
    broker = MemoryBroker()
    obs = np.column_stack([np.linspace(1, 5, len(GROUPS)), np.zeros(len(GROUPS))])
    ticks = PLAN.start_tick + PLAN.ticks
    served: dict[int, list[str]] = {}

    def runtime(bus: InMemoryBus) -> EdgeRuntime:
        return EdgeRuntime(SITE, fleet["reg"], TrustStore([fleet["signer"].public_key]), bus=bus, kpi_guard=None,
                           poll_interval=60, cache_dir=tmp_path / "cache")  # fmt: skip

    async def ticks_from(rt: EdgeRuntime, system: InMemoryBus, first: int, last: int) -> None:
        c = rt.canary
        assert c is not None
        for t in range(first, last):
            served[t] = list(rt.decide_for(obs, GROUPS, t=t).arm)
            rows = pd.DataFrame({"agent": GROUPS, LATE: 1.0 + 0.01 * t})
            await system.publish_durable(outcome_subject(SITE), outcome_envelope(SITE, t, rows, "system"))
            for _ in range(500):
                if c.ticks >= t + 1:
                    break
                await asyncio.sleep(0.005)

    async def first() -> None:
        bus = InMemoryBus(broker, name="rt")
        async with bus, InMemoryBus(broker, name="op") as op, runtime(bus) as rt:
            await op.publish_durable(command_subject(), sign_start(cmd, fleet["signer"]))
            for _ in range(400):
                if rt.canary is not None:
                    break
                await asyncio.sleep(0.01)
            await ticks_from(rt, op, 0, 11)

    async def second() -> dict[str, Any]:
        bus = InMemoryBus(broker, name="rt2")
        async with bus, InMemoryBus(broker, name="op2") as op, runtime(bus) as rt:
            c = rt.canary
            assert c is not None and c.active and c.ticks == 11 and rt.stats.canary_accepted == 0
            await ticks_from(rt, op, 11, ticks)
            return {"reason": c.stop_reason, "obs": c.guard.intervals()[LATE]["observations"],
                    "log": read_spool(c.dir)}  # fmt: skip

    asyncio.run(first())
    (tmp_path / "cache" / "canary" / "sb-resume" / "stopped.json").unlink()  # a crash leaves no end mark
    got = asyncio.run(second())
    assert got["reason"] == "completed" and got["obs"] == PLAN.n_blocks // 2  # each pair once
    for t in range(ticks):
        assert served[t] == [_served_arm(PLAN, t)] * len(GROUPS), t
    assert sorted(got["log"]["t"].unique().tolist()) == list(range(ticks))


@pytest.mark.parametrize("case", ["design", "missing", "changed", "site", "stray"])
def test_bad_switchback_flags_are_one_line_exit_2(fleet: dict[str, Any], tmp_path: Path, case: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    bus = f"memory://sb-{uuid.uuid4().hex}"
    d = fleet["d"]
    changed = tmp_path / "changed.json"
    doc = PLAN.to_dict()
    doc["assignment"] = [1 - v for v in doc["assignment"]]
    changed.write_text(json.dumps(doc))
    base = ["canary", "start", str(d / "plan.json"), "--registry", str(d / "reg"), "--key", str(d / "key.pem"),
            "--bus", bus, "--candidate", "v2", "--current", "v1"]  # fmt: skip
    args, flag = {
        "design": (["--design", "crossover"], "--design"),
        "missing": (["--design", "switchback", "--switchback-plan", str(tmp_path / "none.json")], "--switchback-plan"),
        "changed": (["--design", "switchback", "--switchback-plan", str(changed)], "--switchback-plan"),
        "site": (["--design", "switchback", "--site", OTHER], "--site"),
        "stray": (["--switchback-plan", str(d / "plan.switchback.json")], "--switchback-plan"),
    }[case]  # fmt: skip
    code = _run(*base, *args)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and flag in err and "Traceback" not in err, err
