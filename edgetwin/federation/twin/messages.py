"""The messages of a federated twin fit, and why they cannot carry a log's rows.

Both kinds are signed by their sender on an authenticated bus (`edgetwin.edge.message_auth`):
sites take tasks only from the coordinator, the coordinator an update only from the site it names.

Replays across fits: every message binds the run and the round. The coordinator draws a fresh
``run`` nonce per fit (whatever the ``--fit-id``) and every task carries it; each site draws a
fresh ``nonce`` when its agent starts and sends it in its ``hello``, and every later task carries
each site's nonce (``sites``); a site answers a task other than ``hello`` only when it carries its
own nonce, and follows one run only (a site restarted mid-fit asks once, with a ``rejoin`` update
signed by its key, that later tasks carry its new nonce). Every update echoes the task's ``run`` and round (the
envelope's, signed with it), and the coordinator counts an update only for the open round of its
own run. A message's ``ts`` (signed too) must be within `CLOCK_SKEW_S` of the receiver's clock
ahead, and not older than the round it answers (updates) or `MAX_TASK_AGE_S` (tasks): so
yesterday's signed ``done`` task cannot stop today's sites, and yesterday's site updates do not
count as today's, even under the same fit id (`is_fresh`).

Two kinds travel (registered with `edgetwin.edge.messages`, documented in ``docs/bus.md``):

* ``twin_task`` (coordinator -> sites, durable on ``edgetwin.model.twin.<fit>``): which phase and
  step to compute next, the aggregated context the sites need (the twin's layout, the population
  encoding: aggregates, never rows) and, for the weight phases, the current global parameters.
* ``twin_update`` (site -> coordinator, durable on ``edgetwin.update.twin.<fit>``): one site's
  answer, a flat vector encoded by `edgetwin.federation.compression.UpdateCodec` (dense, top-k or
  int8), and its FedAvg weight — or, when the site could not compute the phase, only the name
  of the exception's type (``failed``, an identifier: no message, which could quote a value) and
  an empty vector, so that the coordinator stops waiting for it (`make_failure`).

A ``twin_update`` has a closed payload (no free-form field: extra keys are refused) and its vector
must decode to exactly the size that `edgetwin.federation.twin.fit.TwinFitPlan` declares for its
phase (checked before the vector is allocated: the schema only checks that the encoding is
consistent, `UpdateCodec.check`). Those sizes follow from the spec, the layout and the model architecture — never from how
many rows a site has — so a site cannot put its rows in an update even by mistake: a vector the
size of a row table is refused by the coordinator (`check_update_size`). The only strings a site
sends are in its ``hello``: scenario labels, its site name and column names (the spec's roles),
in a causal fit the ids of the policies it logged over at least ``min_agents`` agents, and the
type name of a failure.
"""

from __future__ import annotations

import re
import secrets
import time
from typing import Any

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.edge.messages import NUMBER, Envelope, KindSchema, register_kind, type_ok
from edgetwin.federation.compression import EncodedUpdate, UpdateCodec

__all__ = [
    "CLOCK_SKEW_S",
    "MAX_TASK_AGE_S",
    "TASK_KIND",
    "UPDATE_KIND",
    "check_update_size",
    "is_fresh",
    "make_failure",
    "make_task",
    "make_update",
    "new_nonce",
    "read_update",
]

TASK_KIND = "twin_task"
UPDATE_KIND = "twin_update"

#: every field a twin update may have: nothing else is accepted
_UPDATE_FIELDS: dict[str, type | tuple[type, ...]] = {"fit": str, "run": str, "phase": str, "step": int, "member": int, "num_samples": NUMBER, "codec": dict}
_UPDATE_OPTIONAL: dict[str, type | tuple[type, ...]] = {"labels": dict, "seconds": NUMBER, "failed": str, "nonce": str}
#: a run's or a site's nonce: 128 random bits in hex (`new_nonce`)
_NONCE = re.compile(r"[0-9a-f]{32}")
#: how far a sender's clock may be ahead of the receiver's (seconds)
CLOCK_SKEW_S = 120.0
#: the oldest task a site takes (seconds): a site that starts late still gets the coordinator's
#: open round (which waits up to its ``timeout_s``, 900 s by default); older tasks are refused
MAX_TASK_AGE_S = 3600.0


