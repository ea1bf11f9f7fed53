"""The message bus between edge agents: one async interface, in-process or NATS.

`Bus` is what agents program against::

    bus = make_bus("memory")                  # or "nats://127.0.0.1:4222", or a NatsConfig
    async with bus:
        sub = await bus.subscribe("edgetwin.intent.*.>", on_intent)          # core pub/sub, wildcards
        await bus.publish(Subjects.intent("c0", "site-1"), envelope)
        reply = await bus.request(Subjects.decision("site-1"), req, timeout=1.0)
        await bus.publish_durable(Subjects.update("site", "c0"), update_env)    # survives restarts
        await bus.subscribe_durable(Subjects.update("site", "c0"), "coa-c0", on_update)

- `InMemoryBus`: the embedded default, no server. Bus clients that share a `MemoryBroker` (all
  ``make_bus("memory://NAME")`` in one process) see each other. The broker keeps an in-process log
  of durable messages and per-durable-consumer cursors with explicit ack and redelivery, so
  durable semantics are those of JetStream (at-least-once, in order per consumer, a consumer created
  later still gets every stored message).
- `NatsBus`: nats-py. Core NATS for pub/sub and request/reply; JetStream (a file-backed stream over
  `NatsConfig.durable_subjects`, durable pull consumers, explicit ack) for `publish_durable` /
  `subscribe_durable`. Reconnects with exponential backoff and jitter; publishes that must be
  durable are retried until the server acknowledges them (de-duplicated by message id).

Every received message is decoded and validated (`edgetwin.edge.messages.decode`) before a handler
sees it; a malformed, oversized or unknown-version message is logged with its reason and counted in
``bus.stats.rejected[reason]``. A handler that raises is logged and counted
(``stats.handler_errors``), never propagated into the bus: an agent keeps running.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import random
import ssl
import tomllib
import uuid
from abc import ABC, abstractmethod
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Literal

from edgetwin.contract.errors import InputError
from edgetwin.edge.messages import Envelope, MessageRejected, decode, encode

__all__ = [
    "DEFAULT_DURABLE_SUBJECTS",
    "Bus",
    "BusStats",
    "Handler",
    "InMemoryBus",
    "MemoryBroker",
    "NatsBus",
    "NatsConfig",
    "NoResponders",
    "Received",
    "Responder",
    "Subjects",
    "Subscription",
    "make_bus",
    "subject_matches",
]

log = logging.getLogger("edgetwin.bus")

DEFAULT_MAX_BYTES = 1 << 20  # nats-server's default max_payload
DEFAULT_DURABLE_SUBJECTS = ("edgetwin.update.>", "edgetwin.model.>", "edgetwin.policy.>")
_INBOX = "_INBOX"


class NoResponders(RuntimeError):
    """A request found nobody subscribed to its subject."""


# ------------------------------------------------------------------------------ subjects
def _check_subject(subject: str, *, wildcards: bool, what: str = "subject") -> list[str]:
    if not isinstance(subject, str) or not subject:
        raise InputError("a subject is a non-empty string", where=what)
    tokens = subject.split(".")
    for i, tok in enumerate(tokens):
        if not tok or any(c.isspace() for c in tok):
            raise InputError(f"{subject!r}: empty token or whitespace", where=what)
        if tok in ("*", ">") or "*" in tok or ">" in tok:
            if not wildcards:
                raise InputError(f"{subject!r}: wildcards are only allowed when subscribing", where=what)
            if tok not in ("*", ">") or (tok == ">" and i != len(tokens) - 1):
                raise InputError(f"{subject!r}: '*' must be a whole token and '>' the last one", where=what)
    return tokens


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` matches one token, a final ``>`` one or more."""
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)


class Subjects:
    """The subjects edgetwin agents use (documented in ``docs/bus.md``).

    Names (levels, groups, sites) become subject tokens, so they may not contain ``.``, ``*``,
    ``>`` or whitespace.
    """

    PREFIX = "edgetwin"

    @staticmethod
    def _tok(name: str, what: str) -> str:
        if not isinstance(name, str) or not name or any(c in name for c in ".*> \t\r\n"):
            raise InputError(f"{name!r} cannot be a subject token (no '.', '*', '>' or spaces)", where=what)
        return name

    @classmethod
    def update(cls, level: str, group: str) -> str:
        """Model updates going up to ``group`` at ``level`` (durable)."""
        return f"{cls.PREFIX}.update.{cls._tok(level, 'level')}.{cls._tok(group, 'group')}"

    @classmethod
    def model(cls, level: str, group: str) -> str:
        """Aggregated models going down from ``group`` at ``level`` (durable)."""
        return f"{cls.PREFIX}.model.{cls._tok(level, 'level')}.{cls._tok(group, 'group')}"

    @classmethod
    def intent(cls, cluster: str, site: str) -> str:
        """ESA intents within a cluster."""
        return f"{cls.PREFIX}.intent.{cls._tok(cluster, 'cluster')}.{cls._tok(site, 'site')}"

    @classmethod
    def summary(cls, cluster: str) -> str:
        """COA summaries upward."""
        return f"{cls.PREFIX}.summary.{cls._tok(cluster, 'cluster')}"

    @classmethod
    def round(cls, level: str, group: str) -> str:
        """Round open/close control for a group."""
        return f"{cls.PREFIX}.round.{cls._tok(level, 'level')}.{cls._tok(group, 'group')}"

    @classmethod
    def decision(cls, site: str) -> str:
        """Decision requests to a site's policy server (request/reply)."""
        return f"{cls.PREFIX}.decision.{cls._tok(site, 'site')}"

    @classmethod
    def policy_version(cls) -> str:
        """Policy version announcements (durable)."""
        return f"{cls.PREFIX}.policy.version"


