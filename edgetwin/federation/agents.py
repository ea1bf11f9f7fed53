"""MA-FL agents (seed 003 §3.3, §4.2-4.4; seed 000 Algorithm 1): ESA, COA and GCA over a `Bus`.

Three roles, each an asyncio agent that only talks over the bus (in-process or NATS):

- `EdgeServiceAgent` (ESA, one per site): trains its `Learner` locally (dual-critic PPO on the
  site's twin or emulated-cluster VecEnv, or a tiny forecaster at scale), publishes *intents*
  (predicted backlog, tentative migrations) and its *model update* (the change of the federated
  parameters, compressed with `UpdateCodec`, durable over JetStream).
- `ClusterOrchestratorAgent` (COA, one per aggregation group below the root): aggregates its
  members' updates with the group's strategy (`HierarchyNode`: FedAvg, FedAvgM, attention, robust
  rules, ...), resolves conflicting intents with congestion prices (`resolve_intents`), publishes a
  summary and sends its group's model change upward.
- `GlobalCoordinationAgent` (GCA, the root): drives the rounds, aggregates globally, publishes
  policy versions.

One round ``r`` (every wait bounded)::

    GCA ── global_model v=r (durable) ──▶ COA ── global_model v=r (durable, personalised) ──▶ ESA
    GCA ── round_control open r ───────▶ COA ── round_control open r (participants) ────────▶ ESA
                                                                     ESA trains from model v=r
    GCA ◀── model_update (durable) ──── COA ◀── intent + model_update (durable, compressed) ── ESA
          (RoundCollector: k-of-n + grace, hard timeout)   (resolve intents, summary upward)

A round closes on its quorum plus a grace period or at its timeout (`RoundCollector`). An update
that arrives after its round closed (a straggler, or an ESA that restarted and finished the round
it was killed in) is kept and mixed into the next aggregation, discounted by its staleness
(`StalenessAware`). Messages are checked on receipt by the bus; updates from another run, of the
wrong size or of unknown senders are refused and counted here. Bytes on the wire are counted per
round and per level.

Nothing here imports torch or stable-baselines3 at module level: a subprocess agent with the tiny
forecaster starts quickly.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.edge.bus import Bus, Received, Subjects
from edgetwin.edge.messages import Envelope
from edgetwin.federation.aggregation import (
    AggregateResult,
    ClientUpdate,
    QuorumNotMet,
    RoundCollector,
)
from edgetwin.federation.attacks import Attack
from edgetwin.federation.compression import DampedErrorFeedbackCodec, UpdateCodec, decode_update, model_update
from edgetwin.federation.hierarchy import HierarchyNode
from edgetwin.federation.intents import intent_payload, resolve_intents
from edgetwin.federation.learners import Learner
from edgetwin.federation.sites import SiteSpec

__all__ = [
    "AggregatorAgent",
    "ClusterOrchestratorAgent",
    "EdgeServiceAgent",
    "GlobalCoordinationAgent",
    "RoundRecord",
    "params_sha256",
]

log = logging.getLogger("edgetwin.agents")


_DENSE = UpdateCodec(topk=None, quantize_bits=None, error_feedback=False)


def _model_envelope(
    sender: str,
    run: str,
    level: str,
    group: str,
    version: int,
    params: np.ndarray,
    for_client: str | None = None,
    metrics: Mapping[str, float] | None = None,
) -> Envelope:
    """A ``global_model`` envelope carrying full parameters, dense float32 (models are not deltas)."""
    enc = _DENSE.encode("model", params)
    payload: dict[str, Any] = {
        "level": level,
        "group": group,
        "version": int(version),
        "codec": enc.meta,
        "run": run,
    }
    if for_client is not None:
        payload["for_client"] = for_client
    if metrics:
        payload["metrics"] = {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}
    return Envelope(
        kind="global_model", sender=sender, round=int(version), payload=payload, tensors=dict(enc.tensors)
    )


def _control(
    sender: str,
    run: str,
    level: str,
    group: str,
    r: int,
    action: str,
    deadline_s: float | None = None,
    participants: Sequence[str] | None = None,
) -> Envelope:
    payload: dict[str, Any] = {"level": level, "group": group, "action": action, "run": run}
    if deadline_s is not None:
        payload["deadline_s"] = float(deadline_s)
    if participants is not None:
        payload["participants"] = list(participants)
    return Envelope(kind="round_control", sender=sender, round=int(r), payload=payload)


def params_sha256(params: np.ndarray) -> str:
    """The hash a policy version carries: sha256 of the float32 little-endian parameter bytes."""
    return hashlib.sha256(np.ascontiguousarray(params, dtype="<f4").tobytes()).hexdigest()


async def _wait_for(pred: Callable[[], bool], event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``pred()`` holds (re-checked whenever ``event`` fires), at most ``timeout`` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        left = deadline - loop.time()
        if left <= 0:
            return False
        event.clear()
        if pred():
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), left)
    return True


class _AgentBase:
    """Task bookkeeping shared by the agents: spawned tasks are tracked and their errors logged."""

    def __init__(self, bus: Bus, name: str, run: str) -> None:
        self.bus, self.name, self.run_id = bus, name, run
        self.refused: Counter[str] = Counter()
        self.done = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._subs: list[Any] = []

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=f"{self.name}:{name}")
        self._tasks.add(task)

        def _done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("%s: task %s failed: %r", self.name, name, t.exception(), exc_info=t.exception())

        task.add_done_callback(_done)
        return task

    def _foreign(self, env: Envelope) -> bool:
        # Several runs may share a server (and JetStream keeps old messages): ignore other runs'.
        if env.payload.get("run") != self.run_id:
            self.refused["other_run"] += 1
            return True
        return False

    def _from_parent(self, env: Envelope) -> bool:
        """Whether ``env`` was sent by this agent's parent group (its models and round controls
        come from nobody else; on an authenticated bus the sender is who signed it)."""
        parent = getattr(self, "parent", None)
        if parent is None or env.sender == f"agg/{parent[1]}":
            return True
        self.refused["not_parent"] += 1
        log.warning("%s: %s from %s, not from its parent agg/%s", self.name, env.kind, env.sender, parent[1])
        return False

    async def stop(self) -> None:
        """Cancel this agent's tasks and subscriptions (the bus stays open)."""
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for s in self._subs:
            with contextlib.suppress(Exception):
                await s.unsubscribe()
        self._subs.clear()


