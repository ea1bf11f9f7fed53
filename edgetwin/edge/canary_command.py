"""Canary commands on the bus: how an operator starts, stops and watches a canary on running sites.

This module is the **interface** between the operator side (`edgetwin canary start/stop/status/
collect`, `edgetwin.loop`) and the site side (`edgetwin serve`, `edgetwin.edge.runtime`). It is
pure Python over `edgetwin.edge.messages` envelopes: both sides import the builders and parsers
below, so neither writes a field name the other does not read.

Subjects (all under ``Subjects.PREFIX`` = ``edgetwin``; ``<site>`` and ``<run>`` are subject tokens):

| subject | function | durable | kinds |
|---|---|---|---|
| ``edgetwin.canary.command`` | `command_subject` | yes (JetStream) | ``canary_start``, ``canary_stop`` (signed, `sign_start` / `sign_stop`) |
| ``edgetwin.status.canary.<site>`` | `status_subject` | no (request/reply) | ``canary_status_request`` -> ``canary_status`` |
| ``edgetwin.canary.outcome.<site>`` | `outcome_subject` | yes | ``canary_outcome`` (one tick's outcome rows of the site, `outcome_envelope`) |
| ``edgetwin.canary.log.<site>`` | `canary_log_subject` | yes | ``canary_log`` (segment ``<run>-<seq>`` of the joined log, `edgetwin.edge.canary`) |

The status subject is deliberately *outside* ``edgetwin.canary.>``: that prefix is stored by the
JetStream stream (`DEFAULT_DURABLE_SUBJECTS`), and JetStream would answer a request published there
with its own publish acknowledgement before the runtime could reply.

**Commands are signed documents.** A ``canary_start`` / ``canary_stop`` payload carries the command's
fields plus ``key_id`` (`edgetwin.edge.signing.key_id` of the signing key) and ``sig`` (base64
Ed25519 over `COMMAND_FORMAT`, the kind, a newline and the canonical JSON of every other payload
field: `command_signed_bytes`). A runtime accepts a command only when ``key_id`` names a key of its
``--trust`` directory (the same `TrustStore` that verifies policy artifacts: whoever may publish a
policy may canary it) and the signature verifies (`verify_command`); the envelope's own sender
and bus-level auth are not what is trusted, so the check is the same on the in-process bus, on
NATS and through a JetStream replay. The signature binds the run id, the candidate's version
*and its sha256 digest* and ``issued`` (unix seconds): a runtime further refuses a start whose
version its registry does not hold or whose digest differs from the registry's signed manifest,
and a run id it has already finished (a replayed command is the same run: a restarted runtime
resumes an unfinished run, never re-runs a finished one). Every refusal is one log line and one
count of `REFUSALS` in ``/metrics``; the fleet stays on its current policy.

Commands go to every site on one durable subject; a start's ``sites`` (empty: every site that
receives it) says which runtimes run it, and its slice says which of their groups take part
(`CanarySlice`). A start may carry a site-level switchback instead of a group split
(``switchback``: `edgetwin.edge.canary_switchback.SwitchbackDesign`, signed with the rest and
checked on receipt: an assignment that is not its seed's draw is refused, ``invalid``). The runtime's durable consumer is named `command_durable_name` (one per site),
so a site that was down when a command was published gets it when it comes back.

**Outcomes.** The real system reports, per site and per tick, the outcome rows of the groups it
asked decisions for: log-contract columns keyed by ``agent`` (the service group) and ``t`` (the
tick), with at least the guarded ``kpi.*`` columns (others such as ``state.*``, ``response.*``,
``reward``, ``episode``, ``scenario`` are kept). The runtime joins them with the decisions it made
for the same ``(agent, t)`` (action, ``policy`` = the registry version, ``propensity``, ``arm``) into
the canary log. A decision request names its tick with ``t`` (envelope payload, JSON field,
Arrow schema metadata, or the ``Edgetwin-Tick`` header); without it the runtime uses the tick it
expects next (the number of outcome ticks received so far).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import math
import time
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.edge.bus import Subjects
from edgetwin.edge.canary import STOP_REASONS, CanaryConfig, canary_log_subject
from edgetwin.edge.canary_slice import CanarySlice
from edgetwin.edge.canary_switchback import SwitchbackDesign
from edgetwin.edge.kpi_watch import KPIMargin
from edgetwin.edge.messages import NUMBER, Envelope, KindSchema, register_kind
from edgetwin.edge.parquet_bounds import read_parquet_bounded
from edgetwin.edge.signing import Signer, TrustStore, canonical_json, key_id

__all__ = [
    "COMMAND_FORMAT",
    "KIND_OUTCOME",
    "KIND_START",
    "KIND_STATUS",
    "KIND_STATUS_REQUEST",
    "KIND_STOP",
    "PHASES",
    "REFUSALS",
    "CanaryStart",
    "CanaryStatus",
    "CanaryStop",
    "CommandRefused",
    "canary_log_subject",
    "command_durable_name",
    "command_signed_bytes",
    "command_subject",
    "outcome_durable_name",
    "outcome_envelope",
    "outcome_rows",
    "outcome_subject",
    "parse_command",
    "sign_start",
    "sign_stop",
    "status_reply",
    "status_request",
    "status_subject",
    "verify_command",
]

#: what a command's signature covers first (then the kind, ``\n``, canonical JSON of the payload
#: without ``sig``); bump when the signed bytes change
COMMAND_FORMAT = b"edgetwin-canary-command/1\n"
KIND_START = "canary_start"
KIND_STOP = "canary_stop"
KIND_STATUS_REQUEST = "canary_status_request"
KIND_STATUS = "canary_status"
KIND_OUTCOME = "canary_outcome"

#: why a runtime refused a command (each a ``/metrics`` counter label and the log line's reason):
#: no signature; a key not in ``--trust``; a signature that does not verify; fields that do not
#: make a canary; a version the registry does not hold; a digest other than the registry's; a
#: start naming another current policy than the one served; another run is active; a run id
#: already finished here; a stop for a run that is not running here
REFUSALS = ("unsigned", "untrusted_key", "bad_signature", "invalid", "unknown_version", "digest_mismatch",
            "not_current", "busy", "finished", "unknown_run")  # fmt: skip

#: a run's phases as `CanaryStatus.phase` reports them: no run here; accepted, the candidate not
#: served yet (pre-period: every group on the current policy); the candidate served to its arm;
#: ended (``stop_reason`` says why)
PHASES = ("idle", "pre", "running", "stopped")

#: bounds of one outcome report (rows, decoded bytes): a report is one tick of one site
MAX_OUTCOME_ROWS = 200_000
MAX_OUTCOME_BYTES = 64 * 1024 * 1024


# ------------------------------------------------------------------------------------- subjects
def command_subject() -> str:
    """The fleet's canary command subject (durable; every site's runtime subscribes)."""
    return f"{Subjects.PREFIX}.canary.command"


def command_durable_name(site: str) -> str:
    """The durable consumer name of ``site``'s runtime on `command_subject`."""
    Subjects.decision(site)
    return f"canary-command-{site}"


