"""The decision subject in formats any NATS client speaks: JSON or Arrow IPC bodies, metadata in headers.

The platform that asks an edge runtime for decisions is rarely Python (a Kubernetes scheduler
plugin is Go), so besides the edgetwin binary frame (`edgetwin.edge.messages`) the runtime's
decision subject ``edgetwin.decision.<site>`` answers plain NATS requests whose body is

- **JSON** (``Content-Type: application/json``): ``{"obs": [[...], ...]}`` rows in the policy's
  observation column order, or one row ``{"obs": [...]}``; optional ``"columns"`` (the names of
  the row entries, in the order sent: the runtime reorders them and refuses a set that differs
  from the policy's), ``"site"``; and, so that a canary serves each row by its arm
  (`edgetwin.edge.canary_slice`), the rows' service groups ``"agents"`` (and ``"sites"``,
  ``"scenarios"``: lists of strings, one per row) and the tick ``"t"`` (an integer: the key its
  outcome report joins on, `edgetwin.edge.canary_command`). Cheapest for a few observations.
- **Arrow IPC stream** (``Content-Type: application/vnd.apache.arrow.stream``): one record batch
  (or several) with one numeric column per observation column, named as in the spec (any order),
  or a single column ``obs`` of fixed-size lists; the service groups as string columns
  ``agent`` (and ``site``, ``scenario``), the tick as the schema metadata key ``t``. Cheapest for
  batches (no numbers as text); ``docs/bus.md`` gives the measured crossover.

Every format may also name the tick in the ``Edgetwin-Tick`` header. Whatever the order of the
columns a request used, the observations handed to the policy are a fresh C-contiguous float64
array in the served column order (`as_served`): the same rows then take the same BLAS path and get
the same bits, however they were sent.

Without a ``Content-Type`` the body is sniffed: ``{`` starts JSON, the Arrow continuation marker
``0xFFFFFFFF`` starts Arrow, ``ET`` starts an edgetwin frame (served exactly as before).

The reply has the request's format (errors are always JSON) and carries its metadata in NATS
headers: ``Edgetwin-Policy-Version`` (the pointer revision), ``Edgetwin-Version``,
``Edgetwin-Scope``; when the request named its groups, the reply also says per row which
registry version (``policies``) and arm (``arms``: ``candidate`` / ``control`` / ``fleet``)
decided it and the action's ``propensity`` (JSON fields; Arrow columns ``policy``, ``arm``,
``propensity`` after the action columns); and the request's ``Nats-Msg-Id`` echoed back (a request id for the caller's
correlation and logs; core request/reply is not stored, so JetStream's de-duplication does not
apply to it: a retried request is answered again). A request that cannot be answered gets a reply
with the NATS services convention's ``Nats-Service-Error`` / ``Nats-Service-Error-Code`` headers
(400 bad request, 413 too large, 415 unknown body, 503 no policy loaded yet, 500 the policy
failed) and the body ``{"error": reason, "code": code}``; it never crashes the runtime.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from edgetwin.edge.messages import MAGIC

__all__ = [
    "ARROW",
    "CONTENT_TYPE",
    "ERROR",
    "ERROR_CODE",
    "FRAME",
    "JSON",
    "MSG_ID",
    "POLICY_VERSION",
    "SCOPE",
    "SITE",
    "TICK",
    "VERSION",
    "BadDecisionRequest",
    "WireRequest",
    "content_type",
    "as_served",
    "encode_error",
    "encode_reply",
    "is_frame",
    "parse_request",
    "request_id",
]

CONTENT_TYPE = "Content-Type"
JSON = "application/json"
ARROW = "application/vnd.apache.arrow.stream"
FRAME = "application/vnd.edgetwin.frame"
MSG_ID = "Nats-Msg-Id"
ERROR = "Nats-Service-Error"
ERROR_CODE = "Nats-Service-Error-Code"
POLICY_VERSION = "Edgetwin-Policy-Version"
VERSION = "Edgetwin-Version"
SCOPE = "Edgetwin-Scope"
SITE = "Edgetwin-Site"
TICK = "Edgetwin-Tick"
#: Arrow string columns that name a row's service group, site and scenario (not observations)
ID_COLUMNS = ("agent", "site", "scenario")

_ARROW_MARKER = b"\xff\xff\xff\xff"
_JSON_FIELDS = frozenset({"obs", "columns", "site", "deadline_ms", "agents", "sites", "scenarios", "t"})
#: JSON list field -> Arrow column of the same ids
_ID_FIELDS = {"agents": "agent", "sites": "site", "scenarios": "scenario"}


class BadDecisionRequest(ValueError):
    """A decision request that cannot be answered; ``code`` is its HTTP-like status (400, 413, 415)."""

    def __init__(self, reason: str, code: int = 400) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


@dataclass(frozen=True)
class WireRequest:
    """A parsed JSON / Arrow decision request.

    Attributes:
        obs: (N, O) float64 observations, in the order of the columns they were checked against.
        fmt: `JSON` or `ARROW` (the reply uses the same).
        msg_id: the request's ``Nats-Msg-Id`` header, echoed in the reply.
        agents, sites, scenarios: (N,) the rows' service groups, sites and scenarios, when sent.
        t: the tick the request names (None: not named).
    """

    obs: np.ndarray
    fmt: str
    msg_id: str | None
    agents: tuple[str, ...] | None = None
    sites: tuple[str, ...] | None = None
    scenarios: tuple[str, ...] | None = None
    t: int | None = None


def _header(headers: Mapping[str, str], name: str) -> str | None:
    # NATS header names are case-sensitive on the wire, but clients differ in how they spell them.
    v = headers.get(name)
    if v is not None:
        return v
    low = name.lower()
    for k, val in headers.items():
        if k.lower() == low:
            return val
    return None


def request_id(headers: Mapping[str, str]) -> str | None:
    """The request's ``Nats-Msg-Id`` header (echoed in the reply), or None."""
    return _header(headers, MSG_ID)


