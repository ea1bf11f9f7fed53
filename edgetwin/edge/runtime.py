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

The runtime is one class per concern, each extending the previous (none imports a later one):
`edgetwin.edge.runtime_core` (shared state, `ServedPolicy`, `Decision`), `runtime_registry`
(following the registry), `runtime_rollback` (KPI watch and rollback), `runtime_serving` (the
Python API's decisions), `runtime_canary` (a canary's arms, commands, outcomes and log),
`runtime_wire` (the decision subject's wire formats); this module builds and runs it, and the
message helpers live in `runtime_messages` (re-exported here).

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
import logging
import shutil
import tempfile
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import TwinSpec
from edgetwin.edge.bus import Bus, Received, Subjects, make_bus
from edgetwin.edge.canary import (
    Canary,
    CanaryResult,
)
from edgetwin.edge.kpi_watch import KPIGuard, KPIWatch
from edgetwin.edge.message_auth import Keyring
from edgetwin.edge.registry import (
    AsyncPolicyRegistry,
    PolicyRegistry,
    ThreadedRegistry,
    check_scope,
)
from edgetwin.edge.runtime_core import (
    Decision,
    NoPolicyLoaded,
    RuntimeEvent,
    RuntimeStats,
    ServedPolicy,
    _default_loader,
)
from edgetwin.edge.runtime_messages import (
    announce_policy,
    kpi_report,
    kpi_subject,
    policy_version_notice,
    request_decision,
    rollback_subject,
    signed_frame,
)
from edgetwin.edge.runtime_wire import BusDecisions
from edgetwin.edge.signing import TrustStore

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
    "signed_frame",
]

log = logging.getLogger("edgetwin.runtime")

class EdgeRuntime(BusDecisions):
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
        reporters: the identities (public keys by name, `edgetwin.edge.message_auth.Keyring`)
            whose signed ``kpi_report`` and ``canary_outcome`` messages the runtime uses; None:
            only an authenticated bus's (``bus.auth``) or the in-process bus's are used, and on
            NATS every unsigned report is refused and counted.
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
        reporters: Keyring | None = None,
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
        self.reporters = reporters

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
        self._book = None

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
            if self._active is not None:
                await self._resume_runs()  # a command-started run a runtime died in the middle of
            try:  # canary commands, outcome reports and status (edgetwin.edge.runtime_commands)
                await self._subscribe_canary()
            except Exception as e:  # fail-static: decisions are served without them
                log.warning("%s: canary subjects not subscribed (%r): no canary can be started over the bus",
                            self.site, e)  # fmt: skip
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