def status_subject(site: str) -> str:
    """Where ``site``'s runtime answers ``canary_status_request`` (request/reply, not durable)."""
    Subjects.decision(site)
    return f"{Subjects.PREFIX}.status.canary.{site}"


def outcome_subject(site: str) -> str:
    """Where the system reports ``site``'s outcome rows per tick (durable)."""
    Subjects.decision(site)
    return f"{Subjects.PREFIX}.canary.outcome.{site}"


def outcome_durable_name(site: str) -> str:
    """The durable consumer name of ``site``'s runtime on `outcome_subject`."""
    Subjects.decision(site)
    return f"canary-outcome-{site}"


# ------------------------------------------------------------------------------------- commands
class CommandRefused(ValueError):
    """A command a runtime does not run; ``reason`` is one of `REFUSALS`."""

    def __init__(self, reason: str, detail: str) -> None:
        assert reason in REFUSALS, reason
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


def _margin_dict(m: KPIMargin) -> dict[str, Any]:
    return {"kpi": m.kpi, "higher_is_better": bool(m.higher_is_better), "max_regression": float(m.max_regression),
            "min_delta": float(m.min_delta)}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class CanaryStart:
    """A signed order to run canary ``run`` (payload fields of ``canary_start``, same names).

    Attributes:
        run: the run id (a subject token; the key of its log segments ``<run>-<seq>``).
        candidate: the candidate's registry version; ``sha256``: its artifact digest (the signed
            manifest's ``sha256``): a registry holding other bytes under that name is refused.
        current: the version the operator expects the sites to serve now ("" : whatever they
            serve); a site serving another one refuses (``not_current``).
        slice: which groups take part (`CanarySlice`: agents / sites / scenarios, treat_share, seed).
        hours, tick_seconds: how long the candidate is served, in ticks of ``tick_seconds``.
        margins: the guarded KPIs (`KPIMargin`); alpha: the guard's error level.
        pre_ticks: baseline ticks on the current policy before the candidate is served.
        max_loss: ``(kpi, fraction)`` loss budget; fleet_groups and loss_levels its scale
            (`CanaryConfig`).
        batch, min_reports: the guard's (`CanaryGuard`).
        sites: the runtimes that run it (empty: every site that receives it; a switchback's sites
            by default).
        issued: unix seconds when it was signed.
        switchback: a site-level switchback (`SwitchbackDesign`: sites, block length, burn-in, seed,
            scheme, the assignment) in place of the slice's group split; the payload's
            ``switchback`` object, covered by the signature like every field, and checked on receipt
            (an assignment that is not its seed's draw is refused, ``invalid``). Its ``slice`` is
            its sites, its ``pre_ticks`` its ``start_tick``, its hours its blocks
            (`edgetwin.edge.canary.CanaryConfig`).
    """

    run: str
    candidate: str
    sha256: str
    slice: CanarySlice
    hours: float
    margins: tuple[KPIMargin, ...]
    current: str = ""
    alpha: float = 0.05
    pre_ticks: int = 4
    max_loss: tuple[tuple[str, float], ...] = ()
    fleet_groups: int = 0
    loss_levels: tuple[tuple[str, float], ...] = ()
    tick_seconds: float = 900.0
    batch: int = 4
    min_reports: int = 8
    sites: tuple[str, ...] = ()
    issued: float = dataclasses.field(default_factory=time.time)
    switchback: SwitchbackDesign | None = None

    def __post_init__(self) -> None:
        Subjects._tok(self.run, "canary run id")
        if not self.candidate or not isinstance(self.candidate, str):
            raise InputError("a canary start needs the candidate's registry version", where="canary start")
        if not (isinstance(self.sha256, str) and len(self.sha256) == 64 and all(c in "0123456789abcdef" for c in self.sha256)):
            raise InputError("sha256 must be the candidate artifact's 64 hex digits", where="canary start")
        object.__setattr__(self, "margins", tuple(self.margins))
        object.__setattr__(self, "sites", tuple(str(s) for s in self.sites))
        for s in self.sites:
            Subjects._tok(s, "canary start: sites")
        if self.switchback is not None:
            for s in self.switchback.sites:
                Subjects._tok(s, "canary start: switchback sites")
            if not self.sites:
                object.__setattr__(self, "sites", tuple(self.switchback.sites))
            elif set(self.sites) - set(self.switchback.sites):
                raise InputError(f"sites {sorted(set(self.sites) - set(self.switchback.sites))} are not the "
                                 f"switchback's {list(self.switchback.sites)}", where="canary start")  # fmt: skip
        self.config()  # every CanaryConfig check, at the sender

    def config(self) -> CanaryConfig:
        """The runtime's `CanaryConfig` (``canary_id`` = the run id)."""
        return CanaryConfig(
            candidate=self.candidate, slice=self.slice, hours=float(self.hours), margins=self.margins,
            alpha=float(self.alpha), tick_seconds=float(self.tick_seconds), batch=int(self.batch),
            min_reports=int(self.min_reports), pre_ticks=int(self.pre_ticks), canary_id=self.run,
            max_loss=self.max_loss, fleet_groups=int(self.fleet_groups), loss_levels=self.loss_levels,
            switchback=self.switchback,
        )  # fmt: skip

    def for_site(self, site: str) -> bool:
        return not self.sites or site in self.sites

    def to_payload(self) -> dict[str, Any]:
        p = self._payload()
        if self.switchback is not None:  # only then: a split's payload (and signature) is what it always was
            p["switchback"] = self.switchback.to_dict()
        return p

    def _payload(self) -> dict[str, Any]:
        return {
            "run": self.run, "candidate": self.candidate, "sha256": self.sha256, "current": self.current,
            "slice": self.slice.to_dict(), "hours": float(self.hours), "margins": [_margin_dict(m) for m in self.margins],
            "alpha": float(self.alpha), "pre_ticks": int(self.pre_ticks), "max_loss": dict(self.max_loss),
            "fleet_groups": int(self.fleet_groups), "loss_levels": dict(self.loss_levels),
            "tick_seconds": float(self.tick_seconds), "batch": int(self.batch), "min_reports": int(self.min_reports),
            "sites": list(self.sites), "issued": float(self.issued),
        }  # fmt: skip

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> CanaryStart:
        """Raises `InputError` (or ``ValueError`` / ``TypeError`` / ``KeyError``) on a bad payload."""
        margins = []
        for m in p["margins"]:
            if not isinstance(m, dict):
                raise InputError("each margin is {kpi, higher_is_better, max_regression, min_delta}", where="margins")
            margins.append(KPIMargin(str(m["kpi"]), max_regression=float(m.get("max_regression", 0.1)),
                                     min_delta=float(m.get("min_delta", 0.0)),
                                     higher_is_better=bool(m.get("higher_is_better", False))))  # fmt: skip
        if not isinstance(p["slice"], dict):
            raise InputError("slice must be an object", where="slice")
        sb = SwitchbackDesign.from_dict(p["switchback"]) if p.get("switchback") is not None else None
        return cls(
            run=str(p["run"]), candidate=str(p["candidate"]), sha256=str(p["sha256"]), current=str(p.get("current", "")),
            slice=CanarySlice.from_dict(p["slice"]), hours=float(p["hours"]), margins=tuple(margins),
            alpha=float(p.get("alpha", 0.05)), pre_ticks=int(p.get("pre_ticks", 4)),
            max_loss=tuple(sorted((str(k), float(v)) for k, v in dict(p.get("max_loss", {})).items())),
            fleet_groups=int(p.get("fleet_groups", 0)),
            loss_levels=tuple(sorted((str(k), float(v)) for k, v in dict(p.get("loss_levels", {})).items())),
            tick_seconds=float(p.get("tick_seconds", 900.0)), batch=int(p.get("batch", 4)),
            min_reports=int(p.get("min_reports", 8)), sites=tuple(p.get("sites", ())), issued=float(p["issued"]),
            switchback=sb,
        )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class CanaryStop:
    """A signed order to stop run ``run`` (``canary_stop``): its slice goes back to the current policy.

    Attributes:
        run: the run id; reason: a `STOP_REASONS` entry (``operator`` by default);
        sites: the runtimes it addresses (empty: all); issued: unix seconds.
    """

    run: str
    reason: str = "operator"
    sites: tuple[str, ...] = ()
    issued: float = dataclasses.field(default_factory=time.time)

    def __post_init__(self) -> None:
        Subjects._tok(self.run, "canary run id")
        if self.reason not in STOP_REASONS:
            raise InputError(f"a stop reason is one of {STOP_REASONS}, got {self.reason!r}", where="canary stop")
        object.__setattr__(self, "sites", tuple(str(s) for s in self.sites))

    def for_site(self, site: str) -> bool:
        return not self.sites or site in self.sites

    def to_payload(self) -> dict[str, Any]:
        return {"run": self.run, "reason": self.reason, "sites": list(self.sites), "issued": float(self.issued)}

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> CanaryStop:
        return cls(str(p["run"]), str(p.get("reason", "operator")), tuple(p.get("sites", ())), float(p["issued"]))


