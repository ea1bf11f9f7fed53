"""The promotion gate: replay candidate and incumbent in the twin, promote only if nothing regresses.

Seed 003 §4.3: "a digital-twin replay validates aggregated models against recent traces before
rollout". `run_gate` replays both policies on recent traffic (counterfactual replay of a recent
log: its agents, sites, profiles and first states, the policies' actions, the twin's responses)
and under the configured what-if scenarios, on the same worlds and ensemble members (paired),
and checks every guarded KPI: a KPI *regresses* when the candidate is worse than the incumbent by
more than ``max_regression · |incumbent| + min_delta``, in the direction the KPI is better. The
checks and the verdict live in `edgetwin.policies.gate_checks` (re-exported here); this module
resolves the policies, runs the replay and records the promotion.

`promote` wraps it with a registry: it reads the scope's current version (the incumbent), runs the
gate, writes the report, and only if the gate passes (or ``force``) publishes the signed artifact
and moves the scope's pointer with compare-and-swap on the version it read, so a promotion that
raced with another fails instead of overwriting it. A refusal raises `GateRefused` (exit 1)
naming each KPI, scenario, margin and interval; an abstention raises `GateAbstained` (exit 3)
with its reason (an interval that straddles the margin, or a candidate whose rollout lies too
much outside the logs' support). Every interval is the twin's calibrated 90 % interval
(`edgetwin.twin.intervals`): a gate that is wrong when it is sure is the worst failure it can
have, so it says so when it cannot tell.

Policies may not import `edgetwin.edge`, so the registry, signer and trust store are duck-typed
(`RegistryLike`): pass `edgetwin.edge.registry.FileRegistry` / ``open_registry(...)``,
`edgetwin.edge.signing.Signer` and `TrustStore`.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from edgetwin.contract.errors import GateAbstained, GateRefused, InputError
from edgetwin.contract.margins import DEFAULT_MARGIN, KPIMargin
from edgetwin.policies.gate_checks import (
    MAX_OUT_OF_SUPPORT,
    UNCERTAIN,
    VERDICTS,
    GateDecision,
    Guard,
    GuardCheck,
    check_verdict,
    decide,
    episodes_needed,
    evidence_problem,
    gate_markdown,
    kpi_metrics,
    level_text,
    parse_guards,
    parse_level,
    resolve_guards,
)
from edgetwin.twin.whatif import (
    BUILTIN_POLICIES,
    KpiDef,
    PolicySpec,
    Scenario,
    builtin_policy,
    fixed_policy,
    run_whatif,
)


# ------------------------------------------------------------------------------------ policies
def load_view(path: str | Path) -> Any:
    """A `SchedulingView` from a TOML/JSON file (``placement``, ``[[targets]]``, ...)."""
    from edgetwin.policies.heuristics import SchedulingView

    path = Path(path)
    if not path.is_file():
        raise InputError("file not found", str(path))
    try:
        doc = (
            json.loads(path.read_text())
            if path.suffix.lower() == ".json"
            else tomllib.loads(path.read_text())
        )
        return SchedulingView.from_dict(doc)
    except (ValueError, TypeError, KeyError) as e:
        raise InputError(f"not a scheduling view ({type(e).__name__}: {e})", str(path)) from None


def resolve_policy(ref: str | Path, twin: Any, view: Any = None, name: str | None = None) -> PolicySpec:
    """A policy for what-ifs from a reference.

    Args:
        ref: an exported policy directory (`load_policy`), a built-in name (``"logging"``: the
            twin's clone of the logging policy; ``"logged"``: the log's own actions, replay only;
            ``"random"``), or ``"heuristic:NAME"`` (`edgetwin.policies.heuristics`, needs ``view``).
        twin: the twin it will act in (its observation/action columns must match).
        view: a `SchedulingView` (or a path to one) for heuristics.
        name: its name in reports (default: the directory name or the reference).

    Raises:
        InputError: not a policy, unknown name, columns that do not match the twin's.
    """
    text = str(ref)
    if text in BUILTIN_POLICIES:
        spec = builtin_policy(text, twin)
        spec.name = name or text
        return spec
    if text.startswith("heuristic:"):
        from edgetwin.policies.heuristics import make_heuristic

        if view is not None and not hasattr(view, "placement"):
            view = load_view(view)
        h = make_heuristic(text.partition(":")[2], twin.spec, view)
        return fixed_policy(name or text, h)
    path = Path(text)
    if path.is_dir():
        from edgetwin.policies.export import check_policy_spec, load_policy

        pol = load_policy(path)
        check_compatible(pol.spec, twin, str(path))
        check_policy_spec(pol, twin.spec, str(path))
        return fixed_policy(name or path.name, pol)
    raise InputError(
        f"not a policy directory, built-in ({', '.join(BUILTIN_POLICIES)}) or heuristic:NAME: {text!r}",
        "--policy",
    )


def check_compatible(spec: Any, twin: Any, where: str) -> None:
    """The policy must act on the twin's observation columns and produce its action columns."""
    for what, a, b in (
        ("observation", spec.observation_columns, twin.spec.observation_columns),
        ("action", spec.action_columns, twin.spec.action_columns),
    ):
        if list(a) != list(b):
            raise InputError(f"the policy's {what} columns {list(a)} are not the twin's {list(b)}", where)


