"""The edge runtime: serve a site's current policy, verified, shielded, hot-swapped and watched.

An `EdgeRuntime` is what runs on an edge site (``edgetwin serve``)::

    registry = FileRegistry("registry/")                       # or a NatsRegistry (async)
    trust = TrustStore.from_paths(["keys/"])
    async with EdgeRuntime("site-1", registry, trust, bus="nats://127.0.0.1:4222") as rt:
        actions = rt.decide(obs)                               # (N, O) -> (N, A), the Python API
        rt.report_kpis({"kpi.slo_violation": 0.12})            # live KPIs feed the rollback watch

What it does:

- **Loads the current policy of its scope**: the pointer of ``site/<site>``, falling back to
  ``cluster/<cluster>`` and then ``global`` (the first scope that has one wins). Every artifact is
  verified against the trust store before it is unpacked (`verify_artifact`); an unsigned,
  tampered or wrong-key version is refused with a logged reason and the runtime keeps serving the
  last good one. A new version must act on the same observation / action columns as the one it
  replaces (else it is refused as ``incompatible``), and must answer a warm-up call.
- **Answers decisions** through `decide` (a batch ``(N, O)`` -> ``(N, A)``, callable from any
  thread) and over the bus (request/reply on ``Subjects.decision(site)``, kinds
  ``decision_request`` -> ``decision_reply``, or ``error`` with the reason; and, for clients that
  are not edgetwin, JSON or Arrow IPC bodies with NATS headers, `edgetwin.edge.decision_wire`;
  a bad request of any format gets an error reply at once). Every action it
  returns has gone through the safety shield, when one is configured (`Shield.project`).
- **Hot-swaps** without dropping a request: the registry pointer is polled every
  ``poll_interval`` seconds, and at once when anything arrives on ``edgetwin.policy.>`` (a
  ``policy_version`` announcement, another runtime's rollback notice). The new version is fetched,
  verified, loaded and warmed up off the request path (in a worker thread), then the served
  reference is swapped in one assignment; a request that already holds the old one finishes on it.
- **Is fail-static**: when the registry or the bus cannot be reached, it keeps serving the last
  good policy (and starts from the verified local cache of it when the registry is down at
  startup). An absent pointer never unloads a policy.
- **Watches live KPIs** (`report_kpis`, or ``kpi_report`` messages on ``edgetwin.kpi.<site>``)
  over a sliding window (`edgetwin.edge.kpi_watch.KPIWatch`) and, when a guarded KPI regresses beyond its margin relative
  to the baseline recorded at the swap, rolls back: locally at once to the previous version, and in
  the registry with compare-and-swap on its scope (``registry.rollback(scope, expected=bad)``),
  publishing why as a ``policy_rollback`` message on ``edgetwin.policy.rollback.<site>`` (durable)
  and a WARNING log line.

Subjects and message kinds this module adds to those of ``docs/bus.md``:

| subject | kind | payload |
|---|---|---|
| ``edgetwin.decision.<site>`` (request/reply) | ``decision_request`` -> ``decision_reply`` | reply: ``policy_version`` (int: the scope pointer's revision the version was loaded under, 0 if it came from the local cache), ``version`` (str), ``scope`` (str); tensor ``actions`` (N, A) float64 |
| ``edgetwin.kpi.<site>`` | ``kpi_report`` | ``site``, ``kpis`` {name: number}; optional ``version`` (the policy version that produced them) |
| ``edgetwin.policy.rollback.<site>`` (durable) | ``policy_rollback`` | ``site``, ``scope``, ``from_version``, ``to_version``, ``reason``, ``kpis`` {name: {value, baseline, change, margin}}, ``registry`` (``"rolled_back"`` / ``"pending"`` / ``"conflict"`` / ``"no_target"``) |
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import math
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.contract.policy import LoggingPolicy
from edgetwin.contract.spec import TwinSpec
from edgetwin.edge import decision_wire
from edgetwin.edge.bus import Bus, RawMessage, Received, Subjects, make_bus
from edgetwin.edge.canary import (
    Canary,
    CanaryConfig,
    CanaryResult,
    RoutedDecision,
    canary_log_subject,
    segment_envelope,
    unshipped_segments,
)
from edgetwin.edge.canary_guard import GuardStop
from edgetwin.edge.kpi_watch import Breach, KPIGuard, KPIWatch, lookup_kpi
from edgetwin.edge.messages import Envelope, KindSchema, register_kind
from edgetwin.edge.registry import (
    AsyncPolicyRegistry,
    CASConflict,
    NoRollbackTarget,
    PointerChange,
    PolicyRegistry,
    RegistryError,
    ThreadedRegistry,
    VersionNotFound,
    check_scope,
)
from edgetwin.edge.signing import ArtifactRejected, Manifest, TrustStore, unpack_artifact, verify_artifact

__all__ = [
    "Decision",
    "EdgeRuntime",
    "NoPolicyLoaded",
    "RuntimeEvent",
    "ServedPolicy",
    "announce_policy",
    "kpi_report",
    "kpi_subject",
    "policy_version_notice",
    "request_decision",
    "rollback_subject",
]

log = logging.getLogger("edgetwin.runtime")

T = TypeVar("T")

_CACHE_FORMAT = "edgetwin-runtime-cache/1"


# ------------------------------------------------------------------------------------- messages
def kpi_subject(site: str) -> str:
    """Where live KPIs of ``site`` are reported (``kpi_report``)."""
    Subjects.decision(site)  # checks that the name is a valid subject token
    return f"{Subjects.PREFIX}.kpi.{site}"


def rollback_subject(site: str) -> str:
    """Where ``site``'s runtime announces a rollback (``policy_rollback``, durable: it is an audit trail)."""
    Subjects.decision(site)  # checks that the name is a valid subject token
    return f"{Subjects.PREFIX}.policy.rollback.{site}"


def _check_kpis(env: Envelope) -> None:
    kpis = env.payload["kpis"]
    if not kpis:
        raise ValueError("kpis is empty")
    for k, v in kpis.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError(f"kpis[{k!r}] must be a finite number")


register_kind(
    "kpi_report",
    KindSchema(required={"site": str, "kpis": dict}, optional={"version": str}, check=_check_kpis),
)
register_kind(
    "policy_rollback",
    KindSchema(
        required={"site": str, "scope": str, "from_version": str, "to_version": str, "reason": str},
        optional={"kpis": dict, "registry": str},
    ),
)


def kpi_report(
    site: str, kpis: Mapping[str, float], *, version: str | None = None, sender: str = "edgetwin"
) -> Envelope:
    """A ``kpi_report`` envelope (send it on `kpi_subject`)."""
    payload: dict[str, Any] = {"site": site, "kpis": {str(k): float(v) for k, v in kpis.items()}}
    if version is not None:
        payload["version"] = version
    return Envelope(kind="kpi_report", sender=sender, payload=payload)


def policy_version_notice(
    scope: str, version: str, revision: int, sha256: str, *, sender: str = "edgetwin"
) -> Envelope:
    """A ``policy_version`` announcement: ``version`` became current in ``scope`` at pointer ``revision``.

    Runtimes treat it as a hint to re-read the registry at once (the registry stays the source of
    truth, so a forged or stale announcement cannot make a runtime load anything).
    """
    return Envelope(
        kind="policy_version",
        sender=sender,
        payload={"version": int(revision), "uri": f"{check_scope(scope)}@{version}", "sha256": sha256},
    )


async def announce_policy(
    bus: Bus, scope: str, version: str, revision: int, sha256: str, *, sender: str = "edgetwin"
) -> None:
    """Publish `policy_version_notice` durably on ``Subjects.policy_version()``."""
    await bus.publish_durable(
        Subjects.policy_version(), policy_version_notice(scope, version, revision, sha256, sender=sender)
    )


