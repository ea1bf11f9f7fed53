"""Simple candidate policies, and scoring policies in a twin by what it can vouch for.

A policy trained in a twin can exploit the twin's errors; a constant action or the logging
policy's clone cannot do much of that. `edgetwin train` therefore scores the trained policy beside
a built-in set of simple candidates (`simple_candidates`: constant actions on a small grid of the
action box, the twin's clone of the logging policy, heuristics that fit the spec when a
`SchedulingView` is given) and exports the best by the *lower bound* of its 90 % interval of the
return (`score_policies`, `best_by_lower_bound`), saying so when that is not the trained network.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from edgetwin.contract.spec import TwinSpec

__all__ = [
    "CandidateScore",
    "ConstantPolicy",
    "Selection",
    "best_by_lower_bound",
    "score_policies",
    "select_export",
    "simple_candidates",
]


class ConstantPolicy:
    """Always the same action (in spec units); exportable (`to_config`)."""

    def __init__(self, spec: TwinSpec, action: Sequence[float]) -> None:
        self.spec = spec
        self.action = [float(x) for x in action]
        if len(self.action) != len(spec.action_columns):
            raise ValueError(f"expected {len(spec.action_columns)} action values, got {len(self.action)}")

    def act(self, obs: np.ndarray) -> np.ndarray:
        return np.tile(np.asarray(self.action, dtype=np.float64), (len(obs), 1))

    def to_config(self) -> dict[str, Any]:
        return {"action": list(self.action)}

    @property
    def name(self) -> str:
        return "constant(" + ", ".join(f"{x:.3g}" for x in self.action) + ")"


def _action_box(twin: Any) -> tuple[np.ndarray, np.ndarray]:
    low = np.asarray(twin.action_low, dtype=np.float64)
    high = np.asarray(twin.action_high, dtype=np.float64)
    return low, high


def simple_candidates(
    twin: Any, view: Any = None, grid: Sequence[float] = (0.25, 0.75), max_constants: int = 16, seed: int = 0
) -> dict[str, Any]:
    """Built-in simple policies for ``twin``'s spec.

    Constant actions at the centre of the action box and at every combination of the ``grid``
    fractions of each action's range (``len(grid) ** A`` of them; beyond ``max_constants``, the
    centre moved along one action at a time instead), the twin's deterministic clone of the
    logging policy, and, with a `SchedulingView` ``view``, every heuristic of
    `edgetwin.policies.heuristics` that fits the spec.
    """
    spec = twin.spec
    low, high = _action_box(twin)
    mid = (low + high) / 2.0
    points = [mid]
    if len(grid) ** len(low) <= max_constants:
        points += [low + np.asarray(f) * (high - low) for f in itertools.product(grid, repeat=len(low))]
    else:
        for j in range(len(low)):
            for f in grid:
                p = mid.copy()
                p[j] = low[j] + f * (high[j] - low[j])
                points.append(p)
    out: dict[str, Any] = {}
    for p in points:
        c = ConstantPolicy(spec, p)
        out[c.name] = c
    out["logging clone"] = twin.logging_policy(seed=seed, stochastic=False)
    if view is not None:
        from edgetwin.policies.heuristics import HEURISTICS, make_heuristic

        for name in HEURISTICS:
            try:
                out[f"heuristic:{name}"] = make_heuristic(name, spec, view)
            except Exception:  # a heuristic the spec or view does not fit: not a candidate
                continue
    return out


@dataclass
class CandidateScore:
    """One policy's return in the twin: mean, calibrated 90 % interval, out-of-support share."""

    name: str
    mean: float
    low: float
    high: float
    out_of_support: float
    trained: bool = False
    #: the interval is calibrated on held-out logs (``False``: the plain two-level bootstrap over
    #: members x worlds, which covers the twin's mean, not the real system's)
    calibrated: bool = False
    #: the level the interval attains (`edgetwin.twin.intervals.attained_level`; the bootstrap's
    #: nominal 90 % when not calibrated)
    level: float = 0.9

    def interval_label(self) -> str:
        """``"80 % calibrated interval"`` or ``"90 % plain bootstrap interval (not calibrated)"``."""
        pct = f"{100 * self.level:.0f} %"
        return f"{pct} calibrated interval" if self.calibrated else f"{pct} plain bootstrap interval (not calibrated)"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def score_policies(
    twin: Any,
    policies: Mapping[str, Any],
    *,
    log: pd.DataFrame | None = None,
    calibration: Any = None,
    episodes: int = 2,
    seed: int = 0,
    steps: int | None = None,
    n_agents: int | None = None,
    trained: Sequence[str] = (),
    kpi: str = "return",
    progress: bool = False,
) -> list[CandidateScore]:
    """Score every policy's ``kpi`` in the twin (all members, paired worlds), best lower bound first.

    With a held-out ``log`` its episodes are replayed (and, without ``calibration``, the twin is
    calibrated on its logged actions); else fresh worlds are generated.
    """
    from edgetwin.twin.whatif import builtin_policy, default_kpis, fixed_policy, run_whatif

    lay = twin.layout
    kpis = [k for k in default_kpis(twin.spec, lay.outputs + ([] if lay.predict_reward else ["reward"])) if k.name == kpi]
    if not kpis:
        raise ValueError(f"the twin computes no KPI {kpi!r}")
    specs = [fixed_policy(n, p) for n, p in policies.items()]
    if log is not None and calibration is None:
        specs.append(builtin_policy("logged", twin))
    res = run_whatif(
        twin, specs, [], kpis=kpis, episodes=episodes, seeds=1, seed=seed, steps=steps, n_agents=n_agents,
        log=log, calibration=calibration, progress=progress,
    )  # fmt: skip
    out = []
    for name in policies:
        s = res.summary(name, "nominal", kpi)
        lo, hi = s["interval"]
        cal = res.calibration
        level = 0.9 if cal is None else min(cal.level, cal.attained(kpi))
        out.append(
            CandidateScore(name, s["mean"], lo, hi, s["out_of_support"], name in trained, cal is not None, level)
        )
    out.sort(key=lambda c: -c.low if math.isfinite(c.low) else math.inf)
    return out


