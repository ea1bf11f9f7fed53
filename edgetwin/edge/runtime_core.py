"""The edge runtime's shared parts: the served policy, its decisions, events, counters and state.

`ServedPolicy` (one verified, loaded version), `Decision`, `RuntimeEvent`, `RuntimeStats`, and
`RuntimeCore`: the state `EdgeRuntime` is built on (one class per concern extends it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from edgetwin.contract.policy import LoggingPolicy
from edgetwin.contract.spec import TwinSpec
from edgetwin.edge.bus import Bus, Received
from edgetwin.edge.kpi_watch import KPIGuard, KPIWatch
from edgetwin.edge.message_auth import Keyring
from edgetwin.edge.registry import (
    AsyncPolicyRegistry,
    PolicyRegistry,
    RegistryError,
)
from edgetwin.edge.signing import Manifest, TrustStore

log = logging.getLogger("edgetwin.runtime")

T = TypeVar("T")

_CACHE_FORMAT = "edgetwin-runtime-cache/1"

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
    arms: tuple[str, ...] | None = None


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
    #: canary commands accepted, and refused per `edgetwin.edge.canary_command.REFUSALS` reason
    canary_accepted: int = 0
    canary_refused: Counter[str] = dataclasses.field(default_factory=Counter)
    #: decision calls during a canary that named no service groups (served by the current policy)
    unrouted: int = 0
    #: ``kpi_report`` / ``canary_outcome`` messages not used, per ``<kind>:<reason>``
    #: (``unauthenticated``, ``other_site``, ``no_run``, ``invalid``, ``duplicate``)
    reports_rejected: Counter[str] = dataclasses.field(default_factory=Counter)
    #: KPI names reported that no spec or guard declares (dropped: never a new /metrics series)
    kpis_undeclared: int = 0
    #: decisions with no outcome row, and outcome rows with no decision (a canary's join)
    decisions_unjoined: int = 0
    outcomes_unjoined: int = 0

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("by_version", "canary_refused", "reports_rejected"):
            d[k] = dict(getattr(self, k))
        return d


def _default_loader(path: Path) -> Any:
    from edgetwin.policies.export import load_policy

    return load_policy(path)



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


def _key(version: str, sha256: str) -> str:
    """What identifies a loaded version: its name *and* the signed digest of its bytes."""
    return f"{version}@{sha256}"


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class RuntimeCore:
    """The state every part of `EdgeRuntime` shares (set in `EdgeRuntime.__init__`), and the small
    helpers they all use. The runtime is assembled from one class per concern, each extending the
    previous: `RuntimeCore` -> registry following (`edgetwin.edge.runtime_registry`) -> KPI watch and
    rollback (`edgetwin.edge.runtime_rollback`) -> serving (`edgetwin.edge.runtime_serving`) -> the
    canary (`edgetwin.edge.runtime_canary`) -> the decision wire (`edgetwin.edge.runtime_wire`) ->
    `EdgeRuntime` (construction and lifecycle)."""

    scopes: list[str]
    site: str
    cluster: str | None
    registry: PolicyRegistry | AsyncPolicyRegistry
    _areg: AsyncPolicyRegistry
    trust: TrustStore
    _bus_spec: str | None
    bus: Bus | None
    shield: Any
    guard: KPIGuard | None
    watch: KPIWatch | None
    poll_interval: float
    registry_timeout: float
    _own_cache: bool
    cache_dir: Path
    spec: TwinSpec | None
    loader: Callable[[Path], Any]
    freeze_gc: bool
    name: str
    stats: RuntimeStats
    metrics: Any
    events: deque[RuntimeEvent]
    registry_reachable: bool | None
    _active: ServedPolicy | None
    _previous: ServedPolicy | None
    _loaded: dict[str, ServedPolicy]
    _refused: dict[str, str]
    _refused_digest: dict[str, str | None]
    _baselines: dict[str, tuple[dict[str, float] | None, str]]
    _vetoed: tuple[str, str, int, str] | None
    _registry_empty: bool
    _pending_rollback: tuple[str, str, str] | None
    _rollback_outcomes: dict[str, tuple[str, str]]
    _state_lock: threading.RLock
    _stats_lock: threading.Lock
    _refresh_lock: asyncio.Lock | None
    _wake: asyncio.Event | None
    _loop: asyncio.AbstractEventLoop | None
    _tasks: set[asyncio.Future[Any]]
    _poll_task: asyncio.Task[None] | None
    _subs: list[Any]
    _answer_frame: Callable[[Received], Awaitable[None]] | None
    _started: bool
    #: identities whose signed ``kpi_report`` / ``canary_outcome`` messages are used (None: see
    #: `edgetwin.edge.runtime_rollback.KPIRollback._authentic_report`)
    reporters: Keyring | None

    @property
    def active(self) -> ServedPolicy | None:
        """The version being served now (None before the first successful load)."""
        return self._active

    @property
    def version(self) -> str | None:
        return self._active.version if self._active else None

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


    async def _call(self, coro: Awaitable[T]) -> T:
        try:
            return await asyncio.wait_for(coro, self.registry_timeout)
        except TimeoutError:
            raise RegistryError(f"registry call took longer than {self.registry_timeout}s") from None

    def _event(self, kind: str, version: str | None, scope: str | None, reason: str) -> None:
        self.events.append(RuntimeEvent(kind, version, scope, reason))

    def _current_changed(self, version: str) -> None:
        """Called (under ``_state_lock``) when the served version becomes ``version``; the canary
        ends a run whose control arm it no longer is (`edgetwin.edge.runtime_canary`)."""