class EdgeServiceAgent(_AgentBase):
    """An Edge Service Agent: local training, intents and compressed, durable model updates.

    Args:
        bus: its bus client (may be shared with other agents of the process).
        site: the site it runs.
        learner: the local learner.
        parent: ``(level, name)`` of the aggregation group it reports to.
        run: the federation run id (messages of other runs are ignored).
        peers: the other sites of its cluster (migration destinations).
        codec: compression of its uplink (top-k + int8 with error feedback by default).
        attack: make this a Byzantine client (tests, benchmarks).
        state_dir: where it checkpoints its model and the round it is training, so that a restarted
            ESA finishes that round and sends the (then stale) update.
        model_wait_s: how long a round waits for the round's model before training from the
            model it has (its update is then stale).
        seed: randomness of the attack.
    """

    role = "esa"

    def __init__(
        self,
        bus: Bus,
        site: SiteSpec,
        learner: Learner,
        parent: tuple[str, str],
        run: str,
        peers: Sequence[str] = (),
        codec: UpdateCodec | None = None,
        attack: Attack | None = None,
        state_dir: str | Path | None = None,
        model_wait_s: float = 2.0,
        seed: int = 0,
    ) -> None:
        super().__init__(bus, f"esa/{site.name}", run)
        self.site, self.learner, self.parent = site, learner, parent
        self.peers = list(peers)
        self.codec = codec if codec is not None else DampedErrorFeedbackCodec()
        self.attack = attack
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.model_wait_s = float(model_wait_s)
        self.rng = np.random.default_rng(seed)
        self.version = -1  # version of the federated model installed
        self.prices: dict[str, float] = {}
        self.records: list[dict[str, Any]] = []
        self.published_ids: list[str] = []
        self.skipped: list[int] = []  # rounds opened while it was still busy with an earlier one
        self._model_event = asyncio.Event()
        self._busy = asyncio.Lock()
        self._deferred: tuple[int, np.ndarray] | None = None
        self._training = False
        self._started_rounds: set[int] = set()
        self._final_version: int | None = None
        self._size = int(np.asarray(learner.get_params()).size)  # the model's size: what a global model must have

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Subscribe and, if a checkpoint says a round was under way, finish it."""
        level, group = self.parent
        self._subs += [
            await self.bus.subscribe(Subjects.model(level, group), self._on_model),
            await self.bus.subscribe(Subjects.round(level, group), self._on_round),
            await self.bus.subscribe(Subjects.summary(self.site.cluster), self._on_summary),
        ]
        pending = self._load_checkpoint()
        if pending is not None:
            r, base = pending
            log.info("%s: resuming round %d (model v%d) after a restart", self.name, r, base)
            self._started_rounds.add(r)
            self._spawn(self._train_round(r, base=base), f"resume-{r}")

    # --- handlers -------------------------------------------------------------------------------
    async def _on_model(self, rcv: Received) -> None:
        env = rcv.envelope
        if env.kind != "global_model" or self._foreign(env) or not self._from_parent(env):
            return
        fc = env.payload.get("for_client")
        if fc is not None and fc != self.site.name:
            return
        v = int(env.payload["version"])
        if v <= self.version:
            return
        try:  # the size is checked against this site's model before anything is allocated
            params = decode_update(env, self._size)
        except InputError as e:
            self.refused["model_shape"] += 1
            log.warning("%s: refused model v%d: %s", self.name, v, e)
            return
        if self._training:
            # Mid-training: install after this round's update is out (it was computed from the old one).
            if self._deferred is None or v > self._deferred[0]:
                self._deferred = (v, params)
            return
        self._install(v, params)

    def _install(self, v: int, params: np.ndarray) -> None:
        try:
            self.learner.set_params(params)
        except InputError as e:
            self.refused["model_shape"] += 1
            log.warning("%s: refused model v%d: %s", self.name, v, e)
            return
        self.version = v
        self._save_checkpoint(None)
        self._model_event.set()

    async def _on_round(self, rcv: Received) -> None:
        env = rcv.envelope
        if env.kind != "round_control" or self._foreign(env) or not self._from_parent(env):
            return
        if env.payload["action"] == "close":
            self._final_version = env.round
            self._spawn(self._finish(env.round), "finish")
            return
        parts = env.payload.get("participants")
        if parts is not None and self.site.name not in parts:
            return
        if env.round in self._started_rounds:
            return
        if self._busy.locked():
            # Still on an earlier round (a straggler, or finishing the round it was restarted in):
            # skip this one rather than queue up rounds it can no longer make in time.
            self.skipped.append(env.round)
            return
        self._started_rounds.add(env.round)
        self._spawn(self._train_round(env.round), f"round-{env.round}")

    async def _on_summary(self, rcv: Received) -> None:
        env = rcv.envelope
        if env.kind == "summary" and not self._foreign(env) and env.sender == f"agg/{env.payload['cluster']}":
            prices = env.payload["stats"].get("prices", {})
            if isinstance(prices, dict):
                self.prices = {str(k): float(v) for k, v in prices.items() if isinstance(v, int | float)}

    async def _finish(self, final_version: int, finish_timeout_s: float = 60.0) -> None:
        # Let a round in progress send its update (bounded: a stuck learner must not keep the agent).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._busy.acquire(), finish_timeout_s)
            self._busy.release()
        if self._deferred is not None:
            self._install(*self._deferred)
            self._deferred = None
        await _wait_for(lambda: self.version >= final_version, self._model_event, self.model_wait_s)
        self.done.set()

    # --- one round ----------------------------------------------------------------------------------
    async def _train_round(self, r: int, base: int | None = None) -> None:
        async with self._busy:
            if base is None:
                # The round's model normally arrives just before the open; never wait forever for it.
                await _wait_for(lambda: self.version >= r, self._model_event, self.model_wait_s)
                base = self.version
            self._training = True
            try:
                await self._train_and_send(r, base)
            finally:
                self._training = False
                if self._deferred is not None:
                    v, params = self._deferred
                    self._deferred = None
                    if v > self.version:
                        self._install(v, params)

    async def _train_and_send(self, r: int, base: int) -> None:
        self._save_checkpoint((r, base))
        start = self.learner.get_params()
        metrics = await asyncio.to_thread(self.learner.train)
        delta = self.learner.get_params() - start
        if self.attack is not None:
            delta = self.attack.apply(delta, self.rng)
        tel = self.learner.telemetry()
        group = self.parent[1]
        intent = intent_payload(self.site.name, self.site.cluster, tel, self.peers, self.prices)
        intent["run"] = self.run_id
        await self.bus.publish(
            Subjects.intent(self.site.cluster, self.site.name),
            Envelope(kind="intent", sender=self.name, round=r, payload=intent),
        )
        enc = self.codec.encode(self.site.name, delta)
        clean = {k: float(v) for k, v in metrics.items() if math.isfinite(v)}
        env = model_update(
            self.name,
            r,
            enc,
            num_samples=max(1, int(self.learner.num_samples)),
            level="site",
            group=group,
            base_round=max(base, 0),
            metrics=clean,
        )
        env.payload["run"] = self.run_id
        await self.bus.publish_durable(Subjects.update("site", group), env)
        self.published_ids.append(env.msg_id)
        self.records.append({"round": r, "base": base, "msg_id": env.msg_id, **metrics})
        self._save_checkpoint(None)

    # --- checkpoint ---------------------------------------------------------------------------------
    def _save_checkpoint(self, pending: tuple[int, int] | None) -> None:
        if self.state_dir is None:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.learner.save(self.state_dir / "learner")
        doc = {"version": self.version, "pending": list(pending) if pending else None, "run": self.run_id}
        tmp = self.state_dir / "esa.json.tmp"
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.state_dir / "esa.json")

    def _load_checkpoint(self) -> tuple[int, int] | None:
        if self.state_dir is None or not (self.state_dir / "esa.json").is_file():
            return None
        doc = json.loads((self.state_dir / "esa.json").read_text())
        if doc.get("run") != self.run_id:
            return None
        self.learner.load(self.state_dir / "learner")
        self.version = int(doc["version"])
        p = doc.get("pending")
        return (int(p[0]), int(p[1])) if p else None


@dataclass
class RoundRecord:
    """What one aggregation group did in one round.

    Attributes:
        node, level: the group.
        round: the round number.
        reason: how its collection closed (``complete``, ``quorum+grace``, ``timeout``).
        aggregated: whether a new model was made (False: too few updates; the model is kept).
        participants: inputs asked to report; on_time: those that did in time; missing: the rest.
        late: input -> staleness (rounds) of late updates mixed into this aggregation.
        weights: the strategy's weight per input (FedAvg-like strategies), in update order.
        reward: sample-weighted mean of the inputs' reported reward.
        input_rewards: input -> its reported reward.
        bytes_up: bytes of the updates received from the inputs during the round.
        bytes_down: bytes of the models this group published for the round.
        elapsed_s: open to close.
        info: the strategy's diagnostics (trimmed to JSON-able scalars and lists).
    """

    node: str
    level: str
    round: int
    reason: str
    aggregated: bool
    participants: list[str]
    on_time: list[str]
    missing: list[str]
    late: dict[str, int]
    weights: dict[str, float]
    reward: float
    input_rewards: dict[str, float]
    bytes_up: int
    bytes_down: int
    elapsed_s: float
    info: dict[str, Any] = field(default_factory=dict)
    intents: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not math.isfinite(d["reward"]):
            d["reward"] = None
        return d


def _jsonable_info(info: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in info.items():
        if k in ("attention", "scores"):
            continue  # (K, K) matrices: large and not needed in round records
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            continue
        out[k] = v
    return out


class AggregatorAgent(_AgentBase):
    """An aggregation group on the bus (the shared machinery of COA and GCA).

    Args:
        bus: its bus client.
        node: its `HierarchyNode` (strategy, members or children, sampler, quorum, grace, timeout).
        run: the federation run id.
        parent: the parent group ``(level, name)``, None at the root.
        codec: compression of its uplink to the parent.
        model_wait_s: how long a round waits for the parent's model of that round.
    """

    role = "coa"

    def __init__(
        self,
        bus: Bus,
        node: HierarchyNode,
        run: str,
        parent: tuple[str, str] | None = None,
        codec: UpdateCodec | None = None,
        model_wait_s: float = 2.0,
    ) -> None:
        super().__init__(bus, f"agg/{node.name}", run)
        self.node, self.parent = node, parent
        self.codec = codec if codec is not None else DampedErrorFeedbackCodec()
        self.model_wait_s = float(model_wait_s)
        self.inputs = node.inputs
        self.input_level = "site" if node.members else node.children[0].level
        self.records: list[RoundRecord] = []
        self.received_ids: set[str] = set()
        self.params: np.ndarray | None = None  # this group's model after its last round
        self._collector: RoundCollector | None = None
        self._metrics: dict[str, dict[str, float]] = {}
        self._late: dict[str, tuple[ClientUpdate, dict[str, float]]] = {}
        self._early: dict[int, list[tuple[ClientUpdate, dict[str, float]]]] = defaultdict(list)
        self._last_base: dict[str, int] = {}
        self._bytes_up = 0
        self._intents: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
        self._parent_model: tuple[int, np.ndarray] | None = None
        self._parent_event = asyncio.Event()
        self._round_lock = asyncio.Lock()
        self._current_round = -1
        self._used_samples: dict[str, float] = {}

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Subscribe to its inputs' updates (durable), intents, and the parent's rounds and models."""
        durable = f"{self.run_id}-agg-{self.node.name}"
        self._subs.append(
            await self.bus.subscribe_durable(
                f"{Subjects.PREFIX}.update.{self.input_level}.{self.node.name}", durable, self._on_update
            )
        )
        if self.node.members:
            self._subs.append(
                await self.bus.subscribe(f"{Subjects.PREFIX}.intent.{self.node.name}.*", self._on_intent)
            )
        if self.parent is not None:
            self._subs += [
                await self.bus.subscribe(Subjects.model(*self.parent), self._on_parent_model),
                await self.bus.subscribe(Subjects.round(*self.parent), self._on_parent_round),
            ]

    # --- receiving ----------------------------------------------------------------------------------
    async def _on_update(self, rcv: Received) -> None:
        env = rcv.envelope
        if env.kind != "model_update" or self._foreign(env):
            return
        if env.msg_id in self.received_ids:
            self.refused["duplicate"] += 1  # at-least-once delivery: the same update again
            return
        self.received_ids.add(env.msg_id)
        self._bytes_up += rcv.nbytes
        kind, _, client = env.sender.partition("/")
        if (client not in self.inputs or kind != ("esa" if self.node.members else "agg")
                or env.payload["group"] != self.node.name):
            self.refused["unknown_sender"] += 1
            log.warning("%s: update from %s, not an input of %s", self.name, env.sender, self.node.name)
            return
        try:  # against the model's size before anything is allocated
            delta = decode_update(env, None if self.params is None else int(self.params.size))
        except InputError as e:
            self.refused["wrong_size"] += 1
            log.warning("%s: update from %s refused: %s", self.name, client, e)
            return
        if self.params is not None and delta.shape != self.params.shape:
            self.refused["wrong_size"] += 1
            log.warning(
                "%s: update from %s has %d values, the model %d",
                self.name,
                client,
                delta.size,
                self.params.size,
            )
            return
        base = int(env.payload["base_round"])
        if base > max(env.round, self._current_round):
            self.refused["future_base"] += 1
            return
        u = ClientUpdate(client, delta, float(env.payload["num_samples"]), base)
        metrics = {
            k: float(v) for k, v in env.payload.get("metrics", {}).items() if isinstance(v, int | float)
        }
        col = self._collector
        if col is not None and not col.closed and env.round == col.round:
            if col.submit(u):
                self._metrics[client] = metrics
                return
            if client in col.updates:
                return  # a second update for the round: the first counts
        if env.round > self._current_round:
            self._early[env.round].append((u, metrics))
            return
        # Late: keep the newest per input for the next aggregation (discounted by its staleness).
        if base > self._last_base.get(client, -1) and (
            client not in self._late or base >= self._late[client][0].base_round
        ):
            self._late[client] = (u, metrics)

    async def _on_intent(self, rcv: Received) -> None:
        env = rcv.envelope
        if (env.kind == "intent" and not self._foreign(env) and env.payload["site"] in self.inputs
                and env.sender == f"esa/{env.payload['site']}"):
            self._intents[env.round][env.payload["site"]] = env.payload

    async def _on_parent_model(self, rcv: Received) -> None:
        env = rcv.envelope
        if env.kind != "global_model" or self._foreign(env) or not self._from_parent(env):
            return
        fc = env.payload.get("for_client")
        if fc is not None and fc != self.node.name:
            return
        v = int(env.payload["version"])
        if self._parent_model is None or v > self._parent_model[0]:
            try:
                params = decode_update(env, None if self.params is None else int(self.params.size))
            except InputError as e:
                self.refused["model_shape"] += 1
                log.warning("%s: refused parent model v%d: %s", self.name, v, e)
                return
            self._parent_model = (v, params)
            self._parent_event.set()

    async def _on_parent_round(self, rcv: Received) -> None:
        env = rcv.envelope
        if env.kind != "round_control" or self._foreign(env) or not self._from_parent(env):
            return
        if env.payload["action"] == "close":
            self._spawn(self._close_down(env.round), "close")
            return
        parts = env.payload.get("participants")
        if parts is not None and self.node.name not in parts:
            return
        self._spawn(self._child_round(env.round), f"round-{env.round}")

    # --- rounds -------------------------------------------------------------------------------------
    async def _child_round(self, r: int) -> None:
        async with self._round_lock:
            ok = await _wait_for(
                lambda: self._parent_model is not None and self._parent_model[0] >= r,
                self._parent_event,
                self.model_wait_s,
            )
            if self._parent_model is None:
                log.warning("%s: no model from %s for round %d; skipping it", self.name, self.parent, r)
                return
            if not ok:
                log.warning(
                    "%s: round %d runs on model v%d (round's model late)", self.name, r, self._parent_model[0]
                )
            g = self._parent_model[1]
            rec, new = await self.run_round(r, g)
            if rec.aggregated and self.parent is not None:
                total = sum(self._used_samples.values())
                enc = self.codec.encode(self.node.name, (new - g).astype(np.float32))
                metrics = {
                    "reward": rec.reward,
                    f"bytes_up_{self.input_level}": float(rec.bytes_up),
                    "bytes_down": float(rec.bytes_down),
                }
                env = model_update(
                    self.name,
                    r,
                    enc,
                    num_samples=max(1, int(total)),
                    level=self.node.level,
                    group=self.parent[1],
                    base_round=r,
                    metrics={k: v for k, v in metrics.items() if math.isfinite(v)},
                )
                env.payload["run"] = self.run_id
                await self.bus.publish_durable(Subjects.update(self.node.level, self.parent[1]), env)

    async def _close_down(self, final_version: int) -> None:
        """The parent finished: pass the final models and the close down, then stop."""
        async with self._round_lock:
            await _wait_for(
                lambda: self._parent_model is not None and self._parent_model[0] >= final_version,
                self._parent_event,
                self.model_wait_s,
            )
            if self._parent_model is not None:
                self.params = self._parent_model[1]
                await self._publish_models(final_version, self._parent_model[1])
            await self.bus.publish(
                Subjects.round(self.node.level, self.node.name),
                _control(self.name, self.run_id, self.node.level, self.node.name, final_version, "close"),
            )
        self.done.set()

    async def _publish_models(self, version: int, g: np.ndarray) -> int:
        """Send each input the model to train from in round ``version``; returns the bytes sent."""
        agg = self.node.aggregator
        models = {i: agg.model_for(i, g) for i in self.inputs}
        shared = all(m is g or np.array_equal(m, g) for m in models.values())
        envs = (
            [_model_envelope(self.name, self.run_id, self.node.level, self.node.name, version, g)]
            if shared
            else [
                _model_envelope(
                    self.name, self.run_id, self.node.level, self.node.name, version, m, for_client=i
                )
                for i, m in models.items()
            ]
        )
        before = self.bus.stats.bytes_out_by_subject.get(Subjects.model(self.node.level, self.node.name), 0)
        for env in envs:
            await self.bus.publish_durable(Subjects.model(self.node.level, self.node.name), env)
        return int(
            self.bus.stats.bytes_out_by_subject.get(Subjects.model(self.node.level, self.node.name), 0)
            - before
        )

    async def run_round(self, r: int, g: np.ndarray) -> tuple[RoundRecord, np.ndarray]:
        """Run round ``r`` of this group from model ``g`` (D,): send models, open, collect, aggregate.

        Returns the round's record and the group's new model (``g`` itself if it did not aggregate).
        """
        node = self.node
        g = np.asarray(g, dtype=np.float32)
        self.params = g if self.params is None else self.params
        self._current_round = r
        bytes_down = await self._publish_models(r, g)
        participants = node.participants(r)
        col = RoundCollector(
            r,
            participants,
            quorum=min(node.quorum, len(participants)),
            grace_s=node.grace_s,
            timeout_s=node.timeout_s,
        )
        self._collector, self._metrics = col, {}
        self._bytes_up = 0
        for u, m in self._early.pop(r, []):
            if col.submit(u):
                self._metrics[u.client_id] = m
        await self.bus.publish(
            Subjects.round(node.level, node.name),
            _control(self.name, self.run_id, node.level, node.name, r, "open", node.timeout_s, participants),
        )
        outcome = await col.wait()
        on_time = sorted(outcome.updates, key=lambda u: u.client_id)
        late = [self._late.pop(c) for c in sorted(self._late) if c not in col.updates]
        for c in list(self._late):  # an on-time update supersedes what the same input sent late
            if c in col.updates:
                del self._late[c]
        metrics = dict(self._metrics)
        for u, m in late:
            metrics[u.client_id] = m
        updates = []
        for u in on_time + [u for u, _ in late]:
            # An input with a different model (or NaN / inf in its bytes) must not cost the others the round.
            if u.delta.shape != g.shape:
                self.refused["wrong_size"] += 1
            elif not np.all(np.isfinite(u.delta)):
                self.refused["non_finite"] += 1
            else:
                updates.append(u)
        new, res, aggregated = g, None, False
        info: dict[str, Any] = {}
        if updates and (outcome.quorum_met or late):
            try:
                res = node.aggregator.aggregate(updates, g, r)
                new, aggregated = res.params, True
            except (QuorumNotMet, InputError) as e:
                info["skipped"] = str(e)
                log.warning("%s: round %d not aggregated: %s", self.name, r, e)
        else:
            info["skipped"] = f"{len(on_time)} of {len(participants)} updates, quorum {col.quorum}"
        if aggregated:
            for u in updates:
                self._last_base[u.client_id] = max(self._last_base.get(u.client_id, -1), u.base_round)
            self.params = new
        self._used_samples = {u.client_id: u.num_samples for u in updates} if aggregated else {}
        rec = self._record(
            r, outcome, participants, on_time, late, res, metrics, bytes_down, aggregated, info
        )
        if node.members:
            rec.intents = self._settle_intents(r)
            await self._publish_summary(rec)
        self.records.append(rec)
        return rec, new

    def _record(
        self,
        r: int,
        outcome: Any,
        participants: list[str],
        on_time: list[ClientUpdate],
        late: list[tuple[ClientUpdate, dict[str, float]]],
        res: AggregateResult | None,
        metrics: Mapping[str, Mapping[str, float]],
        bytes_down: int,
        aggregated: bool,
        info: dict[str, Any],
    ) -> RoundRecord:
        shape = () if self.params is None else self.params.shape
        updates = [u for u in on_time + [u for u, _ in late] if u.delta.shape == shape]
        rewards = {
            c: float(m["reward"]) for c, m in metrics.items() if "reward" in m and math.isfinite(m["reward"])
        }
        w = np.array([u.num_samples for u in updates if u.client_id in rewards], dtype=np.float64)
        vals = np.array([rewards[u.client_id] for u in updates if u.client_id in rewards])
        reward = float(np.average(vals, weights=w)) if len(vals) else float("nan")
        weights: dict[str, float] = {}
        if res is not None:
            info.update(_jsonable_info(res.info))
            ws = res.info.get("weights")
            clients = res.info.get("clients", [u.client_id for u in updates])
            if isinstance(ws, list) and len(ws) == len(clients):
                weights = {c: float(x) for c, x in zip(clients, ws, strict=True)}
        return RoundRecord(
            node=self.node.name,
            level=self.node.level,
            round=r,
            reason=outcome.reason,
            aggregated=aggregated,
            participants=list(participants),
            on_time=[u.client_id for u in on_time],
            missing=list(outcome.missing),
            late={u.client_id: r - u.base_round for u, _ in late},
            weights=weights,
            reward=reward,
            input_rewards=rewards,
            bytes_up=int(self._bytes_up),
            bytes_down=int(bytes_down),
            elapsed_s=float(outcome.elapsed_s),
            info=info,
        )

    def _settle_intents(self, r: int) -> dict[str, Any]:
        intents = self._intents.pop(r, {})
        for old in [k for k in self._intents if k < r - 2]:
            del self._intents[old]  # intents too old to matter
        if not intents:
            return {}
        res = resolve_intents(intents)
        return {
            "n": len(intents),
            "prices": res.prices,
            "congestion": res.congestion,
            "accepted": len(res.accepted),
            "rejected": len(res.rejected),
            "predicted_backlog_s": float(np.mean([p["predicted_backlog"] for p in intents.values()])),
        }

    async def _publish_summary(self, rec: RoundRecord) -> None:
        stats = {
            "round": rec.round,
            "reason": rec.reason,
            "on_time": len(rec.on_time),
            "missing": rec.missing,
            "late": rec.late,
            "bytes_up": rec.bytes_up,
            "bytes_down": rec.bytes_down,
            "reward": rec.reward if math.isfinite(rec.reward) else None,
            "prices": rec.intents.get("prices", {}),
            "congestion": rec.intents.get("congestion", {}),
            "migrations_accepted": rec.intents.get("accepted", 0),
            "migrations_rejected": rec.intents.get("rejected", 0),
        }
        await self.bus.publish(
            Subjects.summary(self.node.name),
            Envelope(
                kind="summary",
                sender=self.name,
                round=rec.round,
                payload={"cluster": self.node.name, "stats": stats, "run": self.run_id},
            ),
        )