def best_by_lower_bound(scores: Sequence[CandidateScore]) -> CandidateScore:
    """The policy whose 90 % interval's lower bound is highest (ties: the trained one)."""
    return max(scores, key=lambda c: (c.low if math.isfinite(c.low) else -math.inf, c.trained))


@dataclass
class Selection:
    """What `select_export` did: every score, the chosen policy, and where the trained one is."""

    scores: list[CandidateScore]
    chosen: str
    trained: str
    replaced: bool
    path: str
    trained_path: str
    note: str
    #: every exportable candidate was beyond the support limit: the export rests on states the logs
    #: never showed (the note says so)
    unsupported: bool = False
    max_out_of_support: float = 0.25
    #: the `edgetwin canary plan` command that would get the trained network its evidence
    #: ("" when the trained network is the export)
    evidence_command: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "scores": [s.to_dict() for s in self.scores],
            "chosen": self.chosen,
            "trained": self.trained,
            "exported_trained_network": not self.replaced,
            "path": self.path,
            "trained_path": self.trained_path,
            "note": self.note,
            "unsupported": self.unsupported,
            "max_out_of_support": self.max_out_of_support,
            "evidence_command": self.evidence_command,
            "interval": self.scores[0].interval_label() if self.scores else "",
            "calibrated": bool(self.scores and self.scores[0].calibrated),
        }


def _beats(a: CandidateScore, b: CandidateScore) -> bool:
    """Whether ``a``'s lower bound is strictly above ``b``'s (a non-finite bound beats nothing)."""
    return math.isfinite(a.low) and (not math.isfinite(b.low) or a.low > b.low)


def export_note(best: CandidateScore, trained: CandidateScore, limit: float, trained_path: str) -> str:
    """The sentence `select_export` prints: the real reason first, a comparison only when it is true.

    ``best`` is the exported candidate, ``trained`` the trained network's score, ``limit`` the
    support rule (a share of agent-steps, e.g. 0.25). Why this order: a note that led with "the
    lower bound 26.43 beats 29.97" when the network was dropped for being 65 % off the logs'
    support said the opposite of what happened (issue 46).
    """
    label = best.interval_label()
    if best.trained:
        return f"exported the trained network: the lower bound of its {label} ({best.low:.4g}) is the best"
    head = f"exported {best.name!r}, NOT the trained network: "
    tail = f"; the trained network is kept in {trained_path}"
    off = trained.out_of_support > limit and best.out_of_support <= limit
    if off:
        reason = (
            f"{100 * trained.out_of_support:.0f} % of the trained network's agent-steps are outside the logs' "
            f"support, over the {100 * limit:.0f} % rule (the gate's), so the twin cannot vouch for it"
        )
        if _beats(best, trained):
            reason += (
                f"; the lower bound of the {label} of the return of {best.name!r} ({best.low:.4g}) is also above "
                f"the trained network's ({trained.low:.4g})"
            )
        elif _beats(trained, best):
            reason += (
                f"; the trained network's lower bound in the twin ({trained.low:.4g}) is above that of {best.name!r} "
                f"({best.low:.4g}), but that number rests on states the logs never showed"
            )
        return head + reason + tail
    if _beats(best, trained):
        return (
            head + f"the lower bound of its {label} of the return ({best.low:.4g}) beats the trained network's "
            f"({trained.low:.4g})" + tail
        )
    return head + f"the lower bounds do not rank them ({best.low:.4g} against the trained network's {trained.low:.4g})" + tail


