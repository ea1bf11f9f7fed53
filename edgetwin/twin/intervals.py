"""Calibrated 90 % intervals for what the twin says about a policy.

A twin's number about a policy has two kinds of uncertainty. What varies anyway (populations,
days, response noise) and what the twin does not know (its ensemble members disagree) are both
in the two-level bootstrap over members x replicate worlds (`edgetwin.twin.whatif.bootstrap_ci`).
What the bootstrap cannot see is the twin's *bias*: every member can be wrong the same way. A
bootstrap interval of a twin's mean therefore covers the twin's own mean, not the real value, and
on the emulated cluster it excluded the real change of a KPI in most (policy, KPI) pairs
(docs/benchmarks/whatif_gate/README.md).

The construction used everywhere (`interval`, `change_interval`, method ``"replayed"``; the
``"hybrid"`` before it), measured side by side with the others on `benchmarks/whatif_gate.py`:

1. the 90 % two-level bootstrap interval ``[lo, hi]`` of the twin's mean (members x replicates);
2. calibration (`edgetwin.twin.calibration.calibrate`) on **held-out logged episodes**: the twin
   replays each recorded episode with its logged actions, and each episode's ensemble answer ``ŷ``
   is scored against the KPI the real system logged, ``|y - ŷ| / max(|ŷ|, s)`` (relative with a
   floor: `SCORE`, see "The score" below) and ``|y - ŷ| / sd over members`` (normalised);
   ``q_rel``, ``q_norm`` are their split-conformal quantiles (finite-sample ``⌈(n+1)·0.9⌉``-th
   smallest). This needs no access to the real system: the logging policy's own KPIs in logs the
   twin was not fitted on are ground truth;
3. a level's interval is ``[lo, hi]`` widened by ``q_rel · max(|value|, s)`` (the score inverted);
4. a relative change ``(c - b)/|b|`` against a baseline: the paired bootstrap interval widened by
   ``q_rel · |change| + q_norm · sd_members(change)``. Pairing cancels the error both policies share
   (the twin's level bias, which is large: widening a change by the level error abstained on almost
   everything); what is left is an error in the size of the effect and the members' disagreement.
   ``"replayed"`` widens it by ``q_rel · |change| + λ · shift / |b|`` instead: ``λ`` the twin's error
   on the size of an effect (the KPI's units) per unit of action moved, calibrated on the same held-out days replayed
   with their logged actions (`edgetwin.twin.whatif.effects`, at decision time from the replay the
   gate runs anyway), ``shift`` how far the two policies move the actions from the logged ones
   (`sketch_shift`). The hybrid's ``q_norm · sd`` divides by the members' spread at the logged
   actions, which collapses on a small twin (a multiple of 1,502 from one day); ``λ`` is in the KPI's
   units, net of the contrasts' own noise, and only measured where a day moved the actions
   (`MIN_CONTRAST_SHIFT`).

The conformal step is valid for the logging policy (exchangeable held-out episodes); for another
policy it is only as good as the twin's error there resembles its error on logged behaviour,
which holds where the candidate stays within the logs' support. Hence every number also carries
its out-of-support share, and the promotion gate abstains when that share is high
(`edgetwin.policies.gate`).

The score (issue 44). A purely relative score ``|y - ŷ| / |ŷ|`` measures the twin's error in units
of the twin's level, which is no unit at all for a KPI whose level can be near 0 or change sign (a
return, a signed multi-objective reward): one held-out day whose return the twin put at 0.1 % of
its usual size made ``q_rel`` read 1,094 on the what-if gate benchmark's seed 1 (an interval of
±14,700 % on every return change: nothing decided). The score here divides by
``max(|ŷ|, s_k)``, ``s_k`` the KPI's own scale (`Calibration.scale`, `kpi_scale`): the normalised
median absolute deviation of the twin's per-(member, episode) answers on the calibration episodes,
i.e. how much the KPI moves between days and members, in its units. Decided by the data, not by the
KPI's name: where the level is far from 0 (``|ŷ| >= s_k``; on the what-if gate benchmark's runs every
KPI but the return and the reward, whose intervals the rerun left as they were:
tests/test_whatif_gate_score_rerun.py) the score *is* the relative one and so are its intervals; near
0 it is the error in units of the KPI's spread, finite. The scale is a statistic of the twin's answers only, never of the
truths, and it is frozen in the calibration, so the score stays a fixed function of one episode's
(answer, truth) pair and every interval inverts that same function: ``|y - ŷ| <= q · max(|ŷ|, s)``
exactly when the score is at most ``q``. One score per episode, as before, so split-conformal's
exchangeability argument is unchanged; the caveat is that ``s_k`` is estimated on the calibration
episodes themselves (the test episode's answer is not in it), which the guarantee does not cover
exactly: a median over ``M x E`` answers moves little with one episode, and
tests/test_calibration_score.py measures the coverage of an exchangeable case at the stated level.
A change interval's model term ``q_rel · |change|`` is the same transfer of the level error to an
effect as before (an error in the size of the effect). What pairing cancels is different: a shared
error proportional to the level (``ε · |ŷ|``, all the relative score knew) scales ``c - b`` and
``|b|`` alike and leaves the relative change as it is, while below the scale the floored score reads
the error as additive, ``δ = ε · s``, which cancels in ``c - b`` but moves the denominator: there the
relative change is read over every real baseline ``|b| ± q_rel · s`` (`Calibration.baseline_error`),
and is unbounded on the side the effect may take when that range reaches 0 (a baseline within its
calibrated error of 0 leaves the size of a relative change unidentified, only its sign where the
effect's is known). Where ``|b| >= s`` the term is 0 and the interval is the one before (which trusts
the proportional error to be shared, as it always did: a KPI above its scale with ``q_rel >= 1`` is
that assumption's weak point, unchanged here). The unpaired ``"relative"`` construction inverts the
score on each level (``q · hypot(max(|c|, s), max(|b|, s)) / |b|``). A calibration serialised before
the floor (`Calibration.from_dict` of a dict without ``"score"``) has scores ``|y - ŷ| / |ŷ|`` and
no scale: it is read with ``s = 0``, i.e. inverted as it was scored; an unknown score is refused.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgetwin.contract.relative_change import relative_change_interval

__all__ = [
    "DEFAULT_METHOD",
    "LEVEL",
    "attained_level",
    "METHODS",
    "Calibration",
    "bootstrap_ci",
    "calibration_from_arrays",
    "change_interval",
    "conformal_quantile",
    "interval",
    "kpi_scale",
    "measured_change_interval",
    "SCORE",
    "SCORES",
    "action_contrast_errors",
    "action_contrast_shifts",
    "action_shift",
    "effect_multiple",
    "replayed_effect_scores",
    "ACTION_QUANTILES",
    "MIN_CONTRAST_SHIFT",
    "action_sketch",
    "sketch_points",
    "sketch_shift",
]

#: The nominal level of every interval the twin reports.
LEVEL = 0.90
#: Interval constructions: ``"relative"`` (bootstrap widened by the conformal relative error of the
#: ensemble's mean), ``"normalized"`` (ensemble mean ± conformal multiple of the members' spread) and
#: ``"hybrid"`` (the default; for a level, ``"relative"``; for a change, the paired bootstrap widened
#: by the relative error applied to the size of the change plus the normalised multiple of the
#: members' spread of the change). Chosen by measured coverage on the what-if-gate benchmark's rows
#: (docs/benchmarks/whatif_gate/README.md, which also reports a choice made on half of its candidates).
#: ``"replayed"`` (the default): the hybrid with its members-normalised term replaced by the effect-size
#: term calibrated on replayed held-out logged days (`Calibration.effect_multiple` times how far the two
#: policies move the actions, `sketch_shift`); a KPI whose effect was not calibrated (a calibration from
#: before the term) falls back to the hybrid, and says so (`Calibration.effect_note`).
METHODS = ("relative", "normalized", "hybrid", "replayed")
DEFAULT_METHOD = "replayed"
#: The level scores a `Calibration` can hold: ``"relative"``, ``|y - ŷ| / |ŷ|`` (calibrations from
#: before issue 44's floor, and `edgetwin.twin.policy_calibration`'s value scores), and ``"floored"``,
#: ``|y - ŷ| / max(|ŷ|, s_k)`` with the KPI's scale ``s_k`` (`Calibration.scale`; see the module doc).
#: With no scale (``s_k = 0``) the two are the same function.
SCORES = ("relative", "floored")
#: the score `calibration_from_arrays` computes
SCORE = "floored"
#: points of the quantile function an action column is summarised by (`action_sketch`): the
#: 1-Wasserstein distance between two sketches is the mean absolute gap of their quantiles
ACTION_QUANTILES = 64
#: a contrast of a calibration day counts only when it moves its action column by at least this share
#: of the range the day explored (`replayed_effects`): below it, the effect per unit of action moved
#: divides a noise-sized error by a near-zero move and explodes (a normalised multiple of 1,502 came
#: from one day whose ensemble members had collapsed: the failure this keeps out)
MIN_CONTRAST_SHIFT = 0.05


def conformal_quantile(scores: Sequence[float] | np.ndarray, level: float = LEVEL) -> tuple[float, bool]:
    """Split-conformal quantile of nonconformity ``scores``: the ``⌈(n+1)·level⌉``-th smallest.

    ``+inf`` scores are scores (the twin predicted 0 where the real system did not: the largest
    error there is) and are ranked, never dropped; only NaN (nothing to score) is left out.
    Returns ``(q, exact)``; with too few scores for the finite-sample rank (``n < level/(1-level)``,
    9 at 90 %) the largest score is returned and ``exact`` is False: its interval then covers at
    ``n/(n+1)`` (`attained_level`), which reports state instead of the requested level.
    """
    s = np.sort(np.asarray([x for x in scores if not math.isnan(x)], dtype=np.float64))
    n = len(s)
    if n == 0:
        return float("nan"), False
    k = int(math.ceil((n + 1) * level))
    if k > n:
        return float(s[-1]), False
    return float(s[k - 1]), True


def attained_level(n: int, level: float = LEVEL) -> float:
    """The coverage split-conformal guarantees with ``n`` exchangeable (independent) scores when
    ``level`` is asked for: ``level`` when ``⌈(n+1)·level⌉ <= n``, else ``n/(n+1)`` (the largest
    score's rank), 0 with no score. 4 episodes support 80 %, never 90 %."""
    if n <= 0:
        return 0.0
    return float(level) if math.ceil((n + 1) * level) <= n else n / (n + 1.0)


@dataclass
class Calibration:
    """The twin's relative error per KPI on held-out logged episodes, and its conformal quantile.

    Attributes:
        level: nominal coverage (0.9).
        quantile: KPI name -> ``q_k`` (a fraction of ``max(|value|, scale)``; 0.12 = the twin was
            within 12 % of that on 90 % of held-out episodes).
        exact: KPI name -> whether there were enough scores for the finite-sample guarantee.
        scores: KPI name -> the errors it was computed from (`score`).
        source: what it was calibrated on (for reports).
        score: which level score ``scores`` are (`SCORES`); `from_dict` reads ``"relative"`` when
            an artifact does not say (it was written before the floor).
        scale: KPI name -> ``s_k``, the floor of the score's denominator in the KPI's units
            (`kpi_scale`); a KPI without one has ``s_k = 0`` (the relative score).
    """

    level: float = LEVEL
    quantile: dict[str, float] = field(default_factory=dict)
    exact: dict[str, bool] = field(default_factory=dict)
    scores: dict[str, list[float]] = field(default_factory=dict)
    source: str = ""
    #: the members-normalised score's quantile per KPI (``|y - ŷ| / sd over members``)
    quantile_norm: dict[str, float] = field(default_factory=dict)
    #: which construction the intervals use: one of `METHODS`
    method: str = DEFAULT_METHOD
    #: KPI name -> how many *independent* scores (logged episodes) the quantile rests on; noise
    #: seeds of one episode are one score (their mean), not several
    n_independent: dict[str, int] = field(default_factory=dict)
    #: KPI name -> how many episodes had nothing to score (NaN: a KPI the log or the twin lacks)
    dropped: dict[str, int] = field(default_factory=dict)
    #: episode name -> sha256 of its rows (`edgetwin.twin.logdata.episode_hashes`): what it was
    #: calibrated on, compared with the twin's training episodes by the gate
    episode_sha256: dict[str, str] = field(default_factory=dict)
    #: KPI name -> ``λ``, the conformal multiple of an action shift that bounds the twin's error on the
    #: size of an effect, in the KPI's units per unit of action moved (`edgetwin.twin.whatif.effects`);
    #: NaN when no calibration day moved the actions enough to measure one
    effect_multiple: dict[str, float] = field(default_factory=dict)
    #: KPI name -> the calibration days' effect scores ``λ`` is the quantile of (NaN: nothing measured)
    effect_scores: dict[str, list[float]] = field(default_factory=dict)
    #: KPI name -> action column -> ``λ_j``, the same multiple from the contrasts of that column only:
    #: a change interval adds ``Σ_j λ_j · shift_j`` (a KPI that does not respond to a column is not
    #: widened by the largest column's multiple for moving it); NaN where no day measured it
    effect_by_column: dict[str, dict[str, float]] = field(default_factory=dict)
    #: action column -> `action_sketch` of the calibration days' logged actions: the reference a
    #: policy's action shift is measured from (`sketch_shift`)
    action_quantiles: dict[str, list[float]] = field(default_factory=dict)
    #: action column -> the range (max - min) the calibration days explored: the unit of a shift
    action_span: dict[str, float] = field(default_factory=dict)
    #: which level score ``scores`` and ``quantile`` are (`SCORES`)
    score: str = "relative"
    #: KPI name -> ``s_k`` (KPI units, >= 0): the score's denominator is ``max(|ŷ|, s_k)``
    scale: dict[str, float] = field(default_factory=dict)

    def baseline_error(self, kpi: str, baseline: float) -> float:
        """How far the real baseline may lie from the twin's ``baseline`` in a relative change's
        denominator, in the KPI's units: ``q_k · s_k`` where the floor binds (``|baseline| < s_k``: the
        score reads the error there as additive, ``ε · s_k``, which pairing cancels in ``c - b`` but
        not in ``|b|``), 0 where the level is above its scale (the error is proportional to the level,
        ``ε · |b|``, and a shared one cancels in the ratio: the relative score's argument, unchanged)
        and for a calibration without a scale. ``inf`` when ``q_k`` is infinite and the floor binds."""
        s = self.scale.get(kpi, 0.0)
        if not (math.isfinite(s) and abs(float(baseline)) < s):
            return 0.0
        return self.width(kpi) * s

    def level_unit(self, kpi: str, value: float) -> float:
        """What ``kpi``'s score divides the error by at a level ``value``: ``max(|value|, s_k)``
        (``|value|`` with no scale). A level interval is ``value ± q_k · level_unit``: the score
        inverted."""
        s = self.scale.get(kpi, 0.0)
        return max(abs(float(value)), s if math.isfinite(s) else 0.0)

    def effect_days(self, kpi: str) -> int:
        """How many calibration days measured ``kpi``'s effect (independent effect scores)."""
        return sum(1 for x in self.effect_scores.get(kpi, []) if not math.isnan(x))

    def uses_effect(self, kpi: str) -> bool:
        """Whether ``kpi``'s change interval carries the replayed effect-size term (method
        ``"replayed"`` and the term calibrated); else the ``"hybrid"`` construction answers."""
        return self.method == "replayed" and kpi in self.effect_multiple

    def n_support(self, kpi: str) -> int:
        """The independent calibration days ``kpi``'s change interval rests on: its level scores'
        and, with the effect term, the fewer of those and its effect scores."""
        n = self.n_independent.get(kpi, len(self.scores.get(kpi, [])))
        return min(n, self.effect_days(kpi)) if self.uses_effect(kpi) else n

    def attained(self, kpi: str) -> float:
        """The level ``kpi``'s intervals attain: `attained_level` of the independent calibration days
        they rest on (`n_support`; 0 when it was not calibrated)."""
        return attained_level(self.n_support(kpi), self.level)

    def effect_note(self) -> str:
        """What the change intervals' effect-size term rests on (reports): days and level, or why a
        KPI has none."""
        if self.method != "replayed":
            return ""
        if not self.effect_multiple:
            return ("no effect-size term (this calibration has none: recalibrate on a held-out log); the "
                    "members-normalised term instead")
        days = sorted({self.effect_days(k) for k in self.effect_multiple})
        lo = min(days) if days else 0
        return (f"effect-size term calibrated on {lo} replayed held-out day(s) (supports at most "
                f"{100 * attained_level(lo, self.level):.0f} %)")

    def problem(self, kpi: str) -> str | None:
        """Why ``kpi``'s calibration cannot back a verdict (None when it can): not calibrated,
        scores dropped, or an infinite quantile."""
        if kpi not in self.quantile:
            return f"{kpi} was not calibrated (the calibration log has no value of it)"
        if self.dropped.get(kpi, 0):
            n = self.dropped[kpi] + self.n_independent.get(kpi, 0)
            return f"{self.dropped[kpi]} of {n} calibration episode(s) of {kpi} had nothing to score (missing values)"
        q = self.quantile[kpi]
        if not math.isfinite(q):
            return (
                f"the calibration of {kpi} has infinite scores (the twin predicted exactly 0 where the log did not), "
                "so its interval is unbounded"
            )
        if self.uses_effect(kpi) and not math.isfinite(self.effect_multiple[kpi]):
            n = len(self.effect_scores.get(kpi, []))
            return (
                f"the twin's error on the size of {kpi}'s effects could not be calibrated: none of the {n} "
                f"calibration day(s) moved an action by {100 * MIN_CONTRAST_SHIFT:g} % of its explored range "
                f"with a measurable {kpi} (a log that explores the actions calibrates it)"
            )
        return None

    def width(self, kpi: str) -> float:
        """``q_k`` of ``kpi`` (0 when it was not calibrated: the plain bootstrap then; ``inf`` when
        a score was infinite, never 0: an unbounded error does not narrow to none)."""
        q = self.quantile.get(kpi, 0.0)
        return 0.0 if math.isnan(q) else q

    def width_norm(self, kpi: str) -> float:
        """The members-normalised quantile of ``kpi`` (0 when not calibrated)."""
        q = self.quantile_norm.get(kpi, 0.0)
        return 0.0 if math.isnan(q) else q

    def width_effect(self, kpi: str) -> float:
        """``λ`` of ``kpi`` (0 when not calibrated; ``inf`` kept: see `problem`)."""
        q = self.effect_multiple.get(kpi, 0.0)
        return 0.0 if math.isnan(q) else q

    def shift(self, actions: Mapping[str, Sequence[float]] | None) -> float:
        """How far a policy whose `action_sketch` is ``actions`` moves the actions from the
        calibration days' (`sketch_shift`); NaN when either is unknown."""
        if not actions or not self.action_quantiles:
            return float("nan")
        return sketch_shift(actions, self.action_quantiles, self.action_span)

    def shifts(self, actions: Mapping[str, Sequence[float]] | None) -> dict[str, float]:
        """`shift` per action column (``{column: shift}``; their sum is `shift`); empty when unknown."""
        if not actions or not self.action_quantiles:
            return {}
        return {c: sketch_shift(actions, {c: q}, self.action_span) for c, q in self.action_quantiles.items()}

    def effect_width(self, kpi: str, shift: float | Mapping[str, float]) -> float:
        """The effect term of ``kpi``'s change interval for ``shift`` (a total, or per column):
        ``Σ_j λ_j · shift_j`` with a column's own multiple (`effect_by_column`; the KPI's ``λ``
        where the column has none), ``λ · shift`` for a total."""
        lam = self.width_effect(kpi)
        if not isinstance(shift, Mapping):
            return lam * float(shift)
        own = self.effect_by_column.get(kpi, {})
        total = 0.0
        for c, x in shift.items():
            lj = own.get(c, float("nan"))
            total += (lj if math.isfinite(lj) else lam) * float(x)
        return total

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "method": self.method,
            "quantile": dict(self.quantile),
            "quantile_norm": dict(self.quantile_norm),
            "exact": dict(self.exact),
            "n": {k: len(v) for k, v in self.scores.items()},
            "n_independent": dict(self.n_independent),
            "dropped": dict(self.dropped),
            "attained_level": {k: self.attained(k) for k in self.quantile},
            "episode_sha256": dict(self.episode_sha256),
            "source": self.source,
            "effect_multiple": dict(self.effect_multiple),
            "effect_scores": {k: list(v) for k, v in self.effect_scores.items()},
            "effect_days": {k: self.effect_days(k) for k in self.effect_multiple},
            "effect_by_column": {k: dict(v) for k, v in self.effect_by_column.items()},
            "action_quantiles": {k: list(v) for k, v in self.action_quantiles.items()},
            "action_span": dict(self.action_span),
            "score": self.score,
            "scale": dict(self.scale),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Calibration:
        """The `Calibration` ``to_dict`` wrote. A dict without ``"score"`` was written before the
        floor: its scores are relative and it has no scale, so it is inverted as it was scored.
        Raises ValueError on an unknown score or a negative / non-finite scale (a tampered or
        foreign artifact: its intervals could not invert its scores)."""
        score = str(d.get("score", "relative"))
        if score not in SCORES:
            raise ValueError(f"calibration: unknown score {score!r} (this edgetwin reads {', '.join(SCORES)}); "
                             "recalibrate with this version")
        scale = {str(k): float(v) for k, v in dict(d.get("scale", {})).items()}
        bad = sorted(k for k, v in scale.items() if not (math.isfinite(v) and v >= 0.0))
        if bad:
            raise ValueError(f"calibration: scale of {', '.join(bad)} is not a finite number >= 0")
        if score == "relative" and any(v > 0 for v in scale.values()):
            raise ValueError("calibration: a 'relative' score has no scale (its scores divide by |ŷ| only)")
        return cls(
            score=score,
            scale=scale,
            level=float(d.get("level", LEVEL)),
            quantile={str(k): float(v) for k, v in dict(d.get("quantile", {})).items()},
            exact={str(k): bool(v) for k, v in dict(d.get("exact", {})).items()},
            source=str(d.get("source", "")),
            quantile_norm={str(k): float(v) for k, v in dict(d.get("quantile_norm", {})).items()},
            method=str(d.get("method", DEFAULT_METHOD)),
            n_independent={str(k): int(v) for k, v in dict(d.get("n_independent", d.get("n", {}))).items()},
            dropped={str(k): int(v) for k, v in dict(d.get("dropped", {})).items()},
            episode_sha256={str(k): str(v) for k, v in dict(d.get("episode_sha256", {})).items()},
            effect_multiple={str(k): float(v) for k, v in dict(d.get("effect_multiple", {})).items()},
            effect_scores={str(k): [float(x) for x in v] for k, v in dict(d.get("effect_scores", {})).items()},
            action_quantiles={str(k): [float(x) for x in v] for k, v in dict(d.get("action_quantiles", {})).items()},
            effect_by_column={str(k): {str(c): float(x) for c, x in dict(v).items()}
                              for k, v in dict(d.get("effect_by_column", {})).items()},
            action_span={str(k): float(v) for k, v in dict(d.get("action_span", {})).items()},
        )


def bootstrap_ci(
    values: np.ndarray,
    stat: Callable[[np.ndarray], float] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile interval of ``stat`` (default: the mean) of ``(M, R)`` values, resampling members
    and replicates independently (two-level bootstrap): both the ensemble's disagreement and the
    spread over worlds widen it. NaN entries are ignored."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim == 1:
        v = v[None, :]
    m, r = v.shape
    fn = stat or (lambda a: float(np.nanmean(a)))
    if m * r <= 1:
        x = fn(v)
        return x, x
    rng = np.random.default_rng(seed)
    mi = rng.integers(m, size=(n_boot, m))
    ri = rng.integers(r, size=(n_boot, r))
    if stat is None:  # the mean, vectorised over resamples: (B, M, R)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN resample gives NaN, dropped below
            boots = np.nanmean(v[mi[:, :, None], ri[:, None, :]], axis=(1, 2))
    else:
        boots = np.array([fn(v[mi[b]][:, ri[b]]) for b in range(n_boot)])
    boots = boots[np.isfinite(boots)]
    if not len(boots):
        return float("nan"), float("nan")
    a = (1.0 - level) / 2.0
    return float(np.quantile(boots, a)), float(np.quantile(boots, 1.0 - a))


def kpi_scale(answers: np.ndarray) -> float:
    """``s_k`` of the floored score (`SCORE`): the normalised median absolute deviation
    (`scipy.stats.median_abs_deviation`, ``scale="normal"``: the standard deviation of a normal
    sample) of the twin's per-(member, episode) answers ``(M, E)`` on the calibration episodes, in
    the KPI's units; NaN left out, 0 with fewer than 2 answers.

    Why this scale: it is how much the KPI moves between days and between members, the unit a
    near-zero level's error can be read in; it uses the twin's answers only (no truth enters the
    denominator of the score the truths are compared by); a median is not moved by one day the twin
    put far off, unlike a standard deviation over 3 days."""
    from scipy.stats import median_abs_deviation

    a = np.asarray(answers, dtype=np.float64).ravel()
    a = a[np.isfinite(a)]
    if len(a) < 2:
        return 0.0
    return float(median_abs_deviation(a, scale="normal"))


def calibration_from_arrays(
    values: Mapping[str, np.ndarray],
    truth: Mapping[str, np.ndarray],
    level: float = LEVEL,
    source: str = "",
    groups: np.ndarray | None = None,
) -> Calibration:
    """A `Calibration` from the twin's ``(M, R)`` KPI values of replayed logged episodes and the
    ``(E,)`` KPIs those episodes logged.

    ``groups``: ``(R,)`` which episode (index into ``truth``) each replicate replays; default
    ``r % E`` (replicates cycle over the episodes, seed-major, as `run_whatif` lays them out).
    One score per *episode*: the replicates of an episode (its noise seeds) are one sample of the
    twin's error, not several, so they are averaged first (split-conformal's guarantee counts
    exchangeable samples, and seeds of one episode share its world and its truth). The ensemble's
    answer ``ŷ`` (mean over members and the episode's replicates) is scored
    ``|y - ŷ| / max(|ŷ|, s_k)`` (`SCORE`; ``s_k`` = `kpi_scale` of the ``(M, E)`` per-member
    answers, frozen in ``Calibration.scale``; ``+inf`` when the denominator is 0 and ``y != ŷ``, 0
    when ``y = ŷ``) and ``|y - ŷ| / sd over members`` (normalised). Episodes with nothing to score
    (NaN) are counted in ``dropped``.
    """
    out = Calibration(level=level, source=source, score=SCORE)
    for name, v in values.items():
        y = truth.get(name)
        if y is None or not len(y):
            continue
        v = np.asarray(v, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        g = np.arange(v.shape[1]) % len(y) if groups is None else np.asarray(groups, dtype=np.int64)
        eps = np.unique(g)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            per_member = np.stack([np.nanmean(v[:, g == e], axis=1) for e in eps], axis=1)  # (M, E')
            centre = np.nanmean(per_member, axis=0)
            spread = np.nanstd(per_member, axis=0, ddof=1) if v.shape[0] > 1 else np.zeros(len(eps))
        t = y[eps]
        err = np.abs(t - centre)
        scale = kpi_scale(per_member)
        out.scale[name] = scale
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(err == 0, 0.0, err / np.maximum(np.abs(centre), scale))
            norm = np.where(err == 0, 0.0, err / np.maximum(spread, 1e-9 * np.abs(centre) + 1e-12))
        scores = [float(x) for x in rel if not math.isnan(x)]
        q, exact = conformal_quantile(scores, level)
        out.quantile[name], out.exact[name], out.scores[name] = q, exact, scores
        out.n_independent[name] = len(scores)
        out.dropped[name] = int(len(rel) - len(scores))
        out.quantile_norm[name] = conformal_quantile([float(x) for x in norm if not math.isnan(x)], level)[0]
    return out


def interval(
    values: np.ndarray, calibration: Calibration | None, kpi: str, seed: int = 0, level: float = LEVEL
) -> tuple[float, float]:
    """The calibrated interval of the mean of ``(M, R)`` ``values`` of one KPI (see module doc)."""
    v = np.asarray(values, dtype=np.float64)
    lo, hi = bootstrap_ci(v, seed=seed, level=level)
    if calibration is None or not np.isfinite(v).any():
        return lo, hi
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = float(np.nanmean(v))
        members = np.nanmean(v, axis=1) if v.ndim == 2 else v
    if calibration.method == "normalized":
        sd = float(np.nanstd(members, ddof=1)) if len(members) > 1 else 0.0
        w = calibration.width_norm(kpi) * sd
        return min(lo, mean - w), max(hi, mean + w)
    w = calibration.width(kpi) * calibration.level_unit(kpi, mean)
    return lo - w, hi + w


def change_interval(
    change_ci: Sequence[float],
    candidate: np.ndarray | float,
    baseline: np.ndarray | float,
    calibration: Calibration | None,
    kpi: str,
    shift: float | Mapping[str, float] | None = None,
) -> tuple[float, float]:
    """Widen the paired bootstrap interval of a relative change by the twin's calibrated error.

    ``"replayed"`` (the default): ± ``(q_k · |change| + λ_k · shift / |b|)``, ``λ_k`` the calibrated
    effect multiple (`Calibration.effect_multiple`, the KPI's units per unit of action moved) and
    ``shift`` how far the candidate and the baseline together move the actions from the calibration
    days' (`Calibration.shift` of each, summed: the twin's effect error on ``candidate - baseline`` is
    at most its error on each against the logged actions); given per action column
    (`Calibration.shifts`), each column's shift gets its own multiple (`Calibration.effect_width`).
    ``λ_k`` is measured only on contrasts that
    move the actions by `MIN_CONTRAST_SHIFT` or more, so it is bounded by the calibration days' effect
    errors, unlike ``q_norm`` below. A KPI without the term (not calibrated, or ``shift`` unknown)
    gets the hybrid.

    ``candidate`` and ``baseline`` are the ``(M, R)`` values (or their means, for ``"relative"``).
    ``"relative"``: ± ``q_k · sqrt(u(c)² + u(b)²) / |b|``, ``u`` = `Calibration.level_unit` (each
    level's score inverted; ``sqrt(c² + b²)`` far from 0); ``"normalized"``: the change's point estimate ±
    ``q_norm · sd`` over members of each member's own paired change (at least the bootstrap);
    ``"hybrid"``: ± ``(q_k · |change| + q_norm · sd)``. The pairing cancels the twin's error that is
    shared by both policies (its level bias); what is left is an error in the *size* of the effect,
    taken as the level's relative error applied to the change, and the members' disagreement on it.
    With the floored score, ``"replayed"`` and ``"hybrid"`` then read the widened interval over every
    real baseline the calibration allows (`Calibration.baseline_error`, `_uncertain_denominator`):
    unchanged where the baseline is above the KPI's scale, unbounded on the effect's side where it is
    within its calibrated error of 0 (module doc, "The score").

    ``q_norm`` is the ratio of a level error to the members' spread of the level; where the members
    agree at the logged actions and disagree at a candidate's, the hybrid is wide: on a small twin
    whose 2 members replay the logged day 0.0001 apart on an offload ratio the log had 49 % lower,
    the multiple reads 1,502 and times the members' 0.27-point spread of a candidate's change gives
    ±413 %. Capping the model term at the unpaired relative one (``q_k · sqrt(c² + b²) / |b|``) would
    bound it, but the normalised term is what covers 6 of the what-if-gate benchmark's rows (their
    real change lies outside the twin's change ± that cap), so it is not capped here; the KPI's
    declared range bounds the change instead (`edgetwin.twin.whatif.results.WhatIfResult.compare`,
    tests/test_gate_interval_bounds.py).
    """
    lo, hi = float(change_ci[0]), float(change_ci[1])
    if calibration is None:
        return lo, hi
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        va, vb = np.atleast_2d(np.asarray(candidate, np.float64)), np.atleast_2d(np.asarray(baseline, np.float64))
        c, b = float(np.nanmean(va)), float(np.nanmean(vb))
        if not (math.isfinite(c) and math.isfinite(b)) or b == 0.0:
            return lo, hi
        total = float(sum(shift.values())) if isinstance(shift, Mapping) and shift else shift
        if calibration.uses_effect(kpi) and isinstance(total, float) and math.isfinite(total):
            assert shift is not None
            w = calibration.width(kpi) * abs((c - b) / abs(b)) + calibration.effect_width(kpi, shift) / abs(b)
            return _uncertain_denominator(lo - w, hi + w, b, calibration.baseline_error(kpi, b))
        if calibration.method in ("normalized", "hybrid", "replayed"):
            per_member = (np.nanmean(va, axis=1) - np.nanmean(vb, axis=1)) / abs(b)
            sd = float(np.nanstd(per_member, ddof=1)) if len(per_member) > 1 else 0.0
            mid = (c - b) / abs(b)
            if calibration.method != "normalized":
                w = calibration.width(kpi) * abs(mid) + calibration.width_norm(kpi) * sd
                return _uncertain_denominator(lo - w, hi + w, b, calibration.baseline_error(kpi, b))
            w = calibration.width_norm(kpi) * sd
            return min(lo, mid - w), max(hi, mid + w)
    w = calibration.width(kpi) * math.hypot(calibration.level_unit(kpi, c), calibration.level_unit(kpi, b)) / abs(b)
    return lo - w, hi + w


def _uncertain_denominator(lo: float, hi: float, baseline: float, error: float) -> tuple[float, float]:
    """``[lo, hi]``, an interval of a relative change ``(c - b)/|b|`` read with the twin's ``|b|``, when
    the real baseline is ``b + δ`` with ``|δ| <= error`` shared by both policies (it cancels in ``c - b``
    and moves only the denominator): the effect ``[lo, hi] · |b|`` over every denominator in
    ``[max(|b| - error, 0), |b| + error]`` (`edgetwin.contract.relative_change.relative_change_interval`,
    the one reading of a change over an uncertain baseline, which the canary's verdict shares). When
    that range reaches 0 the side of the interval the effect may take is unbounded (a relative change
    over a baseline that may be 0): an effect surely positive keeps its lower bound (at the largest
    denominator), an effect that may be negative has none; an effect of exactly 0 stays 0.
    ``error = 0`` returns ``[lo, hi]`` unchanged.

    Two statements are combined: the effect's interval and the baseline's range, each at the
    calibration's level, both from the same held-out days' scores; nothing says their errors are
    independent, so the result is sure only at the union bound, ``2·level - 1`` (80 % of two 90 %
    statements), where ``error > 0`` (the baseline below the KPI's scale). The gate's checks there are
    labelled at the calibration's level; on the what-if gate benchmark none of them decided (the
    return and reward: an effect of unknown sign), so the gap is a stated limit, not a measured one."""
    if not error > 0.0:
        return lo, hi
    den = abs(float(baseline))
    return relative_change_interval(lo * den, hi * den, baseline, error)


def measured_change_interval(
    twin_change: float,
    twin_ci: Sequence[float],
    logged_days: np.ndarray,
    n_candidate: int,
    n_baseline: int,
    q_rel: float = 0.0,
    level: float = LEVEL,
    paired_twin_days: int | None = None,
    q_effect: float = 0.0,
) -> tuple[float, float]:
    """The interval a relative change *measured on the real system over a finite number of days*
    should fall in, given the twin's prediction.

    Why: the twin's own interval (``twin_ci``, a bootstrap over its simulated days and members) is
    about the twin's mean. A change the real system measures on ``n_candidate`` and ``n_baseline``
    days carries its own day-to-day noise, independent of the twin's; an exact twin whose interval
    ignored it would cover far below the level. That noise is estimated from the logs alone:
    ``logged_days`` ``(E,)`` are one KPI's per-day means on held-out logged days (the logging
    policy's), whose coefficient of variation ``cv`` gives the measured change's standard error
    ``cv · sqrt(1/n_candidate + 1/n_baseline) · |1 + change|`` (delta method, the candidate's days
    taken as noisy as the logging policy's). It is combined in quadrature with the twin's own
    spread (the ``twin_ci`` half-width read as a normal quantile), and the twin's model error is
    added as the calibrated relative error ``q_rel`` (`Calibration.quantile`) applied to the size of
    the change, as `change_interval`'s ``"hybrid"`` does. Shapes: scalars and ``(E,)``; units: the
    change is a fraction (0.1 = +10 %).

    ``paired_twin_days``: the real change is measured *paired* (both policies on the same days:
    the same populations and noise, common random numbers) and ``twin_ci`` is the twin's paired
    bootstrap over that many simulated days, paired the same way. A paired change's day noise is
    what is left of the day-to-day spread once both policies share it: not the logged days' spread
    of one policy (much larger), and not estimable from logs of one policy. The twin's own paired
    spread is its estimate, scaled to the real system's ``n_candidate`` days
    (``sd · sqrt(paired_twin_days / n_candidate)``), and the two are read with Student's t at
    ``paired_twin_days - 1`` degrees of freedom (the bootstrap's plug-in spread corrected by
    ``sqrt(n / (n - 1))``): 10 days are no normal sample. ``logged_days`` is then unused.

    ``q_effect``: the twin's error on the *size* of an effect, in change units (0.1 = 10 points), e.g.
    the conformal quantile of `action_contrast_errors`; added to the model term: a twin can get an
    effect wrong by a fixed amount whatever the size of the change it predicts, which
    ``q_rel · |change|`` (a level error scaled by the change) misses when the change is small.
    """
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + level / 2.0))
    lo, hi = float(twin_ci[0]), float(twin_ci[1])
    sd_lo, sd_hi = max(twin_change - lo, 0.0) / z, max(hi - twin_change, 0.0) / z
    w_model = (q_rel if math.isfinite(q_rel) else 0.0) * abs(twin_change)
    w_model += q_effect if math.isfinite(q_effect) else 0.0
    if paired_twin_days is not None:
        if not math.isfinite(twin_change) or paired_twin_days < 2 or n_candidate < 1:
            return lo, hi
        from scipy.stats import t as student_t

        # a percentile bootstrap over n days is a plug-in: its spread is sqrt((n-1)/n) of the
        # unbiased one; over a few days the combined spread is read with Student's t (n-1 df)
        n = paired_twin_days
        tq = float(student_t.ppf(0.5 + level / 2.0, n - 1)) * math.sqrt(n / (n - 1.0))
        scale = math.sqrt(n / n_candidate)
        return (twin_change - tq * math.hypot(sd_lo, sd_lo * scale) - w_model,
                twin_change + tq * math.hypot(sd_hi, sd_hi * scale) + w_model)
    d = np.asarray(logged_days, dtype=np.float64)
    d = d[np.isfinite(d)]
    if not math.isfinite(twin_change) or len(d) < 2 or n_candidate < 1 or n_baseline < 1:
        return lo, hi
    mean = float(d.mean())
    cv = float(d.std(ddof=1) / abs(mean)) if mean != 0 else 0.0
    sd_real = cv * math.sqrt(1.0 / n_candidate + 1.0 / n_baseline) * abs(1.0 + twin_change)
    return (twin_change - z * math.hypot(sd_lo, sd_real) - w_model,
            twin_change + z * math.hypot(sd_hi, sd_real) + w_model)


def action_contrast_errors(actions: np.ndarray, real: np.ndarray, twin: np.ndarray, bins: int = 3) -> np.ndarray:
    """The twin's errors on effects that logged data can show: ``(K, C)`` per output, per contrast.

    Why: a change between two policies is an effect, and logs of one policy have no second policy to
    score a twin's effects against. Logs of an exploring policy still hold effects: the mean of an
    output among rows whose action ``j`` fell in one of its quantile bins, against its mean over all
    rows (the logging policy's), is a relative change the real system produced (under the logged
    states), in the units of a candidate-vs-logging change. The twin answering the same rows
    (teacher forced: the logged states and actions, e.g. `edgetwin.twin.fidelity.one_step_outputs`)
    gives its own; the difference is an effect-size error with no policy run on the real system.
    ``C = A · bins`` contrasts. One step ahead, so it misses errors that compound over a day (a
    lower bound on a rolled-out change's error); and a bin is a slice of the logged states, not a
    policy's own state distribution.

    Args:
        actions: ``(N, A)`` logged actions.
        real: ``(N, K)`` the outputs the real system logged on those rows.
        twin: ``(N, K)`` the twin's outputs on the same rows.
        bins: quantile bins per action column.

    Returns:
        ``(K, C)`` ``twin contrast - real contrast`` in change units (NaN where an output's real mean
        over all rows is 0).
    """
    a = np.asarray(actions, np.float64)
    y, t = np.asarray(real, np.float64), np.asarray(twin, np.float64)
    ry_all, ty_all = y.mean(axis=0), t.mean(axis=0)
    out: list[np.ndarray] = []
    for j in range(a.shape[1]):
        for rows in _bin_rows(a[:, j], bins):
            with np.errstate(divide="ignore", invalid="ignore"):
                rc = np.where(ry_all != 0, (y[rows].mean(axis=0) - ry_all) / np.abs(ry_all), np.nan)
                tc = np.where(ty_all != 0, (t[rows].mean(axis=0) - ty_all) / np.abs(ty_all), np.nan)
            out.append(tc - rc)
    return np.stack(out, axis=1) if out else np.zeros((y.shape[1], 0))


def _bin_rows(column: np.ndarray, bins: int) -> list[np.ndarray]:
    """Boolean row masks of ``column``'s quantile bins (empty ones left out), in bin order: the
    slices `action_contrast_errors` and `action_contrast_shifts` share."""
    edges = np.quantile(column, np.linspace(0.0, 1.0, bins + 1)[1:-1])
    b = np.searchsorted(edges, column, side="right")
    return [b == k for k in range(bins) if (b == k).any()]


def action_contrast_shifts(actions: np.ndarray, bins: int = 3) -> np.ndarray:
    """``(C,)`` how far each contrast of `action_contrast_errors` moves the actions: the
    1-Wasserstein distance between the binned column's values in the bin and over all rows, in units
    of the range the log explored on that column (``max - min``; 0 for a column the log never moved).

    Same contrast order as `action_contrast_errors` (column-major, bins in order, empty bins left
    out), so ``errors / shifts`` is an effect-size error per unit of action moved.
    """
    from scipy.stats import wasserstein_distance

    a = np.asarray(actions, np.float64)
    out: list[float] = []
    for j in range(a.shape[1]):
        span = float(a[:, j].max() - a[:, j].min()) if len(a) else 0.0
        for rows in _bin_rows(a[:, j], bins):
            out.append(float(wasserstein_distance(a[rows, j], a[:, j])) / span if span > 0 else 0.0)
    return np.asarray(out, np.float64)


def action_shift(actions: np.ndarray, logged: np.ndarray) -> float:
    """How far a policy moves the actions from the log's: the sum over action columns of the
    1-Wasserstein distance between the policy's action marginal (``(N, A)``, e.g. its rows in the
    twin) and the logged one (``(N', A)``), each in units of the range the log explored on that
    column (as `action_contrast_shifts`, so the two are in the same units). 0 for the logging
    policy itself; a constant at the middle of a uniformly explored column adds 0.25, at its end 0.5.
    Columns the log never moved count 0 (their effect cannot be calibrated: the out-of-support
    share is the warning there)."""
    from scipy.stats import wasserstein_distance

    a, g = np.asarray(actions, np.float64), np.asarray(logged, np.float64)
    total = 0.0
    for j in range(g.shape[1]):
        span = float(g[:, j].max() - g[:, j].min()) if len(g) else 0.0
        if span > 0 and len(a):
            total += float(wasserstein_distance(a[:, j], g[:, j])) / span
    return total


def replayed_effect_scores(actions: np.ndarray, real: np.ndarray, twin: np.ndarray, bins: int = 3) -> np.ndarray:
    """One held-out day's effect-size error per unit of action moved, per output: ``(K,)``.

    Why: `action_contrast_errors` on the twin teacher forced one step (`one_step_outputs`) misses
    what compounds over a day. Here ``twin`` is the twin *free-running* the day with its logged
    actions from the day's logged first states (`edgetwin.twin.fidelity.logged_rollout` of
    `edgetwin.twin.policy_calibration.LoggedActions`): its states are its own, so a contrast's error
    holds the response model's one-step effect error and the state error a day of its own dynamics
    builds. Each contrast's error is divided by how far it moves the actions
    (`action_contrast_shifts`), so that it can be carried to a policy that moves them further
    (`action_shift`): a first-order (Lipschitz) reading of the twin's effect error, the only one a
    log of one exploring policy supports. The day's score is its largest contrast's (the contrasts
    of one day share its world, so they are one sample, and an interval covers the day only if it
    covers each of them, as `edgetwin.twin.policy_calibration.policy_value_calibration` scores a
    day's policies). NaN for an output with nothing to score.

    Args:
        actions: ``(N, A)`` the day's logged actions.
        real: ``(N, K)`` the outputs the real system logged on those rows.
        twin: ``(N, K)`` the free-running twin's outputs on the same (t, agent) rows.
        bins: quantile bins per action column.
    """
    err = np.abs(action_contrast_errors(actions, real, twin, bins))  # (K, C)
    shift = action_contrast_shifts(actions, bins)  # (C,)
    keep = shift > 0
    if not keep.any():
        return np.full(err.shape[0], np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an output with all-NaN contrasts gives NaN
        return np.nanmax(err[:, keep] / shift[keep][None, :], axis=1)


def effect_multiple(day_scores: Sequence[float] | np.ndarray, level: float = LEVEL) -> tuple[float, bool]:
    """The conformal multiple ``λ`` of an action shift that bounds the twin's effect-size error:
    the split-conformal quantile (`conformal_quantile`) of held-out days' `replayed_effect_scores`,
    one independent score per day. A candidate's change interval adds ``λ · action_shift`` (change
    units) to its model term (`measured_change_interval`'s ``q_effect``). Returns ``(λ, exact)``;
    with fewer than 9 days at 90 % it is the largest score and ``exact`` is False."""
    return conformal_quantile(day_scores, level)


def sketch_points(q: int = ACTION_QUANTILES) -> np.ndarray:
    """The ``q`` mid-points ``(i + 0.5) / q`` at which `action_sketch` reads a quantile function (and
    `edgetwin.twin.whatif.effects` a contrast's 1-Wasserstein shift: the same grid, the same units)."""
    return (np.arange(q) + 0.5) / q


def action_sketch(actions: np.ndarray, columns: Sequence[str], q: int = ACTION_QUANTILES) -> dict[str, list[float]]:
    """``(N, A)`` actions -> per column its quantile function at ``q`` mid-points ``(i + 0.5)/q``:
    a fixed-size summary of an action marginal from which `sketch_shift` reads a 1-Wasserstein
    distance (the mean absolute gap of two quantile functions) without keeping the rows. NaN rows
    (agents absent) are left out; a column with no value gets no entry."""
    a = np.asarray(actions, np.float64).reshape(-1, len(columns))
    u = sketch_points(q)
    out: dict[str, list[float]] = {}
    for j, c in enumerate(columns):
        x = a[:, j][np.isfinite(a[:, j])]
        if len(x):
            out[c] = [float(v) for v in np.quantile(x, u)]
    return out


def sketch_shift(
    actions: Mapping[str, Sequence[float]], reference: Mapping[str, Sequence[float]], span: Mapping[str, float]
) -> float:
    """`action_shift` from sketches (`action_sketch`): the sum over the reference's columns of the
    1-Wasserstein distance between the two marginals, each in units of ``span`` (the range the
    reference log explored; a column it never moved counts 0, as in `action_shift`). NaN when a
    column the reference moved is missing from ``actions``."""
    total = 0.0
    for c, ref in reference.items():
        w = float(span.get(c, 0.0))
        if w <= 0:
            continue
        if c not in actions:
            return float("nan")
        total += float(np.mean(np.abs(np.asarray(actions[c], np.float64) - np.asarray(ref, np.float64)))) / w
    return total