_SIG = {"key_id": str, "sig": str}
register_kind(KIND_START, KindSchema(
    required={"run": str, "candidate": str, "sha256": str, "slice": dict, "hours": NUMBER, "margins": list,
              "issued": NUMBER},
    optional={"current": str, "alpha": NUMBER, "pre_ticks": int, "max_loss": dict, "fleet_groups": int,
              "loss_levels": dict, "tick_seconds": NUMBER, "batch": int, "min_reports": int, "sites": list,
              "switchback": dict, **_SIG},
))  # fmt: skip
register_kind(KIND_STOP, KindSchema(required={"run": str, "issued": NUMBER},
                                    optional={"reason": str, "sites": list, **_SIG}))  # fmt: skip


def command_signed_bytes(kind: str, payload: Mapping[str, Any]) -> bytes:
    """What a command's signature covers: `COMMAND_FORMAT`, ``kind``, ``\\n``, and the canonical JSON
    (sorted keys) of ``payload`` without ``sig`` (``key_id`` included: a signature names its key)."""
    body = {k: v for k, v in payload.items() if k != "sig"}
    return COMMAND_FORMAT + kind.encode() + b"\n" + canonical_json(body)


def _signed(kind: str, fields: dict[str, Any], signer: Signer, sender: str) -> Envelope:
    payload = {**fields, "key_id": key_id(signer.public_key)}
    payload["sig"] = base64.b64encode(signer.sign(command_signed_bytes(kind, payload))).decode()
    run = fields["run"]
    # the id makes a re-published command a duplicate JetStream stores once
    return Envelope(kind=kind, sender=sender, payload=payload, msg_id=f"{kind}-{run}-{uuid.uuid4().hex[:8]}")


