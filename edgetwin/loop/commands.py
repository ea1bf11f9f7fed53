"""The operator's side of a canary on running sites: start, stop and ask, over the bus only.

`edgetwin canary start / stop / status` are these calls. The messages, subjects and signatures
are the edge's (`edgetwin.edge.canary_command`): this module only builds a `CanaryStart` from a
`CanaryPlan` and the registry's copy of the candidate, signs it, publishes it durably (a site that
is down gets it when it comes back) and gathers the sites' status replies. Nothing here knows what
system the sites serve.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from edgetwin.contract.errors import InputError
from edgetwin.edge.canary_command import (
    CanaryStart,
    CanaryStatus,
    CanaryStop,
    command_subject,
    sign_start,
    sign_stop,
    status_request,
    status_subject,
)
from edgetwin.edge.canary_slice import CanarySlice

__all__ = [
    "CandidateRegistry",
    "candidate_version",
    "fleet_status",
    "new_run_id",
    "publish_start",
    "publish_stop",
    "start_from_plan",
]


class CandidateRegistry(Protocol):
    """What `candidate_version` needs of a policy registry (`edgetwin.edge.registry.PolicyRegistry`)."""

    def list_versions(self) -> list[str]: ...

    def manifest(self, version: str) -> Any: ...

    def current(self, scope: str) -> str | None: ...

    def publish(self, policy_dir: str | Path, metadata: Any, signer: Any) -> str: ...


def new_run_id() -> str:
    """A fresh run id (a subject token); the run's log segments are ``<run>-<seq>``."""
    return f"run-{uuid.uuid4().hex[:12]}"


def candidate_version(registry: CandidateRegistry, ref: str, signer: Any) -> tuple[str, str]:
    """``(version, sha256)`` of the candidate in the registry: ``ref`` is a version it holds, or an
    exported policy directory (e.g. the trained network ``train`` kept beside a safe candidate,
    ``runs/policy.trained``), published signed by ``signer`` unless a version of the very same
    artifact is there already. ``sha256`` is the signed manifest's digest, which a site checks
    against its own registry before it serves the candidate.

    Raises:
        InputError: neither a version of the registry nor a policy directory."""
    from edgetwin.edge.registry import metadata_from_policy_dir
    from edgetwin.loop.evidence import artifact_digest

    versions = registry.list_versions()
    if ref in versions:
        return ref, str(registry.manifest(ref).sha256)
    d = Path(ref)
    if not d.is_dir():
        raise InputError(f"neither a version of the registry ({len(versions)} held) nor a policy directory", f"--candidate {ref}")
    digest = artifact_digest(d, "policy")
    for v in versions:
        md = registry.manifest(v).metadata
        if md.get("artifact_digest") == digest:
            return v, str(registry.manifest(v).sha256)
    md = {**metadata_from_policy_dir(d), "artifact_digest": digest}
    md.pop("version", None)
    if not md.get("name"):
        md["name"] = "".join(c if c.isalnum() or c in "_-." else "-" for c in d.name).strip("-.") or "policy"
    version = registry.publish(d, md, signer)
    return version, str(registry.manifest(version).sha256)


def start_from_plan(
    plan: Any,
    *,
    candidate: str,
    sha256: str,
    run: str,
    current: str = "",
    pre_ticks: int = 4,
    alpha: float = 0.05,
    tick_seconds: float = 900.0,
    sites: Sequence[str] = (),
    switchback: Any = None,
) -> CanaryStart:
    """The `CanaryStart` that runs ``plan`` (`edgetwin.loop.plan.CanaryPlan`): its slice, hours,
    margins and loss budget (`edgetwin.edge.canary.CanaryConfig.from_plan`), the candidate's
    registry ``candidate`` version and ``sha256``, the ``current`` version the sites must be serving
    ("": whatever they serve), ``pre_ticks`` on the current policy first, the guard's ``alpha``.

    With ``switchback`` (a `edgetwin.loop.switchback.SwitchbackPlan`, e.g. the ``*.switchback.json``
    that ``canary plan --switchback-site --out`` writes) the command runs that site-level switchback
    instead of the plan's group split: the plan gives the guarded margins, the switchback its sites
    (the slice, and the runtimes that run it), blocks, burn-in, seed and assignment, its
    ``start_tick`` as the pre-period (``pre_ticks`` is then not used) and its ``tick_seconds``; no
    loss budget travels (the planner checked the switchback's worst case against it).

    Raises:
        InputError: a plan or option that does not make a canary (one line)."""
    from edgetwin.edge.canary import CanaryConfig

    if switchback is not None:
        from edgetwin.edge.canary_switchback import SwitchbackDesign

        design = SwitchbackDesign.from_plan(switchback)
        return CanaryStart(
            run=run, candidate=candidate, sha256=sha256, slice=CanarySlice(sites=design.sites, seed=design.seed),
            hours=float(switchback.hours), margins=tuple(plan.margins), current=current, alpha=alpha,
            pre_ticks=int(design.start_tick), tick_seconds=float(switchback.tick_seconds),
            sites=tuple(sites) or design.sites, switchback=design,
        )  # fmt: skip

    cfg = CanaryConfig.from_plan(plan, candidate, alpha=alpha, tick_seconds=tick_seconds, pre_ticks=pre_ticks)
    sl = cfg.slice if isinstance(cfg.slice, CanarySlice) else CanarySlice.from_dict(dict(cfg.slice))
    return CanaryStart(
        run=run, candidate=candidate, sha256=sha256, slice=sl, hours=cfg.hours, margins=tuple(cfg.margins),
        current=current, alpha=cfg.alpha, pre_ticks=cfg.pre_ticks, max_loss=tuple(cfg.max_loss),
        fleet_groups=int(cfg.fleet_groups), loss_levels=tuple(cfg.loss_levels), tick_seconds=cfg.tick_seconds,
        sites=tuple(sites),
    )  # fmt: skip


async def publish_start(bus: Any, cmd: CanaryStart, signer: Any) -> int:
    """Sign ``cmd`` and store it on the durable command subject; returns its stream sequence."""
    return int(await bus.publish_durable(command_subject(), sign_start(cmd, signer)))


async def publish_stop(bus: Any, cmd: CanaryStop, signer: Any) -> int:
    """Sign ``cmd`` and store it on the durable command subject; returns its stream sequence."""
    return int(await bus.publish_durable(command_subject(), sign_stop(cmd, signer)))


async def fleet_status(bus: Any, sites: Sequence[str], run: str, timeout: float = 2.0) -> dict[str, CanaryStatus | str]:
    """Each site's `CanaryStatus` of ``run`` (request/reply on its status subject), or why it did
    not answer (``"no reply: ..."``), by site."""
    out: dict[str, CanaryStatus | str] = {}
    for site in sites:
        try:
            env = await bus.request(status_subject(site), status_request(run), timeout=timeout)
        except Exception as e:  # noqa: BLE001 - a site that does not answer is reported, not fatal
            out[site] = f"no reply: {type(e).__name__}: {e}"[:200]
            continue
        out[site] = CanaryStatus.from_dict(env.payload)
    return out
