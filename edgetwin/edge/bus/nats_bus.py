"""`NatsBus`: the bus over NATS (nats-py), configured by `NatsConfig`.

Core NATS for pub/sub and request/reply; JetStream (a file-backed stream over
`NatsConfig.durable_subjects`, durable pull consumers, explicit ack) for `publish_durable` /
`subscribe_durable`. Reconnects with exponential backoff and jitter; publishes that must be durable
are retried until the server acknowledges them (de-duplicated by message id).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import ssl
import tomllib
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from edgetwin.contract.errors import InputError
from edgetwin.edge.bus.base import (
    DEFAULT_DURABLE_SUBJECTS,
    DEFAULT_MAX_BYTES,
    Bus,
    Handler,
    NoResponders,
    RawHandler,
    RawMessage,
    Subscription,
    check_durable_filter,
    check_durable_subject,
    check_subject,
)
from edgetwin.edge.messages import Envelope

__all__ = ["NatsBus", "NatsConfig"]

log = logging.getLogger("edgetwin.bus")


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
            check_subject(p, wildcards=True, what=f"{where}: durable_subjects")

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
        self._stopping = False
        self.task = asyncio.create_task(self._run(), name=f"natsdurable:{durable}")

    async def _run(self) -> None:
        import nats.errors
        import nats.js.errors

        failures = 0
        while not self._stopping:
            try:
                msgs = await self.psub.fetch(batch=16, timeout=self.bus.config.fetch_timeout_s)
                failures = 0
                if self._stopping:
                    return  # not acked: JetStream redelivers them to the next consumer after ack_wait
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
        """Stop the consumer task, then drop the pull subscription.

        A cancellation alone can be lost: nats-py's ``fetch`` waits in ``asyncio.wait_for``, which on
        Python 3.11 returns the inner result instead of raising when the message and the cancel arrive
        together (CPython gh-86296), and the loop then long-polls forever (a federation test hung 25 min in
        its teardown that way). So the loop also reads a stop flag, and the cancel is repeated until the
        task has ended, never awaited unboundedly.
        """
        self._stopping = True
        while not self.task.done():
            self.task.cancel()
            await asyncio.wait({self.task}, timeout=0.5)
        if not self.task.cancelled() and (exc := self.task.exception()) is not None:
            log.warning("%s: durable %s consumer ended with %r", self.bus.name, self.durable, exc)
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

    async def publish_raw(
        self, subject: str, data: bytes, reply: str | None = None, headers: Mapping[str, str] | None = None
    ) -> None:
        nc = self._require()
        await nc.publish(subject, bytes(data), reply=reply or "", headers=dict(headers) if headers else None)
        self._count_out(subject, len(data))

    async def subscribe(self, subject: str, handler: Handler, queue: str | None = None) -> Subscription:
        nc = self._require()
        check_subject(subject, wildcards=True)

        async def cb(m: Any) -> None:
            await self._dispatch(m.subject, m.data, m.reply or None, handler)

        sub = _NatsSub(subject, await nc.subscribe(subject, queue=queue or "", cb=cb, pending_msgs_limit=65536))
        self._subs.append(sub)
        await self._flush_interest(subject)
        return sub

    async def subscribe_raw(self, subject: str, handler: RawHandler, queue: str | None = None) -> Subscription:
        nc = self._require()
        check_subject(subject, wildcards=True)

        async def cb(m: Any) -> None:
            await self._dispatch_raw(RawMessage(m.subject, m.data, dict(m.headers or {}), m.reply or None), handler)

        sub = _NatsSub(subject, await nc.subscribe(subject, queue=queue or "", cb=cb, pending_msgs_limit=65536))
        self._subs.append(sub)
        await self._flush_interest(subject)
        return sub

    async def _flush_interest(self, subject: str) -> None:
        import nats.errors

        # Return only once the server holds the interest, so that a request sent by anyone after
        # this call finds the subscriber (no spurious NoResponders). While reconnecting the client
        # resends its subscriptions on reconnect, so a failed round trip here is not an error.
        try:
            await self.flush(timeout=self.config.connect_timeout_s)
        except (TimeoutError, nats.errors.Error) as e:
            log.info("%s: subscribed to %s while the server is unreachable (%r)", self.name, subject, e)

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
        check_subject(subject, wildcards=False)
        check_durable_subject(subject, self.config.durable_subjects)
        data = self.encode(msg)
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
        check_subject(subject, wildcards=True)
        check_durable_filter(subject, self.config.durable_subjects)
        check_subject(durable_name, wildcards=False, what="durable_name")
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