def new_nonce() -> str:
    """A fresh run or site nonce (128 bits from the OS's CSPRNG)."""
    return secrets.token_hex(16)


def is_fresh(env: Envelope, oldest: float, now: float | None = None) -> bool:
    """Whether ``env.ts`` (signed with the message) is at least ``oldest`` (unix seconds, less
    `CLOCK_SKEW_S`) and at most `CLOCK_SKEW_S` ahead of ``now``."""
    now = time.time() if now is None else now
    ts = float(env.ts)
    return bool(np.isfinite(ts)) and oldest - CLOCK_SKEW_S <= ts <= now + CLOCK_SKEW_S
#: what a failure may say: an exception type's (qualified) name
_FAILURE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,99}")
#: tensors an `UpdateCodec` produces
_CODEC_TENSORS = frozenset({"values", "q", "idx", "mask", "bitmap", "indices"})
#: the only strings a site ever sends (``labels`` of its ``hello``), and their limits
_LABEL_KEYS = frozenset({"scenarios", "site", "columns", "has_reward", "policies"})
_MAX_LABELS, _MAX_LABEL_CHARS = 512, 200
#: the most values an update may have before the plan exists (a hello sends one: its row count)
_HELLO_VALUES = 16


def _check_update(env: Envelope) -> None:
    if not _NONCE.fullmatch(env.payload["run"]):
        raise ValueError("run must be a run nonce (32 hex digits)")
    if "nonce" in env.payload and (env.payload["phase"] not in ("hello", "rejoin")
                                   or not _NONCE.fullmatch(env.payload["nonce"])):
        raise ValueError("only a hello or a rejoin carries a site nonce (32 hex digits)")
    extra = sorted(set(env.payload) - set(_UPDATE_FIELDS) - set(_UPDATE_OPTIONAL))
    if extra:
        raise ValueError(f"unexpected field(s) {extra}: a twin update carries statistics or parameters only")
    bad = sorted(set(env.tensors) - _CODEC_TENSORS)
    if bad:
        raise ValueError(f"unexpected tensor(s) {bad}")
    for name, arr in env.tensors.items():
        if np.asarray(arr).ndim != 1:
            raise ValueError(f"tensor {name!r} must be flat")
    labels = env.payload.get("labels")
    if labels is not None:
        if env.payload["phase"] != "hello":
            raise ValueError("only a hello carries labels")
        if set(labels) - _LABEL_KEYS:
            raise ValueError(f"unexpected label key(s) {sorted(set(labels) - _LABEL_KEYS)}")
        for k in ("scenarios", "columns", "policies"):
            v = labels.get(k, [])
            if not isinstance(v, list) or len(v) > _MAX_LABELS or not all(
                isinstance(s, str) and len(s) <= _MAX_LABEL_CHARS for s in v
            ):
                raise ValueError(f"labels.{k} must be a list of at most {_MAX_LABELS} short strings")
        if not isinstance(labels.get("site", ""), str) or len(labels.get("site", "")) > _MAX_LABEL_CHARS:
            raise ValueError("labels.site must be a short string")
    try:  # without allocating: the receiver checks the size against the plan (`read_update`)
        size = UpdateCodec.check(EncodedUpdate(dict(env.tensors), env.payload["codec"]))
    except (InputError, ValueError, IndexError, KeyError, TypeError) as e:
        raise ValueError(f"update does not decode: {e}") from None
    if "failed" in env.payload:
        if not _FAILURE_NAME.fullmatch(env.payload["failed"]):
            raise ValueError("failed must name an exception type (an identifier), nothing else")
        if size or labels is not None:
            raise ValueError("a failure carries no vector and no labels")


def _check_task(env: Envelope) -> None:
    if not type_ok(env.payload.get("context", {}), dict):
        raise ValueError("context must be an object")
    if not _NONCE.fullmatch(env.payload["run"]):
        raise ValueError("run must be a run nonce (32 hex digits)")
    sites = env.payload.get("sites", {})
    if not isinstance(sites, dict) or len(sites) > _MAX_LABELS or not all(
        isinstance(k, str) and len(k) <= _MAX_LABEL_CHARS and isinstance(v, str) and _NONCE.fullmatch(v)
        for k, v in sites.items()
    ):
        raise ValueError("sites must map site names to site nonces (32 hex digits)")