async def request_decision(
    bus: Bus,
    site: str,
    obs: np.ndarray,
    *,
    timeout: float = 2.0,
    sender: str = "client",
    agents: list[str] | None = None,
    sites: list[str] | None = None,
    scenarios: list[str] | None = None,
) -> Decision:
    """Ask ``site``'s runtime for actions over the bus.

    Args:
        obs: (N, O) observations in the policy's observation column order.
        agents, sites, scenarios: the rows' service groups (one per row): during a canary the
            rows of its slice are served by their arm's policy, and the `Decision` then names
            each row's policy and propensity.

    Returns:
        The `Decision` (actions (N, A), version, scope).

    Raises:
        RuntimeError: the runtime answered with an ``error`` (its reason is in the message).
        TimeoutError, NoResponders: see `Bus.request`.
    """
    obs = np.atleast_2d(np.asarray(obs, dtype=np.float64))
    payload: dict[str, Any] = {"site": site}
    for k, v in (("agents", agents), ("sites", sites), ("scenarios", scenarios)):
        if v is not None:
            payload[k] = [str(x) for x in v]
    reply = await bus.request(
        Subjects.decision(site),
        Envelope(kind="decision_request", sender=sender, payload=payload, tensors={"obs": obs}),
        timeout=timeout,
    )
    if reply.kind == "error":
        raise RuntimeError(f"runtime of {site!r} refused the request: {reply.payload.get('reason')}")
    if reply.kind != "decision_reply":
        raise RuntimeError(f"expected a decision_reply from {site!r}, got {reply.kind!r}")
    return Decision(
        actions=np.asarray(reply.tensors["actions"]),
        version=str(reply.payload.get("version", "")),
        scope=str(reply.payload.get("scope", "")),
        revision=int(reply.payload["policy_version"]),
        policies=tuple(reply.payload["policies"]) if "policies" in reply.payload else None,
        propensity=np.asarray(reply.tensors["propensity"]) if "propensity" in reply.tensors else None,
    )


# ------------------------------------------------------------------------------------- served policy
class NoPolicyLoaded(RuntimeError):
    """The runtime has no verified policy yet (nothing promoted for its scopes, or all refused)."""


