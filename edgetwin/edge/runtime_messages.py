"""The edge runtime's bus messages: KPI reports, policy announcements, rollback notices, decision requests.

Subjects and kinds (`edgetwin.edge.runtime`'s docstring and ``docs/bus.md`` list them): ``kpi_report`` on
`kpi_subject`, ``policy_rollback`` on `rollback_subject`, ``policy_version`` announcements
(`announce_policy`), and the client side of the decision subject (`request_decision`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgetwin.edge.bus import Bus, Subjects
from edgetwin.edge.messages import Envelope, KindSchema, encode, register_kind
from edgetwin.edge.registry import (
    check_scope,
)
from edgetwin.edge.runtime_core import Decision
from edgetwin.edge.signing import Signer

log = logging.getLogger("edgetwin.runtime")

def kpi_subject(site: str) -> str:
    """Where live KPIs of ``site`` are reported (``kpi_report``)."""
    Subjects.decision(site)  # checks that the name is a valid subject token
    return f"{Subjects.PREFIX}.kpi.{site}"


def rollback_subject(site: str) -> str:
    """Where ``site``'s runtime announces a rollback (``policy_rollback``, durable: it is an audit trail)."""
    Subjects.decision(site)  # checks that the name is a valid subject token
    return f"{Subjects.PREFIX}.policy.rollback.{site}"


def _check_kpis(env: Envelope) -> None:
    kpis = env.payload["kpis"]
    if not kpis:
        raise ValueError("kpis is empty")
    for k, v in kpis.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError(f"kpis[{k!r}] must be a finite number")


register_kind(
    "kpi_report",
    KindSchema(required={"site": str, "kpis": dict}, optional={"version": str}, check=_check_kpis),
)
register_kind(
    "policy_rollback",
    KindSchema(
        required={"site": str, "scope": str, "from_version": str, "to_version": str, "reason": str},
        optional={"kpis": dict, "registry": str},
    ),
)


def kpi_report(
    site: str, kpis: Mapping[str, float], *, version: str | None = None, sender: str = "edgetwin"
) -> Envelope:
    """A ``kpi_report`` envelope (send it on `kpi_subject`)."""
    payload: dict[str, Any] = {"site": site, "kpis": {str(k): float(v) for k, v in kpis.items()}}
    if version is not None:
        payload["version"] = version
    return Envelope(kind="kpi_report", sender=sender, payload=payload)


def signed_frame(env: Envelope, signer: Signer, max_bytes: int | None = None) -> bytes:
    """``env`` as a frame signed by ``signer`` (its sender's key): what a reporting client that
    has no `MessageAuth` of its own publishes with ``bus.publish_raw`` (a runtime uses a
    ``kpi_report`` / ``canary_outcome`` only when its sender is one of its ``reporters`` and the
    signature verifies, `edgetwin.edge.runtime_rollback.KPIRollback._authentic_report`)."""
    return encode(env, max_bytes, sign=signer.sign)


def policy_version_notice(
    scope: str, version: str, revision: int, sha256: str, *, sender: str = "edgetwin"
) -> Envelope:
    """A ``policy_version`` announcement: ``version`` became current in ``scope`` at pointer ``revision``.

    Runtimes treat it as a hint to re-read the registry at once (the registry stays the source of
    truth, so a forged or stale announcement cannot make a runtime load anything).
    """
    return Envelope(
        kind="policy_version",
        sender=sender,
        payload={"version": int(revision), "uri": f"{check_scope(scope)}@{version}", "sha256": sha256},
    )


async def announce_policy(
    bus: Bus, scope: str, version: str, revision: int, sha256: str, *, sender: str = "edgetwin"
) -> None:
    """Publish `policy_version_notice` durably on ``Subjects.policy_version()``."""
    await bus.publish_durable(
        Subjects.policy_version(), policy_version_notice(scope, version, revision, sha256, sender=sender)
    )


async def request_decision(
    bus: Bus,
    site: str,
    obs: np.ndarray,
    *,
    timeout: float = 2.0,
    sender: str = "client",
    agents: list[str] | None = None,
    sites: list[str] | None = None,
    scenarios: list[str] | None = None,
    t: int | None = None,
) -> Decision:
    """Ask ``site``'s runtime for actions over the bus.

    Args:
        obs: (N, O) observations in the policy's observation column order.
        agents, sites, scenarios: the rows' service groups (one per row): during a canary the
            rows of its slice are served by their arm's policy, and the `Decision` then names
            each row's policy, arm and propensity.
        t: the tick these decisions are for (the key of the system's outcome report).

    Returns:
        The `Decision` (actions (N, A), version, scope).

    Raises:
        RuntimeError: the runtime answered with an ``error`` (its reason is in the message).
        TimeoutError, NoResponders: see `Bus.request`.
    """
    obs = np.atleast_2d(np.asarray(obs, dtype=np.float64))
    payload: dict[str, Any] = {"site": site}
    for k, v in (("agents", agents), ("sites", sites), ("scenarios", scenarios)):
        if v is not None:
            payload[k] = [str(x) for x in v]
    if t is not None:
        payload["t"] = int(t)
    reply = await bus.request(
        Subjects.decision(site),
        Envelope(kind="decision_request", sender=sender, payload=payload, tensors={"obs": obs}),
        timeout=timeout,
    )
    if reply.kind == "error":
        raise RuntimeError(f"runtime of {site!r} refused the request: {reply.payload.get('reason')}")
    if reply.kind != "decision_reply":
        raise RuntimeError(f"expected a decision_reply from {site!r}, got {reply.kind!r}")
    return Decision(
        actions=np.asarray(reply.tensors["actions"]),
        version=str(reply.payload.get("version", "")),
        scope=str(reply.payload.get("scope", "")),
        revision=int(reply.payload["policy_version"]),
        policies=tuple(reply.payload["policies"]) if "policies" in reply.payload else None,
        arms=tuple(reply.payload["arms"]) if "arms" in reply.payload else None,
        propensity=np.asarray(reply.tensors["propensity"]) if "propensity" in reply.tensors else None,
    )