def content_type(headers: Mapping[str, str]) -> str | None:
    """The request's media type (parameters such as ``; charset=utf-8`` dropped), or None."""
    ct = _header(headers, CONTENT_TYPE)
    return ct.split(";", 1)[0].strip().lower() if ct else None


def is_frame(data: bytes, headers: Mapping[str, str]) -> bool:
    """Whether the body is an edgetwin binary frame (served by the envelope path)."""
    ct = content_type(headers)
    return ct == FRAME if ct is not None else data[:2] == MAGIC


def _sniff(data: bytes) -> str | None:
    if data[:4] == _ARROW_MARKER:
        return ARROW
    head = data.lstrip()[:1]
    return JSON if head == b"{" else None


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name}")


def as_served(obs: np.ndarray) -> np.ndarray:
    """``obs`` as the policy gets it: C-contiguous float64, a fresh array when it was not already
    one. A column-reordered view is Fortran-ordered, and a matrix product over it may take another
    BLAS kernel and give other last bits than the same rows in row-major order (issue 46)."""
    return np.ascontiguousarray(obs, dtype=np.float64)


def _reorder(obs: np.ndarray, sent: Sequence[str], columns: Sequence[str]) -> np.ndarray:
    """Columns of ``obs`` named ``sent`` -> the order of ``columns`` (a fresh C-contiguous array,
    `as_served`); refuse any other set."""
    if len(set(sent)) != len(sent):
        raise BadDecisionRequest(f"columns are repeated: {sorted({c for c in sent if list(sent).count(c) > 1})}")
    missing, extra = [c for c in columns if c not in sent], [c for c in sent if c not in columns]
    if missing or extra:
        raise BadDecisionRequest(
            f"observation columns differ from the policy's {list(columns)}: missing {missing}, unknown {extra}"
        )
    if list(sent) == list(columns):
        return obs
    where = {c: j for j, c in enumerate(sent)}
    return as_served(obs[:, [where[c] for c in columns]])