@dataclasses.dataclass
class ServedPolicy:
    """One verified, loaded version and everything needed to answer with it.

    Attributes:
        version: the registry version name.
        scope: the scope whose pointer selected it.
        revision: that pointer's revision (0 when it came from the local cache).
        policy: the loaded policy (``act(obs (N, O)) -> (N, A)``).
        shield: the runtime's shield for this policy's spec (None: no shield configured).
        manifest: its signed manifest (``manifest.metadata["metrics"]`` = metrics at promotion).
        observation_columns / action_columns: its contract.
    """

    version: str
    scope: str
    revision: int
    policy: Any
    shield: Any
    manifest: Manifest
    observation_columns: list[str]
    action_columns: list[str]
    path: Path
    loaded_at: float = dataclasses.field(default_factory=time.time)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def act_logged(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(actions (N, A), propensity (N,))`` for a log: the policy's own probability or density
        of each action where it says it (`edgetwin.contract.policy.LoggingPolicy`, unshielded: a
        shield's projection would move the action off the density), else as the contract reads a
        deterministic policy: 1 when every action feature is discrete, NaN (unknown) otherwise."""
        if self.shield is None and isinstance(self.policy, LoggingPolicy):
            with self.lock:
                a, p = self.policy.act_logged(obs)
            a = np.asarray(a, dtype=np.float64).reshape(len(obs), -1)
            if a.shape != (len(obs), len(self.action_columns)) or not np.isfinite(a).all():
                raise RuntimeError(f"policy {self.version} returned actions of shape {a.shape} from act_logged")
            return a, np.asarray(p, dtype=np.float64).reshape(len(obs))
        spec = getattr(self.policy, "spec", None)
        discrete = bool(spec.discrete_actions()) if isinstance(spec, TwinSpec) else False
        return self.act(obs), np.full(len(obs), 1.0 if discrete else np.nan)

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Shielded actions (N, A) float64 for (N, O) observations."""
        # One call at a time per version: policies and shields keep state (recurrent memory,
        # migration history); a swap gives new requests a new object, so they never wait on this.
        with self.lock:
            actions = np.asarray(self.policy.act(obs), dtype=np.float64)
            if actions.ndim == 1:
                actions = actions.reshape(len(obs), -1)
            if self.shield is not None:
                actions = self.shield.project(obs, actions)
        if actions.shape != (len(obs), len(self.action_columns)) or not np.isfinite(actions).all():
            raise RuntimeError(
                f"policy {self.version} returned actions of shape {actions.shape} (finite: "
                f"{bool(np.isfinite(actions).all())}), expected ({len(obs)}, {len(self.action_columns)})"
            )
        return actions


@dataclasses.dataclass(frozen=True)
class Decision:
    """Actions and the version that produced them (per row, when the request named its groups:
    ``policies`` and ``propensity``, `EdgeRuntime.decide_for`)."""

    actions: np.ndarray
    version: str
    scope: str
    revision: int
    policies: tuple[str, ...] | None = None
    propensity: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class RuntimeEvent:
    """Something the runtime did or refused: ``kind`` is loaded / refused / rollback /
    registry_unreachable / registry_reachable / cache_start."""

    kind: str
    version: str | None
    scope: str | None
    reason: str
    at: float = dataclasses.field(default_factory=time.time)


@dataclasses.dataclass
class RuntimeStats:
    """Counters of one runtime."""

    decisions: int = 0
    rows: int = 0
    by_version: Counter[str] = dataclasses.field(default_factory=Counter)
    bus_requests: int = 0
    bus_errors: int = 0
    kpi_reports: int = 0
    kpi_stale: int = 0
    swaps: int = 0
    refused: int = 0
    rollbacks: int = 0
    registry_errors: int = 0
    polls: int = 0

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["by_version"] = dict(self.by_version)
        return d


def _default_loader(path: Path) -> Any:
    from edgetwin.policies.export import load_policy

    return load_policy(path)


# ------------------------------------------------------------------------------------- runtime
class EdgeRuntime:
    """Serves one site's policy: verified loads, shielded decisions, hot swap, fail-static, rollback.

    Args:
        site: the site's name (a subject token and a ``site/<site>`` scope).
        registry: a `PolicyRegistry` (sync, e.g. `FileRegistry`; run in worker threads) or an
            `AsyncPolicyRegistry` (e.g. `NatsRegistry`, on the runtime's event loop).
        trust: public keys whose signatures are accepted.
        bus: a connected `Bus`, or a spec for `make_bus` (``"memory://NAME"``, ``"nats://..."``),
            which the runtime then connects and closes itself; None: Python API only.
        shield: a `ShieldConfig` (a `Shield` is built for each loaded policy's spec) or a `Shield`
            (used as is); None: actions are returned as the policy gives them (an exported policy
            may still carry its own shield).
        kpi_guard: the rollback watch; ``"auto"`` (= ``KPIGuard(margins=None)``): the KPIs the first
            loaded policy's reward weighs (`KPIGuard.from_spec`); None: no KPI watch.
        cluster: the site's cluster, for the ``cluster/<cluster>`` fallback scope.
        poll_interval: seconds between registry polls.
        registry_timeout: seconds a registry call may take before the registry counts as unreachable.
        cache_dir: where verified artifacts are kept (for fail-static restarts); a temporary
            directory (removed on stop) when None. One runtime per cache directory.
        spec: the observation / action contract; by default the first loaded policy's.
        loader: ``path -> policy`` (default `edgetwin.policies.load_policy`).
        name: the bus sender name (default ``runtime/<site>``).
        freeze_gc: after each load, move every object then alive out of the cyclic garbage
            collector's reach (`gc.freeze`). A process holding torch and SB3 tracks ~400k objects,
            and a full collection of them stalls whatever request is running for ~250 ms (a
            young-generation one ~0.4-0.8 ms, every few hundred requests); frozen, those
            collections only scan what was allocated since. Process-wide, so off by default for
            a library; ``edgetwin serve`` turns it on (it owns its process).
    """

    def __init__(
        self,
        site: str,
        registry: PolicyRegistry | AsyncPolicyRegistry,
        trust: TrustStore,
        bus: Bus | str | None = None,
        shield: Any = None,
        kpi_guard: KPIGuard | Literal["auto"] | None = "auto",
        *,
        cluster: str | None = None,
        poll_interval: float = 2.0,
        registry_timeout: float = 5.0,
        cache_dir: str | Path | None = None,
        spec: TwinSpec | None = None,
        loader: Callable[[Path], Any] = _default_loader,
        name: str | None = None,
        freeze_gc: bool = False,
    ) -> None:
        self.scopes = [check_scope(f"site/{site}")]
        if cluster is not None:
            self.scopes.append(check_scope(f"cluster/{cluster}"))
        self.scopes.append("global")
        Subjects.decision(site)  # the site name must be a valid subject token too
        if not isinstance(trust, TrustStore) or len(trust) == 0:
            raise InputError("the runtime needs a trust store with at least one public key", where="trust")
        if poll_interval <= 0 or registry_timeout <= 0:
            raise InputError("poll_interval and registry_timeout must be positive", where="runtime")
        if not isinstance(registry, PolicyRegistry | AsyncPolicyRegistry):
            raise InputError(
                f"expected a PolicyRegistry or AsyncPolicyRegistry, got {type(registry).__name__}", "registry"
            )
        self.site = site
        self.cluster = cluster
        self.registry = registry
        self._areg: AsyncPolicyRegistry = (
            registry if isinstance(registry, AsyncPolicyRegistry) else ThreadedRegistry(registry)
        )
        self.trust = trust
        self._bus_spec = bus if isinstance(bus, str) else None
        self.bus: Bus | None = bus if isinstance(bus, Bus) else None
        if bus is not None and not isinstance(bus, Bus | str):
            raise InputError(f"expected a Bus or a bus spec string, got {type(bus).__name__}", where="bus")
        self.shield = shield
        if kpi_guard == "auto":
            kpi_guard = KPIGuard(margins=None)
        if kpi_guard is not None and not isinstance(kpi_guard, KPIGuard):
            raise InputError(
                f"kpi_guard must be a KPIGuard, 'auto' or None, got {kpi_guard!r}", where="kpi_guard"
            )
        self.guard: KPIGuard | None = kpi_guard
        self.watch: KPIWatch | None = (
            KPIWatch(kpi_guard) if kpi_guard is not None and kpi_guard.margins is not None else None
        )
        self.poll_interval = float(poll_interval)
        self.registry_timeout = float(registry_timeout)
        self._own_cache = cache_dir is None
        self.cache_dir = (
            Path(cache_dir)
            if cache_dir is not None
            else Path(tempfile.mkdtemp(prefix=f"edgetwin-runtime-{site}-"))
        )
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.spec = spec
        self.loader = loader
        self.freeze_gc = bool(freeze_gc)
        self.name = name or f"runtime/{site}"

        self.stats = RuntimeStats()
        self.metrics: Any = None  # a `edgetwin.edge.metrics.RuntimeMetrics`: `instrument(runtime)` sets it
        self.events: deque[RuntimeEvent] = deque(maxlen=1000)
        self.registry_reachable: bool | None = None
        self._active: ServedPolicy | None = None
        self._previous: ServedPolicy | None = None  # the local rollback target
        # What is loaded is keyed by the artifact's signed digest, never by its name alone: a
        # registry rebuilt after losing its store can give other bytes an old name (`_key`).
        self._loaded: dict[str, ServedPolicy] = {}  # version@sha256 -> kept in memory (active, previous)
        self._refused: dict[str, str] = {}  # version -> reason (the bytes of `_refused_digest`)
        self._refused_digest: dict[str, str | None] = {}  # version -> sha256 refused (None: unknown)
        self._baselines: dict[str, tuple[dict[str, float] | None, str]] = {}  # version@sha256 -> baseline
        self._vetoed: tuple[str, str, int, str] | None = None  # (scope, version, revision, sha256) rolled back from
        self._registry_empty = False  # the "registry lost its record" warning was given (once)
        self._pending_rollback: tuple[str, str, str] | None = None  # (scope, bad version, reason)
        self._rollback_outcomes: dict[str, tuple[str, str]] = {}  # bad version -> (outcome, target)
        self._state_lock = threading.RLock()
        self._stats_lock = threading.Lock()
        self._refresh_lock: asyncio.Lock | None = None
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Future[Any]] = set()
        self._poll_task: asyncio.Task[None] | None = None
        self._subs: list[Any] = []
        self._answer_frame: Callable[[Received], Awaitable[None]] | None = None
        self._started = False
        # A canary (`start_canary`): its run, and the candidate version it serves to its slice.
        self._canary: Canary | None = None
        self._canary_policy: ServedPolicy | None = None
        self._canary_final: CanaryResult | None = None  # a canary's result kept when its spool is removed
        self._ship_lock: asyncio.Lock | None = None

    # ---------------------------------------------------------------- properties
    @property
    def active(self) -> ServedPolicy | None:
        """The version being served now (None before the first successful load)."""
        return self._active

    @property
    def version(self) -> str | None:
        return self._active.version if self._active else None

    def status(self) -> dict[str, Any]:
        """A JSON-able snapshot (what ``edgetwin serve --json`` prints)."""
        a = self._active
        return {
            "site": self.site,
            "scopes": self.scopes,
            "version": a.version if a else None,
            "scope": a.scope if a else None,
            "revision": a.revision if a else None,
            "registry_reachable": self.registry_reachable,
            "refused": dict(self._refused),
            "pending_rollback": self._pending_rollback,
            "guard": self.guard.describe() if self.guard else None,
            "kpi_watch": None if self.watch is None else {
                "version": self.watch.version, "judging": self.watch.judging and not self.watch.accepted,
                "accepted": self.watch.accepted, "reports": self.watch.reports,
                "baseline": self.watch.baseline, "baseline_source": self.watch.baseline_source,
            },  # fmt: skip
            "stats": self.stats.as_dict(),
        }

    # ---------------------------------------------------------------- lifecycle
    async def __aenter__(self) -> EdgeRuntime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Load the current policy (or the cached last good one), start serving and polling."""
        if self._started:
            return
        self._loop = asyncio.get_running_loop()
        self._refresh_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        if self._bus_spec is not None:
            self.bus = make_bus(self._bus_spec, name=self.name)
            await self.bus.connect()
        try:
            await self.refresh()
        except Exception as e:  # fail-static: a registry outage at startup is not fatal if we have a cache
            self._registry_down(e)
        if self._active is None:
            await asyncio.to_thread(self._start_from_cache)
        if self.bus is not None:
            import pyarrow.ipc  # noqa: F401  (imported now: not on the first Arrow request's time)

            subject = Subjects.decision(self.site)
            self._answer_frame = self.bus.answering(subject, self._on_decision)
            self._subs.append(
                await self.bus.subscribe_raw(subject, self._on_decision_raw, queue=f"runtime-{self.site}")
            )
            self._subs.append(await self.bus.subscribe(kpi_subject(self.site), self._on_kpi_report))
            self._subs.append(await self.bus.subscribe(f"{Subjects.PREFIX}.policy.>", self._on_policy_note))
            try:  # the server has our subscriptions once this returns: "started" means "answering"
                await self.bus.flush(timeout=self.registry_timeout)
            except Exception as e:  # fail-static: the bus may be down; nats-py resubscribes on reconnect
                log.warning(
                    "%s: bus not reachable at startup (%r); serving the Python API meanwhile", self.site, e
                )
        self._ship_lock = asyncio.Lock()
        if self.bus is not None and self._spooled():
            self.call_soon(self._ship_spool())  # a canary log left by a runtime that died mid-canary
        self._poll_task = asyncio.create_task(self._poll_loop(), name=f"runtime-poll:{self.site}")
        self._started = True

    async def stop(self) -> None:
        """Stop polling and serving; wait briefly for rollback notices still being published."""
        if self._canary is not None and self._canary.active:
            self._end_canary("runtime", None)
        if self.bus is not None and self._ship_lock is not None and self._spooled():
            with contextlib.suppress(Exception):  # bounded: what is not shipped stays spooled
                await asyncio.wait_for(self._ship_spool(), timeout=self.registry_timeout)
        if self._poll_task is not None:
            self._poll_task.cancel()
            # bounded: stopping must never hang on a registry call stuck in a worker thread
            await asyncio.wait({self._poll_task}, timeout=5.0)
            self._poll_task = None
        if self._tasks:
            _, still = await asyncio.wait(list(self._tasks), timeout=5.0)
            for t in still:
                t.cancel()
        for s in self._subs:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(s.unsubscribe(), timeout=5.0)
        self._subs.clear()
        if self._bus_spec is not None and self.bus is not None:
            await self.bus.close()
            self.bus = None
        if self._own_cache:
            if self._canary is not None:  # its spool goes with the temporary cache: keep the result
                self._canary_final = self._canary.result()
            shutil.rmtree(self.cache_dir, ignore_errors=True)
        self._started = False

    @contextlib.contextmanager
    def running_in_thread(self, timeout: float = 60.0) -> Iterator[EdgeRuntime]:
        """Run the runtime's event loop in a daemon thread (for synchronous callers).

        Inside the block `decide` and `report_kpis` work from the calling thread while polling,
        bus serving and rollbacks happen on the runtime's loop. Pass the bus as a spec string so
        it is created on that loop.
        """
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name=f"edgetwin-runtime-{self.site}", daemon=True)
        thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.start(), loop).result(timeout)
            try:
                yield self
            finally:
                asyncio.run_coroutine_threadsafe(self.stop(), loop).result(timeout)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()

    def call_soon(self, coro: Awaitable[Any]) -> None:
        """Run ``coro`` as a task on the runtime's loop, from any thread (`stop` waits for it)."""
        if self._loop is None:
            raise RuntimeError("the runtime is not started")

        def spawn() -> None:
            task = asyncio.ensure_future(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            spawn()
        else:
            self._loop.call_soon_threadsafe(spawn)

    # ---------------------------------------------------------------- decisions
    def _check_obs(self, obs: Any) -> np.ndarray:
        try:
            x = np.asarray(obs, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise InputError(f"observations must be numbers ({e})", where="obs") from None
        if x.ndim == 1:
            x = x[None, :]
        a = self._active
        width = len(a.observation_columns) if a else None
        if x.ndim != 2 or (width is not None and x.shape[1] != width):
            raise InputError(f"expected observations of shape (N, {width}), got {x.shape}", where="obs")
        if not np.isfinite(x).all():
            raise InputError("observations contain NaN or inf", where="obs")
        return x

    def decide_with_info(self, obs: np.ndarray) -> Decision:
        """Like `decide`, with the version that answered."""
        x = self._check_obs(obs)
        served = self._active  # one read: a concurrent swap does not affect this call
        if served is None:
            raise NoPolicyLoaded(
                f"site {self.site!r} has no verified policy yet (scopes {self.scopes}); see the log"
            )
        t0 = time.perf_counter()
        actions = served.act(x)
        if self.metrics is not None:
            self.metrics.observe_decision(served.version, len(x), time.perf_counter() - t0, arm="fleet")
        with self._stats_lock:  # `+=` from several threads would lose counts
            self.stats.decisions += 1
            self.stats.rows += len(x)
            self.stats.by_version[served.version] += 1
        return Decision(actions, served.version, served.scope, served.revision)

    def decide(self, obs: np.ndarray) -> np.ndarray:
        """Actions ``(N, A)`` (float64, spec units, shielded) for observations ``(N, O)``.

        Thread-safe and non-blocking (no I/O); works while the registry and bus are down.

        Raises:
            InputError: observations of the wrong width, or not finite.
            NoPolicyLoaded: nothing verified to serve yet.
        """
        return self.decide_with_info(obs).actions

    async def _on_decision_raw(self, msg: RawMessage) -> None:
        """One request on the decision subject: an edgetwin frame goes the envelope way (decoded
        and validated by the bus, rejections counted there, `_on_decision`); JSON and Arrow bodies
        (`edgetwin.edge.decision_wire`) are answered in kind, and every failure gets an error
        reply with its reason and code."""
        assert self.bus is not None and self._answer_frame is not None
        if decision_wire.is_frame(msg.data, msg.headers):
            rejected = await self.bus.deliver(msg, self._answer_frame)
            if rejected is not None and msg.reply is not None:
                # counted in bus.stats.rejected; the requester hears why now instead of timing out
                self.stats.bus_requests += 1
                self.stats.bus_errors += 1
                reason = f"rejected frame: {rejected}"
                await self.bus.publish(msg.reply, Envelope(kind="error", sender=self.name, payload={"reason": reason}))
            return
        self.stats.bus_requests += 1
        msg_id = decision_wire.request_id(msg.headers)
        try:
            a = self._active
            req = decision_wire.parse_request(
                msg.data, msg.headers, a.observation_columns if a else None, self.site, self.bus.max_bytes
            )
            d = self.decide_with_info(req.obs)
            body, headers = decision_wire.encode_reply(
                req.fmt, d.actions, self._served_action_columns(), version=d.version, scope=d.scope,
                revision=d.revision, msg_id=msg_id,
            )  # fmt: skip
        except Exception as e:  # a bad request is answered, never raised into the bus
            self.stats.bus_errors += 1
            code, reason = _error_status(e)
            if code >= 500:
                log.warning("%s: decision request failed: %s", self.site, reason)
            body, headers = decision_wire.encode_error(code, reason, msg_id)
        if msg.reply is not None:
            await self.bus.publish_raw(msg.reply, body, headers=headers)

    def _served_action_columns(self) -> list[str]:
        a = self._active  # a swap keeps the columns (an incompatible version is refused)
        return a.action_columns if a is not None else []

    async def _on_decision(self, rcv: Received) -> Envelope:
        self.stats.bus_requests += 1
        env = rcv.envelope
        try:
            if env.kind != "decision_request":
                raise InputError(f"expected a decision_request, got {env.kind!r}", where=rcv.subject)
            if env.payload["site"] != self.site:
                raise InputError(
                    f"request for site {env.payload['site']!r} reached {self.site!r}", where=rcv.subject
                )
            if "agents" in env.payload:  # named groups: each row is served by its canary arm
                routed = self._decide_named(env)
            else:
                d = self.decide_with_info(env.tensors["obs"])
        except Exception:
            self.stats.bus_errors += 1
            raise  # the bus answers with an "error" envelope carrying the reason
        if "agents" in env.payload:
            a = self._active
            return Envelope(
                kind="decision_reply",
                sender=self.name,
                round=env.round,
                payload={"policy_version": int(a.revision if a else 0), "version": a.version if a else "",
                         "scope": a.scope if a else "", "policies": [str(v) for v in routed.policy]},
                tensors={"actions": routed.actions, "propensity": routed.propensity},
            )  # fmt: skip
        return Envelope(
            kind="decision_reply",
            sender=self.name,
            round=env.round,
            payload={"policy_version": int(d.revision), "version": d.version, "scope": d.scope},
            tensors={"actions": d.actions},
        )

    def _decide_named(self, env: Envelope) -> RoutedDecision:
        """`decide_for` on a request naming its rows' groups (checked: strings, one per row)."""
        obs = np.atleast_2d(np.asarray(env.tensors["obs"]))
        named: dict[str, Any] = {}
        for k in ("agents", "sites", "scenarios"):
            v = env.payload.get(k)
            if v is None:
                continue
            if len(v) != len(obs) or not all(isinstance(x, str) for x in v):
                raise InputError(f"{k} must be {len(obs)} strings, one per observation row", where="decision_request")
            named[k] = v
        return self.decide_for(obs, named["agents"], named.get("sites"), named.get("scenarios"))

    # ---------------------------------------------------------------- registry
    async def _call(self, coro: Awaitable[T]) -> T:
        try:
            return await asyncio.wait_for(coro, self.registry_timeout)
        except TimeoutError:
            raise RegistryError(f"registry call took longer than {self.registry_timeout}s") from None

    def _event(self, kind: str, version: str | None, scope: str | None, reason: str) -> None:
        self.events.append(RuntimeEvent(kind, version, scope, reason))

    def _registry_down(self, e: BaseException) -> None:
        self.stats.registry_errors += 1
        if self.registry_reachable is not False:
            a = self._active
            serving = f"keep serving {a.version} (fail-static)" if a else "no policy loaded yet"
            log.warning("%s: registry unreachable (%s: %s); %s", self.site, type(e).__name__, e, serving)
            self._event(
                "registry_unreachable",
                a.version if a else None,
                a.scope if a else None,
                f"{type(e).__name__}: {e}",
            )
        self.registry_reachable = False

    def _registry_up(self) -> None:
        if self.registry_reachable is False:
            log.info("%s: registry reachable again", self.site)
            self._event("registry_reachable", self.version, None, "")
        self.registry_reachable = True

    async def _resolve(self) -> tuple[str, PointerChange] | None:
        """The first scope (site, cluster, global) with a pointer, and its latest change."""
        for scope in self.scopes:
            history = await self._call(self._areg.history(scope))
            if history:
                return scope, history[-1]
        return None

    async def refresh(self) -> bool:
        """Read the registry now and swap if the current version changed; True if it swapped.

        Raises:
            RegistryError, OSError, ...: the registry could not be read (the caller logs it and
                keeps serving; `start` and the poll loop do).
        """
        assert self._refresh_lock is not None, "start() the runtime first"
        async with self._refresh_lock:
            self.stats.polls += 1
            found = await self._resolve()
            self._registry_up()
            if self._pending_rollback is not None:
                await self._complete_rollback(found)
                found = await self._resolve()
            if found is None:  # nothing promoted anywhere: keep whatever we serve
                if self._active is not None:
                    self._registry_lost(f"no pointer for scopes {', '.join(self.scopes)}")
                return False
            scope, change = found
            version, revision = change.version, change.revision
            # The registry's record of the version (its signed digest) decides what "the same
            # version" means: a name alone may have been reused by a rebuilt registry.
            try:
                record = await self._call(self._areg.manifest(version))
            except VersionNotFound:
                self._registry_lost(f"{scope} points to {version!r}, which the registry no longer holds")
                return False
            self._registry_empty = False
            sha = record.sha256
            if self._vetoed is not None and self._vetoed == (scope, version, revision, sha):
                return False  # the version we rolled back from, still current: do not serve it again
            a = self._active
            if a is not None and a.version == version and a.manifest.sha256 == sha:
                if (a.scope, a.revision) != (scope, revision):
                    a.scope, a.revision = scope, revision
                return False
            if version in self._refused and self._refused_digest.get(version) in (sha, None):
                return False
            served = self._loaded.get(_key(version, sha))
            if served is None:
                served = await self._fetch_and_load(scope, version, revision)
                if served is None:
                    return False
                if a is not None and a.version == version:
                    log.warning(
                        "%s: the registry's %s is other bytes than the %s served (sha256 %s... -> %s...); "
                        "switching to the registry's record",
                        self.site, version, version, a.manifest.sha256[:12], served.manifest.sha256[:12],
                    )  # fmt: skip
            else:
                served.scope, served.revision = scope, revision
            self._activate(served, change.kind, f"{scope} r{revision} ({change.kind})")
            return True

    def _registry_lost(self, why: str) -> None:
        """The registry answers but has no record for us: keep serving, and say so once."""
        if self._registry_empty:
            return
        self._registry_empty = True
        a = self._active
        serving = f"keep serving {a.version} (sha256 {a.manifest.sha256[:12]}..., fail-static)" if a else (
            "nothing to serve yet (fail-static)"
        )
        log.warning("%s: the registry lost its record (%s); %s", self.site, why, serving)
        self._event("registry_lost", a.version if a else None, a.scope if a else None, why)

    async def _fetch_and_load(self, scope: str, version: str, revision: int) -> ServedPolicy | None:
        try:
            packed, manifest = await self._call(self._areg._load(version))
        except VersionNotFound as e:  # gone between the record and the bytes: not "registry down"
            self._registry_lost(f"{scope} points to {version!r}, which the registry no longer holds ({e})")
            return None
        try:
            return await asyncio.to_thread(self._prepare, version, scope, revision, packed, manifest)
        except (ArtifactRejected, _Incompatible) as e:
            reason = e.reason.value if isinstance(e, ArtifactRejected) else "incompatible"
            self._refuse(version, scope, f"{reason}: {getattr(e, 'detail', e)}", manifest.sha256)
            return None

    def _refuse(self, version: str, scope: str | None, reason: str, sha256: str | None = None) -> None:
        self._refused[version] = reason
        self._refused_digest[version] = sha256
        self.stats.refused += 1
        a = self._active
        keep = f"keeping {a.version}" if a else "nothing to serve yet"
        log.warning("%s: refused policy %s from %s: %s; %s", self.site, version, scope, reason, keep)
        self._event("refused", version, scope, reason)

    def _prepare(
        self, version: str, scope: str, revision: int, packed: bytes, manifest: Manifest
    ) -> ServedPolicy:
        """Verify, unpack, load, check and warm up one version (in a worker thread)."""
        verify_artifact(packed, manifest, self.trust, expected_version=version)
        vdir = self.cache_dir / "versions" / version  # the last verified bytes of that name
        policy_dir = vdir / "policy"
        if policy_dir.exists():
            shutil.rmtree(policy_dir)
        vdir.mkdir(parents=True, exist_ok=True)
        tmp = vdir / f".policy.{uuid.uuid4().hex}.partial"
        try:
            unpack_artifact(packed, tmp)
            os.rename(tmp, policy_dir)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        try:
            policy = self.loader(policy_dir)
        except InputError as e:
            raise _Incompatible(f"the artifact is not a loadable policy: {e}") from None
        served = self._build(version, scope, revision, policy, manifest, policy_dir)
        # Keep the verified bytes: a restart with the registry down starts from them (re-verified).
        _atomic_write(vdir / "artifact.tar.gz", packed)
        _atomic_write(vdir / "manifest.json", manifest.to_json())
        return served

    def _build(
        self, version: str, scope: str, revision: int, policy: Any, manifest: Manifest, path: Path
    ) -> ServedPolicy:
        pspec: TwinSpec | None = getattr(policy, "spec", None)
        obs_cols = list(pspec.observation_columns) if pspec is not None else None
        act_cols = list(pspec.action_columns) if pspec is not None else None
        want_obs: list[str] | None
        want_act: list[str] | None
        if self.spec is not None:
            want_obs, want_act = list(self.spec.observation_columns), list(self.spec.action_columns)
        elif self._active is not None:
            want_obs, want_act = self._active.observation_columns, self._active.action_columns
        else:
            want_obs, want_act = obs_cols, act_cols
        if want_obs is None or want_act is None:
            raise _Incompatible(
                "the policy has no spec and the runtime was given none: cannot tell its columns"
            )
        if obs_cols is not None and (obs_cols != want_obs or act_cols != want_act):
            raise _Incompatible(
                f"acts on observation columns {obs_cols} -> actions {act_cols}, but this site serves "
                f"{want_obs} -> {want_act}"
            )
        shield = self.shield
        if shield is not None and not hasattr(shield, "project"):  # a ShieldConfig: build it for this spec
            from edgetwin.policies.shield import Shield

            try:
                shield = Shield(pspec or self.spec, shield)  # type: ignore[arg-type]
            except InputError as e:
                raise _Incompatible(f"the site's shield does not fit this policy's spec: {e}") from None
        served = ServedPolicy(version, scope, revision, policy, shield, manifest, want_obs, want_act, path)
        # Warm-up off the request path: first calls of torch models are slow, and a policy that
        # cannot act must not be swapped in. Mid-range observations are inside any bounds (the
        # site's spec when the policy carries none: zeros are outside e.g. a latency SLO's bounds).
        probe = _probe_obs(pspec or self.spec, len(want_obs))
        try:
            served.act(probe)
        except Exception as e:
            raise _Incompatible(f"the policy failed its warm-up call: {type(e).__name__}: {e}") from None
        if served.shield is not None and hasattr(served.shield, "reset"):
            served.shield.reset()
        if hasattr(policy, "reset"):
            policy.reset()
        return served

    def _activate(self, served: ServedPolicy, kind: str, why: str) -> None:
        """Swap the served reference (one assignment) and restart the KPI watch."""
        with self._state_lock:
            old = self._active
            if old is served:
                return
            baseline_prev = self.watch.window_means() if self.watch is not None and old is not None else {}
            if (
                self.guard is not None and self.guard.margins is None
            ):  # "auto": the first policy's reward KPIs
                self.guard = self.guard.resolve(getattr(served.policy, "spec", None) or self.spec)
                self.watch = KPIWatch(self.guard)
            self._active = served  # the swap: requests that already read `old` finish on it
            if self._canary is not None and self._canary.active and served.version != self._canary.current:
                self._end_canary("swapped", None)  # its control arm is no longer the current policy
            # The local rollback target is the version this one replaced; after a rollback it is
            # unknown here (the registry's history knows it), never the version rolled back from.
            self._previous = None if kind == "rollback" else (old or self._previous)
            self._loaded[_key(served.version, served.manifest.sha256)] = served
            if self.freeze_gc:
                gc.freeze()  # the policy just loaded, and everything before it, is long-lived
            keep = {_key(x.version, x.manifest.sha256) for x in (served, self._previous) if x is not None}
            for v in [v for v in self._loaded if v not in keep]:
                del self._loaded[v]
            self.stats.swaps += 1 if old is not None else 0
            if self.watch is not None:
                baseline, source = self._choose_baseline(served, kind, baseline_prev)
                self.watch.start(served.version, baseline, source, judge=kind != "rollback")
            _atomic_write(self.cache_dir / "last_good.json", json.dumps(
                {"format": _CACHE_FORMAT, "version": served.version, "scope": served.scope, "site": self.site,
                 "sha256": served.manifest.sha256}
            ).encode())  # fmt: skip
        log.info(
            "%s: serving %s (from %s; sha256 %s..., key %s)%s",
            self.site, served.version, why, served.manifest.sha256[:12], served.manifest.key_id,
            f", replacing {old.version}" if old is not None else "",
        )  # fmt: skip
        self._event("loaded", served.version, served.scope, why)

    def _choose_baseline(
        self, served: ServedPolicy, kind: str, prev_window: Mapping[str, float]
    ) -> tuple[dict[str, float] | None, str]:
        assert self.guard is not None and self.guard.margins is not None
        key = _key(served.version, served.manifest.sha256)
        if kind == "rollback" and key in self._baselines:
            return self._baselines[key]  # a reinstated version keeps its own baseline
        names = [m.kpi for m in self.guard.margins]
        metrics = served.manifest.metadata.get("metrics") or {}
        from_md = {k: v for k in names if (v := lookup_kpi(metrics, k)) is not None}
        choice: tuple[dict[str, float] | None, str]
        mode = self.guard.baseline
        if (
            mode in ("auto", "previous")
            and prev_window
            and len(prev_window) == len(names)
            and kind != "rollback"
        ):
            choice = (dict(prev_window), f"previous version's last window ({self._active_prev_name()})")
        elif mode in ("auto", "metadata") and from_md and (mode == "metadata" or len(from_md) == len(names)):
            choice = (from_md, "metrics at promotion")
        else:
            choice = (None, "first_window")
        self._baselines[key] = choice
        return choice

    def _active_prev_name(self) -> str:
        return self._previous.version if self._previous else "?"

    def _start_from_cache(self) -> None:
        """Fail-static start: serve the last good version from the cache, verified again."""
        marker = self.cache_dir / "last_good.json"
        if not marker.is_file():
            log.warning(
                "%s: no policy from the registry and no cached last good policy in %s",
                self.site,
                self.cache_dir,
            )
            return
        try:
            doc = json.loads(marker.read_text())
            version, scope = str(doc["version"]), str(doc["scope"])
            vdir = self.cache_dir / "versions" / version
            packed = (vdir / "artifact.tar.gz").read_bytes()
            manifest = Manifest.from_json((vdir / "manifest.json").read_bytes(), version)
            if doc.get("sha256", manifest.sha256) != manifest.sha256:  # other bytes cached under the name
                raise ValueError(f"the cached {version} is not the last good one (sha256 differs)")
        except (OSError, ValueError, KeyError, ArtifactRejected) as e:
            log.warning("%s: the cached last good policy is unreadable (%s)", self.site, e)
            return
        try:
            served = self._prepare(version, scope, 0, packed, manifest)
        except (ArtifactRejected, _Incompatible) as e:
            self._refuse(version, scope, f"cached copy: {e}")
            return
        self._activate(served, "cache", f"local cache {self.cache_dir} (registry unreachable)")
        self._event("cache_start", version, scope, str(self.cache_dir))

    async def _poll_loop(self) -> None:
        assert self._wake is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_interval)
            self._wake.clear()
            if self.bus is not None and self._spooled():
                await self._ship_spool()  # segments a failed link left behind
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # fail-static: log once, keep serving, try again next period
                self._registry_down(e)

    async def _on_policy_note(self, rcv: Received) -> None:
        # A hint only: the registry pointer decides what is served.
        if self._wake is not None:
            self._wake.set()

    # ---------------------------------------------------------------- canary
    @property
    def canary(self) -> Canary | None:
        """The last canary started here (active or ended), or None."""
        return self._canary

    async def start_canary(self, config: CanaryConfig) -> Canary:
        """Serve ``config.candidate`` to the candidate arm of ``config.slice`` (`edgetwin.edge.canary`).

        The candidate is fetched from the registry and verified, unpacked, loaded and warmed up
        like any version; the current policy keeps serving everyone else.

        Raises:
            InputError: no current policy, a canary already running, the candidate not in the
                registry, refused (its reason) or the current version itself.
        """
        a = self._active
        if a is None:
            raise InputError(f"site {self.site!r} serves no policy yet: nothing to compare a canary with", where="canary")
        if self._canary is not None and self._canary.active:
            raise InputError(f"canary {self._canary.config.canary_id} is still running", where="canary")
        if config.candidate == a.version:
            raise InputError(f"the candidate {config.candidate!r} is the version already served", where="canary")
        try:
            packed, manifest = await self._call(self._areg._load(config.candidate))
        except VersionNotFound as e:
            raise InputError(f"candidate {config.candidate!r} is not in the registry ({e})", where="canary") from None
        try:
            served = await asyncio.to_thread(self._prepare, config.candidate, "canary", 0, packed, manifest)
        except (ArtifactRejected, _Incompatible) as e:
            reason = e.reason.value if isinstance(e, ArtifactRejected) else "incompatible"
            raise InputError(
                f"candidate {config.candidate!r} refused: {reason}: {getattr(e, 'detail', e)}", where="canary"
            ) from None
        canary = Canary(config, a.version, self.cache_dir / "canary")
        with self._state_lock:
            self._canary, self._canary_policy = canary, served
        log.info(
            "%s: canary %s: %s on %s (treat share %.0f%%) for %d ticks, guarding %s; current %s elsewhere",
            self.site, config.canary_id, config.candidate, _describe_slice(config), 100 * config.slice.treat_share,
            config.ticks, ", ".join(m.describe() for m in config.margins), a.version,
        )  # fmt: skip
        self._event("canary_started", config.candidate, "canary", config.canary_id)
        return canary

    def decide_for(self, obs: np.ndarray, agents: Any, sites: Any = None, scenarios: Any = None) -> RoutedDecision:
        """Actions for N rows of named service groups, each served by its canary arm.

        Args:
            obs: (N, O) observations.
            agents: (N,) the groups' ids (the log's ``agent``); sites, scenarios: (N,) theirs, or None.

        Returns:
            `RoutedDecision`: actions (N, A), and per row the policy (registry version) that
            decided it, the probability of its action and its arm. Without an active canary every
            row is the current policy's (arm ``"fleet"``).
        """
        t0 = time.perf_counter()
        x = self._check_obs(obs)
        agent_ids = [str(v) for v in np.asarray(agents, dtype=object).ravel()]
        site_ids = None if sites is None else [str(v) for v in np.asarray(sites, dtype=object).ravel()]
        scen_ids = None if scenarios is None else [str(v) for v in np.asarray(scenarios, dtype=object).ravel()]
        if len(agent_ids) != len(x) or any(v is not None and len(v) != len(x) for v in (site_ids, scen_ids)):
            raise InputError(f"{len(x)} observations but {len(agent_ids)} agents / sites", where="agents")
        with self._state_lock:  # one consistent view of (current, canary)
            served, canary, cand = self._active, self._canary, self._canary_policy
        if served is None:
            raise NoPolicyLoaded(f"site {self.site!r} has no verified policy yet (scopes {self.scopes}); see the log")
        if canary is None or not canary.active or cand is None or canary.in_pre_period:
            arms = np.full(len(x), "fleet", dtype=object)
            actions, prop = served.act_logged(x)
            policy = np.full(len(x), served.version, dtype=object)
            assign = np.ones(len(x))
        else:
            arms = canary.router.arms(agent_ids, site_ids, scen_ids)
            on_cand = arms == "candidate"
            actions = np.empty((len(x), len(served.action_columns)))
            prop = np.empty(len(x))
            for pol, mask in ((served, ~on_cand), (cand, on_cand)):
                if mask.any():
                    actions[mask], prop[mask] = pol.act_logged(x[mask])
            policy = canary.router.policy_ids(arms)
            policy[~on_cand] = served.version
            assign = canary.router.assignment_propensity(arms)
        with self._stats_lock:
            self.stats.decisions += 1
            self.stats.rows += len(x)
            for v in set(policy.tolist()):  # decisions (calls) a version took part in
                self.stats.by_version[v] += 1
        if self.metrics is not None:
            self.metrics.observe_routed(policy, arms, time.perf_counter() - t0)
        return RoutedDecision(actions, policy, prop, arms, assign)

    def canary_report(self, rows: Any) -> GuardStop | None:
        """One tick of the canary's log: its rows (the log contract with ``policy``, ``propensity``
        and the guarded KPIs), spooled before this returns, then shipped and judged.

        Returns:
            The `GuardStop` when this tick made the guard stop the canary (the slice is already
            back on the current policy when this returns).

        Raises:
            InputError: no canary was started, or rows that cannot be its log.
        """
        canary = self._canary
        if canary is None:
            raise InputError("no canary was started on this runtime", where="canary")
        _, stop = canary.record(rows)
        if self.metrics is not None:
            self.metrics.observe_canary_rows(canary, rows)
        if not canary.active and canary.stop_reason in ("guard", "completed", "budget") and self._canary_policy is not None:
            self._end_canary(canary.stop_reason, stop)
        if self.bus is not None and self._loop is not None:
            self.call_soon(self._ship_spool())
        return stop

    def stop_canary(self, reason: str = "operator") -> CanaryResult:
        """End the canary now (the slice returns to the current policy); its result so far."""
        if self._canary is None:
            raise InputError("no canary was started on this runtime", where="canary")
        if self._canary.active:
            self._end_canary(reason, None)
        return self._canary.result()

    def canary_result(self) -> CanaryResult:
        """The last canary's result (its log: every row reported, shipped or not; also after
        `stop` removed a temporary cache directory)."""
        if self._canary is None:
            raise InputError("no canary was started on this runtime", where="canary")
        if self._canary_final is not None and not self._canary.dir.exists():
            return self._canary_final
        return self._canary.result()

    def _end_canary(self, reason: str, stop: GuardStop | None) -> None:
        canary = self._canary
        assert canary is not None
        with self._state_lock:
            canary.stop(reason)
            self._canary_policy = None  # from here on the slice is served the current policy
        if reason == "guard" and stop is not None:
            log.warning("%s: canary %s stopped by its guard; slice back on %s: %s",
                        self.site, canary.config.canary_id, canary.current, stop.reason())  # fmt: skip
        elif reason == "budget":
            log.warning("%s: canary %s stopped: one more tick would spend more than its loss budget (%s); slice back "
                        "on %s", self.site, canary.config.canary_id, canary.budget_stop, canary.current)  # fmt: skip
        elif reason in ("link", "runtime"):
            log.warning("%s: canary %s stopped (%s); slice back on %s, its log stays spooled in %s until shipped",
                        self.site, canary.config.canary_id, reason, canary.current, canary.dir)  # fmt: skip
        else:
            log.info("%s: canary %s ended (%s) after %d ticks", self.site, canary.config.canary_id, reason, canary.ticks)
        self._event("canary_stopped", canary.config.candidate, "canary", f"{reason}: {stop.reason() if stop else ''}")

    def _spooled(self) -> bool:
        root = self.cache_dir / "canary"
        return root.is_dir() and any(unshipped_segments(d) for d in root.iterdir() if d.is_dir())

    async def _ship_spool(self) -> None:
        """Ship every spooled, unacknowledged canary segment durably, in order; on a failure stop
        the running canary (``link``) and leave the rest spooled for the next attempt."""
        if self.bus is None or self._ship_lock is None:
            return
        async with self._ship_lock:
            root = self.cache_dir / "canary"
            for d in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
                for seg in unshipped_segments(d):
                    env = segment_envelope(self.site, d.name, seg, self.name)
                    try:
                        await asyncio.wait_for(
                            self.bus.publish_durable(canary_log_subject(self.site), env), self.registry_timeout
                        )
                    except Exception as e:  # the link: stop the canary, keep the rows spooled
                        c = self._canary
                        if c is not None and c.active:
                            log.warning("%s: could not ship canary log (%s: %s)", self.site, type(e).__name__, e)
                            self._end_canary("link", None)
                        return
                    _atomic_write(seg.with_suffix(".shipped"), b"")

    # ---------------------------------------------------------------- KPIs and rollback
    def report_kpis(self, kpis: Mapping[str, float], *, version: str | None = None) -> Breach | None:
        """Feed one live KPI report (name -> value, e.g. means over the last control period).

        Args:
            kpis: the KPIs; names as in the guard (others are ignored).
            version: the version whose decisions produced them; a report for another version than
                the one served is ignored (it arrived after a swap). None: the served version.

        Returns:
            The `Breach` if this report triggered a rollback (already under way: the served policy
            is switched before this returns when the previous version is in memory).
        """
        bad = {
            k: v
            for k, v in kpis.items()
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
        }
        if bad:
            raise InputError(f"KPI values must be finite numbers, got {bad}", where="kpis")
        with self._state_lock:
            a = self._active
            if self.watch is None or a is None:
                return None
            if version is not None and version != a.version:
                self.stats.kpi_stale += 1
                return None
            self.stats.kpi_reports += 1
            if self.metrics is not None:
                self.metrics.observe_kpis(kpis, a.version, arm="fleet")
            was_accepted = self.watch.accepted
            breach = self.watch.observe(kpis)
            if breach is None:
                if self.watch.accepted and not was_accepted and self.watch.judging:
                    log.info("%s: %s passed its probation (%d KPI reports); accepted", self.site, a.version, self.watch.reports)
                    self._event("accepted", a.version, a.scope, f"{self.watch.reports} reports within margins")
                return None
            self._rollback_locally(a, breach)
        if self._loop is not None:
            self.call_soon(self._rollback_in_registry(a, breach))
        return breach

    async def _on_kpi_report(self, rcv: Received) -> None:
        env = rcv.envelope
        if env.kind != "kpi_report" or env.payload.get("site") != self.site:
            return
        self.report_kpis(env.payload["kpis"], version=env.payload.get("version"))

    def _rollback_locally(self, bad: ServedPolicy, breach: Breach) -> None:
        """Stop serving ``bad`` now: switch to the version it replaced when we still hold it."""
        self.stats.rollbacks += 1
        prev = self._previous
        self._vetoed = (bad.scope, bad.version, bad.revision, bad.manifest.sha256)
        self._pending_rollback = (bad.scope, bad.version, breach.reason())
        if prev is not None and prev is not bad and prev.version != bad.version:
            self._activate(prev, "rollback", f"local rollback from {bad.version}")
        else:
            log.error(
                "%s: %s regressed but no earlier version is in memory; still serving it until the registry rolls back",
                self.site,
                bad.version,
            )
        log.warning("%s: KPI regression, rolling back %s: %s", self.site, bad.version, breach.reason())
        self._event("rollback", bad.version, bad.scope, breach.reason())

    async def _rollback_in_registry(self, bad: ServedPolicy, breach: Breach) -> None:
        outcome, target = "pending", self._previous.version if self._previous else bad.version
        try:
            async with self._refresh_lock:  # type: ignore[union-attr]
                pending = self._pending_rollback
                if pending is not None and pending[1] == bad.version:
                    outcome, target = await self._registry_rollback(bad.scope, bad.version, breach.reason())
                elif self._rollback_outcomes.get(bad.version) is not None:
                    outcome, target = self._rollback_outcomes[bad.version]  # a poll already did it
            if outcome != "pending":
                await self.refresh()  # load the registry's target if it differs from our local one
        except Exception as e:
            self._registry_down(e)
        await self._publish_rollback(bad, target, breach, outcome)

    async def _registry_rollback(self, scope: str, bad: str, reason: str) -> tuple[str, str]:
        """``registry.rollback(scope, expected=bad)``; returns (outcome, target)."""
        try:
            target = await self._call(
                self._areg.rollback(scope, expected=bad, reason=f"edge runtime {self.site}: {reason}")
            )
        except CASConflict as e:
            log.warning("%s: %s was already moved (%s); following the registry", self.site, scope, e)
            outcome, target = "conflict", str(e.actual)
        except NoRollbackTarget as e:
            log.error("%s: cannot roll back %s in the registry: %s", self.site, scope, e)
            outcome, target = "no_target", bad
        except Exception as e:
            self._registry_down(e)
            return "pending", self._previous.version if self._previous else bad
        else:
            outcome = "rolled_back"
            log.warning("%s: registry %s rolled back from %s to %s", self.site, scope, bad, target)
        self._pending_rollback = None
        self._rollback_outcomes[bad] = (outcome, target)
        return outcome, target

    async def _complete_rollback(self, found: tuple[str, PointerChange] | None) -> None:
        """A rollback the registry missed while unreachable: do it now if the pointer is still the bad one."""
        assert self._pending_rollback is not None
        scope, bad, reason = self._pending_rollback
        if found is None or found[0] != scope or found[1].version != bad:
            self._pending_rollback = None  # someone else moved the pointer meanwhile
            return
        await self._registry_rollback(scope, bad, reason)

    async def _publish_rollback(self, bad: ServedPolicy, target: str, breach: Breach, outcome: str) -> None:
        if self.bus is None:
            return
        env = Envelope(
            kind="policy_rollback",
            sender=self.name,
            payload={
                "site": self.site,
                "scope": bad.scope,
                "from_version": bad.version,
                "to_version": target,
                "reason": breach.reason(),
                "kpis": breach.kpis,
                "registry": outcome,
            },
        )
        try:
            await self.bus.publish_durable(rollback_subject(self.site), env)
        except Exception as e:  # the bus may be down too: the log line above already says why
            log.warning("%s: could not publish the rollback notice: %r", self.site, e)


def _error_status(e: Exception) -> tuple[int, str]:
    """(code, reason) of a failed JSON / Arrow decision request."""
    if isinstance(e, decision_wire.BadDecisionRequest):
        return e.code, e.reason
    if isinstance(e, InputError):
        return 400, str(e)
    if isinstance(e, NoPolicyLoaded):
        return 503, str(e)
    return 500, f"the policy failed: {type(e).__name__}: {e}"


class _Incompatible(RuntimeError):
    """A verified artifact that this site cannot serve (other columns, not loadable, fails to act)."""


def _probe_obs(spec: TwinSpec | None, width: int) -> np.ndarray:
    """One (1, O) observation inside the spec's bounds (allowed value, mid-range or a bound + 1)."""
    if spec is None:
        return np.zeros((1, width))
    row = np.zeros(len(spec.observation_columns))
    for j, c in enumerate(spec.observation_columns):
        f = spec.feature(c)
        lo = f.low if f.low is not None and math.isfinite(f.low) else None
        hi = f.high if f.high is not None and math.isfinite(f.high) else None
        vals = f.allowed_values()
        if vals:
            row[j] = float(vals[0])
        elif lo is not None and hi is not None:
            row[j] = 0.5 * (lo + hi)
        elif lo is not None:
            row[j] = lo + 1.0
        elif hi is not None:
            row[j] = hi - 1.0
    return row[None, :]


def _describe_slice(config: CanaryConfig) -> str:
    sl = config.slice
    parts = ([f"{len(sl.agents)} groups"] if sl.agents else []) + ([f"sites {', '.join(sl.sites)}"] if sl.sites else [])
    return " + ".join(parts)


def _key(version: str, sha256: str) -> str:
    """What identifies a loaded version: its name *and* the signed digest of its bytes."""
    return f"{version}@{sha256}"


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
