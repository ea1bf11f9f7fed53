"""Run a canary on the emulated cluster ("the real system") through a real edge runtime.

`canary_on_cluster` is the closed loop's canary (``edgetwin promote --canary``, the demo, the
benchmarks) and a thin driver over exactly the operator's steps on a fleet (docs/canary.md "On
your own fleet"), on an in-process bus (`edgetwin.edge.bus`, the same subjects and messages as
NATS): a signed canary start on the durable command subject (`edgetwin.loop.commands`), the site
(an `EdgeRuntime`, what ``edgetwin serve`` runs) serving the slice's arms on the JSON decision
wire, the emulated cluster as the system (`drive_cluster_over_bus`: it asks for decisions naming
each row's group and tick and reports each tick's outcome rows; it knows nothing of the canary),
the site's own join and guard, the operator watching the site's status, and the run's durable
log collected from the bus (`edgetwin.loop.collect.collect_canary`). The verdict is the caller's.

`run_emulated_canary` is the in-process Python path of the same canary: each tick the cluster's
observations go to `EdgeRuntime.decide_for`, and the slice's rows back through
`EdgeRuntime.canary_report` (a test checks that both paths give the same log on the same seed).
When the guard stops the canary, the rest of the hours run on the current policy and are not
part of the canary's log.

`python3 -m edgetwin.loop.fleet` runs `drive_cluster_over_bus` in its own process (the
cross-process test's "real system").
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.contract.manifest import write_manifest
from edgetwin.edge.canary import CanaryConfig, CanaryResult
from edgetwin.emulator.cluster import ClusterConfig, EdgeCluster, check_actions
from edgetwin.emulator.logs import episode_seed
from edgetwin.emulator.population import SCENARIOS

__all__ = [
    "DecisionClient",
    "EmulatedCanaryConfig",
    "WireDecisions",
    "ask_site",
    "canary_on_cluster",
    "drive_cluster_over_bus",
    "edge_routes",
    "load_toml_config",
    "run_emulated_canary",
]


def load_toml_config(path: str | Path, cls: type[Any], where: str) -> Any:
    """A frozen dataclass ``cls`` from a TOML file's top-level keys: every key must be one of its
    fields and of its default's type (a list for a tuple field); a missing key keeps its default.
    Why not a schema library: the dataclass is the documentation (one attribute, one knob), and
    the error must be one line naming the file and the key (exit 2).

    Raises:
        InputError: file missing, not TOML, an unknown key or a value of another type."""
    import dataclasses
    import tomllib
    import typing

    p = Path(path)
    if not p.is_file():
        raise InputError("config file not found", f"{where} {p}")
    try:
        raw = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"not TOML ({e})", f"{where} {p}") from None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise InputError(f"unknown key(s) {unknown}; expected some of {sorted(fields)}", f"{where} {p}")
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for k, v in raw.items():
        t = hints[k]
        if t == tuple[str, ...]:
            ok = isinstance(v, list) and all(isinstance(x, str) for x in v)
            v, what = (tuple(v) if ok else v), "a list of strings"
        elif t is bool:
            ok, what = isinstance(v, bool), "true or false"
        elif t is int:
            ok, what = isinstance(v, int) and not isinstance(v, bool), "an integer"
        elif t is float:
            ok, what = isinstance(v, int | float) and not isinstance(v, bool), "a number"
            v = float(v) if ok else v
        else:  # str or str | None: a number is taken as written (e.g. max_share = 0.1)
            ok, what = isinstance(v, str | int | float) and not isinstance(v, bool), "a string"
            v = str(v) if ok else v
        if not ok:
            raise InputError(f"key {k!r} must be {what}, got {v!r}", f"{where} {p}")
        values[k] = v
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise InputError(str(e), f"{where} {p}") from None


@dataclass(frozen=True)
class EmulatedCanaryConfig:
    """``edgetwin promote --canary-config FILE``: the closed loop on the emulated cluster when the
    gate abstains (a TOML file of these keys; an empty file keeps every default). These knobs only
    mean something where edgetwin emulates the fleet; on an operator's own fleet the same steps are
    `edgetwin canary plan / start / collect / verdict` and ``promote --evidence`` (docs/canary.md).

    Attributes:
        rounds: canary rounds at most (plan -> canary -> `Twin.update` -> verdict each).
        max_share: share of the service groups per round (``"10%"`` or ``0.1``).
        max_loss: ``"KPI=0.5%"`` each: the largest fleet-wide worst-case worsening a round may cause.
        hours: hours per round at most.
        current: what the emulated cluster runs now (the current policy of the canary's control
            arm and of the fleet log the plan is made on): ``random``, ``heuristic`` (any
            `edgetwin.emulator.logs.make_policy` name) or an exported policy directory.
        agents: service groups of the emulated cluster (0: as many as the recent log's last day).
        train_log: the twin's training data (each part), so that `Twin.update` learns from each
            canary; empty: the twin is not updated between rounds.
    """

    rounds: int = 3
    max_share: str = "10%"
    max_loss: tuple[str, ...] = ()
    hours: float = 24.0
    current: str = "random"
    agents: int = 0
    train_log: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if int(self.rounds) < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")
        if int(self.agents) != 0 and int(self.agents) < 4:
            raise ValueError(f"agents must be 0 (the log's) or >= 4, got {self.agents}")

    @classmethod
    def load(cls, path: str | Path) -> EmulatedCanaryConfig:
        """From a TOML file (`load_toml_config`); exit 2 on an unknown key or a bad value."""
        cfg: EmulatedCanaryConfig = load_toml_config(path, cls, "--canary-config")
        return cfg

    def budget(self) -> Any:
        """The per-round `edgetwin.loop.plan.PlanBudget` (exit 2 on a bad share, loss or hours)."""
        from edgetwin.loop.plan import budget_from_flags

        return budget_from_flags(str(self.max_share), list(self.max_loss), float(self.hours))


def _rows(
    cluster: EdgeCluster, episode: Any, t: int, obs: np.ndarray, actions: np.ndarray, info: dict[str, Any],
    reward: np.ndarray, policy: np.ndarray, propensity: np.ndarray, keep: np.ndarray,
) -> pd.DataFrame:  # fmt: skip
    """One tick's rows in the log contract (the rows of ``keep`` only)."""
    spec = cluster.spec
    data: dict[str, Any] = {
        "episode": np.full(int(keep.sum()), episode, dtype=object if isinstance(episode, str) else np.int64),
        "t": np.full(int(keep.sum()), t, dtype=np.int64),
        "agent": cluster.agent_ids[keep],
        "scenario": np.array(SCENARIOS, dtype=object)[cluster.scenario[keep]],
        "site": np.array(cluster.site_names, dtype=object)[cluster.home[keep]],
    }
    for j, c in enumerate(spec.observation_columns):
        data[c] = obs[keep, j]
    for j, c in enumerate(spec.action_columns):
        data[c] = actions[keep, j]
    for j, c in enumerate(spec.names("response")):
        data[c] = info["responses"][keep, j]
    for j, c in enumerate(spec.names("kpi")):
        data[c] = info["kpis"][keep, j]
    data["reward"] = reward[keep]
    data["policy"] = policy[keep].astype(str)
    data["propensity"] = propensity[keep]
    return pd.DataFrame(data)


def run_emulated_canary(
    runtime: Any,
    config: CanaryConfig,
    cluster: ClusterConfig | EdgeCluster,
    *,
    seed: int = 0,
    day: float | None = None,
    episode: int | str = 0,
    timeout: float = 120.0,
) -> CanaryResult:
    """Run ``config`` on the emulated cluster through ``runtime`` (running in its own thread,
    `EdgeRuntime.running_in_thread`) for ``config.hours`` of one episode.

    Args:
        runtime: the site's `EdgeRuntime`, serving the current policy.
        config: the canary; its ``tick_seconds`` must be the cluster's tick.
        cluster: the emulated system (a fresh population is sampled from ``seed``).
        seed: the episode's seed (`episode_seed(seed, 0)` is used, as `generate_logs` does).
        day: the day of the carbon series (default the config's start day).
        episode: the ``episode`` value written in the log.

    Returns:
        The `CanaryResult` (its log: the slice's rows while the canary ran; its ``fleet_log``: the
        rest of the fleet's rows over the same ticks, as the operator's own logs would hold them).
    """
    em = cluster if isinstance(cluster, EdgeCluster) else EdgeCluster(cluster)
    _check_ticks(em, config)
    loop = runtime._loop
    if loop is None:
        raise InputError("start the runtime first (EdgeRuntime.running_in_thread)", where="canary")
    asyncio.run_coroutine_threadsafe(runtime.start_canary(config), loop).result(timeout)
    canary = runtime.canary
    obs = em.reset(seed=episode_seed(seed, 0), day=day)
    scen = np.array(SCENARIOS, dtype=object)[em.scenario]
    sites = np.array(em.site_names, dtype=object)[em.home]
    in_slice = canary.router.arms(em.agent_ids.tolist(), sites.tolist(), scen.tolist()) != "fleet"
    if not in_slice.any():
        runtime.stop_canary("operator")
        raise InputError(f"no service group of the cluster is in the canary's slice {config.slice.to_dict()}", "canary")
    rest: list[pd.DataFrame] = []  # the rest of the fleet's rows over the canary's ticks
    for t in range(em.steps):
        if not canary.active:
            break
        d = runtime.decide_for(obs, em.agent_ids, sites, scen)
        actions = check_actions(d.actions, em.n)
        new_obs, reward, done, info = em.step(actions)
        runtime.canary_report(_rows(em, episode, t, obs, actions, info, reward, d.policy, d.propensity, in_slice))
        if (~in_slice).any():
            rest.append(_rows(em, episode, t, obs, actions, info, reward, d.policy, d.propensity, ~in_slice))
        obs = new_obs
        if done:
            break
    if canary.active:
        runtime.stop_canary("completed" if canary.ticks >= config.total_ticks else "operator")
    result = runtime.canary_result()
    # the fleet's own log of the same ticks (the guard's or the budget's stop ends them too)
    result.fleet_log = pd.concat(rest[: max(int(result.ticks), 0)], ignore_index=True) if rest else None
    return result


def _stub_dir(root: Path, name: str, spec: Any) -> Path:
    """A sealed directory standing for an in-process policy (its name only; nothing to execute)."""
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "policy.json").write_text(json.dumps({"format": "edgetwin-inprocess/1", "name": name}))
    spec.save(d / "spec.toml")
    write_manifest(d, "policy", require=("policy.json",))
    return d


