"""Versioned bus messages: one `Envelope` type, a compact binary frame, validation on receipt.

Wire frame (all integers little-endian)::

    b"ET" | v: u8 | header_len: u32 | header: UTF-8 JSON (header_len bytes) | tensor bytes

A signed frame's header also has ``auth`` (``{"alg": "ed25519", "sig": base64}``) over
`signing_payload`; `decode` keeps the signature and what it covers on the envelope, and a bus with
``auth`` set checks it (`edgetwin.edge.message_auth`), rejecting as ``unauthenticated``.

The JSON header holds ``kind``, ``sender``, ``round``, ``ts`` (unix seconds), ``id`` (unique per
message; JetStream de-duplicates retried publishes by it), ``payload`` (a JSON object whose fields
depend on ``kind``) and ``tensors``: ``[[name, dtype, shape], ...]`` describing the raw arrays that
follow, in order. A small control message is a few dozen bytes of JSON; a model update carries its
parameters as raw float32 / int8 / bitmap bytes (no base64, no per-number text), so the frame is
within a few hundred bytes of `EncodedUpdate.encoded_nbytes`.

`decode` checks, in this order, and raises `MessageRejected` with one of the `REASONS`:
``oversized`` (more than ``max_bytes``), ``malformed`` (bad magic, header, JSON, tensor table or
lengths), ``unknown_version`` (a schema version this build does not read), ``unknown_kind`` and
``invalid_payload`` (the kind's schema: required fields, their types, finite numbers, tensors).
The bus counts each reason in ``bus.stats.rejected`` and never passes such a message to a handler.

Kinds are registered with `register_kind`; the ones registered here and by the modules that own the
others (``model_update`` / ``global_model`` by `edgetwin.federation.compression`, the runtime's by
`edgetwin.edge.runtime`) are listed in `KINDS` and documented in ``docs/bus.md``. The federation's model updates are put into and read out of envelopes by
`edgetwin.federation.compression.model_update` / `decode_update`, beside their codec.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import struct
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgetwin.contract.errors import InputError

__all__ = [
    "KINDS",
    "MAGIC",
    "REASONS",
    "SCHEMA_VERSION",
    "Envelope",
    "KindSchema",
    "MessageRejected",
    "NUMBER",
    "decode",
    "encode",
    "signing_payload",
    "register_kind",
    "type_ok",
    "validate",
]

MAGIC = b"ET"
SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})
_PREFIX = struct.Struct("<2sBI")  # magic, v, header_len
REASONS = ("oversized", "malformed", "unknown_version", "unknown_kind", "invalid_payload", "unauthenticated")
#: what a signature covers: this tag, then the SHA-256 of the canonical header (sorted keys, without
#: ``auth``) followed by the raw tensor bytes (`signing_payload`)
AUTH_FORMAT = b"edgetwin-envelope/1\n"
# dtypes a tensor may have on the wire; anything else (object, strings, ...) is malformed.
_DTYPES = frozenset({"float16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool"})
# Per dtype name: (its little-endian wire dtype, its native dtype), and native dtype -> name. Looked
# up once here: `np.dtype(...)`, `.newbyteorder` and `dtype.name` cost microseconds per call, and a
# decision request / reply pays them on every tensor of both frames.
_WIRE = {n: (np.dtype(n).newbyteorder("<"), np.dtype(n)) for n in _DTYPES}
_NAME = {np.dtype(n): n for n in _DTYPES}
_MAX_DIMS = 8


class MessageRejected(ValueError):
    """A received message that is not used; ``reason`` is one of `REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        assert reason in REASONS, reason
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


@dataclass
class Envelope:
    """One bus message.

    Attributes:
        kind: what it is (``"model_update"``, ``"intent"``, ...): selects the payload schema.
        sender: the agent that sent it (e.g. ``"esa/site-3"``).
        round: the federated round it belongs to (0 outside rounds).
        payload: JSON-able fields, checked against the kind's `KindSchema`.
        tensors: named arrays sent as raw bytes (parameters, observations, ...).
        v: schema version of the envelope.
        ts: send time, unix seconds.
        msg_id: unique id (hex); retried durable publishes reuse it so they are stored once.
    """

    kind: str
    sender: str
    round: int = 0
    payload: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    v: int = SCHEMA_VERSION
    ts: float = field(default_factory=time.time)
    msg_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: set by `decode`: the Ed25519 signature the frame carried (None: unsigned) and the bytes it
    #: must verify over (`signing_payload`); checked by `edgetwin.edge.message_auth.MessageAuth`
    signature: bytes | None = field(default=None, compare=False, repr=False)
    signed_payload: bytes | None = field(default=None, compare=False, repr=False)


# ------------------------------------------------------------------------------ schemas
#: the JSON number types a numeric payload field accepts (``bool`` excluded by `type_ok`)
NUMBER = (int, float)


@dataclass(frozen=True)
class KindSchema:
    """What a kind's payload must hold.

    Attributes:
        required: field -> accepted Python type(s); ``int`` never accepts ``bool``.
        optional: the same, for fields that may be absent.
        tensors: names of arrays that must be present.
        check: extra validation; raise ``ValueError`` with the reason.
    """

    required: Mapping[str, type | tuple[type, ...]] = field(default_factory=dict)
    optional: Mapping[str, type | tuple[type, ...]] = field(default_factory=dict)
    tensors: tuple[str, ...] = ()
    check: Callable[[Envelope], None] | None = None


KINDS: dict[str, KindSchema] = {}


def register_kind(kind: str, schema: KindSchema) -> None:
    """Make ``kind`` known to `encode` / `decode` (agents register their own kinds at import)."""
    if not kind or not isinstance(kind, str):
        raise InputError("a message kind is a non-empty string", where="kind")
    KINDS[kind] = schema


def type_ok(value: Any, types: type | tuple[type, ...]) -> bool:
    """Whether a payload value has one of ``types``; a bool is never an int, a float must be finite."""
    types = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool) and bool not in types:
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return isinstance(value, types)


def _check_intent(env: Envelope) -> None:
    for i, m in enumerate(env.payload["migrations"]):
        if not isinstance(m, dict) or not isinstance(m.get("service"), str) or not isinstance(m.get("to"), str):
            raise ValueError(f"migrations[{i}] must be {{'service': str, 'to': str, ...}}")


def _check_round_control(env: Envelope) -> None:
    if env.payload["action"] not in ("open", "close"):
        raise ValueError("action must be 'open' or 'close'")


for _kind, _schema in {
    # ESA intents (seed 003 §4.2): predicted backlog, tentative migrations
    "intent": KindSchema(
        required={"site": str, "cluster": str, "predicted_backlog": NUMBER, "migrations": list},
        optional={"congestion": NUMBER, "horizon_s": NUMBER, "risk": NUMBER},
        check=_check_intent,
    ),
    # COA -> GCA cluster summaries
    "summary": KindSchema(required={"cluster": str, "stats": dict}),
    "policy_version": KindSchema(
        required={"version": int, "uri": str, "sha256": str}, optional={"metrics": dict, "spec_hash": str}
    ),
    # agents / sites / scenarios (one per row): the rows' service groups, so that a canary's slice
    # gets its arm's policy; the reply then names each row's policy and arm (and carries `propensity`);
    # `t`: the tick the decisions are for (what the system's outcome report joins on)
    "decision_request": KindSchema(
        required={"site": str},
        optional={"deadline_ms": NUMBER, "agents": list, "sites": list, "scenarios": list, "t": int},
        tensors=("obs",),
    ),
    "decision_reply": KindSchema(required={"policy_version": int}, optional={"policies": list, "arms": list},
                                 tensors=("actions",)),
    "round_control": KindSchema(
        required={"level": str, "group": str, "action": str},
        optional={"deadline_s": NUMBER, "participants": list},
        check=_check_round_control,
    ),
    "error": KindSchema(required={"reason": str}),
}.items():
    register_kind(_kind, _schema)


def validate(env: Envelope) -> None:
    """Check ``env`` against its kind's schema; raise `MessageRejected` if it does not fit."""
    if env.v not in SUPPORTED_VERSIONS:
        raise MessageRejected("unknown_version", f"schema version {env.v}, this build reads {sorted(SUPPORTED_VERSIONS)}")
    schema = KINDS.get(env.kind)
    if schema is None:
        raise MessageRejected("unknown_kind", f"kind {env.kind!r} (known: {sorted(KINDS)})")
    if not isinstance(env.payload, dict):
        raise MessageRejected("invalid_payload", "payload must be a JSON object")
    for name, types in schema.required.items():
        if name not in env.payload:
            raise MessageRejected("invalid_payload", f"{env.kind}: missing field {name!r}")
        if not type_ok(env.payload[name], types):
            raise MessageRejected("invalid_payload", f"{env.kind}: field {name!r} has the wrong type or is not finite")
    for name, types in schema.optional.items():
        if name in env.payload and not type_ok(env.payload[name], types):
            raise MessageRejected("invalid_payload", f"{env.kind}: field {name!r} has the wrong type or is not finite")
    for name in schema.tensors:
        if name not in env.tensors:
            raise MessageRejected("invalid_payload", f"{env.kind}: missing tensor {name!r}")
    if schema.check is not None:
        try:
            schema.check(env)
        except ValueError as e:
            raise MessageRejected("invalid_payload", f"{env.kind}: {e}") from None


# ------------------------------------------------------------------------------ frame
def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name}")


def signing_payload(header: Mapping[str, Any], tensor_bytes: bytes) -> bytes:
    """What an envelope's signature covers: `AUTH_FORMAT` and the SHA-256 of the header as canonical
    JSON (sorted keys, ``auth`` left out) followed by the tensors' raw little-endian bytes. Computed
    from parsed values on both sides, so a receiver does not depend on the sender's JSON spacing."""
    h = {k: v for k, v in header.items() if k != "auth"}
    digest = hashlib.sha256()
    digest.update(json.dumps(h, sort_keys=True, separators=(",", ":"), allow_nan=False).encode())
    digest.update(tensor_bytes)
    return AUTH_FORMAT + digest.digest()


def encode(env: Envelope, max_bytes: int | None = None, sign: Callable[[bytes], bytes] | None = None) -> bytes:
    """Serialise ``env`` into one frame (signed with ``sign`` when given: header field ``auth``).

    Raises:
        InputError: the envelope does not fit its kind's schema, or the frame exceeds ``max_bytes``
            (the sender learns at once instead of every receiver dropping it).
    """
    try:
        validate(env)
    except MessageRejected as e:
        raise InputError(str(e), where=f"message {env.kind!r} from {env.sender!r}") from None
    table, blobs = [], []
    for name, arr in env.tensors.items():
        a = np.asarray(arr)
        dname = _NAME.get(a.dtype)  # native byte order; a big-endian array is looked up by name
        if dname is None:
            dname = a.dtype.name if a.dtype.name in _DTYPES else None
            if dname is None:
                raise InputError(f"tensor {name!r} has dtype {a.dtype}, expected one of {sorted(_DTYPES)}", where="tensors")
        a = np.ascontiguousarray(a, dtype=_WIRE[dname][0])
        table.append([name, dname, list(a.shape)])
        blobs.append(a.tobytes())
    header = {
        "kind": env.kind,
        "sender": env.sender,
        "round": int(env.round),
        "ts": float(env.ts),
        "id": env.msg_id,
        "payload": env.payload,
        "tensors": table,
    }
    try:
        if sign is not None:
            header["auth"] = {"alg": "ed25519", "sig": base64.b64encode(sign(signing_payload(header, b"".join(blobs)))).decode()}
        hb = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        raise InputError(f"payload is not JSON-serialisable with finite numbers: {e}", where=f"message {env.kind!r}") from None
    frame = b"".join([_PREFIX.pack(MAGIC, env.v, len(hb)), hb, *blobs])
    if max_bytes is not None and len(frame) > max_bytes:
        raise InputError(f"message is {len(frame)} bytes, above max_bytes={max_bytes}", where=f"message {env.kind!r}")
    return frame


def decode(data: bytes, max_bytes: int | None = None) -> Envelope:
    """Parse and validate one frame; raise `MessageRejected` (with a reason) if it is not usable."""
    n = len(data)
    if max_bytes is not None and n > max_bytes:
        raise MessageRejected("oversized", f"{n} bytes > max_bytes={max_bytes}")
    if n < _PREFIX.size:
        raise MessageRejected("malformed", f"{n} bytes is shorter than the {_PREFIX.size}-byte prefix")
    magic, v, hlen = _PREFIX.unpack_from(data, 0)
    if magic != MAGIC:
        raise MessageRejected("malformed", f"bad magic {magic!r}")
    if v not in SUPPORTED_VERSIONS:
        raise MessageRejected("unknown_version", f"schema version {v}, this build reads {sorted(SUPPORTED_VERSIONS)}")
    if _PREFIX.size + hlen > n:
        raise MessageRejected("malformed", f"header length {hlen} runs past the end ({n} bytes)")
    try:
        header = json.loads(bytes(data[_PREFIX.size : _PREFIX.size + hlen]).decode(), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as e:
        raise MessageRejected("malformed", f"header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise MessageRejected("malformed", "header is not a JSON object")
    for key, types in (("kind", str), ("sender", str), ("round", int), ("ts", NUMBER), ("id", str), ("tensors", list)):
        if key not in header or not type_ok(header[key], types):
            raise MessageRejected("malformed", f"header field {key!r} missing or of the wrong type")
    tensors: dict[str, np.ndarray] = {}
    offset = _PREFIX.size + hlen
    for i, spec in enumerate(header["tensors"]):
        if not (isinstance(spec, list) and len(spec) == 3 and isinstance(spec[0], str) and spec[1] in _DTYPES):
            raise MessageRejected("malformed", f"tensor table entry {i} is not [name, dtype, shape]")
        name, dtype, shape = spec
        if not (isinstance(shape, list) and len(shape) <= _MAX_DIMS and all(type_ok(d, int) and d >= 0 for d in shape)):
            raise MessageRejected("malformed", f"tensor {name!r} has an invalid shape {shape!r}")
        dt, native = _WIRE[dtype]
        nbytes = math.prod(shape) * dt.itemsize
        if offset + nbytes > n:
            raise MessageRejected("malformed", f"tensor {name!r} needs {nbytes} bytes, frame ends first")
        # a writable array in native byte order (a copy: the frame's bytes are read-only)
        tensors[name] = np.frombuffer(data, dtype=dt, count=nbytes // dt.itemsize, offset=offset).reshape(shape).astype(native)
        offset += nbytes
    if offset != n:
        raise MessageRejected("malformed", f"{n - offset} trailing bytes after the tensors")
    signature, signed = None, None
    auth = header.get("auth")
    if auth is not None:
        if not (isinstance(auth, dict) and auth.get("alg") == "ed25519" and isinstance(auth.get("sig"), str)
                and len(auth["sig"]) <= 128):
            raise MessageRejected("malformed", "header field 'auth' is not {alg: ed25519, sig: base64}")
        try:
            signature = base64.b64decode(auth["sig"], validate=True)
        except ValueError:
            raise MessageRejected("malformed", "header field 'auth.sig' is not base64") from None
        signed = signing_payload(header, bytes(data[_PREFIX.size + hlen :]))
    env = Envelope(
        kind=header["kind"],
        sender=header["sender"],
        round=header["round"],
        payload=header.get("payload", {}),
        tensors=tensors,
        v=v,
        ts=float(header["ts"]),
        msg_id=header["id"],
        signature=signature,
        signed_payload=signed,
    )
    validate(env)
    return env
