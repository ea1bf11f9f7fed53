"""A canary at the edge: its order, its run (slice router + guard + log) and its result.

`EdgeRuntime.start_canary(CanaryConfig)` fetches the candidate version from the registry (verified
like any version), and from then on `EdgeRuntime.decide_for` serves each row by its group's arm
(`edgetwin.edge.canary_slice`): the candidate on the candidate arm, the current policy elsewhere.
A site-level switchback (`CanaryConfig.switchback`) serves every group of its sites the arm of the
block of each decision's tick instead (`edgetwin.edge.canary_switchback`), and its guard judges
pairs of blocks (`Canary._observe_switchback`).
Whoever observes the outcomes (the emulated cluster's driver, `edgetwin.loop.fleet`, or
a site's collector) hands each tick's rows back with `EdgeRuntime.canary_report`; those rows are
the canary's log: ordinary rows of the log contract, with ``policy`` (the registry version that
made the decision) and ``propensity`` (as docs/log-format.md defines it: the probability or
density of the logged action under that policy, given what it saw, where the policy says it
(`edgetwin.contract.policy.LoggingPolicy`); for a deterministic policy 1 with discrete actions,
empty (unknown) with continuous ones). Which arm a group was randomized to, and with what
probability, is the plan's (`CanarySlice.treat_share`, `RoutedDecision.assignment`): a group keeps
its arm for the whole canary, so the rows of the two arms are a randomized trial.

**Durability.** Every reported tick is written to a spool segment (Parquet, in the runtime's cache
directory) *before* `canary_report` returns, and only then shipped: over a bus as a durable
``canary_log`` message (JetStream on NATS; de-duplicated by its id ``<run>-<seq>-<digest>`` when a
retry re-sends it), a segment marked shipped once the bus acknowledged it. If the link fails, the
canary stops at once (``link``: nobody can watch it) and the slice returns to the current policy;
the unshipped segments are re-sent when the bus works again, or by the next runtime started on the
same cache directory (``runtime``: a runtime that died mid-canary restarts on the current policy;
a canary started from Python is never resumed; one started by a signed command is, see below). So a canary killed
mid-way loses no row it reported.

The cloud side reads the log with `CanaryLogCollector` (a durable subscription on
``edgetwin.canary.log.>``), which keeps each segment once, attributed to the site of its
authenticated sender. A canary started by a signed command (`edgetwin.edge.canary_command`)
carries the command's run id and, when its runtime dies mid-run, is resumed from its spool by the
next runtime started on the same cache directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import math
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.edge.bus import Received, Subjects
from edgetwin.edge.canary_guard import CanaryGuard, GuardStop, cuped_slope
from edgetwin.edge.canary_slice import CanarySlice, SliceRouter
from edgetwin.edge.canary_switchback import SwitchbackDesign, SwitchbackRouter, block_index
from edgetwin.edge.kpi_watch import KPIMargin
from edgetwin.edge.messages import Envelope, KindSchema, register_kind
from edgetwin.edge.parquet_bounds import read_parquet_bounded

__all__ = [
    "STOP_REASONS",
    "Canary",
    "CanaryConfig",
    "CanaryLogCollector",
    "CanaryResult",
    "RoutedDecision",
    "arm_worsening",
    "canary_log_subject",
    "fleet_loss",
    "read_spool",
]

log = logging.getLogger("edgetwin.runtime")

#: why a canary ended: it ran its hours; the guard stopped it; the link (bus) failed; an operator
#: stopped it; the runtime stopped (or died) before it ended; the current policy changed meanwhile;
#: one more tick would have spent more than the operator's loss budget (`CanaryConfig.max_loss`)
STOP_REASONS = ("completed", "guard", "link", "operator", "runtime", "swapped", "budget")

#: columns every reported canary row must have (besides the guarded KPIs)
_REQUIRED = ("episode", "t", "agent", "site", "policy", "propensity")


def canary_log_subject(site: str) -> str:
    """Where ``site``'s runtime ships its canary log (durable)."""
    Subjects.decision(site)  # a valid subject token
    return f"{Subjects.PREFIX}.canary.log.{site}"


register_kind(
    "canary_log",
    KindSchema(required={"site": str, "canary": str, "seq": int}, tensors=("parquet",)),
)