def canary_on_cluster(
    cluster: ClusterConfig,
    current: Any,
    candidate: Any,
    config: CanaryConfig,
    *,
    seed: int = 0,
    day: float | None = None,
    episode: int | str = 0,
    site: str = "edge",
    workdir: str | Path | None = None,
) -> CanaryResult:
    """Run ``config`` on the emulated cluster through exactly the operator's steps on a fleet.

    A thin driver over the path docs/canary.md "On your own fleet" describes, on an in-process
    bus: a signed registry holding ``current`` (promoted at ``site``) and ``candidate``; a running
    `EdgeRuntime` (what ``edgetwin serve`` runs) that trusts the operator's key; **start**: a
    signed `CanaryStart` on the durable command subject (`edgetwin.loop.commands.publish_start`,
    what ``edgetwin canary start`` sends); **serve / guard**: the emulated cluster as the real
    system (`drive_cluster_over_bus`: JSON decision requests naming each row's group and tick,
    outcome reports per tick; it knows nothing of the canary), the operator watching the site's
    status after each tick (`edgetwin.loop.commands.fleet_status`) and ending the day when the
    site's run has stopped (completed, or the guard's or the loss budget's stop); **collect**:
    the run's durable log segments to a Parquet file (`edgetwin.loop.collect.collect_canary`).
    The verdict is the caller's (`edgetwin.loop.rounds.canary_loop`).

    Args:
        cluster: the emulated system.
        current, candidate: each an exported policy directory (loaded by
            `edgetwin.policies.load_policy`, verified and signed like any version) or an
            in-process policy object with ``act(obs) -> actions`` (published as a sealed stub
            that the runtime's loader maps back to the object: for callers in this process only).
        config: the canary; ``config.candidate`` names the candidate's registry version (the
            ``policy`` of its rows); the current one is published as ``"current"``.
        seed, day, episode: the day's population (`episode_seed(seed, 0)`, as `generate_logs`
            draws it), the carbon series' day, and the ``episode`` value of its rows.
        site: the runtime's site name (every cluster site is routed to it).
        workdir: where the registry, the runtime's spool and the collected log go (a temporary
            directory by default).

    Returns:
        The site's `CanaryResult`; its ``log`` is the collected log (the slice's rows in the
        log contract, ``policy`` = the registry version, ``propensity``), checked to hold
        as many rows as the site spooled; its ``fleet_log`` the system's own rows of every other
        group over the ticks the canary ran.

    Raises:
        InputError: a tick other than the cluster's, more ticks than an episode, a slice holding
            no group of the cluster, or the candidate named ``current``.
    """
    from edgetwin.edge.bus import make_bus
    from edgetwin.edge.registry import FileRegistry, metadata_from_policy_dir
    from edgetwin.edge.runtime import EdgeRuntime
    from edgetwin.edge.signing import Signer, TrustStore

    if config.candidate == "current":
        raise InputError("the candidate's version may not be named 'current'", where="canary")
    em = EdgeCluster(cluster)
    _check_fits(em, config, seed, day)
    tmp = tempfile.TemporaryDirectory(prefix="edgetwin-canary-") if workdir is None else None
    root = Path(workdir) if workdir is not None else Path(tmp.name)  # type: ignore[union-attr]
    try:
        signer = Signer.generate()
        reg = FileRegistry(root / "registry")
        objects: dict[str, Any] = {}
        for name, pol in (("current", current), (config.candidate, candidate)):
            if isinstance(pol, str | Path):
                d = Path(pol)
            else:
                if not hasattr(pol, "act"):
                    raise InputError(f"{name}: expected a policy directory or an object with act(obs)", "canary")
                objects[name] = pol
                d = _stub_dir(root / "stubs", name, getattr(pol, "spec", None) or em.spec)
            reg.publish(d, {**metadata_from_policy_dir(d), "name": name, "version": name}, signer)
        reg.set_current(f"site/{site}", "current", expected=None)
        bus_name = f"memory://canary-{uuid.uuid4().hex}"  # a broker of its own
        frame = fleet_frame_bytes(em.n)
        site_bus = make_bus(bus_name, max_bytes=frame, name=f"runtime/{site}")
        asyncio.run(site_bus.connect())
        rt = EdgeRuntime(
            site, reg, TrustStore([signer.public_key]), bus=site_bus, kpi_guard=None, poll_interval=3600.0,
            cache_dir=root / "runtime", loader=_loader(objects), spec=em.spec,
        )  # fmt: skip
        start = _start_command(config, str(reg.manifest(config.candidate).sha256), site)
        try:
            with rt.running_in_thread():
                assert rt._loop is not None
                day_log, collected = asyncio.run_coroutine_threadsafe(
                    _operate(bus_name, signer, start, cluster, site, root / "canary.parquet", seed=seed, day=day,
                             episode=episode, max_bytes=frame), rt._loop,
                ).result()  # fmt: skip
                result = rt.canary_result()
        finally:
            asyncio.run(site_bus.close())  # the runtime closes only a bus it made itself
        if len(collected) != len(result.log):
            raise RuntimeError(
                f"canary {result.run_id}: {len(result.log)} rows spooled but {len(collected)} collected from the bus"
            )
        # the log contract's columns, as `load_log` reads the collected file for `canary verdict`
        # and `edgetwin update`: the site's ``arm`` annotation (which arm served each row) is not one
        result.log = collected.drop(columns=["arm"], errors="ignore")
        in_slice = day_log["agent"].astype(str).isin(set(collected["agent"].astype(str)))
        rest = day_log[~in_slice & (day_log["t"] < int(result.ticks))]
        result.fleet_log = rest.reset_index(drop=True) if len(rest) else None
        return result
    finally:
        if tmp is not None:
            tmp.cleanup()