# ------------------------------------------------------------------------------------ the gate
def check_held_out(twin: Any, log: pd.DataFrame | None, episodes: int, calibration: Any = None) -> None:
    """The gate calibrates on held-out traffic: refuse (`InputError`, exit 2) when the episodes it
    would calibrate on, the last ``episodes`` of ``log`` (or those ``calibration`` records), are
    episodes the twin was fitted on (`edgetwin.twin.logdata.overlapping_episodes`): scored on its
    own training data, the twin's error looks smaller than it is, and so do the intervals."""
    from edgetwin.twin.logdata import overlapping_episodes

    meta = getattr(twin, "meta", {}) or {}
    train = set((meta.get("episode_sha256") or {}).values())
    if calibration is not None and getattr(calibration, "episode_sha256", None) and train:
        bad = sorted(n for n, h in calibration.episode_sha256.items() if h in train)
        if bad:
            raise InputError(
                f"the calibration was computed on episode(s) {bad} of the twin's training data; calibrate on a log "
                "the twin was not fitted on",
                "--calibration",
            )
    if calibration is None and log is not None and "episode" in log.columns:
        names = [str(x) for x in pd.unique(log["episode"])][-int(episodes) :]
        bad = overlapping_episodes(meta, log, names, getattr(twin, "spec", None))
        if bad:
            raise InputError(
                f"episode(s) {bad} of the log are the twin's training data; the gate calibrates on them, so give a "
                "recent log the twin was not fitted on",
                "--log",
            )


def run_gate(
    twin: Any,
    candidate: PolicySpec,
    baseline: PolicySpec,
    *,
    log: pd.DataFrame | None,
    scenarios: Sequence[Scenario] = (),
    guards: Sequence[KPIMargin] | None = None,
    default_margin: float = DEFAULT_MARGIN,
    kpis: Sequence[KpiDef] | None = None,
    episodes: int = 4,
    seeds: int = 1,
    seed: int = 0,
    members: Sequence[int] | None = None,
    steps: int | None = None,
    exogenous: Sequence[str] = (),
    refuse_out_of_support: bool = False,
    oos_tolerance: float = 0.05,
    max_out_of_support: float = MAX_OUT_OF_SUPPORT,
    calibration: Any = None,
    progress: bool = False,
    level: float | None = None,
    method: str | None = None,
    ahead: Sequence[Any] = (),
) -> GateDecision:
    """Replay ``candidate`` and ``baseline`` in the twin (recent ``log``, nominal + ``scenarios``)
    and check the guarded KPIs; see the module docstring and `decide`. ``episodes`` recorded
    episodes (the last of the log) are replayed with every member and ``seeds`` noise seeds.

    ``calibration`` (`edgetwin.twin.intervals.Calibration`) widens the intervals by the twin's
    error on held-out logs; by default (with a log) the log's own actions are replayed too and the
    twin is calibrated on them: the recent log is traffic the twin was not fitted on, and its
    logged KPIs are the real system's answer for the logged actions.

    ``method``: the intervals' construction (`edgetwin.twin.intervals.METHODS`; default
    ``"replayed"``, the effect-size term calibrated on the replayed days; ``"hybrid"`` is the
    construction before it, narrower, whose normalised term can collapse or explode on a small twin).

    ``ahead``: cells of the baseline (or of the replayed log's own actions, ``"logged"``) run before
    with these arguments (`edgetwin.twin.whatif.run.run_policy_cells`), not run again: the same
    decision (the demo runs them on its spare core while the candidate trains)."""
    from edgetwin.twin.intervals import METHODS

    if method is not None and method not in METHODS:
        raise InputError(f"unknown interval method {method!r}; expected one of {', '.join(METHODS)}", "interval_method")
    if candidate.name == baseline.name:
        candidate = PolicySpec(f"{candidate.name} (candidate)", candidate.factory)
    # fail on a bad guard, or none, before the long replay
    from edgetwin.twin.whatif import default_kpis

    lay = twin.layout
    ks = (
        list(kpis)
        if kpis is not None
        else default_kpis(twin.spec, lay.outputs + ([] if lay.predict_reward else ["reward"]))
    )
    resolve_guards(ks, guards, default_margin)
    check_held_out(twin, log, episodes, calibration)
    pols = [baseline, candidate]
    if calibration is None and log is not None and all(p.factory is not None for p in pols):
        logged = builtin_policy("logged", twin)
        while logged.name in (baseline.name, candidate.name):
            logged.name += "_"
        pols.append(logged)
    result = run_whatif(
        twin,
        pols,
        scenarios,
        baseline=baseline.name,
        kpis=kpis,
        episodes=episodes,
        seeds=seeds,
        seed=seed,
        members=members,
        steps=steps,
        log=log,
        exogenous=exogenous,
        oos_tolerance=oos_tolerance,
        progress=progress,
        calibration=calibration,
        ahead=ahead,
    )
    if method is not None and result.calibration is not None and result.calibration.method != method:
        import copy

        chosen = copy.copy(result.calibration)
        chosen.method = method
        result.calibrate(chosen)
    return decide(result, guards, default_margin, refuse_out_of_support, max_out_of_support, level)