# ------------------------------------------------------------------------------------- the order
@dataclasses.dataclass(frozen=True)
class CanaryConfig:
    """What a canary is asked to do.

    Attributes:
        candidate: the registry version served to the candidate arm (published and signed).
        slice: the service groups / sites taking part, and the candidate's share of them.
        hours: how long it runs (in the system's time: ticks of ``tick_seconds``).
        margins: the guarded KPIs and how far each may regress (relative to the control arm).
        alpha: the chance that the guard stops a canary whose candidate is within its margins.
        tick_seconds: the length of one reported tick (the emulated cluster's: 900 s).
        batch, min_reports: the guard's (`CanaryGuard`).
        max_loss: ``(kpi, fraction)`` pairs: the operator's loss budget per guarded KPI, the largest
            fleet-wide relative worsening the canary may cause over its hours (`fleet_loss`); the
            canary stops (``budget``) when one more tick twice as bad as its worst tick so far
            would spend more (`Canary._over_budget_next_tick`). Empty: no loss budget (the guard alone
            stops it).
        fleet_groups: the fleet's service groups (the denominator of the fleet-wide loss; required
            with ``max_loss``).
        loss_levels: ``(kpi, level)`` pairs: the fleet's level of each budgeted KPI under the
            current policy (the plan's ``loss_levels``), the scale of the relative loss
            (`arm_worsening`); a KPI without one is measured against the control arm's mean.
        pre_ticks: ticks at the start during which every group is still served the current policy:
            each group's KPI means over them are its own baseline, which explains most of how
            groups differ (`Canary.composition`). Groups differ far more than policies do (on the
            emulated cluster the spread of groups' SLO violation is ~0.3 while policies move its
            mean by ~0.05), so without it the guard's composition term swamps any effect. The
            canary runs ``pre_ticks`` + its hours' ticks. 0: no baseline (every group judged).
        canary_id: a name for logs and the bus (default: a hash of everything above).
        switchback: a site-level switchback (`edgetwin.edge.canary_switchback.SwitchbackDesign`)
            instead of a group split: every group of its sites on one arm at a time, by the block
            of the decision's tick. Its slice is its sites (``slice.sites``), its ``pre_ticks`` its
            ``start_tick``, its hours its blocks' ticks; no loss budget (`Canary` says how its
            guard judges). None: the slice's groups split into two arms.
    """

    candidate: str
    slice: CanarySlice
    hours: float
    margins: tuple[KPIMargin, ...]
    alpha: float = 0.05
    tick_seconds: float = 900.0
    batch: int = 4
    min_reports: int = 8
    pre_ticks: int = 4
    canary_id: str = ""
    max_loss: tuple[tuple[str, float], ...] = ()
    fleet_groups: int = 0
    loss_levels: tuple[tuple[str, float], ...] = ()
    switchback: SwitchbackDesign | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "margins", tuple(self.margins))
        if not self.candidate:
            raise InputError("a canary needs a candidate version", where="canary")
        if not (math.isfinite(self.hours) and self.hours > 0):
            raise InputError(f"a canary's hours must be > 0, got {self.hours}", where="canary")
        if not (math.isfinite(self.tick_seconds) and self.tick_seconds > 0):
            raise InputError(f"tick_seconds must be > 0, got {self.tick_seconds}", where="canary")
        if not self.margins:
            raise InputError("a canary needs at least one guarded KPI (margins)", where="canary")
        if int(self.pre_ticks) < 0:
            raise InputError(f"pre_ticks must be >= 0, got {self.pre_ticks}", where="canary")
        object.__setattr__(self, "max_loss", tuple((str(k), float(v)) for k, v in dict(self.max_loss).items()))
        guarded = {m.kpi for m in self.margins}
        for k, v in self.max_loss:
            if k not in guarded:
                raise InputError(f"a loss budget for {k!r}, which the canary does not guard ({sorted(guarded)})",
                                 where="canary")  # fmt: skip
            if not (math.isfinite(v) and v > 0):
                raise InputError(f"{k}: the loss budget must be > 0, got {v}", where="canary")
        object.__setattr__(self, "loss_levels", tuple((str(k), float(v)) for k, v in dict(self.loss_levels).items()))
        for k, v in self.loss_levels:
            if not (math.isfinite(v) and v != 0):
                raise InputError(f"{k}: the fleet's level of a budgeted KPI must be finite and non-zero, got {v}",
                                 where="canary")  # fmt: skip
        if self.max_loss and int(self.fleet_groups) < 1:
            raise InputError("a loss budget needs the fleet's size (fleet_groups >= 1)", where="canary")
        if self.switchback is not None:
            self._check_switchback(self.switchback)
        if not self.canary_id:
            order: dict[str, Any] = {"candidate": self.candidate, "slice": self.slice.to_dict(), "hours": self.hours,
                                     "margins": [dataclasses.asdict(m) for m in self.margins], "alpha": self.alpha}
            if self.max_loss:  # only then: an order without a budget keeps the id it always had
                order.update(max_loss=list(self.max_loss), fleet_groups=int(self.fleet_groups),
                             loss_levels=list(self.loss_levels))  # fmt: skip
            if self.switchback is not None:
                order["switchback"] = self.switchback.to_dict()
            doc = json.dumps(order, sort_keys=True)
            object.__setattr__(self, "canary_id", "c" + hashlib.sha256(doc.encode()).hexdigest()[:12])
        Subjects.decision(self.canary_id)  # a subject token: it names the bus messages

    def _check_switchback(self, sb: SwitchbackDesign) -> None:
        """A switchback's slice, pre-period and hours are its design's (one line otherwise)."""
        if not isinstance(sb, SwitchbackDesign):
            raise InputError("switchback must be a SwitchbackDesign", where="canary switchback")
        sl = self.slice
        if sl.agents or sl.scenarios or set(sl.sites) != set(sb.sites):
            raise InputError(f"a switchback's slice is its sites {list(sb.sites)}, got {sl.to_dict()}",
                             where="canary switchback")  # fmt: skip
        if int(self.pre_ticks) != int(sb.start_tick):
            raise InputError(f"a switchback's pre_ticks are its start_tick ({sb.start_tick}), got {self.pre_ticks}",
                             where="canary switchback")  # fmt: skip
        if self.ticks != sb.ticks:
            raise InputError(f"{self.hours:g} h of {self.tick_seconds:g} s ticks is {self.ticks} ticks, the switchback's "
                             f"{sb.n_blocks} blocks of {sb.block_ticks} ticks are {sb.ticks}", where="canary switchback")  # fmt: skip
        if self.max_loss:
            raise InputError("a switchback carries no loss budget (its guard stops it; the plan checked its worst "
                             "case)", where="canary switchback")  # fmt: skip

    @property
    def ticks(self) -> int:
        """Ticks the candidate is served for (at least one), after the ``pre_ticks``."""
        return max(1, math.ceil(self.hours * 3600.0 / self.tick_seconds - 1e-9))

    @property
    def total_ticks(self) -> int:
        return self.ticks + int(self.pre_ticks)

    @classmethod
    def from_plan(cls, plan: Any, candidate: str, spec: Any = None, **overrides: Any) -> CanaryConfig:
        """From a canary *plan* (e.g. `edgetwin.policies`' plan): any object with ``hours``,
        ``margins`` (`KPIMargin`s, ``"kpi<=+5%"`` strings, or objects with ``kpi``,
        ``max_regression`` and optionally ``min_delta`` / ``higher_is_better``, such as the gate's
        guards: their direction then comes from ``spec``'s reward weights, a cost when the reward
        does not weigh the KPI) and either ``slice`` (a
        `CanarySlice`, or any object with those lists) or ``agents`` / ``sites`` / ``scenarios`` lists
        (and optionally ``treat_share``, ``seed``); a plan's ``loss_budget`` (log column ->
        fraction), ``loss_levels`` and ``fleet_groups`` become ``max_loss``, ``loss_levels`` and
        ``fleet_groups``."""
        sl = getattr(plan, "slice", None)
        if not isinstance(sl, CanarySlice):
            src = sl if sl is not None else plan  # a slice object of another module, or the plan itself
            sl = CanarySlice(
                tuple(getattr(src, "agents", ()) or ()), tuple(getattr(src, "sites", ()) or ()),
                float(getattr(src, "treat_share", getattr(plan, "treat_share", 0.5))),
                int(getattr(src, "seed", getattr(plan, "seed", 0))),
                tuple(getattr(src, "scenarios", ()) or ()),
            )  # fmt: skip
        margins = tuple(_margin(m, spec) for m in getattr(plan, "margins", ()))
        kw: dict[str, Any] = {"candidate": candidate, "slice": sl, "hours": float(plan.hours), "margins": margins}
        budget = dict(getattr(plan, "loss_budget", None) or {})  # a canary plan's: log column -> fraction
        if budget:
            kw["max_loss"] = tuple(sorted(budget.items()))
            kw["fleet_groups"] = int(getattr(plan, "fleet_groups", 0) or 0)
            kw["loss_levels"] = tuple(sorted(dict(getattr(plan, "loss_levels", None) or {}).items()))
        for f in ("alpha", "tick_seconds"):
            if getattr(plan, f, None) is not None:
                kw[f] = getattr(plan, f)
        kw.update(overrides)
        return cls(**kw)