def sign_start(cmd: CanaryStart, signer: Signer, sender: str = "operator") -> Envelope:
    """The signed ``canary_start`` envelope of ``cmd`` (publish it durably on `command_subject`)."""
    return _signed(KIND_START, cmd.to_payload(), signer, sender)


def sign_stop(cmd: CanaryStop, signer: Signer, sender: str = "operator") -> Envelope:
    """The signed ``canary_stop`` envelope of ``cmd``."""
    return _signed(KIND_STOP, cmd.to_payload(), signer, sender)


def parse_command(env: Envelope) -> CanaryStart | CanaryStop:
    """The command an envelope carries, NOT verified (`verify_command` verifies and parses).

    Raises:
        CommandRefused: ``invalid``: not a command kind, or fields that do not make one.
    """
    try:
        if env.kind == KIND_START:
            return CanaryStart.from_payload(env.payload)
        if env.kind == KIND_STOP:
            return CanaryStop.from_payload(env.payload)
    except (InputError, ValueError, TypeError, KeyError) as e:
        raise CommandRefused("invalid", f"{env.kind}: {e}") from None
    raise CommandRefused("invalid", f"kind {env.kind!r} is not a canary command")


def verify_command(env: Envelope, trust: TrustStore) -> CanaryStart | CanaryStop:
    """The command of ``env`` when it is signed by a key of ``trust``; else `CommandRefused`
    (``unsigned``, ``untrusted_key``, ``bad_signature``, ``invalid``)."""
    from cryptography.exceptions import InvalidSignature

    p = env.payload
    kid, sig = p.get("key_id"), p.get("sig")
    if not isinstance(kid, str) or not isinstance(sig, str):
        raise CommandRefused("unsigned", f"{env.kind} from {env.sender!r} carries no key_id / sig")
    pub = trust.get(kid)
    if pub is None:
        raise CommandRefused("untrusted_key", f"{env.kind} signed by key {kid[:16]!r}, not in the trust store")
    try:
        raw = base64.b64decode(sig, validate=True)
        pub.verify(raw, command_signed_bytes(env.kind, p))
    except (binascii.Error, ValueError, InvalidSignature):
        raise CommandRefused("bad_signature", f"{env.kind} signature does not verify under key {kid[:16]!r}") from None
    return parse_command(env)