# ------------------------------------------------------------------------------ common types
@dataclass
class BusStats:
    """Counters of one bus client. ``rejected`` is keyed by `messages.REASONS`."""

    published: int = 0
    received: int = 0
    bytes_out: int = 0
    bytes_in: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    handler_errors: int = 0
    dropped: int = 0  # deliveries dropped because a subscriber's queue was full (slow consumer)
    durable_published: int = 0
    durable_acked: int = 0
    redelivered: int = 0
    dead_letters: int = 0  # durable messages given up after max_deliver failed attempts
    disconnects: int = 0
    reconnects: int = 0
    bytes_out_by_subject: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-able)."""
        d = asdict(self)
        d["rejected"] = dict(self.rejected)
        d["bytes_out_by_subject"] = dict(self.bytes_out_by_subject)
        return d


@dataclass
class Received:
    """A validated message handed to a handler.

    Attributes:
        subject: the subject it was published on.
        envelope: the decoded message.
        reply: where a responder should answer (None unless it came from `Bus.request`).
        nbytes: its size on the wire.
        redelivered: how many times it was delivered before (durable subscriptions).
    """

    subject: str
    envelope: Envelope
    reply: str | None
    nbytes: int
    redelivered: int = 0
    bus: Bus | None = field(default=None, repr=False)

    async def respond(self, envelope: Envelope) -> None:
        """Answer a request; an error if the message did not ask for a reply."""
        if self.reply is None or self.bus is None:
            raise InputError(f"message on {self.subject!r} did not ask for a reply", where="respond")
        await self.bus.publish(self.reply, envelope)


Handler = Callable[[Received], Awaitable[None]]
Responder = Callable[[Received], Awaitable[Envelope | None]]
_Outcome = Literal["ack", "nak", "term"]


class Subscription(ABC):
    """A live subscription; `unsubscribe` stops delivery (a durable consumer keeps its position)."""

    subject: str

    @abstractmethod
    async def unsubscribe(self) -> None: ...


class Bus(ABC):
    """The async bus interface shared by `InMemoryBus` and `NatsBus`.

    Args:
        max_bytes: largest frame sent or accepted; larger received ones are rejected as
            ``oversized``.
        name: this client's name (logs, NATS connection name).
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, name: str = "edgetwin") -> None:
        if max_bytes <= 0:
            raise InputError(f"max_bytes must be positive, got {max_bytes}", where="max_bytes")
        self.max_bytes = int(max_bytes)
        self.name = name
        self.stats = BusStats()

    async def __aenter__(self) -> Bus:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- to implement
    @abstractmethod
    async def connect(self) -> None:
        """Connect (retrying with backoff where there is a server)."""

    @abstractmethod
    async def close(self) -> None:
        """Stop all subscriptions and disconnect."""

    @abstractmethod
    async def publish_raw(self, subject: str, data: bytes, reply: str | None = None) -> None:
        """Send an already-encoded frame (relays, and tests that inject bad frames)."""

    @abstractmethod
    async def subscribe(self, subject: str, handler: Handler, queue: str | None = None) -> Subscription:
        """Deliver every valid message on ``subject`` (wildcards ``*``, ``>``) to ``handler``, one at a
        time. With ``queue``, each message goes to one member of the queue group."""

    @abstractmethod
    async def request_raw(self, subject: str, data: bytes, timeout: float) -> bytes:
        """Send a frame and wait up to ``timeout`` seconds for the reply frame."""

    @abstractmethod
    async def publish_durable(self, subject: str, msg: Envelope) -> int:
        """Store ``msg`` durably (subject must match a durable subject); returns its sequence."""

    @abstractmethod
    async def subscribe_durable(self, subject: str, durable_name: str, handler: Handler) -> Subscription:
        """Deliver every stored and future durable message on ``subject`` to ``handler``, resuming
        where the consumer ``durable_name`` left off. A message is acknowledged after the handler
        returns; if it raises, the message is redelivered (up to ``max_deliver`` times)."""

    @abstractmethod
    async def flush(self, timeout: float = 5.0) -> None:
        """Wait until what this client published has reached the server / subscribers' queues."""

    # ---- shared behaviour
    async def publish(self, subject: str, msg: Envelope) -> None:
        """Validate, encode and send ``msg`` on ``subject`` (no wildcards)."""
        _check_subject(subject, wildcards=False)
        data = encode(msg, self.max_bytes)
        await self.publish_raw(subject, data)

    async def request(self, subject: str, msg: Envelope, timeout: float = 2.0) -> Envelope:
        """Send ``msg`` and return the validated reply.

        Raises:
            TimeoutError: no reply within ``timeout`` seconds.
            NoResponders: nobody listens on ``subject``.
            MessageRejected: the reply was not a valid message (also counted).
        """
        _check_subject(subject, wildcards=False)
        if timeout <= 0:
            raise InputError(f"timeout must be positive, got {timeout}", where="timeout")
        data = await self.request_raw(subject, encode(msg, self.max_bytes), timeout)
        self.stats.received += 1
        self.stats.bytes_in += len(data)
        try:
            return decode(data, self.max_bytes)
        except MessageRejected as e:
            self._count_rejected(subject, e)
            raise

    async def serve(self, subject: str, responder: Responder, queue: str | None = None) -> Subscription:
        """Answer requests on ``subject`` with ``responder``'s return value.

        If the responder raises, the requester gets an ``error`` envelope at once instead of
        waiting for its timeout.
        """

        async def handle(rcv: Received) -> None:
            try:
                answer = await responder(rcv)
            except Exception as e:  # the requester must hear about it, the bus must go on
                self.stats.handler_errors += 1
                log.warning("responder on %s failed: %r", subject, e)
                answer = Envelope(kind="error", sender=self.name, round=rcv.envelope.round, payload={"reason": repr(e)})
            if answer is not None and rcv.reply is not None:
                await rcv.respond(answer)

        return await self.subscribe(subject, handle, queue=queue)

    def _count_rejected(self, subject: str, e: MessageRejected) -> None:
        self.stats.rejected[e.reason] += 1
        log.warning("%s: rejected message on %s: %s", self.name, subject, e)

    async def _dispatch(self, subject: str, data: bytes, reply: str | None, handler: Handler, redelivered: int = 0) -> _Outcome:
        """Decode, validate and hand one frame to ``handler``; never raises (except cancellation)."""
        self.stats.received += 1
        self.stats.bytes_in += len(data)
        try:
            env = decode(data, self.max_bytes)
        except MessageRejected as e:
            self._count_rejected(subject, e)
            return "term"
        try:
            await handler(Received(subject, env, reply, len(data), redelivered, self))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.stats.handler_errors += 1
            log.exception("%s: handler for %s failed on %s from %s: %r", self.name, subject, env.kind, env.sender, e)
            return "nak"
        return "ack"

    def _count_out(self, subject: str, nbytes: int) -> None:
        self.stats.published += 1
        self.stats.bytes_out += nbytes
        # Reply inboxes are unique per request: pool them so the counter stays small.
        self.stats.bytes_out_by_subject[_INBOX if subject.startswith(_INBOX + ".") else subject] += nbytes