@dataclasses.dataclass(frozen=True)
class RoutedDecision:
    """Actions for N rows and who made them.

    Attributes:
        actions: (N, A) float64, spec units, shielded.
        policy: (N,) the registry version that decided each row.
        propensity: (N,) the probability / density of each row's action under its policy (NaN:
            unknown; see the module docstring).
        arm: (N,) ``"candidate"`` / ``"control"`` / ``"fleet"`` (all ``"fleet"`` with no canary).
        assignment: (N,) the probability of the row's arm given its group (1 outside the slice).
    """

    actions: np.ndarray
    policy: np.ndarray
    propensity: np.ndarray
    arm: np.ndarray
    assignment: np.ndarray


@dataclasses.dataclass
class CanaryResult:
    """What a canary did.

    Attributes:
        canary_id, candidate, current: who took part; run_id: this run of it (the key of its
            log on the bus and in the spool).
        stop_reason: one of `STOP_REASONS`.
        guard_stop: the guard's `GuardStop` when ``stop_reason == "guard"``.
        ticks: ticks reported; ``planned_ticks``: ticks it was to run.
        log: the canary's rows (the log contract, ``policy`` / ``propensity`` included), in order.
        intervals: the guard's confidence sequences at the end (per KPI: estimate, lower, upper).
        arms: groups per arm among the reported rows.
        budget_stop: when ``stop_reason == "budget"``: the KPI, its loss so far, the loss one more
            tick would have brought, its budget.
        fleet_log: the rest of the fleet's rows over the same ticks (every group outside the slice,
            on the current policy): the operator's ordinary logs of the canary's window, which the
            verdict may use as a larger control arm (`edgetwin.loop.rounds.canary_verdict`);
            None where the caller has none (a runtime does not ship them: they are not the canary's).
    """

    canary_id: str
    run_id: str
    candidate: str
    current: str
    stop_reason: str
    guard_stop: GuardStop | None
    ticks: int
    planned_ticks: int
    log: pd.DataFrame
    intervals: dict[str, dict[str, float]]
    arms: dict[str, int]
    budget_stop: dict[str, Any] | None = None
    fleet_log: pd.DataFrame | None = None

    @property
    def stopped_by_guard(self) -> bool:
        return self.stop_reason == "guard"

    def summary(self) -> dict[str, Any]:
        """JSON-able, without the log."""
        return {
            "canary": self.canary_id, "run": self.run_id, "candidate": self.candidate, "current": self.current,
            "stop_reason": self.stop_reason, "ticks": self.ticks, "planned_ticks": self.planned_ticks,
            "rows": len(self.log), "arms": self.arms, "intervals": self.intervals,
            "guard_stop": self.guard_stop.to_dict() if self.guard_stop else None, "budget_stop": self.budget_stop,
        }  # fmt: skip