# ------------------------------------------------------------------------------------ promotion
class RegistryLike(Protocol):
    """What `promote` needs of a registry (`edgetwin.edge.registry.PolicyRegistry` has it)."""

    def current(self, scope: str) -> str | None: ...

    def list_versions(self) -> list[str]: ...

    def publish(self, policy_dir: str | Path, metadata: Mapping[str, Any], signer: Any) -> str: ...

    def fetch(self, version: str, dest_dir: str | Path, trust: Any) -> Path: ...

    def set_current(
        self, scope: str, version: str, *, expected: str | None, reason: str = "", kind: str = "promote"
    ) -> Any: ...


@dataclass
class PromotionResult:
    """What `promote` did.

    Attributes:
        promoted: the pointer moved. forced: the gate was overridden (recorded in the metadata).
        version: the candidate's version in the registry (None when refused before publishing).
        previous: what the scope pointed at before (the CAS ``expected``); against: what the
            candidate was compared with. report: the report's files.
    """

    decision: GateDecision
    promoted: bool
    forced: bool
    scope: str
    version: str | None
    previous: str | None
    against: str
    report: dict[str, Path]
    metadata: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "promoted": self.promoted,
            "forced": self.forced,
            "scope": self.scope,
            "version": self.version,
            "previous": self.previous,
            "against": self.against,
            "gate": self.decision.to_dict(),
            "report": {
                k: str(v) for k, v in self.report.items() if k in ("html", "markdown", "json", "promotion")
            },
        }


_NAME_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _fallback_scopes(scope: str) -> list[str]:
    # the edge runtime serves site -> cluster -> global; a site's cluster is not known here
    return [scope] if scope == "global" else [scope, "global"]