def _has_bool(obs: object, data: bytes) -> bool:
    """Whether JSON ``true``/``false`` sit among the numbers of ``obs``: numpy reads ``[1, true, 2]``
    as ``[1, 1, 2]`` (and ``[1.5, true]`` as ``[1.5, 1.0]``) without a word. The walk runs only when
    the body holds the word at all (``obs`` is at most numpy's 64 dimensions deep by now)."""
    if b"true" not in data and b"false" not in data:
        return False
    if isinstance(obs, bool):
        return True
    return isinstance(obs, list) and any(_has_bool(v, data) for v in obs)


def _ids(values: object, n: int, name: str) -> tuple[str, ...]:
    if not isinstance(values, list) or len(values) != n or not all(isinstance(v, str) for v in values):
        raise BadDecisionRequest(f'"{name}" must be {n} strings, one per observation row')
    return tuple(values)


def _tick(value: object, where: str) -> int:
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise BadDecisionRequest(f"{where} must be an integer tick, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadDecisionRequest(f"{where} must be an integer tick >= 0, got {value!r}")
    return value


def _json_ids(doc: Mapping[str, object], n: int) -> dict[str, object]:
    """The ids and tick a JSON request names (`WireRequest` fields)."""
    out: dict[str, object] = {k: _ids(doc[k], n, k) for k in _ID_FIELDS if k in doc}
    if ("sites" in out or "scenarios" in out) and "agents" not in out:
        raise BadDecisionRequest('"sites" / "scenarios" need "agents" (the rows\' service groups)')
    if "t" in doc:
        out["t"] = _tick(doc["t"], '"t"')
    return out


def _parse_json(data: bytes, columns: Sequence[str] | None, site: str) -> tuple[np.ndarray, dict[str, object]]:
    try:
        doc = json.loads(data, parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as e:
        raise BadDecisionRequest(f"body is not valid JSON: {e}") from None
    except RecursionError:
        raise BadDecisionRequest("body is JSON nested too deeply") from None
    if not isinstance(doc, dict):
        raise BadDecisionRequest('body must be a JSON object {"obs": [[...], ...]}')
    unknown = sorted(set(doc) - _JSON_FIELDS)
    if unknown:
        raise BadDecisionRequest(f"unknown field(s) {unknown}; expected {sorted(_JSON_FIELDS)}")
    if "site" in doc and doc["site"] != site:
        raise BadDecisionRequest(f"request for site {doc['site']!r} reached {site!r}")
    if "deadline_ms" in doc and (
        isinstance(doc["deadline_ms"], bool)
        or not isinstance(doc["deadline_ms"], int | float)
        or not math.isfinite(doc["deadline_ms"])
    ):
        raise BadDecisionRequest("deadline_ms must be a number")
    if "obs" not in doc:
        raise BadDecisionRequest('missing field "obs" (a list of observation rows)')
    try:
        obs = np.asarray(doc["obs"])
    except ValueError as e:  # ragged rows
        raise BadDecisionRequest(f'"obs" must be rows of equal length: {e}') from None
    if obs.dtype.kind not in "iuf" or obs.size == 0:
        raise BadDecisionRequest('"obs" must be a non-empty list of numbers or of rows of numbers')
    if _has_bool(doc["obs"], data):
        raise BadDecisionRequest('"obs" holds true/false, which are not numbers (send 1/0 if that is what you mean)')
    if obs.ndim == 1:
        obs = obs[None, :]
    if obs.ndim != 2:
        raise BadDecisionRequest(f'"obs" must be a row or a list of rows, got {obs.ndim} dimensions')
    obs = obs.astype(np.float64, copy=False)
    sent = doc.get("columns")
    if sent is not None:
        if not isinstance(sent, list) or not all(isinstance(c, str) for c in sent) or len(sent) != obs.shape[1]:
            raise BadDecisionRequest(f'"columns" must be {obs.shape[1]} column names, one per row entry')
        if columns is not None:
            obs = _reorder(obs, sent, columns)
    return obs, _json_ids(doc, obs.shape[0])


def _u32(b: bytes, i: int) -> int:
    if i < 0 or i + 4 > len(b):
        raise ValueError("flatbuffer offset out of range")
    return int(struct.unpack_from("<I", b, i)[0])


def _field(b: bytes, table: int, index: int) -> int | None:
    """Absolute position of field ``index`` of the flatbuffer table at ``table`` (None: absent)."""
    vt = table - struct.unpack_from("<i", b, table)[0]
    if vt < 0 or vt + 4 > len(b):
        raise ValueError("flatbuffer vtable out of range")
    vt_size = struct.unpack_from("<H", b, vt)[0]
    if 4 + 2 * index + 2 > vt_size:
        return None
    off = struct.unpack_from("<H", b, vt + 4 + 2 * index)[0]
    return None if off == 0 else table + off


def _batch_decoded_bytes(metadata: bytes, body: bytes) -> int:
    """The bytes a record-batch message's buffers take once decoded, read from its flatbuffer
    metadata (Arrow's ``Message.fbs``: Message.header -> RecordBatch.buffers, .compression) and,
    for compressed buffers, from the uncompressed length each one starts with, before anything
    is decompressed."""
    root = _u32(metadata, 0)
    header = _field(metadata, root, 2)  # Message.header (a union's value: offset to RecordBatch)
    if header is None:
        raise ValueError("record batch message without a header")
    rb = header + _u32(metadata, header)
    compressed = _field(metadata, rb, 3) is not None  # RecordBatch.compression
    bufs = _field(metadata, rb, 2)  # RecordBatch.buffers: [Buffer {offset: long, length: long}]
    if bufs is None:
        return 0
    vec = bufs + _u32(metadata, bufs)
    n = _u32(metadata, vec)
    if vec + 4 + 16 * n > len(metadata):
        raise ValueError("buffer table runs past the metadata")
    total = 0
    for k in range(n):
        offset, length = struct.unpack_from("<qq", metadata, vec + 4 + 16 * k)
        if offset < 0 or length < 0 or offset + length > len(body):
            raise ValueError("a buffer lies outside the message body")
        if compressed and length >= 8:
            raw = struct.unpack_from("<q", body, offset)[0]
            total += length - 8 if raw == -1 else raw
        else:
            total += length
    return total


def _check_arrow_size(data: bytes, max_decoded: int) -> None:
    """Refuse an Arrow stream whose record batches would decode to more than ``max_decoded``
    bytes (a zstd- or lz4-compressed body can be thousands of times smaller than what it
    decodes to: 18.9 KB became 600 MB), or that carries dictionary batches (observations are
    numbers), before pyarrow decompresses anything."""
    import pyarrow as pa

    try:
        total = 0
        for msg in pa.ipc.MessageReader.open_stream(pa.py_buffer(data)):
            if msg.type == "dictionary batch":
                raise BadDecisionRequest("Arrow dictionary batches are not accepted (send numeric columns)")
            if msg.type == "record batch":
                body = msg.body.to_pybytes() if msg.body is not None else b""
                total += _batch_decoded_bytes(msg.metadata.to_pybytes(), body)
                if total > max_decoded:
                    raise BadDecisionRequest(f"the Arrow body decodes to more than max_bytes={max_decoded}", 413)
    except BadDecisionRequest:
        raise
    except (pa.ArrowException, OSError, ValueError, struct.error) as e:
        raise BadDecisionRequest(f"body is not an Arrow IPC stream: {e}") from None


def _arrow_ids(batch: object, schema: object) -> dict[str, object]:
    """The id columns (`ID_COLUMNS`, strings without nulls) and the metadata tick of an Arrow request."""
    import pyarrow as pa

    out: dict[str, object] = {}
    names = schema.names  # type: ignore[attr-defined]
    for field_name, col in _ID_FIELDS.items():
        if col not in names:
            continue
        arr = batch.column(names.index(col))  # type: ignore[attr-defined]
        if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)) or arr.null_count:
            raise BadDecisionRequest(f"Arrow column {col!r} must hold strings without nulls, got {arr.type}")
        out[field_name] = tuple(arr.to_pylist())
    if ("sites" in out or "scenarios" in out) and "agents" not in out:
        raise BadDecisionRequest("Arrow columns 'site' / 'scenario' need the column 'agent' (the rows' service groups)")
    meta = schema.metadata or {}  # type: ignore[attr-defined]
    if b"t" in meta:
        out["t"] = _tick(meta[b"t"].decode(errors="replace"), "Arrow schema metadata 't'")
    return out