def _check_durable_subject(subject: str, patterns: Iterable[str]) -> None:
    patterns = list(patterns)
    if not any(subject_matches(p, subject) for p in patterns):
        raise InputError(f"{subject!r} is not a durable subject (durable subjects: {patterns})", where="subject")


def _check_durable_filter(subject: str, patterns: Iterable[str]) -> None:
    # A durable subscription's filter must lie inside one stream pattern, i.e. every subject it
    # matches is stored; checked token-wise (a '>' pattern token covers the rest).
    def covered(p: str, s: str) -> bool:
        pt, st = p.split("."), s.split(".")
        for i, tok in enumerate(pt):
            if tok == ">":
                return len(st) > i
            if i >= len(st) or st[i] == ">" or (tok != "*" and tok != st[i]):
                return False
        return len(pt) == len(st)

    patterns = list(patterns)
    if not any(covered(p, subject) for p in patterns):
        raise InputError(f"{subject!r} is not within the durable subjects {patterns}", where="subject")


# ------------------------------------------------------------------------------ in-memory
@dataclass
class _LogEntry:
    seq: int
    subject: str
    data: bytes


@dataclass
class _Consumer:
    """A durable consumer's position: everything below ``next_seq`` was handed out once."""

    name: str
    filter_subject: str
    next_seq: int = 1
    unacked: dict[int, int] = field(default_factory=dict)  # seq -> deliveries so far
    redeliver: deque[int] = field(default_factory=deque)
    wakeups: set[asyncio.Event] = field(default_factory=set)


class MemoryBroker:
    """The in-process "server" shared by `InMemoryBus` clients: subscriptions and the durable log.

    Args:
        durable_subjects: patterns `publish_durable` accepts (like a JetStream stream's subjects).
        max_deliver: delivery attempts of a durable message before it is given up.
        pending_limit: per-subscription queue length; beyond it deliveries are dropped and
            counted, as NATS does for slow consumers.
    """

    _named: ClassVar[dict[str, MemoryBroker]] = {}

    def __init__(
        self,
        durable_subjects: Iterable[str] = DEFAULT_DURABLE_SUBJECTS,
        max_deliver: int = 5,
        pending_limit: int = 65536,
    ) -> None:
        self.durable_subjects = tuple(durable_subjects)
        for p in self.durable_subjects:
            _check_subject(p, wildcards=True, what="durable_subjects")
        if max_deliver < 1:
            raise InputError(f"max_deliver must be >= 1, got {max_deliver}", where="max_deliver")
        self.max_deliver = max_deliver
        self.pending_limit = pending_limit
        self.subs: list[_MemSub] = []
        self.log: list[_LogEntry] = []
        self.seen_ids: dict[str, int] = {}
        self.consumers: dict[str, _Consumer] = {}
        self._queue_rr: dict[str, itertools.count[int]] = {}

    @classmethod
    def named(cls, name: str) -> MemoryBroker:
        """The process-wide broker called ``name`` (created on first use)."""
        if name not in cls._named:
            cls._named[name] = cls()
        return cls._named[name]

    @classmethod
    def forget(cls, name: str) -> None:
        """Drop a named broker (tests)."""
        cls._named.pop(name, None)

    def route(self, subject: str, data: bytes, reply: str | None) -> int:
        """Queue ``data`` for every matching subscription (one per queue group); returns how many."""
        matching = [s for s in self.subs if subject_matches(s.subject, subject)]
        plain = [s for s in matching if s.queue is None]
        groups: dict[str, list[_MemSub]] = {}
        for s in matching:
            if s.queue is not None:
                groups.setdefault(s.queue, []).append(s)
        for qname, members in groups.items():
            rr = self._queue_rr.setdefault(qname, itertools.count())
            plain.append(members[next(rr) % len(members)])
        for s in plain:
            s.offer(subject, data, reply)
        return len(plain)

    def append(self, subject: str, data: bytes, msg_id: str) -> int:
        """Store a durable message once per ``msg_id``; wake the consumers. Returns its sequence."""
        if msg_id in self.seen_ids:
            return self.seen_ids[msg_id]
        seq = len(self.log) + 1
        self.log.append(_LogEntry(seq, subject, data))
        self.seen_ids[msg_id] = seq
        for c in self.consumers.values():
            for ev in c.wakeups:
                ev.set()
        return seq

    def consumer(self, name: str, filter_subject: str) -> _Consumer:
        c = self.consumers.get(name)
        if c is None:
            c = self.consumers[name] = _Consumer(name, filter_subject)
        elif c.filter_subject != filter_subject:
            raise InputError(
                f"durable consumer {name!r} exists with filter {c.filter_subject!r}, not {filter_subject!r}",
                where="durable_name",
            )
        return c

    def take(self, c: _Consumer) -> int | None:
        """The next sequence for consumer ``c`` (a redelivery first), or None when caught up."""
        if c.redeliver:
            return c.redeliver.popleft()
        while c.next_seq <= len(self.log):
            seq = c.next_seq
            c.next_seq += 1
            if subject_matches(c.filter_subject, self.log[seq - 1].subject):
                return seq
        return None