def promote(
    policy: str | Path,
    registry: RegistryLike,
    *,
    twin: Any,
    log: pd.DataFrame,
    signer: Any,
    trust: Any,
    scope: str = "global",
    against: str = "auto",
    scenarios: Sequence[Scenario] = (),
    guards: Sequence[KPIMargin] | None = None,
    default_margin: float = DEFAULT_MARGIN,
    kpis: Sequence[KpiDef] | None = None,
    episodes: int = 4,
    seeds: int = 1,
    seed: int = 0,
    members: Sequence[int] | None = None,
    steps: int | None = None,
    exogenous: Sequence[str] = (),
    refuse_out_of_support: bool = False,
    max_out_of_support: float = MAX_OUT_OF_SUPPORT,
    calibration: Any = None,
    force: bool = False,
    out_dir: str | Path = "promotion-report",
    name: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    view: Any = None,
    progress: bool = False,
    level: float | None = None,
    method: str | None = None,
) -> PromotionResult:
    """Gate ``policy`` against the scope's current version and promote it if nothing regresses.

    Args:
        policy: an exported policy directory, or a version already in the registry.
        registry: a `RegistryLike`.
        twin: the twin to replay in; log: recent traffic of the real system (the contract's table).
        signer: signs the published artifact (`edgetwin.edge.signing.Signer`).
        trust: verifies versions fetched from the registry (`TrustStore`).
        scope: ``"global"``, ``"cluster/<c>"`` or ``"site/<s>"``.
        against: ``"auto"`` (the scope's current version; else the global one; else the twin's
            clone of the logging policy), a registry version, a policy directory or a built-in.
        scenarios, guards, default_margin, kpis, episodes, seeds, seed, members, steps, exogenous,
        refuse_out_of_support, level: see `run_gate` / `decide`.
        force: promote even if the gate refuses (recorded as ``gate.forced`` in the metadata).
        out_dir: where the report goes.
        name: the policy's name in the registry (default: from metadata or the directory name).
        metadata: base metadata (e.g. `edgetwin.edge.registry.metadata_from_policy_dir`).

    Raises:
        GateRefused: a guarded KPI regressed (``.result`` holds the `PromotionResult`).
        GateAbstained: the twin cannot tell (``.result`` holds the `PromotionResult`); nothing is
            published unless ``force``.
        InputError: bad policy, scope, guard or log. The registry's CAS conflict propagates.
    """
    out = Path(out_dir)
    expected = registry.current(scope)  # read before the long replay: the CAS compares against it
    versions = set(registry.list_versions())
    with tempfile.TemporaryDirectory(prefix="edgetwin-promote-") as tmp:
        cand_path, cand_version, cand_name, candidate = _resolve_candidate(
            policy, registry, versions, Path(tmp), trust=trust, twin=twin, name=name, metadata=metadata
        )
        baseline, against_label, parent = _resolve_baseline(
            against, scope, registry, versions, Path(tmp), trust=trust, twin=twin, view=view
        )
        if baseline.name == candidate.name:
            baseline.name = f"{baseline.name}-baseline"

        decision = run_gate(
            twin, candidate, baseline, log=log, scenarios=scenarios, guards=guards, default_margin=default_margin,
            kpis=kpis, episodes=episodes, seeds=seeds, seed=seed, members=members, steps=steps, exogenous=exogenous,
            refuse_out_of_support=refuse_out_of_support, max_out_of_support=max_out_of_support,
            calibration=calibration, progress=progress, level=level, method=method,
        )  # fmt: skip

        files = _write_gate_report(decision, out, candidate.name, against_label, scope, force)
        md = _promotion_metadata(
            decision, metadata, cand_name=cand_name, candidate_label=candidate.name, parent=parent,
            against_label=against_label, scope=scope, force=force,
            report_sha=hashlib.sha256(files["json"].read_bytes()).hexdigest(),
        )  # fmt: skip
        result = PromotionResult(
            decision, False, False, scope, cand_version, expected, against_label, files, md
        )
        files["promotion"] = out / "promotion.json"
        if not decision.passed and not force:
            files["promotion"].write_text(json.dumps(result.to_dict(), indent=1, default=str))
            err: Any = (GateAbstained if decision.verdict == "abstain" else GateRefused)(
                f"{decision.reason()} (report: {files['html']})"
            )
            err.result = result
            raise err
        _publish_and_set_current(result, registry, cand_path, signer, expected=expected, force=force)
        files["promotion"].write_text(json.dumps(result.to_dict(), indent=1, default=str))
        return result


def _resolve_candidate(
    policy: str | Path,
    registry: RegistryLike,
    versions: set[str],
    tmp: Path,
    *,
    trust: Any,
    twin: Any,
    name: str | None,
    metadata: Mapping[str, Any] | None,
) -> tuple[Path, str | None, str, Any]:
    """Step 1 of `promote`: find the candidate (a directory, or a registry version fetched into
    ``tmp``), give it a registry-safe name and load it as a policy.

    Separate because a candidate may already be published (its version is then re-pointed, not
    re-published), which the later publish step must know.

    Returns:
        (its directory, its registry version or None, its sanitised name, the loaded policy).
    """
    cand_path = Path(policy)
    cand_version: str | None = None
    if not cand_path.is_dir():
        if str(policy) in versions:
            cand_version = str(policy)
            cand_path = registry.fetch(cand_version, tmp / "candidate", trust)
        else:
            raise InputError("not a policy directory nor a version in the registry", str(policy))
    cand_name = name or (metadata or {}).get("name") or (cand_version or cand_path.name)
    cand_name = _NAME_SAFE.sub("-", str(cand_name)).strip("-.") or "policy"
    return cand_path, cand_version, cand_name, resolve_policy(cand_path, twin, name=cand_name)