def _parse_arrow(
    data: bytes, columns: Sequence[str] | None, max_decoded: int | None = None
) -> tuple[np.ndarray, dict[str, object]]:
    import pyarrow as pa

    if max_decoded is not None:
        _check_arrow_size(data, max_decoded)
    try:
        with pa.ipc.open_stream(pa.py_buffer(data)) as reader:
            batches = list(reader)
            schema = reader.schema
    except (pa.ArrowException, OSError, ValueError) as e:
        raise BadDecisionRequest(f"body is not an Arrow IPC stream: {e}") from None
    if not batches or sum(b.num_rows for b in batches) == 0:
        raise BadDecisionRequest("the Arrow stream has no rows")
    # One batch is the common case: its columns are read as they are, without a Table.
    batch = batches[0] if len(batches) == 1 else pa.Table.from_batches(batches, schema).combine_chunks().to_batches()[0]
    ids = _arrow_ids(batch, schema)
    keep = [j for j, n in enumerate(schema.names) if n not in ID_COLUMNS]
    names = [schema.names[j] for j in keep]
    types = [schema.types[j] for j in keep]
    if names == ["obs"] and (pa.types.is_fixed_size_list(types[0]) or pa.types.is_list(types[0])):
        flat = batch.column(keep[0])
        if flat.null_count:
            raise BadDecisionRequest(f"Arrow column 'obs' has {flat.null_count} null rows")
        if pa.types.is_fixed_size_list(types[0]):
            width = types[0].list_size
        else:
            widths = np.unique(flat.value_lengths().to_numpy(zero_copy_only=False))
            if len(widths) != 1:
                raise BadDecisionRequest("Arrow column 'obs' must hold rows of equal length")
            width = int(widths[0])
        values = flat.flatten()
        if values.null_count or not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
            raise BadDecisionRequest(f"Arrow column 'obs' must hold numbers without nulls, got {values.type}")
        return as_served(values.to_numpy(zero_copy_only=False).reshape(batch.num_rows, width)), ids
    for name, t in zip(names, types, strict=True):
        if not (pa.types.is_floating(t) or pa.types.is_integer(t)):
            raise BadDecisionRequest(f"Arrow column {name!r} must be numeric, got {t}")
    if columns is None:
        raise BadDecisionRequest("named Arrow columns need a policy with a spec (send a single 'obs' list column)")
    sent, want = set(names), set(columns)
    if sent != want or len(sent) != len(names):
        missing, extra = [c for c in columns if c not in sent], [c for c in names if c not in want]
        raise BadDecisionRequest(
            f"observation columns differ from the policy's {list(columns)}: missing {missing}, unknown {extra}"
            + (" (repeated names)" if len(sent) != len(names) else "")
        )
    try:  # one C++ call for all columns, in the policy's order (a Python loop over them costs 15x more)
        out = np.asarray(batch.select(list(columns)).to_tensor(row_major=True))
    except pa.ArrowException as e:  # nulls, mostly
        raise BadDecisionRequest(f"Arrow columns cannot be read as numbers: {e}") from None
    return as_served(out), ids


