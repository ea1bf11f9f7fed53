"""`Bus`: the one async interface edge agents program against, and the subjects they use.

How agents use it is shown in `edgetwin.edge.bus`. Its implementations are
`edgetwin.edge.bus.memory_bus.InMemoryBus` (the embedded default) and
`edgetwin.edge.bus.nats_bus.NatsBus`; `edgetwin.edge.bus.connect.make_bus` picks one.

Every received message is decoded and validated (`edgetwin.edge.messages.decode`) before a handler
sees it; a malformed, oversized or unknown-version message is logged with its reason and counted in
``bus.stats.rejected[reason]``. A handler that raises is logged and counted
(``stats.handler_errors``), never propagated into the bus: an agent keeps running.
"""

from __future__ import annotations

import asyncio
import logging
import os
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from edgetwin.contract.errors import InputError
from edgetwin.edge.message_auth import MessageAuth
from edgetwin.edge.messages import Envelope, MessageRejected, decode, encode

__all__ = [
    "DEFAULT_DURABLE_SUBJECTS",
    "DEFAULT_MAX_BYTES",
    "INBOX",
    "Bus",
    "BusStats",
    "Handler",
    "NoResponders",
    "RawHandler",
    "RawMessage",
    "Received",
    "Responder",
    "Subjects",
    "Subscription",
    "check_durable_filter",
    "check_durable_subject",
    "check_subject",
    "subject_matches",
]


log = logging.getLogger("edgetwin.bus")


DEFAULT_MAX_BYTES = 1 << 20  # nats-server's default max_payload


DEFAULT_DURABLE_SUBJECTS = ("edgetwin.update.>", "edgetwin.model.>", "edgetwin.policy.>", "edgetwin.canary.>")


INBOX = "_INBOX"


class NoResponders(RuntimeError):
    """A request found nobody subscribed to its subject."""


# ------------------------------------------------------------------------------ subjects
def check_subject(subject: str, *, wildcards: bool, what: str = "subject") -> list[str]:
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


@dataclass
class RawMessage:
    """A message as it came off the wire, not decoded: for subjects that also speak formats other
    than the edgetwin frame (the decision subject answers JSON and Arrow IPC too, see
    `edgetwin.edge.decision_wire`).

    Attributes:
        subject: the subject it was published on.
        data: its body (bytes).
        headers: its NATS headers (``{}`` when it had none).
        reply: where to answer (None unless it was a request).
    """

    subject: str
    data: bytes
    headers: dict[str, str]
    reply: str | None