def _check_ticks(em: EdgeCluster, config: CanaryConfig) -> None:
    """The canary's tick is the cluster's and its ticks fit in an episode (else one line)."""
    if abs(em.dt - config.tick_seconds) > 1e-9:
        raise InputError(f"the canary's tick is {config.tick_seconds} s but the cluster's is {em.dt} s", "canary")
    if config.total_ticks > em.steps:
        raise InputError(
            f"the canary runs {config.total_ticks} ticks ({config.pre_ticks} before the candidate, then "
            f"{config.hours} h) but an episode of the cluster has {em.steps}",
            where="canary",
        )


def _check_fits(em: EdgeCluster, config: CanaryConfig, seed: int, day: float | None) -> None:
    """The canary's tick is the cluster's, its ticks fit in an episode, and its slice holds a group
    of the day's population (what the operator's plan, made on the fleet's log, guarantees)."""
    from edgetwin.edge.canary_slice import CanarySlice, SliceRouter

    _check_ticks(em, config)
    em.reset(seed=episode_seed(seed, 0), day=day)
    sl = config.slice if isinstance(config.slice, CanarySlice) else CanarySlice.from_dict(dict(config.slice))
    arms = SliceRouter(sl, "next", "current").arms(em.agent_ids.tolist(),
                                                   np.array(em.site_names, dtype=object)[em.home].tolist(),
                                                   np.array(SCENARIOS, dtype=object)[em.scenario].tolist())  # fmt: skip
    if not (arms != "fleet").any():
        raise InputError(f"no service group of the cluster is in the canary's slice {sl.to_dict()}", "canary")