class _MemSub(Subscription):
    def __init__(self, bus: InMemoryBus, subject: str, handler: Handler, queue: str | None) -> None:
        self.bus, self.subject, self.handler, self.queue = bus, subject, handler, queue
        self.pending: asyncio.Queue[tuple[str, bytes, str | None]] = asyncio.Queue()
        self.task = asyncio.create_task(self._run(), name=f"memsub:{subject}")

    def offer(self, subject: str, data: bytes, reply: str | None) -> None:
        if self.pending.qsize() >= self.bus.broker.pending_limit:
            self.bus.stats.dropped += 1
            log.warning("%s: slow consumer on %s, dropped a message", self.bus.name, self.subject)
            return
        self.pending.put_nowait((subject, data, reply))

    async def _run(self) -> None:
        while True:
            subject, data, reply = await self.pending.get()
            try:
                await self.bus._dispatch(subject, data, reply, self.handler)
            finally:
                self.pending.task_done()

    async def unsubscribe(self) -> None:
        with contextlib.suppress(ValueError):
            self.bus.broker.subs.remove(self)
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class _MemDurableSub(Subscription):
    def __init__(self, bus: InMemoryBus, consumer: _Consumer, handler: Handler) -> None:
        self.bus, self.consumer, self.handler = bus, consumer, handler
        self.subject = consumer.filter_subject
        self.wakeup = asyncio.Event()
        consumer.wakeups.add(self.wakeup)
        self.task = asyncio.create_task(self._run(), name=f"memdurable:{consumer.name}")

    async def _run(self) -> None:
        broker, c = self.bus.broker, self.consumer
        while True:
            seq = broker.take(c)
            if seq is None:
                self.wakeup.clear()
                seq = broker.take(c)  # re-check: an append may have happened before clear()
                if seq is None:
                    await self.wakeup.wait()
                    continue
            entry = broker.log[seq - 1]
            prior = c.unacked.get(seq, 0)
            c.unacked[seq] = prior + 1
            if prior:
                self.bus.stats.redelivered += 1
            try:
                outcome = await self.bus._dispatch(entry.subject, entry.data, None, self.handler, redelivered=prior)
            except asyncio.CancelledError:
                # Not acknowledged: the next subscriber of this durable gets it again.
                c.redeliver.appendleft(seq)
                raise
            if outcome == "nak" and c.unacked[seq] < broker.max_deliver:
                c.redeliver.append(seq)
                await asyncio.sleep(0.01 * c.unacked[seq])  # small backoff before the retry
                continue
            if outcome == "nak":
                self.bus.stats.dead_letters += 1
                log.error("%s: durable message %d on %s given up after %d attempts", self.bus.name, seq, entry.subject, c.unacked[seq])
            elif outcome == "ack":
                self.bus.stats.durable_acked += 1
            c.unacked.pop(seq, None)

    async def unsubscribe(self) -> None:
        self.consumer.wakeups.discard(self.wakeup)
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class InMemoryBus(Bus):
    """The embedded bus: no server, all clients of one `MemoryBroker` in one process.

    Messages go through the same encode / validate path as on NATS (so size limits and rejection
    behave identically) and each subscription gets them in order on its own task.

    Args:
        broker: shared broker; a private one when None.
        max_bytes: see `Bus`.
        name: this client's name.
    """

    def __init__(self, broker: MemoryBroker | None = None, max_bytes: int = DEFAULT_MAX_BYTES, name: str = "edgetwin") -> None:
        super().__init__(max_bytes=max_bytes, name=name)
        self.broker = broker if broker is not None else MemoryBroker()
        self._subs: list[Subscription] = []
        self._connected = False

    async def connect(self) -> None:
        self._connected = True

    async def close(self) -> None:
        for s in list(self._subs):
            await s.unsubscribe()
        self._subs.clear()
        self._connected = False

    def _require(self) -> None:
        if not self._connected:
            raise RuntimeError(f"bus {self.name!r} is not connected (call connect() or use 'async with')")

    async def publish_raw(self, subject: str, data: bytes, reply: str | None = None) -> None:
        self._require()
        self._count_out(subject, len(data))
        self.broker.route(subject, bytes(data), reply)
        await asyncio.sleep(0)  # let subscribers run, as a network round trip would

    async def subscribe(self, subject: str, handler: Handler, queue: str | None = None) -> Subscription:
        self._require()
        _check_subject(subject, wildcards=True)
        sub = _MemSub(self, subject, handler, queue)
        self.broker.subs.append(sub)
        self._subs.append(sub)
        return sub

    async def request_raw(self, subject: str, data: bytes, timeout: float) -> bytes:
        self._require()
        inbox = f"{_INBOX}.{uuid.uuid4().hex}"
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        class _Inbox:
            queue = None
            subject = inbox

            @staticmethod
            def offer(_s: str, d: bytes, _r: str | None) -> None:
                if not fut.done():
                    fut.set_result(d)

        box = _Inbox()
        self.broker.subs.append(box)  # type: ignore[arg-type]
        try:
            self._count_out(subject, len(data))
            if self.broker.route(subject, bytes(data), inbox) == 0:
                raise NoResponders(f"no responders on {subject!r}")
            return await asyncio.wait_for(fut, timeout)
        finally:
            self.broker.subs.remove(box)  # type: ignore[arg-type]

    async def publish_durable(self, subject: str, msg: Envelope) -> int:
        self._require()
        _check_subject(subject, wildcards=False)
        _check_durable_subject(subject, self.broker.durable_subjects)
        data = encode(msg, self.max_bytes)
        seq = self.broker.append(subject, data, msg.msg_id)
        self._count_out(subject, len(data))
        self.stats.durable_published += 1
        # A JetStream publish is also a core message on the subject.
        self.broker.route(subject, data, None)
        await asyncio.sleep(0)
        return seq

    async def subscribe_durable(self, subject: str, durable_name: str, handler: Handler) -> Subscription:
        self._require()
        _check_subject(subject, wildcards=True)
        _check_durable_filter(subject, self.broker.durable_subjects)
        _check_subject(durable_name, wildcards=False, what="durable_name")
        sub = _MemDurableSub(self, self.broker.consumer(durable_name, subject), handler)
        self._subs.append(sub)
        return sub

    async def flush(self, timeout: float = 5.0) -> None:
        """Wait until every subscription's queue (all clients of the broker) is drained."""

        async def drained() -> None:
            for s in list(self.broker.subs):
                if isinstance(s, _MemSub):
                    await s.pending.join()

        await asyncio.wait_for(drained(), timeout)