def _resolve_baseline(
    against: str,
    scope: str,
    registry: RegistryLike,
    versions: set[str],
    tmp: Path,
    *,
    trust: Any,
    twin: Any,
    view: Any,
) -> tuple[Any, str, str | None]:
    """Step 2 of `promote`: what the candidate is compared with.

    ``"auto"`` walks the scope's serving fallback (scope, then global) and falls back to the
    twin's clone of the logging policy when nothing is promoted yet; a registry version is
    fetched into ``tmp``; anything else is a directory or a built-in. Separate because the
    choice also fixes the lineage (``parent``) recorded in the published metadata.

    Returns:
        (the baseline policy, its label for the report, the parent version or None).
    """
    parent: str | None = None
    if against == "auto":
        current = next(
            (v for s in _fallback_scopes(scope) if (v := registry.current(s)) is not None), None
        )
        if current is None:
            baseline = resolve_policy("logging", twin, name="logging")
            return baseline, "logging (nothing promoted yet: the twin's clone of the logging policy)", None
        parent = current
        inc = registry.fetch(current, tmp / "incumbent", trust)
        return resolve_policy(inc, twin, name=f"current-{current}"), current, parent
    if against in versions:
        parent = against
        inc = registry.fetch(against, tmp / "incumbent", trust)
        return resolve_policy(inc, twin, name=f"version-{against}"), against, parent
    return resolve_policy(against, twin, view=view), str(against), None


def _write_gate_report(
    decision: GateDecision, out: Path, candidate_label: str, against_label: str, scope: str, force: bool
) -> dict[str, Path]:
    """Step 4 of `promote`: write the report (HTML, Markdown, JSON) with the verdict on top.

    Separate because the report is written whatever the verdict: a refused or abstaining
    candidate leaves the evidence behind, and the JSON's hash is recorded in the metadata.
    """
    from edgetwin.twin.report import markdown_html, write_report

    verdict_md = gate_markdown(decision)
    return write_report(
        decision.result,
        out,
        title=f"Promotion gate: {candidate_label} vs {against_label} ({scope})",
        extra={"gate": decision.to_dict(), "scope": scope, "against": against_label, "forced": force},
        preamble_md=verdict_md,
        preamble_html=markdown_html(verdict_md),
    )


def _promotion_metadata(
    decision: GateDecision,
    metadata: Mapping[str, Any] | None,
    *,
    cand_name: str,
    candidate_label: str,
    parent: str | None,
    against_label: str,
    scope: str,
    force: bool,
    report_sha: str,
) -> dict[str, Any]:
    """Step 5 of `promote`: the registry metadata — the caller's, plus the name, the lineage,
    the candidate's KPI means and the ``gate`` record (verdict, guards, report hash).

    Separate because it is what an auditor reads in the registry: everything the gate decided
    is gathered here in one place.
    """
    md = dict(metadata or {})
    md["name"] = cand_name
    if md.get("parent_version") is None:
        md["parent_version"] = parent
    metrics = dict(md.get("metrics") or {})
    metrics.update(kpi_metrics(decision.result, candidate_label))
    md["metrics"] = metrics
    md["gate"] = {
        "passed": decision.passed,
        "verdict": decision.verdict,
        "forced": bool(force and not decision.passed),
        "against": against_label,
        "scope": scope,
        "failures": [c.describe() for c in decision.failures],
        "abstentions": [c.abstain_reason(decision.max_out_of_support) for c in decision.abstentions],
        "guards": {c.kpi: c.max_regression for c in decision.checks},
        "scenarios": [s.name for s in decision.result.scenarios],
        "report_sha256": report_sha,
    }
    return md


def _publish_and_set_current(
    result: PromotionResult,
    registry: RegistryLike,
    cand_path: Path,
    signer: Any,
    *,
    expected: str | None,
    force: bool,
) -> None:
    """Step 7 of `promote` (the gate passed, or ``force``): publish the candidate unless it is
    already a registry version, then compare-and-set the scope's pointer against ``expected``
    (read before the replay, so a concurrent promotion makes this fail rather than be lost).
    Updates ``result`` in place.
    """
    decision = result.decision
    cand_version = result.version
    if cand_version is None:
        cand_version = registry.publish(cand_path, result.metadata, signer)
    reason = "gate passed" if decision.passed else f"gate overridden (--force, {decision.verdict}): {decision.reason()}"
    registry.set_current(result.scope, cand_version, expected=expected, reason=reason[:500], kind="promote")
    result.version = cand_version
    result.promoted = True
    result.forced = bool(force and not decision.passed)


__all__ = [
    "UNCERTAIN",
    "episodes_needed",
    "parse_level",
    "check_compatible",
    "DEFAULT_MARGIN",
    "MAX_OUT_OF_SUPPORT",
    "VERDICTS",
    "GateAbstained",
    "GateDecision",
    "Guard",
    "GuardCheck",
    "PromotionResult",
    "RegistryLike",
    "decide",
    "gate_markdown",
    "check_held_out",
    "check_verdict",
    "evidence_problem",
    "level_text",
    "kpi_metrics",
    "load_view",
    "parse_guards",
    "promote",
    "resolve_guards",
    "resolve_policy",
    "run_gate",
]