def _start_command(config: CanaryConfig, sha256: str, site: str) -> Any:
    """The signed-to-be `CanaryStart` that runs ``config`` at ``site`` (what `start_from_plan`
    builds from a plan, here from the config the caller already holds: same fields)."""
    from edgetwin.edge.canary_command import CanaryStart
    from edgetwin.edge.canary_slice import CanarySlice

    sl = config.slice if isinstance(config.slice, CanarySlice) else CanarySlice.from_dict(dict(config.slice))
    return CanaryStart(
        run=f"{config.canary_id}-{uuid.uuid4().hex[:8]}", candidate=config.candidate, sha256=sha256, slice=sl,
        hours=config.hours, margins=tuple(config.margins), current="current", alpha=config.alpha,
        pre_ticks=config.pre_ticks, max_loss=tuple(config.max_loss), fleet_groups=int(config.fleet_groups),
        loss_levels=tuple(config.loss_levels), tick_seconds=config.tick_seconds, batch=config.batch,
        min_reports=config.min_reports, sites=(site,), switchback=config.switchback,
    )  # fmt: skip


async def _operate(
    bus_url: str, signer: Any, start: Any, cluster: ClusterConfig, site: str, out: Path, *,
    seed: int, day: float | None, episode: int | str, max_bytes: int = 0,
) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """The operator's and the system's side of one run, over the bus only: start → serve / guard
    (the system drives its day; the operator watches the site's status after each tick) → collect.
    Returns the system's own log of the ticks it ran and the collected canary log."""
    from edgetwin.edge.bus import make_bus
    from edgetwin.loop.collect import collect_canary
    from edgetwin.loop.commands import fleet_status, publish_start, publish_stop

    async def status() -> Any:
        st = (await fleet_status(bus, [site], start.run, timeout=30.0))[site]
        if isinstance(st, str):
            raise RuntimeError(f"site {site} did not answer the status of canary {start.run}: {st}")
        return st

    async def until(cond: Callable[[Any], bool], what: str, timeout: float = 120.0) -> Any:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            st = await status()
            if cond(st):
                return st
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"canary {start.run} at site {site}: timed out waiting for {what} ({st.to_dict()})")
            await asyncio.sleep(0.002)

    async def joined(t: int) -> bool:  # the site has judged tick t: go on while its run does
        st = await until(lambda s: s.phase == "stopped" or s.ticks >= t + 1, f"tick {t} to be joined")
        return bool(st.phase != "stopped")

    async with make_bus(bus_url, **({"max_bytes": max_bytes} if max_bytes else {})) as bus:
        await publish_start(bus, start, signer)
        st = await until(lambda s: s.run == start.run and s.phase != "idle", "the site to accept the start")
        if st.phase == "stopped":
            raise InputError(f"site {site} ended canary {start.run} at once ({st.stop_reason})", "canary")
        sites = {s: site for s in EdgeCluster(cluster).site_names}
        day_log = await drive_cluster_over_bus(bus, cluster, sites, seed=seed, day=day, episode=episode,
                                               ticks=start.config().total_ticks, on_tick=joined)  # fmt: skip
        if (await status()).phase != "stopped":  # the day ended before the run did
            from edgetwin.edge.canary_command import CanaryStop

            await publish_stop(bus, CanaryStop(start.run, "operator", (site,)), signer)
        st = await until(lambda s: s.phase == "stopped" and s.shipped >= s.segments, "the log to be shipped")
        res = await collect_canary(bus, start.run, out, idle=0.05, timeout=120.0, expected={site: st.shipped})
        if res.missing:
            raise RuntimeError(f"canary {start.run}: segments {res.missing} never arrived")
    return day_log, pd.read_parquet(out)