def parse_request(
    data: bytes,
    headers: Mapping[str, str],
    columns: Sequence[str] | None,
    site: str,
    max_bytes: int | None = None,
) -> WireRequest:
    """Parse a JSON or Arrow decision request.

    Args:
        data: the body; headers: its NATS headers.
        columns: the served policy's observation columns (named columns are checked against them
            and reordered to them); None when no policy is loaded (rows are then taken as sent).
        site: this runtime's site (a request naming another site is refused).
        max_bytes: the largest body accepted, and the most bytes an Arrow body may decode to
            (checked before anything is decompressed).

    Returns:
        The `WireRequest`; its ``obs`` still goes through the runtime's width / finiteness checks.

    Raises:
        BadDecisionRequest: with the reason and code (400, 413, 415).
    """
    if max_bytes is not None and len(data) > max_bytes:
        raise BadDecisionRequest(f"{len(data)} bytes > max_bytes={max_bytes}", 413)
    hsite = _header(headers, SITE)
    if hsite is not None and hsite != site:
        raise BadDecisionRequest(f"request for site {hsite!r} reached {site!r}")
    ct = content_type(headers)
    fmt = ct if ct is not None else _sniff(data)
    if fmt in (JSON, ARROW):
        try:
            obs, ids = _parse_json(data, columns, site) if fmt == JSON else _parse_arrow(data, columns, max_bytes)
            htick = _header(headers, TICK)
            if htick is not None:
                ids.setdefault("t", _tick(htick, f"header {TICK}"))
        except BadDecisionRequest:
            raise
        except Exception as e:  # a malformed body no check above foresaw: the request's fault, not the policy's
            raise BadDecisionRequest(f"could not read the {fmt} body: {type(e).__name__}: {e}") from None
    else:
        raise BadDecisionRequest(
            f"unsupported body ({'Content-Type ' + repr(ct) if ct else 'no Content-Type, not recognised'}): "
            f"send {JSON}, {ARROW} or an edgetwin frame",
            415,
        )
    return WireRequest(obs, fmt, _header(headers, MSG_ID), **ids)  # type: ignore[arg-type]