# ------------------------------------------------------------------------------ NATS
@dataclass
class NatsConfig:
    """How to reach NATS (loadable from a TOML/JSON file or dict, see `from_dict`).

    Authentication: at most one of user/password, token, NKey seed file, creds (JWT) file.
    TLS: ``tls_ca`` to verify the server (and ``tls_cert`` / ``tls_key`` for mutual TLS).

    Attributes:
        servers: ``nats://host:port`` URLs (credentials may also be in the URL).
        name: connection name shown by the server.
        connect_timeout_s: per attempt.
        connect_attempts: initial connection attempts, with exponential backoff between them.
        reconnect_backoff_s / reconnect_backoff_max_s / reconnect_jitter: reconnect delay is
            ``min(max, base * 2**attempt) * (1 ± jitter)``.
        max_reconnect_attempts: -1 for forever.
        max_bytes: largest frame (capped by the server's max_payload).
        stream: JetStream stream holding the durable subjects.
        durable_subjects: subjects stored durably.
        stream_max_age_s: how long durable messages are kept (0: forever).
        storage: ``"file"`` (survives restarts) or ``"memory"``.
        max_deliver: delivery attempts of a durable message.
        ack_wait_s: redelivery if not acknowledged within it.
        durable_publish_timeout_s: how long `publish_durable` keeps retrying (e.g. across a restart).
        fetch_timeout_s: long-poll of durable pull consumers.
    """

    servers: list[str] = field(default_factory=lambda: ["nats://127.0.0.1:4222"])
    name: str = "edgetwin"
    user: str | None = None
    password: str | None = None
    token: str | None = None
    nkey_seed_file: str | None = None
    creds_file: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_hostname: str | None = None
    connect_timeout_s: float = 2.0
    connect_attempts: int = 5
    reconnect_backoff_s: float = 0.1
    reconnect_backoff_max_s: float = 5.0
    reconnect_jitter: float = 0.2
    max_reconnect_attempts: int = -1
    max_bytes: int = DEFAULT_MAX_BYTES
    stream: str = "EDGETWIN"
    durable_subjects: list[str] = field(default_factory=lambda: list(DEFAULT_DURABLE_SUBJECTS))
    stream_max_age_s: float = 0.0
    storage: str = "file"
    max_deliver: int = 5
    ack_wait_s: float = 30.0
    durable_publish_timeout_s: float = 30.0
    fetch_timeout_s: float = 1.0
    seed: int = 0  # jitter of the reconnect backoff

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, where: str = "nats config") -> None:
        """Refuse settings that cannot work, naming the field."""
        if isinstance(self.servers, str):
            self.servers = [self.servers]
        if not self.servers or not all(isinstance(s, str) and "://" in s for s in self.servers):
            raise InputError(f"servers must be URLs like nats://host:4222, got {self.servers!r}", where=f"{where}: servers")
        methods = [
            m
            for m, on in (
                ("user/password", self.user is not None or self.password is not None),
                ("token", self.token is not None),
                ("nkey_seed_file", self.nkey_seed_file is not None),
                ("creds_file", self.creds_file is not None),
            )
            if on
        ]
        if len(methods) > 1:
            raise InputError(f"choose one authentication method, got {methods}", where=where)
        if (self.user is None) != (self.password is None):
            raise InputError("user and password go together", where=f"{where}: user/password")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InputError("tls_cert and tls_key go together (mutual TLS)", where=f"{where}: tls_cert/tls_key")
        if self.storage not in ("file", "memory"):
            raise InputError(f"storage must be 'file' or 'memory', got {self.storage!r}", where=f"{where}: storage")
        for name in ("connect_timeout_s", "reconnect_backoff_s", "reconnect_backoff_max_s", "ack_wait_s",
                     "durable_publish_timeout_s", "fetch_timeout_s"):
            if not getattr(self, name) > 0:
                raise InputError(f"must be > 0, got {getattr(self, name)}", where=f"{where}: {name}")
        if not 0 <= self.reconnect_jitter < 1:
            raise InputError(f"must be in [0, 1), got {self.reconnect_jitter}", where=f"{where}: reconnect_jitter")
        if self.connect_attempts < 1 or self.max_deliver < 1 or self.max_bytes <= 0:
            raise InputError("connect_attempts, max_deliver and max_bytes must be positive", where=where)
        for p in self.durable_subjects:
            _check_subject(p, wildcards=True, what=f"{where}: durable_subjects")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "nats config") -> NatsConfig:
        """From a dict; a ``{"nats": {...}}`` section is unwrapped; unknown keys are refused."""
        if "nats" in d and isinstance(d["nats"], Mapping):
            d, where = d["nats"], f"{where} [nats]"
        known = {f.name: str(f.type) for f in fields(cls)}
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise InputError(f"unknown keys {unknown}; known: {sorted(known)}", where=where)
        kwargs: dict[str, Any] = {}
        for k, v in d.items():
            t = known[k]
            if v is None and "None" in t:
                kwargs[k] = None
            elif t.startswith("list"):
                if isinstance(v, str):
                    v = [v]
                if not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
                    raise InputError(f"expected a list of strings, got {v!r}", where=f"{where}: {k}")
                kwargs[k] = list(v)
            elif t.startswith("float"):
                if isinstance(v, bool) or not isinstance(v, int | float):
                    raise InputError(f"expected a number, got {v!r}", where=f"{where}: {k}")
                kwargs[k] = float(v)
            elif t.startswith("int"):
                if isinstance(v, bool) or not isinstance(v, int):
                    raise InputError(f"expected an integer, got {v!r}", where=f"{where}: {k}")
                kwargs[k] = v
            else:  # str or str | None
                if not isinstance(v, str):
                    raise InputError(f"expected a string, got {v!r}", where=f"{where}: {k}")
                kwargs[k] = v
        cfg = cls.__new__(cls)
        for f in fields(cls):
            setattr(cfg, f.name, kwargs[f.name] if f.name in kwargs else cls._default(f))
        cfg.validate(where)
        return cfg

    @staticmethod
    def _default(f: Any) -> Any:
        return f.default_factory() if f.default_factory is not MISSING else f.default

    @classmethod
    def load(cls, path: str | Path) -> NatsConfig:
        """From a ``.toml`` or ``.json`` file (a ``[nats]`` table or top-level keys)."""
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise InputError(f"cannot read: {e.strerror}", where=str(p)) from None
        try:
            d = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
        except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
            raise InputError(f"not valid {'JSON' if p.suffix == '.json' else 'TOML'}: {e}", where=str(p)) from None
        return cls.from_dict(d, where=str(p))

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context, or None when no TLS setting is given and no server URL is tls://."""
        if not (self.tls_ca or self.tls_cert or any(s.startswith("tls://") for s in self.servers)):
            return None
        for name in ("tls_ca", "tls_cert", "tls_key"):
            v = getattr(self, name)
            if v is not None and not Path(v).is_file():
                raise InputError(f"file not found: {v}", where=f"nats config: {name}")
        ctx = ssl.create_default_context(cafile=self.tls_ca)
        if self.tls_cert and self.tls_key:
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
        return ctx