#: bytes of bus frame per service group that `canary_on_cluster`'s in-process bus allows: one
#: tick's JSON decision request for a group is about 435 bytes and its outcome report's row about
#: 275 (measured at 5,000 groups on one site: 2.17 MB and 1.37 MB), so 1 KiB leaves twice the room
FRAME_BYTES_PER_GROUP = 1024


def fleet_frame_bytes(n_groups: int) -> int:
    """The largest bus frame `canary_on_cluster` allows for a cluster of ``n_groups`` groups, all
    routed to one site: the bus default (1 MiB, nats-server's default ``max_payload``) up to about
    1,000 groups, `FRAME_BYTES_PER_GROUP` per group above it.

    Why: a tick's decision request and outcome report carry every group the site serves in one
    message (`drive_cluster_over_bus`, `edgetwin.loop.collect.publish_outcomes`); at 5,000 groups
    on one site they are 2.2 and 1.4 MB and the site refused the request (413). An operator
    serving that many groups from one site raises the NATS server's ``max_payload`` (at most
    64 MB) and `NatsConfig.max_bytes` alike (docs/canary.md); this is the in-process bus's
    equivalent. The rows are never split: a site joins one outcome report per tick."""
    from edgetwin.edge.bus.base import DEFAULT_MAX_BYTES

    return max(DEFAULT_MAX_BYTES, FRAME_BYTES_PER_GROUP * int(n_groups))


