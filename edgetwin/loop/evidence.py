"""A canary's verdict as evidence a promotion can carry, and the checks that tie it to what is promoted.

`edgetwin canary verdict --out verdict.json` writes an `Evidence`; `edgetwin promote POLICY
--evidence verdict.json` checks it against the policy, the twin and the registry
(`check_evidence`) and records it in the signed metadata of the version it publishes. Every input
is named by a digest, never by a path: the canary and fleet logs by the sha256 of their files, the
twin and the policies by the sha256 of their sealed ``MANIFEST.json`` (which lists every file's
sha256, so it names the whole artifact; `edgetwin.twin.update.manifest_sha256` names a twin's parent
the same way), and the candidate's registry copy by its registry version.

Why a digest of the manifest rather than of a packed archive: a policy directory and the copy a
site fetched from the registry hold the same files and the same manifest, so both give the same
digest, while packing is an implementation detail of each registry backend.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from edgetwin.contract.errors import InputError
from edgetwin.contract.manifest import MANIFEST_FILE, sha256_file, verify_manifest

__all__ = [
    "EVIDENCE_FORMAT",
    "Evidence",
    "RegistryView",
    "artifact_digest",
    "canary_stop",
    "check_evidence",
    "file_digest",
    "judge_stopped",
]

EVIDENCE_FORMAT = "edgetwin-canary-evidence/1"
VERDICTS = ("promote", "refuse", "undecided")


class RegistryView(Protocol):
    """What `check_evidence` reads of a policy registry (`edgetwin.edge.registry.PolicyRegistry`)."""

    def list_versions(self) -> list[str]: ...

    def current(self, scope: str) -> str | None: ...

    def fetch(self, version: str, dest_dir: str | Path, trust: Any, kind: str = "policy") -> Path: ...


def artifact_digest(directory: str | Path, kind: str) -> str:
    """sha256 of a sealed artifact's ``MANIFEST.json``, after checking every file against it.

    Raises:
        InputError / ArtifactTampered: not a sealed ``kind`` directory, or a file that does not match."""
    root = Path(directory)
    verify_manifest(root, kind)
    return sha256_file(root / MANIFEST_FILE)


def file_digest(path: str | Path) -> str:
    """sha256 of a log: of its file, or of every file of a directory (a partitioned Parquet
    dataset), by relative path, as one sha256 over the sorted ``path:sha256`` lines."""
    import hashlib

    p = Path(path)
    if p.is_file():
        return sha256_file(p)
    if p.is_dir():
        lines = sorted(f"{f.relative_to(p).as_posix()}:{sha256_file(f)}" for f in p.rglob("*") if f.is_file())
        return hashlib.sha256("\n".join(lines).encode()).hexdigest()
    raise InputError("log not found", str(p))


@dataclass
class Evidence:
    """A canary's verdict and what it was computed from.

    Attributes:
        verdict: ``promote`` | ``refuse`` | ``undecided`` (`edgetwin.loop.ppi.ppi_verdict`'s
            abstain, named as the CLI's exit code 3 says it).
        reason: one line per guarded KPI (change, interval, margin).
        checks: `edgetwin.loop.ppi.PPIEstimate.to_dict` per guarded KPI: the estimate, its
            interval (relative change, two-sided at ``level``) and the margin it was judged against.
        level: the intervals' coverage (e.g. 0.9).
        candidate_version, current_version: the registry versions the canary log's ``policy``
            column names for the two arms (what the sites served).
        candidate_digest, current_digest: `artifact_digest` of the two policies the verdict
            replayed in the twin (None for a built-in such as ``logging``).
        twin_digest: `artifact_digest` of the twin (its version: `Twin.update` names parents so).
        canary_log_sha256, fleet_log_sha256, plan_sha256: `file_digest` of the inputs.
        run_id: the canary run (from the plan or the log), when known.
    """

    verdict: str
    reason: str
    checks: list[dict[str, Any]]
    level: float
    candidate_version: str
    current_version: str | None
    candidate_digest: str | None
    current_digest: str | None
    twin_digest: str
    canary_log_sha256: str
    fleet_log_sha256: str
    plan_sha256: str | None = None
    run_id: str | None = None
    format: str = field(default=EVIDENCE_FORMAT)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=1, default=float) + "\n")
        return p

    @classmethod
    def from_dict(cls, d: Any, where: str = "--evidence") -> Evidence:
        if not isinstance(d, Mapping) or d.get("format") != EVIDENCE_FORMAT:
            got = d.get("format") if isinstance(d, Mapping) else type(d).__name__
            raise InputError(f"not canary evidence (format {got!r}, expected {EVIDENCE_FORMAT!r})", where)
        try:
            ev = cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})
        except TypeError as e:
            raise InputError(f"canary evidence lacks a field ({e})", where) from None
        if ev.verdict not in VERDICTS:
            raise InputError(f"verdict {ev.verdict!r} is not one of {VERDICTS}", where)
        for name in ("candidate_version", "twin_digest", "canary_log_sha256", "fleet_log_sha256"):
            if not isinstance(getattr(ev, name), str) or not getattr(ev, name):
                raise InputError(f"canary evidence field {name!r} must be a non-empty string", where)
        return ev

    @classmethod
    def load(cls, path: str | Path) -> Evidence:
        p = Path(path)
        if not p.is_file():
            raise InputError("evidence file not found", str(p))
        try:
            doc = json.loads(p.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise InputError(f"not JSON ({e})", str(p)) from None
        return cls.from_dict(doc, str(p))

    def metadata(self) -> dict[str, Any]:
        """What the registry records beside the signed policy (its ``evidence`` metadata field)."""
        return {
            "via": "canary-evidence", "verdict": self.verdict, "reason": self.reason[:500], "level": self.level,
            "candidate_version": self.candidate_version, "current_version": self.current_version,
            "twin": self.twin_digest, "canary_log_sha256": self.canary_log_sha256,
            "fleet_log_sha256": self.fleet_log_sha256, "plan_sha256": self.plan_sha256, "run_id": self.run_id,
            "guards": {c["kpi"]: {"interval": c.get("interval"), "allowed_change": c.get("allowed_change"),
                                  "verdict": c.get("verdict")} for c in self.checks},
        }  # fmt: skip


def check_evidence(
    evidence: Evidence,
    policy_dir: str | Path,
    twin_dir: str | Path,
    registry: RegistryView,
    *,
    scope: str,
    trust: Any,
    workdir: str | Path,
) -> None:
    """Refuse evidence that is not about this policy, this twin and this registry (`InputError`,
    one line naming ``--evidence``; the CLI exits 2).

    - the policy: ``policy_dir``'s `artifact_digest` is the candidate the verdict replayed;
    - the twin: ``twin_dir``'s `artifact_digest` is the twin the verdict was computed with;
    - the registry: it holds ``candidate_version`` (the version the sites served), whose copy is the
      same artifact (fetched and verified with ``trust``), and ``scope``'s current version is still
      the one the canary compared against (``current_version``), so the evidence is not applied
      over a fleet that has moved on.
    """
    where = "--evidence"
    pol = artifact_digest(policy_dir, "policy")
    if evidence.candidate_digest is not None and pol != evidence.candidate_digest:
        raise InputError(f"the evidence is about another policy (digest {evidence.candidate_digest[:12]}, "
                         f"{Path(policy_dir).name} is {pol[:12]})", where)  # fmt: skip
    tw = artifact_digest(twin_dir, "twin")
    if tw != evidence.twin_digest:
        raise InputError(f"the evidence was computed with another twin (digest {evidence.twin_digest[:12]}, "
                         f"--twin is {tw[:12]})", where)  # fmt: skip
    if evidence.candidate_version not in registry.list_versions():
        raise InputError(f"the registry holds no version {evidence.candidate_version!r}, which the canary served",
                         where)  # fmt: skip
    copy = registry.fetch(evidence.candidate_version, Path(workdir) / "candidate", trust)
    if artifact_digest(copy, "policy") != pol:
        raise InputError(f"registry version {evidence.candidate_version!r} is another policy than "
                         f"{Path(policy_dir).name}", where)  # fmt: skip
    now = registry.current(scope)
    if evidence.current_version is not None and now != evidence.current_version:
        raise InputError(f"{scope}'s current version is {now!r}, but the canary compared against "
                         f"{evidence.current_version!r}: the fleet moved on since", where)  # fmt: skip


def infer_versions(canary_log: Any, fleet_log: Any, candidate_version: str | None) -> tuple[str, str | None]:
    """The registry versions of the candidate and current arms, as the canary log's ``policy``
    column names them. ``candidate_version`` None: the one version the canary log holds and the
    fleet log does not (the fleet ran the current policy only).

    Raises:
        InputError: the candidate is not in the log, or it cannot be told which version it is."""
    held = sorted({str(v) for v in canary_log["policy"].unique()})
    if candidate_version is None:
        fleet = {str(v) for v in fleet_log["policy"].unique()} if "policy" in fleet_log.columns else set()
        new = [v for v in held if v not in fleet]
        if len(new) != 1:
            raise InputError(f"cannot tell the candidate among the canary log's policies {held}: name it",
                             "--candidate-version")  # fmt: skip
        candidate_version = new[0]
    if candidate_version not in held:
        raise InputError(f"the canary log has no row served by {candidate_version!r} (it holds {held})",
                         "--candidate-version")  # fmt: skip
    others = [v for v in held if v != candidate_version]
    return candidate_version, (others[0] if len(others) == 1 else None)


def judge_canary(
    twin: Any,
    fleet_log: Any,
    canary_log: Any,
    plan: Any,
    candidate: Any,
    current: Any,
    *,
    candidate_version: str,
    pre_ticks: int,
    seed: int = 0,
    planned_ticks: int | None = None,
    status: Mapping[str, Any] | None = None,
) -> tuple[str, list[Any], str]:
    """The verdict of one canary from its logs: `edgetwin.loop.verdict.canary_verdict` (the
    prediction-powered estimates per guarded KPI of ``plan.margins``) judged by
    `edgetwin.loop.ppi.ppi_verdict` — or, when a stop ended it, by the loop's stopped-day rule
    (`edgetwin.loop.day_verdict.stopped_verdict`, the one place it is made; why: that module's docstring).

    Args:
        twin: the twin; fleet_log: the fleet's log the plan was made on (the current policy).
        canary_log: the collected canary log (the log contract; ``policy`` = registry versions).
        plan: the `CanaryPlan` the canary ran (its margins are the guards).
        candidate, current: the two policies as the twin runs them (`PolicySpec`).
        candidate_version: the candidate's value in the ``policy`` column.
        pre_ticks: ticks at the start on the current policy everywhere (the canary's command).
        planned_ticks: the day's ticks after the pre-period (`CanaryConfig.ticks` of the plan;
            None: the log's, i.e. no check that the day ran whole).
        status: what the sites said of the run (``edgetwin canary status RUN --json``), which names
            a stop (`canary_stop`); None: the log's length alone tells a day cut short.

    A day is whole when every site of the log holds every one of its ``planned_ticks``; a day cut
    short (fewer ticks at a site, the loss budget's, an operator's or any other stop, or a log
    collected early), or a guard stop, is judged as the loop judges it: the guard's KPI refused by
    the guard, every other KPI open (this log is one day: no completed day before it), the reason
    saying so and what would decide them. Its estimates on the ticks it ran are returned for the
    record with the verdict ``open``.

    Returns:
        ``(verdict, checks, reason)``: verdict ``promote`` / ``refuse`` / ``undecided``, the
        `PPIEstimate` s, and one line per KPI.
    """
    from edgetwin.loop.day_verdict import bound_note
    from edgetwin.loop.ppi import ppi_verdict
    from edgetwin.loop.verdict import canary_verdict, guarded_day_variance

    after = canary_log[canary_log["t"] >= pre_ticks]
    ran = int(after["t"].nunique())
    if ran < 1:
        raise InputError(f"the canary log has no tick after its {pre_ticks} pre-ticks", "--canary-log")
    stop = canary_stop(canary_log, pre_ticks, ran if planned_ticks is None else int(planned_ticks), status,
                       candidate_version)
    # the estimand is the change over the days the decision lives with: the fleet log's own days
    # give the day-to-day term (the loop's, `guarded_day_variance`); one day: about the canary's day
    day_var = guarded_day_variance(twin, [m.kpi for m in plan.margins], [fleet_log], candidate, current, seed)
    try:
        est = canary_verdict(twin, fleet_log, canary_log, plan, candidate, current, candidate_version=candidate_version,
                             pre_ticks=pre_ticks, ticks=ran, seed=seed, day_var=day_var)  # fmt: skip
    except (InputError, ValueError, KeyError):
        if stop.reason != "guard":  # the loop's: a guard stop before both arms had a tick stands alone
            raise
        est = {}
    if stop.decides:
        return judge_stopped(stop, est, plan, day_var)
    verdict, checks = ppi_verdict(est, list(plan.margins))
    reason = "; ".join(
        f"{e.kpi} {100 * e.change:+.1f}% [{100 * e.interval[0]:+.1f}%, {100 * e.interval[1]:+.1f}%] vs margin "
        f"{100 * e.allowed_change:g}% ({e.verdict})" for e in checks
    )
    if not day_var:
        reason += " (about the canary's day only: the fleet log has one day, none to estimate the day-to-day variance from)"
    reason += bound_note([est], 1)  # one canary day: which KPIs carry the bound (the loop's note, `_pooled_verdict`)
    return ("undecided" if verdict == "abstain" else verdict), checks, reason


def canary_stop(canary_log: Any, pre_ticks: int, planned: int, status: Mapping[str, Any] | None = None,
                candidate: str = "", sites: Sequence[str] = ()) -> Any:
    """How the canary's day ended (`edgetwin.loop.day_verdict.Stop`), from its log and the sites' status.

    ``ran``: the fewest ticks after the pre-period any site of the log holds (a stop is a site's:
    its slice is served the current policy, and no canary row is logged there, from then on).
    ``status``: ``edgetwin canary status RUN --json``'s document; a site's ``guard`` stop makes the
    stop the guard's (its ``guard.stop.kpi``), else a site's other stop names it. Without one, a log
    short of ``planned`` ticks is a ``"short log"`` stop.

    ``candidate``: the log's candidate version (a site's status of another candidate's canary is
    refused: the log and the status are of two runs). ``sites``: the sites the canary ran on, when
    known (a switchback's): one of them with no row after the pre-period ran 0 ticks.

    Raises:
        InputError: a status that is not such a document, of another candidate than the log's, or
            of a canary of another length than the plan's."""
    from edgetwin.loop.day_verdict import Stop

    after = canary_log[canary_log["t"] >= pre_ticks]
    by_site = after.groupby(after["site"].astype(str))["t"].nunique() if "site" in after.columns else None
    if by_site is not None and sites:
        by_site = by_site.reindex([str(s) for s in sites], fill_value=0)
    ran = int(by_site.min()) if by_site is not None and len(by_site) else int(after["t"].nunique())
    reasons, guard = _status_stops(status, candidate, pre_ticks + planned) if status is not None else ({}, ())
    if guard:
        return Stop("guard", ran, planned, guard)
    other = sorted(r for r in reasons.values() if r and r != "completed")
    return Stop(other[0] if other else "completed" if ran >= planned else "short log", ran, planned)


def _status_stops(status: Mapping[str, Any], candidate: str, total_ticks: int) -> tuple[dict[str, str], tuple[str, ...]]:
    """Per site its stop reason, and the KPIs any site's guard stopped on, from a status document."""
    from edgetwin.loop.day_verdict import guard_kpis

    where = "--status"
    sites = status.get("sites") if isinstance(status, Mapping) else None
    if not isinstance(sites, Mapping) or not sites:
        raise InputError("not a canary status (expected `edgetwin canary status RUN --json`'s {run, sites})", where)
    reasons: dict[str, str] = {}
    guard: list[str] = []
    for site, st in sites.items():
        if not isinstance(st, Mapping):  # a site that did not answer: its log rows alone say how it ran
            continue
        if st.get("candidate") and str(st["candidate"]) != candidate:
            raise InputError(f"site {site}'s status is of a canary of {st['candidate']!r}, the log's candidate is "
                             f"{candidate!r}: another run", where)  # fmt: skip
        planned = int(st.get("planned_ticks") or 0)
        if planned and planned != total_ticks:
            raise InputError(f"site {site} ran a canary of {planned} ticks, the plan's is {total_ticks} (pre-ticks "
                             "included): check --pre-ticks and --tick-seconds", where)  # fmt: skip
        reasons[str(site)] = str(st.get("stop_reason") or "")
        if reasons[str(site)] == "guard":
            guard += guard_kpis((st.get("guard") or {}).get("stop") or {}) or ["?"]
    return reasons, tuple(sorted(set(guard)))


def judge_stopped(stop: Any, est: Mapping[str, Any], plan: Any, day_var: Any,
                  decider: str = "a canary that runs its whole day") -> tuple[str, list[Any], str]:
    """A canary a stop ended (`canary_stop`; ``stop.decides``), judged by the loop's stopped-day
    rule: `judge_canary`'s, and `edgetwin.loop.switchback.judge_switchback`'s. ``est``: per KPI its
    estimate's terms (`edgetwin.loop.ppi` 's dict) on what ran, for the record ({}: none); ``plan``:
    its ``margins`` (and ``kpis``, the expected widths); ``decider``: what would decide the open KPIs."""
    from dataclasses import replace

    from edgetwin.loop.day_verdict import stopped_kpi_verdicts, stopped_verdict
    from edgetwin.loop.ppi import ppi_verdict

    whole = [{k: {**v, "day": 0.0, "local:day": 0.0} for k, v in est.items()}] if est and not stop.short else []
    got = stopped_verdict(stop, whole, 1, plan, day_var)
    assert got is not None  # `Stop.decides`
    verdict, ests, checks, reason, _ = got
    record = {e.kpi: e for e in (ppi_verdict(est, list(plan.margins))[1] if est else [])}
    judged = {e.kpi: e for e in ests}
    labels = stopped_kpi_verdicts(stop, [m.kpi for m in plan.margins], checks)
    out = [replace(judged.get(k) or record[k], verdict=v) for k, (v, _by) in labels.items() if k in judged or k in record]
    open_ = [k for k, (_v, by) in labels.items() if by == "stop"]
    if open_:
        reason += f"; open: {', '.join(open_)} — {decider} ({stop.planned} tick(s) after the pre-period) would decide them"
        if record:
            reason += f" (their estimates shown are on the {stop.ran} tick(s) it ran, for the record)"
    return ("undecided" if verdict == "abstain" else verdict), out, reason