class _NatsSub(Subscription):
    def __init__(self, subject: str, sub: Any) -> None:
        self.subject, self._sub = subject, sub

    async def unsubscribe(self) -> None:
        with contextlib.suppress(Exception):  # already gone with a closed connection
            await self._sub.unsubscribe()


class _NatsDurableSub(Subscription):
    def __init__(self, bus: NatsBus, subject: str, durable: str, psub: Any, handler: Handler) -> None:
        self.bus, self.subject, self.durable, self.psub, self.handler = bus, subject, durable, psub, handler
        self.task = asyncio.create_task(self._run(), name=f"natsdurable:{durable}")

    async def _run(self) -> None:
        import nats.errors
        import nats.js.errors

        failures = 0
        while True:
            try:
                msgs = await self.psub.fetch(batch=16, timeout=self.bus.config.fetch_timeout_s)
                failures = 0
            except (TimeoutError, nats.errors.TimeoutError):
                continue  # nothing new: long-poll again
            except asyncio.CancelledError:
                raise
            except nats.js.errors.NotFoundError:
                # The consumer (or stream) is gone, e.g. a memory-storage server restarted: recreate it.
                failures += 1
                await asyncio.sleep(self.bus._backoff(failures))
                with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError, OSError):
                    self.bus._stream_ready = False
                    self.psub = await self.bus._pull_subscription(self.subject, self.durable)
                continue
            except Exception as e:
                # Disconnected, the server restarting, or anything unexpected: back off and go on
                # (nats-py reconnects underneath); the consumer task must not die.
                failures += 1
                delay = self.bus._backoff(failures)
                log.info("%s: durable %s fetch failed (%r); retry in %.2fs", self.bus.name, self.durable, e, delay)
                await asyncio.sleep(delay)
                continue
            for m in msgs:
                try:
                    delivered = int(m.metadata.num_delivered)
                except Exception:
                    delivered = 1
                if delivered > 1:
                    self.bus.stats.redelivered += 1
                outcome = await self.bus._dispatch(m.subject, m.data, None, self.handler, redelivered=delivered - 1)
                try:
                    if outcome == "ack":
                        await m.ack()
                        self.bus.stats.durable_acked += 1
                    elif outcome == "term":
                        await m.term()
                    elif delivered >= self.bus.config.max_deliver:
                        await m.term()
                        self.bus.stats.dead_letters += 1
                        log.error("%s: durable message on %s given up after %d attempts", self.bus.name, m.subject, delivered)
                    else:
                        await m.nak(delay=0.05 * delivered)
                except (nats.errors.Error, OSError) as e:
                    # The ack is lost with the connection: JetStream redelivers after ack_wait.
                    log.info("%s: ack on %s failed: %r", self.bus.name, m.subject, e)

    async def unsubscribe(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        with contextlib.suppress(Exception):
            await self.psub.unsubscribe()


class NatsBus(Bus):
    """`Bus` over NATS (nats-py): core NATS for pub/sub and request/reply, JetStream for durable.

    Args:
        config: servers, auth, TLS, backoff, stream settings.
    """

    def __init__(self, config: NatsConfig | None = None) -> None:
        config = config or NatsConfig()
        super().__init__(max_bytes=config.max_bytes, name=config.name)
        self.config = config
        self.nc: Any = None
        self.js: Any = None
        self._subs: list[Subscription] = []
        self._stream_ready = False
        self._stream_lock: asyncio.Lock | None = None
        self._rng = random.Random(config.seed)

    def _backoff(self, attempt: int) -> float:
        c = self.config
        base = min(c.reconnect_backoff_max_s, c.reconnect_backoff_s * (2 ** max(0, attempt - 1)))
        return base * (1.0 + c.reconnect_jitter * (2.0 * self._rng.random() - 1.0))

    def _connect_options(self) -> dict[str, Any]:
        c = self.config
        opts: dict[str, Any] = {
            "servers": c.servers,
            "name": c.name,
            "connect_timeout": c.connect_timeout_s,
            "max_reconnect_attempts": c.max_reconnect_attempts,
            "allow_reconnect": True,
            "error_cb": self._on_error,
            "disconnected_cb": self._on_disconnected,
            "reconnected_cb": self._on_reconnected,
            "closed_cb": self._on_closed,
            "reconnect_to_server_handler": self._pick_server,
        }
        if c.user is not None:
            opts["user"], opts["password"] = c.user, c.password
        if c.token is not None:
            opts["token"] = c.token
        for key, opt in (("nkey_seed_file", "nkeys_seed"), ("creds_file", "user_credentials")):
            path = getattr(c, key)
            if path is not None:
                if not Path(path).is_file():
                    raise InputError(f"file not found: {path}", where=f"nats config: {key}")
                try:
                    import nkeys  # noqa: F401  (nats-py needs it to sign the server's nonce)
                except ImportError:
                    raise InputError("NKey / creds authentication needs the 'nkeys' package", where=f"nats config: {key}") from None
                opts[opt] = path
        ctx = c.ssl_context()
        if ctx is not None:
            opts["tls"] = ctx
            if c.tls_hostname:
                opts["tls_hostname"] = c.tls_hostname
        return opts

    def _pick_server(self, servers: list[Any], _info: dict[str, Any]) -> tuple[Any, float]:
        # nats-py calls this before each reconnect attempt: exponential backoff with jitter.
        s = min(servers, key=lambda s: s.reconnects)
        return s, self._backoff(s.reconnects + 1)

    async def _on_error(self, e: Exception) -> None:
        log.debug("%s: nats error: %r", self.name, e)

    async def _on_disconnected(self) -> None:
        self.stats.disconnects += 1
        log.info("%s: disconnected from NATS", self.name)

    async def _on_reconnected(self) -> None:
        self.stats.reconnects += 1
        log.info("%s: reconnected to NATS", self.name)

    async def _on_closed(self) -> None:
        log.info("%s: NATS connection closed", self.name)

    async def connect(self) -> None:
        import nats
        import nats.errors

        opts = self._connect_options()
        last: Exception | None = None
        for attempt in range(1, self.config.connect_attempts + 1):
            nc = nats.NATS()
            try:
                # nats-py retries a failing *initial* connect forever when reconnecting is allowed;
                # we retry here with our own backoff instead and allow reconnects once connected.
                initial = {**opts, "allow_reconnect": False, "max_reconnect_attempts": 1, "reconnect_time_wait": 0.05}
                await asyncio.wait_for(nc.connect(**initial), 3 * self.config.connect_timeout_s)
            except (TimeoutError, nats.errors.NoServersError, OSError, nats.errors.Error) as e:
                last = e
                # close() can wait forever on a half-open TLS transport: bound it.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(nc.close(), 1.0)
                if isinstance(e, nats.errors.AuthorizationError) or "authoriz" in str(e).lower():
                    raise ConnectionError(f"NATS at {self.config.servers} refused the credentials: {e!r}") from None
                if isinstance(e, ssl.SSLCertVerificationError):
                    raise ConnectionError(f"TLS verification of {self.config.servers} failed: {e}") from None
                if attempt < self.config.connect_attempts:
                    await asyncio.sleep(self._backoff(attempt))
                continue
            nc.options["allow_reconnect"] = True
            nc.options["max_reconnect_attempts"] = self.config.max_reconnect_attempts
            self.nc = nc
            self.js = nc.jetstream(timeout=self.config.connect_timeout_s)
            self._stream_lock = asyncio.Lock()
            if nc.max_payload and nc.max_payload < self.max_bytes:
                self.max_bytes = int(nc.max_payload)
            return
        raise ConnectionError(
            f"cannot connect to {self.config.servers} after {self.config.connect_attempts} attempts: {last!r}"
        )

    async def close(self) -> None:
        for s in list(self._subs):
            await s.unsubscribe()
        self._subs.clear()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.nc.close(), 5.0)
        self.nc = self.js = None
        self._stream_ready = False

    def _require(self) -> Any:
        if self.nc is None:
            raise RuntimeError(f"bus {self.name!r} is not connected (call connect() or use 'async with')")
        return self.nc

    async def publish_raw(self, subject: str, data: bytes, reply: str | None = None) -> None:
        nc = self._require()
        await nc.publish(subject, bytes(data), reply=reply or "")
        self._count_out(subject, len(data))

    async def subscribe(self, subject: str, handler: Handler, queue: str | None = None) -> Subscription:
        import nats.errors

        nc = self._require()
        _check_subject(subject, wildcards=True)

        async def cb(m: Any) -> None:
            await self._dispatch(m.subject, m.data, m.reply or None, handler)

        sub = _NatsSub(subject, await nc.subscribe(subject, queue=queue or "", cb=cb, pending_msgs_limit=65536))
        self._subs.append(sub)
        # Return only once the server holds the interest, so that a request sent by anyone after
        # this call finds the subscriber (no spurious NoResponders). While reconnecting the client
        # resends its subscriptions on reconnect, so a failed round trip here is not an error.
        try:
            await self.flush(timeout=self.config.connect_timeout_s)
        except (TimeoutError, nats.errors.Error) as e:
            log.info("%s: subscribed to %s while the server is unreachable (%r)", self.name, subject, e)
        return sub

    async def request_raw(self, subject: str, data: bytes, timeout: float) -> bytes:
        import nats.errors

        nc = self._require()
        self._count_out(subject, len(data))
        try:
            m = await nc.request(subject, bytes(data), timeout=timeout)
        except nats.errors.NoRespondersError:
            raise NoResponders(f"no responders on {subject!r}") from None
        except nats.errors.TimeoutError:
            raise TimeoutError(f"no reply on {subject!r} within {timeout}s") from None
        return bytes(m.data)

    async def _ensure_stream(self) -> None:
        if self._stream_ready:
            return
        import nats.js.errors
        from nats.js.api import StorageType, StreamConfig

        assert self._stream_lock is not None
        async with self._stream_lock:
            if self._stream_ready:
                return
            c = self.config
            cfg = StreamConfig(
                name=c.stream,
                subjects=list(c.durable_subjects),
                storage=StorageType.FILE if c.storage == "file" else StorageType.MEMORY,
                max_age=c.stream_max_age_s or None,
                duplicate_window=120.0,
                max_msg_size=self.max_bytes,
            )
            try:
                info = await self.js.stream_info(c.stream)
                if sorted(info.config.subjects or []) != sorted(cfg.subjects or []):
                    await self.js.update_stream(cfg)
            except nats.js.errors.NotFoundError:
                await self.js.add_stream(cfg)
            self._stream_ready = True

    async def publish_durable(self, subject: str, msg: Envelope) -> int:
        import nats.errors
        import nats.js.errors

        self._require()
        _check_subject(subject, wildcards=False)
        _check_durable_subject(subject, self.config.durable_subjects)
        data = encode(msg, self.max_bytes)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.durable_publish_timeout_s
        attempt = 0
        while True:
            attempt += 1
            try:
                await self._ensure_stream()
                # The message id makes retries idempotent: JetStream stores it once per window.
                ack = await self.js.publish(
                    subject, data, timeout=self.config.connect_timeout_s, headers={"Nats-Msg-Id": msg.msg_id}
                )
                self._count_out(subject, len(data))
                self.stats.durable_published += 1
                return int(ack.seq)
            except nats.js.errors.NotFoundError:
                # The stream is gone (e.g. a server with a fresh store): create it again.
                self._stream_ready = False
                e: Exception = RuntimeError(f"stream {self.config.stream} not found")
            except nats.js.errors.APIError as err:
                if not isinstance(err, nats.js.errors.ServiceUnavailableError):
                    raise  # a request JetStream refuses (too large, bad subject): retrying won't help
                e = err  # JetStream not ready yet after a restart
            except (TimeoutError, nats.errors.Error, OSError) as err:
                e = err  # disconnected / reconnecting / no reply: retry
            delay = self._backoff(attempt)
            if loop.time() + delay > deadline:
                raise TimeoutError(
                    f"durable publish on {subject!r} not acknowledged within "
                    f"{self.config.durable_publish_timeout_s}s: {e!r}"
                ) from None
            log.info("%s: durable publish on %s failed (%r); retry in %.2fs", self.name, subject, e, delay)
            await asyncio.sleep(delay)

    async def subscribe_durable(self, subject: str, durable_name: str, handler: Handler) -> Subscription:
        self._require()
        _check_subject(subject, wildcards=True)
        _check_durable_filter(subject, self.config.durable_subjects)
        _check_subject(durable_name, wildcards=False, what="durable_name")
        if "." in durable_name:
            raise InputError(f"{durable_name!r}: a durable name may not contain '.'", where="durable_name")
        psub = await self._pull_subscription(subject, durable_name)
        sub = _NatsDurableSub(self, subject, durable_name, psub, handler)
        self._subs.append(sub)
        return sub

    async def _pull_subscription(self, subject: str, durable_name: str) -> Any:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        await self._ensure_stream()
        cfg = ConsumerConfig(
            durable_name=durable_name,
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.config.ack_wait_s,
            max_deliver=self.config.max_deliver,
            filter_subject=subject,
        )
        return await self.js.pull_subscribe(subject, durable=durable_name, stream=self.config.stream, config=cfg)

    async def flush(self, timeout: float = 5.0) -> None:
        nc = self._require()
        # nats-py (2.16) writes PING straight to the socket while SUB/PUB wait in its pending buffer
        # for the flusher task, so a single PING can overtake a SUB queued just before it and its
        # PONG proves nothing (measured: 9 of 300 requests got NoResponders after subscribe+flush).
        # The first round trip lets the flusher write everything queued before this call; the
        # second PING is behind it on the wire, so its PONG means the server has processed it all.
        await nc.flush(timeout=timeout)
        await nc.flush(timeout=timeout)