def _loader(objects: dict[str, Any]) -> Callable[[Path], Any]:
    def load(path: Path) -> Any:
        doc_path = path / "policy.json"
        doc = json.loads(doc_path.read_text()) if doc_path.is_file() else {}
        if doc.get("format") == "edgetwin-inprocess/1":
            name = str(doc.get("name"))
            if name not in objects:
                raise InputError(f"no in-process policy named {name!r}", where=str(doc_path))
            return objects[name]
        from edgetwin.policies.export import load_policy

        return load_policy(path)

    return load


# ------------------------------------------------------------------ the cluster as an operator's system
class DecisionClient(Protocol):
    """What `drive_cluster_over_bus` needs of a bus: a plain request/reply of bytes and a durable
    publish (`edgetwin.edge.bus.Bus`)."""

    async def request_raw(self, subject: str, data: bytes, timeout: float) -> bytes: ...

    async def publish_durable(self, subject: str, msg: Any) -> int: ...


@dataclass
class WireDecisions:
    """One site's answer to one tick's JSON decision request (`edgetwin.edge.decision_wire`)."""

    actions: np.ndarray
    policy: np.ndarray
    propensity: np.ndarray
    arm: np.ndarray


def decision_request_body(
    obs: np.ndarray, columns: list[str], agents: list[str], sites: list[str], scenarios: list[str], t: int
) -> bytes:
    """The JSON body of one decision request (`ask_site`): ``obs`` (N, obs) in ``columns``' order and
    each row's group, site and scenario, for tick ``t``; its size is what the bus frame must hold."""
    return json.dumps({"obs": obs.tolist(), "columns": columns, "agents": agents, "sites": sites,
                       "scenarios": scenarios, "t": int(t)}).encode()  # fmt: skip