def _meta_headers(fmt: str, msg_id: str | None) -> dict[str, str]:
    h = {CONTENT_TYPE: fmt}
    if msg_id:
        h[MSG_ID] = msg_id
    return h


def encode_reply(
    fmt: str,
    actions: np.ndarray,
    action_columns: Sequence[str],
    *,
    version: str,
    scope: str,
    revision: int,
    msg_id: str | None = None,
    policies: Sequence[str] | None = None,
    arms: Sequence[str] | None = None,
    propensity: np.ndarray | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The reply body and headers for ``actions`` (N, A) in the request's format.

    JSON: ``{"actions": [[...]], "action_columns": [...], "version", "scope", "policy_version"}``
    (floats printed with Python's shortest round-trip repr: they parse back to the same float64).
    Arrow: one record batch, one float64 column per action column, the same fields in the
    schema's metadata. With ``policies`` / ``arms`` / ``propensity`` (a request that named its
    groups): JSON fields of those names (a NaN propensity, unknown, as null), Arrow columns
    ``policy``, ``arm``, ``propensity`` after the action columns.
    """
    headers = _meta_headers(fmt, msg_id)
    headers.update({POLICY_VERSION: str(int(revision)), VERSION: version, SCOPE: scope})
    if fmt == ARROW:
        import pyarrow as pa

        a = np.asarray(actions, dtype=np.float64)
        cols = [pa.array(a[:, j]) for j in range(a.shape[1])]
        names = list(action_columns)
        if policies is not None and arms is not None and propensity is not None:
            cols += [pa.array([str(p) for p in policies]), pa.array([str(x) for x in arms]),
                     pa.array(np.asarray(propensity, dtype=np.float64))]  # fmt: skip
            names += ["policy", "arm", "propensity"]
        batch = pa.record_batch(
            cols,
            names=names,
            metadata={"version": version, "scope": scope, "policy_version": str(int(revision))},
        )
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as w:
            w.write_batch(batch)
        return sink.getvalue().to_pybytes(), headers
    body = {
        "actions": np.asarray(actions, dtype=np.float64).tolist(),
        "action_columns": list(action_columns),
        "version": version,
        "scope": scope,
        "policy_version": int(revision),
    }
    if policies is not None and arms is not None and propensity is not None:
        body["policies"] = [str(p) for p in policies]
        body["arms"] = [str(x) for x in arms]
        body["propensity"] = [float(v) if math.isfinite(v) else None for v in np.asarray(propensity, dtype=np.float64)]
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode(), headers


def encode_error(code: int, reason: str, msg_id: str | None = None) -> tuple[bytes, dict[str, str]]:
    """An error reply: ``{"error": reason, "code": code}`` (JSON) and the NATS service-error headers."""
    headers = _meta_headers(JSON, msg_id)
    headers[ERROR] = " ".join(reason.split())[:1000]  # one line: a header value cannot hold newlines
    headers[ERROR_CODE] = str(int(code))
    return json.dumps({"error": reason, "code": int(code)}).encode(), headers