RawHandler = Callable[[RawMessage], Awaitable[None]]


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
        #: when set, every envelope sent is signed by its sender's key and every one received must
        #: be signed by the key its ``sender`` names (`edgetwin.edge.message_auth`)
        self.auth: MessageAuth | None = None

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
    async def publish_raw(
        self, subject: str, data: bytes, reply: str | None = None, headers: Mapping[str, str] | None = None
    ) -> None:
        """Send already-encoded bytes, optionally with NATS headers (relays, replies in other
        formats, and tests that inject bad frames)."""

    @abstractmethod
    async def subscribe_raw(self, subject: str, handler: RawHandler, queue: str | None = None) -> Subscription:
        """Deliver every message on ``subject`` to ``handler`` as it came (`RawMessage`: bytes and
        headers, nothing decoded or validated: the handler owns that), one at a time; counted in
        ``stats.received`` / ``bytes_in``; a handler that raises is logged and counted."""

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
    def encode(self, msg: Envelope) -> bytes:
        """``msg`` as a frame of at most ``max_bytes``, signed by its sender's key when ``auth`` is set."""
        sign = None if self.auth is None else self.auth.sign_for(msg.sender).sign
        return encode(msg, self.max_bytes, sign=sign)

    def decode(self, data: bytes) -> Envelope:
        """A received frame as a validated (and, with ``auth``, authenticated) envelope.

        Raises:
            MessageRejected: not usable, for one of `REASONS`. Anything else a decoder raises on
                hostile bytes (a MemoryError, a bug) is turned into ``malformed``, so that no frame
                can end a subscription.
        """
        try:
            env = decode(data, self.max_bytes)
        except MessageRejected:
            raise
        except Exception as e:
            raise MessageRejected("malformed", f"frame could not be decoded ({type(e).__name__})") from None
        if self.auth is not None:
            self.auth.verify(env)
        return env

    async def publish(self, subject: str, msg: Envelope) -> None:
        """Validate, encode and send ``msg`` on ``subject`` (no wildcards)."""
        check_subject(subject, wildcards=False)
        data = self.encode(msg)
        await self.publish_raw(subject, data)

    async def request(self, subject: str, msg: Envelope, timeout: float = 2.0) -> Envelope:
        """Send ``msg`` and return the validated reply.

        Raises:
            TimeoutError: no reply within ``timeout`` seconds.
            NoResponders: nobody listens on ``subject``.
            MessageRejected: the reply was not a valid message (also counted).
        """
        check_subject(subject, wildcards=False)
        if timeout <= 0:
            raise InputError(f"timeout must be positive, got {timeout}", where="timeout")
        data = await self.request_raw(subject, self.encode(msg), timeout)
        self.stats.received += 1
        self.stats.bytes_in += len(data)
        try:
            return self.decode(data)
        except MessageRejected as e:
            self._count_rejected(subject, e)
            raise

    async def serve(self, subject: str, responder: Responder, queue: str | None = None) -> Subscription:
        """Answer requests on ``subject`` with ``responder``'s return value.

        If the responder raises, the requester gets an ``error`` envelope at once instead of
        waiting for its timeout.
        """
        return await self.subscribe(subject, self.answering(subject, responder), queue=queue)

    def answering(self, subject: str, responder: Responder) -> Handler:
        """The handler `serve` subscribes: it sends ``responder``'s envelope (or an ``error`` one
        when it raises) to the request's reply subject."""

        async def handle(rcv: Received) -> None:
            try:
                answer = await responder(rcv)
            except Exception as e:  # the requester must hear about it, the bus must go on
                self.stats.handler_errors += 1
                log.warning("responder on %s failed: %r", subject, e)
                answer = Envelope(kind="error", sender=self.name, round=rcv.envelope.round, payload={"reason": repr(e)})
            if answer is not None and rcv.reply is not None:
                await rcv.respond(answer)

        return handle

    async def deliver(self, msg: RawMessage, handler: Handler) -> MessageRejected | None:
        """Decode and validate a raw frame and hand it to ``handler`` as a `subscribe` would
        (rejections and handler errors counted the same way); for `subscribe_raw` handlers that
        also accept edgetwin frames. ``stats.received`` was counted when ``msg`` arrived.

        Returns:
            The rejection when the frame was not usable (the handler did not see it), else None.
        """
        rejected: list[MessageRejected] = []
        await self._dispatch(msg.subject, msg.data, msg.reply, handler, _counted=True, _rejected=rejected)
        return rejected[0] if rejected else None

    async def _dispatch_raw(self, msg: RawMessage, handler: RawHandler) -> None:
        """Count and hand one raw message to ``handler``; never raises (except cancellation)."""
        self.stats.received += 1
        self.stats.bytes_in += len(msg.data)
        try:
            await handler(msg)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.stats.handler_errors += 1
            log.error("%s: raw handler for %s failed: %r", self.name, msg.subject, e, exc_info=_debug())

    def _count_rejected(self, subject: str, e: MessageRejected) -> None:
        self.stats.rejected[e.reason] += 1
        log.warning("%s: rejected message on %s: %s", self.name, subject, e)

    async def _dispatch(
        self, subject: str, data: bytes, reply: str | None, handler: Handler, redelivered: int = 0,
        _counted: bool = False, _rejected: list[MessageRejected] | None = None,
    ) -> _Outcome:
        """Decode, validate and hand one frame to ``handler``; never raises (except cancellation)."""
        if not _counted:
            self.stats.received += 1
            self.stats.bytes_in += len(data)
        try:
            env = self.decode(data)
        except MessageRejected as e:
            self._count_rejected(subject, e)
            if _rejected is not None:
                _rejected.append(e)
            return "term"
        try:
            await handler(Received(subject, env, reply, len(data), redelivered, self))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.stats.handler_errors += 1
            # one line (a hostile message must not fill the log with tracebacks); EDGETWIN_DEBUG=1 adds it
            log.error("%s: handler for %s failed on %s from %s: %r", self.name, subject, env.kind, env.sender, e,
                      exc_info=_debug())
            return "nak"
        return "ack"

    def _count_out(self, subject: str, nbytes: int) -> None:
        self.stats.published += 1
        self.stats.bytes_out += nbytes
        # Reply inboxes are unique per request: pool them so the counter stays small.
        self.stats.bytes_out_by_subject[INBOX if subject.startswith(INBOX + ".") else subject] += nbytes


def _debug() -> bool:
    return os.environ.get("EDGETWIN_DEBUG", "") not in ("", "0")


def check_durable_subject(subject: str, patterns: Iterable[str]) -> None:
    patterns = list(patterns)
    if not any(subject_matches(p, subject) for p in patterns):
        raise InputError(f"{subject!r} is not a durable subject (durable subjects: {patterns})", where="subject")


def check_durable_filter(subject: str, patterns: Iterable[str]) -> None:
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