async def ask_site(
    bus: DecisionClient, site: str, obs: np.ndarray, columns: list[str], agents: list[str], sites: list[str],
    scenarios: list[str], t: int, timeout: float = 10.0, retries: int = 0,
) -> WireDecisions:  # fmt: skip
    """One JSON decision request on ``edgetwin.decision.<site>`` naming the rows' groups, sites,
    scenarios and tick, as any NATS client would send it (docs/bus.md); the reply's per-row
    ``policies`` (registry versions), ``arms`` and ``propensity``. A site that does not answer
    (restarting) is asked again up to ``retries`` times, backing off, as a system's client would.

    Raises:
        RuntimeError: the site answered with an error (its ``error`` field)."""
    from edgetwin.edge.bus import Subjects

    body = decision_request_body(obs, columns, agents, sites, scenarios, t)
    for attempt in range(retries + 1):
        try:
            raw = await bus.request_raw(Subjects.decision(site), body, timeout)
            break
        except Exception as e:  # noqa: BLE001 - no responder / timeout: the site is restarting
            if attempt == retries:
                raise RuntimeError(f"site {site} did not answer the decision request of tick {t}: {type(e).__name__}") from None
            await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
    doc = json.loads(raw)
    if "error" in doc:
        raise RuntimeError(f"site {site} refused the decision request of tick {t}: {doc['error']}")
    n = len(agents)
    actions = np.asarray(doc["actions"], dtype=np.float64).reshape(n, -1)
    policy = np.asarray(doc.get("policies") or [doc.get("version", "")] * n, dtype=object)
    prop = np.array([np.nan if p is None else float(p) for p in (doc.get("propensity") or [None] * n)])
    arm = np.asarray(doc.get("arms") or ["fleet"] * n, dtype=object)
    return WireDecisions(actions, policy, prop, arm)


def edge_routes(cluster_sites: list[str], sites: dict[str, str] | list[str]) -> dict[str, str]:
    """Edge site per cluster site: ``sites`` itself when a dict, else the cluster's sites dealt to
    the listed edge sites in turn (the k-th cluster site to ``sites[k % len(sites)]``)."""
    if isinstance(sites, dict):
        return dict(sites)
    return {s: list(sites)[k % len(sites)] for k, s in enumerate(cluster_sites)}