# ------------------------------------------------------------------------------------- the loss
def arm_worsening(cand: float, ctrl: float, cand_pre: float, ctrl_pre: float, higher_is_better: bool,
                  level: float | None = None) -> float:
    """The candidate arm's relative worsening of a KPI against the control arm, net of where the two
    arms stood before the candidate was served (difference in differences; NaN pre-means: none).

    ``((cand - cand_pre) - (ctrl - ctrl_pre)) / |level|``, signed so that positive is worse;
    ``level`` is the fleet's level of the KPI (the plan's ``loss_levels``: what "relative" means
    in the budget), by default the control arm's mean (ill-conditioned when a few groups' KPI is
    near 0, e.g. SLO violations at night). With a handful of groups per arm the arms differ more by
    who is in them than by the policy (the guard's `Canary.composition` says the same); their
    pre-canary means take most of that out. NaN when the level is 0 or not finite."""
    diff = cand - ctrl
    if math.isfinite(cand_pre) and math.isfinite(ctrl_pre):
        diff -= cand_pre - ctrl_pre
    ref = ctrl if level is None else level
    if not (math.isfinite(diff) and math.isfinite(ref)) or ref == 0:
        return float("nan")
    return (-diff if higher_is_better else diff) / abs(ref)


def fleet_loss(worsening: float, n_candidate: int, n_fleet: int, ticks_run: int, planned_ticks: int) -> float:
    """What a canary cost the fleet, as the plan's budget counts it: the candidate arm's relative
    worsening (`arm_worsening`, 0 when it improved) times its share of the fleet's groups times the
    share of the planned hours it ran (a canary stopped early returned its slice to the current
    policy for the rest). A canary that runs its hours at the twin's worst case costs the plan's
    ``fleet_loss`` (`edgetwin.loop.plan.PlannedKPI`)."""
    if not math.isfinite(worsening) or n_fleet < 1 or planned_ticks < 1:
        return 0.0
    return max(0.0, worsening) * n_candidate / n_fleet * min(1.0, ticks_run / planned_ticks)


# ------------------------------------------------------------------------------------- the run
def _margin(m: Any, spec: Any) -> KPIMargin:
    if isinstance(m, KPIMargin):
        return m
    if isinstance(m, str):
        return KPIMargin.parse(m, where="canary plan")
    kpi = getattr(m, "kpi", None)
    if not isinstance(kpi, str):
        raise InputError(f"a canary plan's margin must name a KPI, got {m!r}", where="canary plan")
    hib = getattr(m, "higher_is_better", None)
    if hib is None:  # the spec's declared direction of the column, else its reward weight's sign
        declared = next((f.better for f in getattr(spec, "features", ()) if f.name == kpi), None)
        weights = getattr(spec, "reward_weights", None) or {}
        hib = declared == "higher" if declared is not None else float(weights.get(kpi, 0.0)) > 0
    return KPIMargin(kpi, higher_is_better=bool(hib), max_regression=float(m.max_regression),
                     min_delta=float(getattr(m, "min_delta", 0.0)))  # fmt: skip