# ------------------------------------------------------------------------------------- status
register_kind(KIND_STATUS_REQUEST, KindSchema(optional={"run": str}))


@dataclasses.dataclass
class CanaryStatus:
    """What a site's runtime says about a canary run (``canary_status`` payload, same names).

    Attributes:
        site: the answering site.
        run: the run id ("" when ``phase == "idle"`` and no run was asked for).
        phase: one of `PHASES`.
        candidate, current: the versions (the candidate arm's, the rest's).
        ticks: outcome ticks joined so far (pre-period included); planned_ticks: the run's total.
        arms: groups seen per arm (``candidate`` / ``control`` / ``fleet``).
        guard: per guarded KPI the guard's running estimate and confidence sequence
            (``{kpi: {estimate, lower, upper, ...}}``), and ``stop`` (the `GuardStop` dict) once it
            stopped the run.
        loss: per budgeted KPI the fleet-wide loss so far (`Canary.loss_so_far`).
        stop_reason: a `STOP_REASONS` entry once stopped, else None.
        segments, shipped: log segments spooled, and acknowledged by the bus.
        unjoined: decisions or outcome rows that found no partner (per ``decisions`` / ``outcomes``).
        refused: commands this runtime refused so far, per `REFUSALS` reason.
    """

    site: str
    run: str = ""
    phase: str = "idle"
    candidate: str = ""
    current: str = ""
    ticks: int = 0
    planned_ticks: int = 0
    arms: dict[str, int] = dataclasses.field(default_factory=dict)
    guard: dict[str, Any] = dataclasses.field(default_factory=dict)
    loss: dict[str, float] = dataclasses.field(default_factory=dict)
    stop_reason: str | None = None
    segments: int = 0
    shipped: int = 0
    unjoined: dict[str, int] = dataclasses.field(default_factory=dict)
    refused: dict[str, int] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (what ``canary status --json`` prints per site)."""
        d = dataclasses.asdict(self)
        d["guard"] = _finite(d["guard"])
        d["loss"] = _finite(d["loss"])
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CanaryStatus:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def _finite(x: Any) -> Any:
    """``x`` with non-finite floats as None (a payload is JSON without NaN / inf)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