# ------------------------------------------------------------------------------ factory
def make_bus(spec: str | NatsConfig | Mapping[str, Any] = "memory", **overrides: Any) -> Bus:
    """A bus from a string, a `NatsConfig` or a config dict.

    - ``"memory"``: an in-process bus with its own broker;
      ``"memory://NAME"``: a client of the process-wide broker ``NAME`` (agents in one process).
    - ``"nats://host:port"`` (or ``tls://``; several comma-separated): a `NatsBus`; ``overrides``
      are `NatsConfig` fields (e.g. ``token=...``).
    """
    if isinstance(spec, NatsConfig):
        return NatsBus(spec)
    if isinstance(spec, Mapping):
        return NatsBus(NatsConfig.from_dict({**spec, **overrides}))
    if not isinstance(spec, str):
        raise InputError(f"expected 'memory', 'memory://NAME' or 'nats://host:port', got {spec!r}", where="--bus")
    if spec == "memory" or spec == "memory://":
        return InMemoryBus(max_bytes=overrides.pop("max_bytes", DEFAULT_MAX_BYTES), name=overrides.pop("name", "edgetwin"))
    if spec.startswith("memory://"):
        return InMemoryBus(
            MemoryBroker.named(spec[len("memory://") :]),
            max_bytes=overrides.pop("max_bytes", DEFAULT_MAX_BYTES),
            name=overrides.pop("name", "edgetwin"),
        )
    if spec.startswith(("nats://", "tls://", "ws://", "wss://")):
        return NatsBus(NatsConfig.from_dict({"servers": [s.strip() for s in spec.split(",")], **overrides}, where="--bus"))
    raise InputError(f"expected 'memory', 'memory://NAME' or 'nats://host:port', got {spec!r}", where="--bus")