def evidence_command(twin_dir: str | Path | None, trained_path: str | Path, log_path: str | Path | None) -> str:
    """The `edgetwin canary plan` command that would get the trained network (kept, loadable with
    `load_policy`, in ``trained_path``) its evidence on a slice of the real system (issue 43 item 8).

    ``TWIN`` and ``RECENT_LOG`` stand in where the directory or the recent log is not known.
    """
    import shlex

    twin = shlex.quote(str(twin_dir)) if twin_dir is not None else "TWIN"
    log = shlex.quote(str(log_path)) if log_path is not None else "RECENT_LOG"
    return f"edgetwin canary plan {twin} --policy {shlex.quote(str(trained_path))} --log {log} --max-share 10%"


def select_export(
    twin: Any,
    policy_dir: str | Path,
    *,
    view: Any = None,
    log: pd.DataFrame | None = None,
    episodes: int = 2,
    seed: int = 0,
    steps: int | None = None,
    n_agents: int | None = None,
    progress: bool = False,
    max_out_of_support: float | None = None,
    twin_dir: str | Path | None = None,
    log_path: str | Path | None = None,
) -> Selection:
    """Score the trained policy in ``policy_dir`` beside `simple_candidates` and keep the best by
    the lower bound of its 90 % interval of the return.

    When a simple candidate wins and can be exported (constants and heuristics can; the logging
    clone cannot, so the best exportable one is taken), the trained network is moved to
    ``<policy_dir>.trained`` and the winner exported to ``policy_dir`` (metadata
    ``selected_over``); the `Selection`'s ``note`` says so.

    The gate's support rule applies (``max_out_of_support``, default
    `edgetwin.policies.gate.MAX_OUT_OF_SUPPORT`): a candidate with a larger share of its
    agent-steps outside the logs' support is not eligible, since its interval is only as good as
    the twin off its data; when no exportable candidate is within it, the best is exported anyway
    and the note says so loudly (``Selection.unsupported``).

    When the trained network is not exported, the note says why first (`export_note`) and ends with
    the `edgetwin canary plan` command that would get it evidence from the real system
    (`evidence_command`; ``twin_dir`` and ``log_path`` fill it in, else it names placeholders).
    """
    from edgetwin.policies.gate import MAX_OUT_OF_SUPPORT

    limit = MAX_OUT_OF_SUPPORT if max_out_of_support is None else float(max_out_of_support)
    import shutil

    from edgetwin.policies.export import export_policy, load_policy

    policy_dir = Path(policy_dir)
    trained_name = "trained network"
    pols: dict[str, Any] = {trained_name: load_policy(policy_dir)}
    pols.update(simple_candidates(twin, view=view, seed=seed))
    scores = score_policies(
        twin, pols, log=log, episodes=episodes, seed=seed, steps=steps, n_agents=n_agents, trained=[trained_name],
        progress=progress,
    )  # fmt: skip
    exportable = [s for s in scores if s.trained or hasattr(pols[s.name], "to_config")]
    supported = [s for s in exportable if s.out_of_support <= limit]
    best = best_by_lower_bound(supported or exportable)
    overall = best_by_lower_bound([s for s in scores if s.out_of_support <= limit] or scores)
    trained_path = policy_dir
    t = next(s for s in scores if s.trained)
    note = export_note(best, t, limit, str(policy_dir))
    if not best.trained:
        trained_path = policy_dir.with_name(policy_dir.name + ".trained")
        if trained_path.exists():
            shutil.rmtree(trained_path)
        shutil.move(str(policy_dir), str(trained_path))
        export_policy(
            pols[best.name], policy_dir, twin.spec,
            metadata={"name": best.name, "selected_over": {"trained_network": str(trained_path),
                      "trained_lower_bound": t.low, "chosen_lower_bound": best.low}},
        )  # fmt: skip
        note = export_note(best, t, limit, str(trained_path))
    if overall.name != best.name:
        note += f" ({overall.name!r} scored higher but cannot be exported)"
    skipped = [s.name for s in exportable if s.out_of_support > limit and s.low > best.low]
    if supported and skipped:
        note += (
            f"; not eligible, more than {100 * limit:.0f} % of their agent-steps outside the logs' support "
            f"(the gate's rule): {', '.join(skipped)}"
        )
    if not supported:
        note = (
            f"WARNING: NO candidate stays within the logs' support: every exportable one has more than "
            f"{100 * limit:.0f} % of its agent-steps outside it (the gate's rule; {best.name!r}: "
            f"{100 * best.out_of_support:.0f} %), so the twin cannot vouch for any; the gate will abstain on it. "
        ) + note
    evidence = ""
    if not best.trained:
        evidence = evidence_command(twin_dir, trained_path, log_path)
        note += f"\nto get the trained network its evidence on a slice of the real system: {evidence}"
    return Selection(
        scores, best.name, trained_name, not best.trained, str(policy_dir), str(trained_path), note,
        unsupported=not supported, max_out_of_support=limit, evidence_command=evidence,
    )  # fmt: skip