register_kind(KIND_STATUS, KindSchema(required={"site": str, "phase": str},
                                      optional={f: object for f in ("run", "candidate", "current", "ticks",
                                                "planned_ticks", "arms", "guard", "loss", "stop_reason",
                                                "segments", "shipped", "unjoined", "refused")}))  # fmt: skip


def status_request(run: str = "", sender: str = "operator") -> Envelope:
    """A ``canary_status_request`` (send it with ``bus.request(status_subject(site), ...)``)."""
    return Envelope(kind=KIND_STATUS_REQUEST, sender=sender, payload={"run": run} if run else {})


def status_reply(status: CanaryStatus, sender: str) -> Envelope:
    """The ``canary_status`` reply envelope (parse it with ``CanaryStatus.from_dict(env.payload)``)."""
    return Envelope(kind=KIND_STATUS, sender=sender, payload=status.to_dict())


# ------------------------------------------------------------------------------------- outcomes
register_kind(KIND_OUTCOME, KindSchema(required={"site": str, "t": int}, optional={"run": str}, tensors=("parquet",)))


def outcome_envelope(site: str, t: int, rows: pd.DataFrame, sender: str, run: str = "") -> Envelope:
    """One tick's outcome rows of ``site`` as a ``canary_outcome`` message (durable on
    `outcome_subject`); rows need ``agent`` and the guarded ``kpi.*`` columns, ``t`` is set to the
    tick. Its id ``outcome-<site>-<t>-<random>`` makes a retried publish of this envelope a duplicate
    JetStream stores once, and cannot be guessed: a forger who publishes first under a predictable
    id would make JetStream drop the real report. The runtime joins each tick once anyway."""
    if "agent" not in rows.columns:
        raise InputError("outcome rows need an 'agent' column (the service group)", where="canary outcome")
    df = rows.reset_index(drop=True).copy()
    df["t"] = int(t)
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    payload: dict[str, Any] = {"site": site, "t": int(t)}
    if run:
        payload["run"] = run
    return Envelope(kind=KIND_OUTCOME, sender=sender, payload=payload,
                    tensors={"parquet": np.frombuffer(buf.getvalue(), dtype=np.uint8)},
                    msg_id=f"outcome-{site}-{int(t)}-{uuid.uuid4().hex[:12]}")  # fmt: skip


def outcome_rows(env: Envelope, max_rows: int = MAX_OUTCOME_ROWS, max_bytes: int = MAX_OUTCOME_BYTES) -> pd.DataFrame:
    """The rows of a ``canary_outcome`` message, decoded only after its Parquet metadata's declared
    rows and uncompressed sizes are within bounds (`read_parquet_bounded`); each row's ``t`` is the
    message's tick. Raises `InputError` (one line) otherwise."""
    df = read_parquet_bounded(np.asarray(env.tensors["parquet"], dtype=np.uint8).tobytes(), max_rows, max_bytes,
                              where=f"canary_outcome from {env.sender!r}")  # fmt: skip
    if "agent" not in df.columns:
        raise InputError("outcome rows lack the 'agent' column", where=f"canary_outcome from {env.sender!r}")
    df["t"] = int(env.payload["t"])
    return df