register_kind(
    UPDATE_KIND,
    KindSchema(required=_UPDATE_FIELDS, optional=_UPDATE_OPTIONAL, check=_check_update),
)
register_kind(
    TASK_KIND,
    KindSchema(
        required={"fit": str, "run": str, "phase": str, "step": int, "member": int},
        optional={"context": dict, "final": bool, "sites": dict},
        check=_check_task,
    ),
)


def make_task(
    sender: str, fit: str, seq: int, phase: str, step: int, member: int,
    context: dict[str, Any] | None = None, params: np.ndarray | None = None, final: bool = False,
    run: str | None = None, sites: dict[str, str] | None = None,
) -> Envelope:
    """A coordinator's task; ``seq`` (the envelope's round) orders tasks, ``params`` rides as float32.
    ``run``: the coordinator's run nonce (required on the bus); ``sites``: site -> the nonce of its
    hello (every task after the hello)."""
    payload: dict[str, Any] = {"fit": fit, "phase": phase, "step": int(step), "member": int(member)}
    if run is not None:
        payload["run"] = run
    if sites:
        payload["sites"] = dict(sites)
    if context:
        payload["context"] = context
    if final:
        payload["final"] = True
    tensors = {} if params is None else {"params": np.asarray(params, np.float32)}
    return Envelope(kind=TASK_KIND, sender=sender, round=int(seq), payload=payload, tensors=tensors)


def make_update(
    sender: str, fit: str, seq: int, phase: str, step: int, member: int, vector: np.ndarray,
    num_samples: float, codec: UpdateCodec | None = None, labels: dict[str, Any] | None = None,
    seconds: float | None = None, run: str | None = None, nonce: str | None = None,
) -> Envelope:
    """A site's answer: ``vector (D,)`` encoded by ``codec`` (dense float32 when None); ``run``:
    the run nonce of the task it answers (required on the bus); ``nonce``: the site's own (hello)."""
    codec = codec or UpdateCodec(topk=None, quantize_bits=None, error_feedback=False)
    enc = codec.encode(f"{sender}/{phase}/{member}", np.asarray(vector, np.float32))
    payload: dict[str, Any] = {
        "fit": fit, "phase": phase, "step": int(step), "member": int(member),
        "num_samples": float(num_samples), "codec": enc.meta,
    }
    if run is not None:
        payload["run"] = run
    if nonce is not None:
        payload["nonce"] = nonce
    if labels is not None:
        payload["labels"] = labels
    if seconds is not None:
        payload["seconds"] = float(seconds)
    return Envelope(kind=UPDATE_KIND, sender=sender, round=int(seq), payload=payload, tensors=dict(enc.tensors))


def make_failure(sender: str, fit: str, seq: int, phase: str, step: int, member: int, error: BaseException,
                 run: str | None = None) -> Envelope:
    """A site's report that it could not compute task ``seq``: the type of ``error`` only (its
    message could quote a value of the site's log) and an empty vector."""
    env = make_update(sender, fit, seq, phase, step, member, np.zeros(0, np.float32), 0.0, run=run)
    env.payload["failed"] = type(error).__qualname__[:100]
    return env


def read_update(env: Envelope, expected: int | None) -> np.ndarray:
    """The dense float32 vector of a ``twin_update``, whose declared size must be ``expected``
    (the plan's for its phase; None before the plan exists: the hello, a few values) — checked
    before anything is allocated (`InputError` otherwise)."""
    limit = _HELLO_VALUES if expected is None else expected
    enc = EncodedUpdate(dict(env.tensors), env.payload["codec"])
    return UpdateCodec.decode(enc, expected_size=expected, max_size=limit)


def check_update_size(vector: np.ndarray, expected: int, sender: str, phase: str) -> None:
    """Refuse a vector whose size is not the one the plan declares for ``phase``."""
    if vector.shape != (expected,):
        raise InputError(
            f"update of {sender!r} for phase {phase!r} has {vector.size} values, the plan declares {expected}",
            where="twin_update",
        )
