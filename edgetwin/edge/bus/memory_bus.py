"""`InMemoryBus`: the embedded bus, no server.

Bus clients that share a `MemoryBroker` (all ``make_bus("memory://NAME")`` in one process) see each
other. The broker keeps an in-process log of durable messages and per-durable-consumer cursors with
explicit ack and redelivery, so durable semantics are those of JetStream (at-least-once, in order per
consumer, a consumer created later still gets every stored message).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from edgetwin.contract.errors import InputError
from edgetwin.edge.bus.base import (
    DEFAULT_DURABLE_SUBJECTS,
    DEFAULT_MAX_BYTES,
    INBOX,
    Bus,
    Handler,
    NoResponders,
    RawHandler,
    RawMessage,
    Subscription,
    check_durable_filter,
    check_durable_subject,
    check_subject,
    subject_matches,
)
from edgetwin.edge.messages import Envelope

__all__ = ["InMemoryBus", "MemoryBroker"]

log = logging.getLogger("edgetwin.bus")


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
            check_subject(p, wildcards=True, what="durable_subjects")
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

    def route(self, subject: str, data: bytes, reply: str | None, headers: Mapping[str, str] | None = None) -> int:
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
            s.offer(subject, data, reply, dict(headers) if headers else {})
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
    """A core subscription; ``raw`` handlers get `RawMessage` (bytes and headers, not decoded)."""

    def __init__(
        self, bus: InMemoryBus, subject: str, handler: Handler | RawHandler, queue: str | None, raw: bool = False
    ) -> None:
        self.bus, self.subject, self.handler, self.queue, self.raw = bus, subject, handler, queue, raw
        self.pending: asyncio.Queue[tuple[str, bytes, str | None, dict[str, str]]] = asyncio.Queue()
        self.task = asyncio.create_task(self._run(), name=f"memsub:{subject}")

    def offer(self, subject: str, data: bytes, reply: str | None, headers: dict[str, str]) -> None:
        if self.pending.qsize() >= self.bus.broker.pending_limit:
            self.bus.stats.dropped += 1
            log.warning("%s: slow consumer on %s, dropped a message", self.bus.name, self.subject)
            return
        self.pending.put_nowait((subject, data, reply, headers))

    async def _run(self) -> None:
        while True:
            subject, data, reply, headers = await self.pending.get()
            try:
                if self.raw:
                    await self.bus._dispatch_raw(RawMessage(subject, data, headers, reply), self.handler)  # type: ignore[arg-type]
                else:
                    await self.bus._dispatch(subject, data, reply, self.handler)  # type: ignore[arg-type]
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

    async def publish_raw(
        self, subject: str, data: bytes, reply: str | None = None, headers: Mapping[str, str] | None = None
    ) -> None:
        self._require()
        self._count_out(subject, len(data))
        self.broker.route(subject, bytes(data), reply, headers)
        await asyncio.sleep(0)  # let subscribers run, as a network round trip would

    async def subscribe(self, subject: str, handler: Handler, queue: str | None = None) -> Subscription:
        self._require()
        check_subject(subject, wildcards=True)
        sub = _MemSub(self, subject, handler, queue)
        self.broker.subs.append(sub)
        self._subs.append(sub)
        return sub

    async def subscribe_raw(self, subject: str, handler: RawHandler, queue: str | None = None) -> Subscription:
        self._require()
        check_subject(subject, wildcards=True)
        sub = _MemSub(self, subject, handler, queue, raw=True)
        self.broker.subs.append(sub)
        self._subs.append(sub)
        return sub

    async def request_raw(self, subject: str, data: bytes, timeout: float) -> bytes:
        self._require()
        inbox = f"{INBOX}.{uuid.uuid4().hex}"
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        class _Inbox:
            queue = None
            subject = inbox

            @staticmethod
            def offer(_s: str, d: bytes, _r: str | None, _h: dict[str, str]) -> None:
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
        check_subject(subject, wildcards=False)
        check_durable_subject(subject, self.broker.durable_subjects)
        data = self.encode(msg)
        seq = self.broker.append(subject, data, msg.msg_id)
        self._count_out(subject, len(data))
        self.stats.durable_published += 1
        # A JetStream publish is also a core message on the subject.
        self.broker.route(subject, data, None)
        await asyncio.sleep(0)
        return seq

    async def subscribe_durable(self, subject: str, durable_name: str, handler: Handler) -> Subscription:
        self._require()
        check_subject(subject, wildcards=True)
        check_durable_filter(subject, self.broker.durable_subjects)
        check_subject(durable_name, wildcards=False, what="durable_name")
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