class ClusterOrchestratorAgent(AggregatorAgent):
    """A Cluster Orchestrator Agent: aggregates its sites (or child groups), settles intents, reports up.

    Its rounds are opened by its parent (`GlobalCoordinationAgent` or a region group); see
    `AggregatorAgent` for the arguments.
    """

    role = "coa"

    def __init__(
        self, bus: Bus, node: HierarchyNode, run: str, parent: tuple[str, str], **kwargs: Any
    ) -> None:
        if parent is None:
            raise InputError(f"the COA of {node.name!r} needs a parent group", where="parent")
        super().__init__(bus, node, run, parent=parent, **kwargs)


class GlobalCoordinationAgent(AggregatorAgent):
    """The Global Coordination Agent: drives the rounds, aggregates globally, versions the policy.

    Args:
        bus, node, run, codec, model_wait_s: see `AggregatorAgent` (``node`` is the root).
        initial_params: (D,) the federated parameters every site starts from (round 0's model).
        on_round: called with each finished `RoundRecord` (progress bars).
    """

    role = "gca"

    def __init__(
        self,
        bus: Bus,
        node: HierarchyNode,
        run: str,
        initial_params: np.ndarray,
        on_round: Callable[[RoundRecord], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(bus, node, run, parent=None, **kwargs)
        self.params = np.asarray(initial_params, dtype=np.float32)
        self.on_round = on_round
        self.versions: list[dict[str, Any]] = []
        self.summaries: dict[str, list[dict[str, Any]]] = defaultdict(list)

    async def start(self) -> None:
        await super().start()
        self._subs.append(await self.bus.subscribe(f"{Subjects.PREFIX}.summary.*", self._on_summary))

    async def _on_summary(self, rcv: Received) -> None:
        env = rcv.envelope
        if env.kind == "summary" and not self._foreign(env) and env.sender == f"agg/{env.payload['cluster']}":
            self.summaries[env.payload["cluster"]].append(env.payload["stats"])

    async def run(self, rounds: int) -> list[RoundRecord]:
        """Run ``rounds`` rounds, publish a policy version after each, then the final model and close."""
        if rounds < 1:
            raise InputError(f"rounds must be >= 1, got {rounds}", where="--rounds")
        assert self.params is not None
        g = self.params
        for r in range(rounds):
            rec, g = await self.run_round(r, g)
            self.params = g
            await self._publish_version(r + 1, g, rec)
            if self.on_round is not None:
                self.on_round(rec)
        await self._publish_models(rounds, g)
        await self.bus.publish(
            Subjects.round(self.node.level, self.node.name),
            _control(self.name, self.run_id, self.node.level, self.node.name, rounds, "close"),
        )
        self.done.set()
        return self.records

    async def _publish_version(self, version: int, params: np.ndarray, rec: RoundRecord) -> None:
        doc = {
            "version": int(version),
            "uri": f"edgetwin://federation/{self.run_id}/model/{version}",
            "sha256": params_sha256(params),
            "run": self.run_id,
        }
        if math.isfinite(rec.reward):
            doc["metrics"] = {"reward": float(rec.reward)}
        await self.bus.publish_durable(
            Subjects.policy_version(),
            Envelope(kind="policy_version", sender=self.name, round=rec.round, payload=doc),
        )
        self.versions.append(doc)