async def drive_cluster_over_bus(
    bus: DecisionClient,
    cluster: ClusterConfig,
    sites: dict[str, str] | list[str],
    *,
    seed: int = 0,
    day: float | None = None,
    episode: int | str = 0,
    ticks: int | None = None,
    report: bool = True,
    on_tick: Callable[[int], Awaitable[bool | None]] | None = None,
    retries: int = 20,
    sender: str = "cluster",
    reporter: Callable[[str, int, pd.DataFrame], Awaitable[None]] | None = None,
) -> pd.DataFrame:
    """The emulated cluster as an operator's own system: every tick it asks the edge sites for
    decisions over the JSON decision wire (`ask_site`), steps, and reports each site's outcome rows
    on its durable outcome subject (`edgetwin.edge.canary_command.outcome_envelope`). It knows
    nothing of canaries: which rows the candidate served is the sites' business, read back from
    the replies' ``policies``.

    Args:
        bus: a connected bus. cluster: the emulated system (its population from ``seed``,
            `episode_seed(seed, 0)`, as `generate_logs` draws it).
        sites: edge site per cluster site name (a dict), or a list of edge sites the cluster's
            sites are dealt to in turn.
        ticks: at most this many ticks (default: the episode's). report: publish outcome rows.
        retries: decision requests re-sent to a site that does not answer (`ask_site`).
        sender: the outcome reports' sender (on NATS the sites accept reports signed by a key of
            their ``--reporters``: set ``bus.auth`` to a `MessageAuth` holding this identity's key).
        reporter: awaited as ``reporter(site, t, rows)`` to report each site's outcome rows of
            tick t another way (e.g. to the system's metrics, read back from Prometheus and
            published by `edgetwin.loop.collect.publish_outcomes`); None: published on the bus.
        on_tick: awaited with each tick after its outcomes are reported (e.g. to pace the
            system, or to wait until the sites have joined them); its returning False ends the
            day there (the rest of the log is not generated).

    Returns:
        The system's own log of those ticks (the log contract; ``policy`` = the registry version
        that decided each row, ``propensity``): what an operator's logs would hold.
    """
    from edgetwin.loop.collect import publish_outcomes

    em = EdgeCluster(cluster)
    obs = em.reset(seed=episode_seed(seed, 0), day=day)
    names = list(em.site_names)
    route = edge_routes(names, sites)
    home = np.array(names, dtype=object)[em.home]
    edge = np.array([route.get(str(s), "") for s in home], dtype=object)
    if (edge == "").any():
        raise InputError(f"cluster site(s) {sorted(set(home[edge == '']))} have no edge site", "sites")
    scen = np.array(SCENARIOS, dtype=object)[em.scenario]
    cols = list(em.spec.observation_columns)
    out: list[pd.DataFrame] = []
    for t in range(min(em.steps, ticks or em.steps)):
        actions = np.zeros((em.n, len(em.spec.action_columns)))
        policy = np.empty(em.n, dtype=object)
        prop = np.full(em.n, np.nan)
        for site in sorted(set(edge)):
            m = edge == site
            d = await ask_site(bus, site, obs[m], cols, em.agent_ids[m].tolist(), home[m].tolist(), scen[m].tolist(), t,
                               retries=retries)  # fmt: skip
            actions[m], policy[m], prop[m] = d.actions, d.policy, d.propensity
        actions = check_actions(actions, em.n)
        new_obs, reward, done, info = em.step(actions)
        rows = _rows(em, episode, t, obs, actions, info, reward, policy, prop, np.ones(em.n, bool))
        if report:
            for site in sorted(set(edge)):
                if reporter is not None:
                    await reporter(site, t, rows[edge == site])
                else:
                    await publish_outcomes(bus, rows[edge == site], site, sender=sender, day=episode)
        out.append(rows)
        if on_tick is not None and await on_tick(t) is False:
            break
        obs = new_obs
        if done:
            break
    return pd.concat(out, ignore_index=True)


def main(argv: list[str] | None = None) -> int:
    """``python3 -m edgetwin.loop.fleet --bus URL --site A --site B ...``: run the emulated cluster
    in its own process as the real system of `drive_cluster_over_bus` and write its own log."""
    import argparse
    import sys

    from edgetwin.edge.bus import make_bus

    ap = argparse.ArgumentParser(prog="python3 -m edgetwin.loop.fleet", description=main.__doc__)
    ap.add_argument("--bus", required=True)
    ap.add_argument("--site", action="append", required=True, help="an edge site; repeatable")
    ap.add_argument("--agents", type=int, default=40)
    ap.add_argument("--steps", type=int, default=96)
    ap.add_argument("--ticks", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--episode", default="0")
    ap.add_argument("--pace", type=float, default=0.0, help="seconds to wait after each tick")
    ap.add_argument("--keys", default=None, help="keys directory holding <identity>.key.pem: outcome reports are "
                    "signed with it (the sites' `serve --reporters` must hold its public key)")  # fmt: skip
    ap.add_argument("--identity", default="cluster", help="the reporting identity (the outcome reports' sender)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)

    async def go() -> pd.DataFrame:
        async def pace(_t: int) -> None:
            await asyncio.sleep(a.pace)

        bus = make_bus(a.bus)
        if a.keys:
            from edgetwin.edge.message_auth import FederationKeys

            bus.auth = FederationKeys.load(a.keys, [a.identity]).auth(a.identity)
        async with bus:
            return await drive_cluster_over_bus(bus, ClusterConfig(n_agents=a.agents, steps=a.steps), a.site,
                                                seed=a.seed, episode=a.episode, ticks=a.ticks, on_tick=pace,
                                                sender=a.identity)  # fmt: skip

    try:
        log = asyncio.run(go())
    except (InputError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    log.to_parquet(a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