def _segment_bytes(rows: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    rows.to_parquet(buf, index=False)
    return buf.getvalue()


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class Canary:
    """One canary in a runtime: routes rows, keeps its spooled log, feeds its guard.

    Args:
        config: the order.
        current: the current policy's version (served to the control and fleet arms).
        spool_dir: where its log segments are written before they are shipped.
        run_id: this run's id (a run started by a signed command carries its own, `edgetwin.edge.
            canary_command`); None: ``<canary_id>-<random>``. A directory already holding segments
            of that run is *resumed*: its segments are fed to the guard again, in order, without
            being written again (`_replay`), so a restarted runtime goes on where the run was.
    """

    def __init__(self, config: CanaryConfig, current: str, spool_dir: Path, run_id: str | None = None) -> None:
        self.config = config
        self.current = current
        sb = config.switchback
        self.router: SliceRouter | SwitchbackRouter
        if sb is None:
            self.router = SliceRouter(config.slice, config.candidate, current)
            self.guard = CanaryGuard(
                config.margins, alpha=config.alpha, t_star=config.ticks, batch=config.batch,
                min_reports=config.min_reports,
            )  # fmt: skip
        else:  # one observation per pair of blocks (`_observe_switchback`); as many observations
            # before it may stop as a split's guard waits for (min_reports ticks in batches of batch)
            pairs = int(sb.n_blocks) // 2
            self.router = SwitchbackRouter(sb, config.candidate, current)
            wait = max(2, math.ceil(int(config.min_reports) / int(config.batch)))
            self.guard = CanaryGuard(config.margins, alpha=config.alpha, t_star=pairs, batch=1,
                                     min_reports=min(wait, pairs), unit="pairs of blocks")  # fmt: skip
        # a switchback's blocks: per block, judged ticks seen and the sum of their per-tick KPI means;
        # the last block a tick was seen of; the blocks already fed to the guard
        self._sb_sums: dict[int, np.ndarray] = {}
        self._sb_last = -1
        self._sb_fed: set[int] = set()
        # One run of a canary: the same order run twice is two runs (two spools, and bus message
        # ids that JetStream's de-duplication does not confuse).
        self.run_id = run_id or f"{config.canary_id}-{uuid.uuid4().hex[:8]}"
        self.dir = Path(spool_dir) / self.run_id
        self.dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.dir / "canary.json", json.dumps(
            {"canary": config.canary_id, "run": self.run_id, "candidate": config.candidate, "current": current}
        ).encode())  # fmt: skip
        self.ticks = 0
        self.seq = 0
        self.stop_reason: str | None = None
        self.guard_stop: GuardStop | None = None
        #: the KPI, its loss so far and its budget when the loss budget stopped the canary
        self.budget_stop: dict[str, Any] | None = None
        self._loss_track: dict[str, tuple[float, float]] = {}  # kpi -> (worsenings summed, worst tick)
        self._arm_groups: dict[str, set[str]] = {"candidate": set(), "control": set(), "fleet": set()}
        # per (arm, group): rows and the sum of each guarded KPI, for the composition's spread
        self._group_sums: dict[tuple[str, str], np.ndarray] = {}
        self._pre_sums: dict[str, np.ndarray] = {}  # group -> rows, sum of each KPI during pre_ticks
        #: the values of the rows' ``t`` recorded so far (a tick reported twice is recorded once)
        self.ticks_seen: set[int] = set()
        self._replay()

    def _replay(self) -> None:
        """Feed the segments already in this run's directory to the guard (a resumed run)."""
        for seg in sorted(self.dir.glob("seg-*.parquet")):
            rows = pd.read_parquet(seg)
            self.seq = int(seg.stem.split("-")[1])
            self.ticks += 1
            self._observe(rows)
        stopped = self.dir / "stopped.json"
        if stopped.is_file():
            self.stop_reason = str(json.loads(stopped.read_text()).get("reason", "runtime"))

    @property
    def active(self) -> bool:
        """The canary runs (not stopped); the candidate is served once `in_pre_period` is over."""
        return self.stop_reason is None

    @property
    def in_pre_period(self) -> bool:
        """Every group is still on the current policy (its baseline is being measured)."""
        return self.ticks < int(self.config.pre_ticks)

    def stop(self, reason: str) -> None:
        if reason not in STOP_REASONS:
            raise ValueError(reason)
        if self.stop_reason is None:
            self.stop_reason = reason
            _atomic_write(self.dir / "stopped.json", json.dumps({"reason": reason}).encode())

    def record(self, rows: pd.DataFrame) -> tuple[int, GuardStop | None]:
        """Spool one tick's rows (durably, first) and feed the guard; returns (segment seq, stop).

        Raises:
            InputError: rows missing a contract column or a guarded KPI, or naming a policy that
                is neither the candidate nor the current one.
        """
        missing = [c for c in (*_REQUIRED, *(m.kpi for m in self.config.margins)) if c not in rows.columns]
        if missing:
            raise InputError(f"canary rows lack column(s) {missing}", where=f"canary {self.config.canary_id}")
        bad = sorted(set(rows["policy"].astype(str)) - {self.config.candidate, self.current})
        if bad:
            raise InputError(
                f"canary rows name policies {bad}, expected {self.config.candidate!r} or {self.current!r}",
                where=f"canary {self.config.canary_id}",
            )
        self.seq += 1
        seg = self.dir / f"seg-{self.seq:06d}.parquet"
        _atomic_write(seg, _segment_bytes(rows.reset_index(drop=True)))
        self.ticks += 1
        return self.seq, self._observe(rows)

    def _observe(self, rows: pd.DataFrame) -> GuardStop | None:
        """Feed one spooled tick to the guard, the loss budget and the arms' bookkeeping."""
        if self.config.switchback is not None:
            return self._observe_switchback(rows)
        if "t" in rows.columns:
            self.ticks_seen.update(int(v) for v in pd.unique(rows["t"]))
        scen = rows["scenario"].astype(str).tolist() if "scenario" in rows.columns else None
        arms = self.router.arms(rows["agent"].astype(str).tolist(), rows["site"].astype(str).tolist(), scen)
        for a in ("candidate", "control", "fleet"):
            self._arm_groups[a].update(rows["agent"].astype(str)[arms == a])
        stop = None
        kpis = [m.kpi for m in self.config.margins]
        if self.ticks <= int(self.config.pre_ticks):  # this tick was served before the candidate
            vals = rows[kpis].to_numpy(dtype=np.float64)
            for i, agent in enumerate(rows["agent"].astype(str)):
                acc = self._pre_sums.setdefault(agent, np.zeros(len(kpis) + 1))
                acc[0] += 1
                acc[1:] += vals[i]
            return None
        vals, keep = self._judged(rows, kpis)
        arms_k = arms[keep]
        cand_m, ctrl_m = arms_k == "candidate", arms_k == "control"
        self._add_group_sums(rows[keep], arms_k, vals)
        if self.active:
            if cand_m.any() and ctrl_m.any():
                cand = {k: float(vals[cand_m, j].mean()) for j, k in enumerate(kpis)}
                ctrl = {k: float(vals[ctrl_m, j].mean()) for j, k in enumerate(kpis)}
                stop = self.guard.observe(cand, ctrl, self.composition())
            if stop is not None:
                self.guard_stop = stop
                self.stop("guard")
            elif self.ticks < self.config.total_ticks and self._over_budget_next_tick():
                self.stop("budget")
            elif self.ticks >= self.config.total_ticks:
                self.stop("completed")
        return stop

    def _observe_switchback(self, rows: pd.DataFrame) -> GuardStop | None:
        """Feed one spooled tick of a switchback: its judged rows (of its sites, in a block, past
        the block's burn-in) make the tick's mean of each guarded KPI, a block's mean is the mean
        of its judged ticks, and each pair of blocks with one on each arm, once both are over,
        is ONE observation of the guard (candidate block's mean vs the current block's).

        Why pairs of blocks and not ticks: within a block every tick is on the same arm, so no tick
        has both arms to compare; a pair is the switchback's unit of randomization (under the
        ``paired`` scheme a coin said which of its two blocks gets the candidate, so the
        difference of its blocks is unbiased for the pair's effect and cancels the slow trend of
        the day; under ``complete`` the k-th candidate block is paired with the k-th current
        block in time order). The guard's always-valid sequence is then over pairs (``t_star`` =
        the pairs, ``batch`` 1, no composition term: the same groups are on both arms; it may stop
        after ``ceil(min_reports / batch)`` pairs, at least 2, as many observations as a split's
        guard waits for), so a regression stops the whole site at the end of the first pair that
        makes it certain.
        A block is over once its judged ticks are all seen or a tick of a later block arrives."""
        sb = self.config.switchback
        assert sb is not None and isinstance(self.router, SwitchbackRouter)
        kpis = [m.kpi for m in self.config.margins]
        ticks = rows["t"].to_numpy(np.int64) if "t" in rows.columns else np.full(len(rows), self.ticks - 1)
        if len(ticks):
            self.ticks_seen.update(int(v) for v in np.unique(ticks))
            self.router.tick = int(ticks.max())
        sites = rows["site"].astype(str).tolist()
        block, judged = block_index(sb, ticks)
        arms = np.where(block >= 0, self.router.arms(rows["agent"].astype(str).tolist(), sites, None, t=ticks), "fleet")
        agents = rows["agent"].astype(str)
        for a in ("candidate", "control", "fleet"):
            self._arm_groups[a].update(agents[arms == a])
        sel = judged & self.router.in_sites(sites)
        if sel.any():
            per_tick = rows.loc[sel, kpis].astype(np.float64).groupby(ticks[sel]).mean()
            for tick, means in per_tick.iterrows():
                b = int(block_index(sb, np.array([int(tick)]))[0][0])
                acc = self._sb_sums.setdefault(b, np.zeros(len(kpis) + 1))
                acc[0] += 1
                acc[1:] += means.to_numpy(np.float64)
        if (block >= 0).any():
            self._sb_last = max(self._sb_last, int(block.max()))
        stop = None
        if self.active:
            stop = self._feed_pairs(kpis, final=self.ticks >= self.config.total_ticks)
            if stop is not None:
                self.guard_stop = stop
                self.stop("guard")
            elif self.ticks >= self.config.total_ticks:
                self.stop("completed")
        return stop

    def _feed_pairs(self, kpis: list[str], final: bool) -> GuardStop | None:
        """Feed the guard every pair of blocks that is over and not fed yet (`_observe_switchback`)."""
        sb = self.config.switchback
        assert sb is not None
        need = sb.judged_ticks_per_block

        def over(b: int) -> bool:
            acc = self._sb_sums.get(b)
            return final or self._sb_last > b or (acc is not None and acc[0] >= need)

        done = [b for b in range(int(sb.n_blocks)) if over(b) and b not in self._sb_fed]
        if sb.scheme == "paired":
            pairs = [(b, b + 1) for b in done if b % 2 == 0 and b + 1 in done]
        else:  # the k-th candidate block with the k-th current block, in time order
            fed_c = sum(1 for b in self._sb_fed if sb.assignment[b] == 1)
            fed_b = len(self._sb_fed) - fed_c
            on_c = [b for b in range(int(sb.n_blocks)) if sb.assignment[b] == 1 and (over(b) or b in self._sb_fed)]
            on_b = [b for b in range(int(sb.n_blocks)) if sb.assignment[b] == 0 and (over(b) or b in self._sb_fed)]
            k0 = min(fed_c, fed_b)
            pairs = list(zip(on_c[k0:], on_b[k0:], strict=False))
        stop = None
        for a, b in pairs:
            self._sb_fed.update((a, b))
            on, off = (a, b) if sb.assignment[a] == 1 else (b, a)
            acc_on, acc_off = self._sb_sums.get(on), self._sb_sums.get(off)
            if acc_on is None or acc_off is None or acc_on[0] < 1 or acc_off[0] < 1:
                continue  # a block with no judged tick reported: nothing to compare
            cand = {k: float(acc_on[1 + j] / acc_on[0]) for j, k in enumerate(kpis)}
            ctrl = {k: float(acc_off[1 + j] / acc_off[0]) for j, k in enumerate(kpis)}
            stop = self.guard.observe(cand, ctrl, None) or stop
        return stop

    def loss_so_far(self) -> dict[str, float]:
        """Per KPI with a loss budget: the fleet-wide loss the canary has caused (`fleet_loss` of
        its ticks so far)."""
        return {k: v[0] for k, v in self._losses(0).items()}

    def _losses(self, ahead: int) -> dict[str, tuple[float, float]]:
        """Per budgeted KPI: (loss after ``ahead`` more ticks at the worsening so far, worsening)."""
        cfg = self.config
        if not cfg.max_loss:
            return {}
        idx = {m.kpi: j for j, m in enumerate(cfg.margins)}
        hib = {m.kpi: m.higher_is_better for m in cfg.margins}
        run = self.ticks - int(cfg.pre_ticks)
        out = {}
        for kpi, _cap in cfg.max_loss:
            j = 1 + idx[kpi]
            means = {}
            for arm in ("candidate", "control"):
                accs = [(a, acc) for (ar, a), acc in self._group_sums.items() if ar == arm]
                rows = sum(acc[0] for _, acc in accs)
                pre = [self._pre_sums[a] for a, _ in accs if a in self._pre_sums]
                pre_rows = sum(p[0] for p in pre)
                means[arm] = (sum(acc[j] for _, acc in accs) / rows if rows else float("nan"),
                              sum(p[j] for p in pre) / pre_rows if pre_rows else float("nan"))  # fmt: skip
            w = arm_worsening(means["candidate"][0], means["control"][0], means["candidate"][1], means["control"][1],
                              hib[kpi], dict(cfg.loss_levels).get(kpi))  # fmt: skip
            n_c = sum(1 for (ar, _a) in self._group_sums if ar == "candidate")
            out[kpi] = (fleet_loss(w, n_c, int(cfg.fleet_groups), run + ahead, cfg.ticks), w)
        return out

    def _over_budget_next_tick(self) -> bool:
        """Whether one more tick twice as bad as the worst tick so far would spend more than a KPI's
        loss budget; records why in ``budget_stop``.

        The loss is linear in the ticks' worsenings (`fleet_loss` of their mean times the ticks
        run), so the loss so far plus twice the largest one-tick increment seen (never less than
        twice the running mean's) bounds the next tick's unless that tick is more than twice as bad
        as any before it. Called once per judged tick."""
        run = self.ticks - int(self.config.pre_ticks)
        n_c = sum(1 for (ar, _a) in self._group_sums if ar == "candidate")
        unit = fleet_loss(1.0, n_c, int(self.config.fleet_groups), 1, self.config.ticks)  # one tick of worsening 1
        for kpi, (loss, w) in self._losses(0).items():
            cap = dict(self.config.max_loss)[kpi]
            cum = (w * run) if math.isfinite(w) else 0.0  # the ticks' worsenings summed
            prev, worst = self._loss_track.get(kpi, (0.0, 0.0))
            worst = max(worst, cum - prev, w if math.isfinite(w) else 0.0)
            self._loss_track[kpi] = (cum, worst)
            nxt = loss + 2.0 * max(0.0, worst) * unit
            if nxt > cap:
                self.budget_stop = {"kpi": kpi, "loss_next_tick": nxt, "worsening": w, "budget": cap,
                                    "loss_so_far": loss, "ticks": self.ticks}  # fmt: skip
                return True
        return False

    def _judged(self, rows: pd.DataFrame, kpis: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(rows kept x KPIs) values, and the kept-row mask: groups with no pre-period rows have
        no baseline and are not judged (all rows when ``pre_ticks`` is 0)."""
        vals = rows[kpis].to_numpy(dtype=np.float64)
        if int(self.config.pre_ticks) == 0:
            return vals, np.ones(len(rows), dtype=bool)
        keep = rows["agent"].astype(str).map(lambda a: a in self._pre_sums).to_numpy(dtype=bool)
        return vals[keep], keep

    def _add_group_sums(self, rows: pd.DataFrame, arms: np.ndarray, vals: np.ndarray) -> None:
        kpis = [m.kpi for m in self.config.margins]
        for i, (agent, arm) in enumerate(zip(rows["agent"].astype(str), arms, strict=True)):
            if arm == "fleet":
                continue
            acc = self._group_sums.get((arm, agent))
            if acc is None:
                acc = self._group_sums[(arm, agent)] = np.zeros(len(kpis) + 1)
            acc[0] += 1
            acc[1:] += vals[i]

    def composition(self) -> dict[str, tuple[float, float, float]]:
        """Per guarded KPI, what the arms' composition contributes to the candidate's measured
        worsening: ``(offset, se, df)`` in the KPI's units (df: Welch-Satterthwaite's degrees of
        freedom of se).

        Each group ``i`` has its canary mean ``y_i`` and (with ``pre_ticks``) its pre-canary mean
        ``x_i``. ``theta`` = `edgetwin.edge.canary_guard.cuped_slope` (the verdict's too: pooled
        within-arm; 0 without a baseline or with < 3 groups); the offset
        is ``theta * (mean x over candidate groups - mean x over control groups)``, oriented as a
        worsening, and ``se = sqrt(s_c^2 / n_c + (1 + r)^2 s_0^2 / n_0)`` with ``s^2`` the spread
        of ``y_i - theta x_i`` within each arm and ``r`` the KPI's relative margin (the margin moves
        with the control's mean): the part of the composition the baselines do not explain
        (CUPED; Deng et al. 2013). se is inf with fewer than 2 groups in an arm.
        """
        out = {}
        for j, m in enumerate(self.config.margins):
            groups = {arm: ([], []) for arm in ("candidate", "control")}  # type: dict[str, tuple[list[float], list[float]]]
            for (arm, agent), acc in self._group_sums.items():
                pre = self._pre_sums.get(agent)
                groups[arm][0].append(acc[1 + j] / acc[0])
                groups[arm][1].append(pre[1 + j] / pre[0] if pre is not None else 0.0)
            yc, xc = (np.asarray(v) for v in groups["control"])
            yt, xt = (np.asarray(v) for v in groups["candidate"])
            theta = cuped_slope([xt, xc], [yt, yc]) if int(self.config.pre_ticks) > 0 else 0.0  # shared with the verdict
            if len(yc) < 2 or len(yt) < 2:
                out[m.kpi] = (0.0, math.inf, math.inf)
                continue
            comp = theta * (float(xt.mean()) - float(xc.mean()))  # candidate minus control, KPI units
            offset = -comp if m.higher_is_better else comp
            rt, rc = yt - theta * xt, yc - theta * xc
            a = float(np.var(rt, ddof=1)) / len(rt)
            b = (1.0 + m.max_regression) ** 2 * float(np.var(rc, ddof=1)) / len(rc)
            se = math.sqrt(a + b)
            # Welch-Satterthwaite: a handful of groups per arm estimate se; the guard's bound on the
            # composition is a t bound with these degrees of freedom, not a normal one
            df = (a + b) ** 2 / (a**2 / (len(rt) - 1) + b**2 / (len(rc) - 1)) if a + b > 0 else math.inf
            out[m.kpi] = (offset, se, df)
        return out

    def unshipped(self) -> list[Path]:
        return unshipped_segments(self.dir)

    def result(self) -> CanaryResult:
        return CanaryResult(
            canary_id=self.config.canary_id, run_id=self.run_id, candidate=self.config.candidate, current=self.current,
            stop_reason=self.stop_reason or "runtime", guard_stop=self.guard_stop, ticks=self.ticks,
            planned_ticks=self.config.total_ticks, log=read_spool(self.dir), intervals=self.guard.intervals(),
            arms={k: len(v) for k, v in self._arm_groups.items()}, budget_stop=self.budget_stop,
        )  # fmt: skip


def unshipped_segments(canary_dir: Path) -> list[Path]:
    """Spooled segments of one canary that no bus has acknowledged yet, in order."""
    return sorted(p for p in canary_dir.glob("seg-*.parquet") if not p.with_suffix(".shipped").exists())


def read_spool(canary_dir: str | Path) -> pd.DataFrame:
    """A canary's log from its spool directory (every reported row, shipped or not), in order."""
    segs = sorted(Path(canary_dir).glob("seg-*.parquet"))
    if not segs:
        return pd.DataFrame()
    return pd.concat([pd.read_parquet(p) for p in segs], ignore_index=True)


def segment_envelope(site: str, run_id: str, seg: Path, sender: str) -> Envelope:
    """The ``canary_log`` message of one spooled segment of canary run ``run_id`` (its id makes a
    re-send a duplicate; it names the site: a command-started run has one id on every site, and
    JetStream would drop another site's segment of the same ``seq`` as a duplicate)."""
    seq = int(seg.stem.split("-")[1])
    raw = seg.read_bytes()
    data = np.frombuffer(raw, dtype=np.uint8)
    # <run>-<seq>, then the segment's digest: a re-send of the same spooled bytes is a duplicate
    # JetStream stores once, while a forgery published first under the same run and seq (other
    # bytes) gets another id and cannot make JetStream drop the real segment
    return Envelope(
        kind="canary_log", sender=sender, payload={"site": site, "canary": run_id, "seq": seq},
        tensors={"parquet": data}, msg_id=f"{run_id}-{site}-{seq}-{hashlib.sha256(raw).hexdigest()[:16]}",
    )  # fmt: skip


# ------------------------------------------------------------------------------------- the cloud side
class CanaryLogCollector:
    """Collects canary logs shipped by runtimes (call `handle` from a bus subscription).

    A segment is attributed by its **authenticated sender**, never by its payload: its site is the
    one of the sender ``runtime/<site>`` (the runtime's bus identity; on a bus with
    `edgetwin.edge.message_auth` the bus has verified it, and with ``keyring`` the collector
    verifies it itself), and a segment whose subject or payload names another site is refused
    (``forged``), so a site cannot ship a segment into another site's log nor displace the real
    one. Its Parquet is decoded only within declared bounds (``max_rows`` rows, ``max_bytes``
    uncompressed bytes: `edgetwin.edge.parquet_bounds`). Each refusal is one log line and a count
    in ``refused`` (by reason). Each (site, canary run, seq) is kept once, however often it is
    delivered; `log` assembles a canary run's rows in order (``run_id``: `CanaryResult.run_id`).
    """

    def __init__(self, keyring: Any = None, max_rows: int = 1_000_000, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.segments: dict[tuple[str, str], dict[int, pd.DataFrame]] = {}
        self.duplicates = 0
        self.refused: dict[str, int] = {}
        self.keyring = keyring
        self.max_rows, self.max_bytes = int(max_rows), int(max_bytes)

    def _refuse(self, reason: str, detail: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        log.warning("canary log segment refused (%s): %s", reason, detail)

    async def handle(self, rcv: Received) -> None:
        env = rcv.envelope
        if env.kind != "canary_log":
            return
        if self.keyring is not None:
            from edgetwin.edge.message_auth import MessageAuth
            from edgetwin.edge.messages import MessageRejected

            try:
                MessageAuth(self.keyring).verify(env)
            except MessageRejected as e:
                self._refuse("unauthenticated", str(e))
                return
        sender, claimed = str(env.sender), str(env.payload["site"])
        site = sender.removeprefix("runtime/") if sender.startswith("runtime/") else None
        on = rcv.subject.rsplit(".", 1)[-1] if rcv.subject.startswith(f"{Subjects.PREFIX}.canary.log.") else None
        if site is None or claimed != site or (on is not None and on != site):
            self._refuse("forged", f"sender {sender!r} on {rcv.subject!r} ships a segment naming site {claimed!r}")
            return
        key = (site, str(env.payload["canary"]))
        seq = int(env.payload["seq"])
        got = self.segments.setdefault(key, {})
        if seq in got:
            self.duplicates += 1
            return
        data = np.asarray(env.tensors["parquet"], dtype=np.uint8).tobytes()
        try:
            got[seq] = read_parquet_bounded(data, self.max_rows, self.max_bytes, where=f"canary log {key[1]}-{seq} of {site}")
        except InputError as e:
            self._refuse("bounds", str(e))

    async def subscribe(self, bus: Any, durable_name: str = "canary-collector") -> Any:
        """A durable subscription on every site's canary log."""
        return await bus.subscribe_durable(f"{Subjects.PREFIX}.canary.log.>", durable_name, self.handle)

    def rows(self, site: str, run_id: str) -> int:
        return sum(len(df) for df in self.segments.get((site, run_id), {}).values())

    def seqs(self, site: str, run_id: str) -> list[int]:
        return sorted(self.segments.get((site, run_id), {}))

    def log(self, site: str, run_id: str) -> pd.DataFrame:
        segs = self.segments.get((site, run_id), {})
        if not segs:
            return pd.DataFrame()
        return pd.concat([segs[k] for k in sorted(segs)], ignore_index=True)
