"""The prediction-powered verdict: the twin's fleet-wide prediction rectified by a canary's measurements.

Prediction-powered inference (Angelopoulos et al. 2023) for a difference of means over service
groups. Every group ``g`` of the fleet (``N`` of them) has the twin's predictions ``f_c(g)``,
``f_b(g)`` of a KPI with *every* group on the candidate (resp. the baseline): the full switch the
verdict is about. A canary measured ``y(g)`` on a random slice, the candidate on its candidate
arm (``n_c`` groups), the baseline on its control arm (``n_b``), and every group outside the
slice on the baseline (the current policy) meanwhile. The twin also predicts *that* experiment:
``f^canary(g)``, the same replay (same world seed, same window) with the canary's actual
assignment (`CanaryAssignment`: the candidate arm's groups on the candidate, every other group on
the baseline). The fleet-wide change ``θ = E[Y_c] − E[Y_b]`` is estimated by

    θ̂ = mean_N(f_c − f_b) + mean_{cand}(y − f^canary) − mean_{ctrl}(y − f^canary)

and the baseline level ``μ_b`` by ``mean_N(f_b) + mean_{ctrl}(y − f^canary)``. The second and
third terms (the *rectifier*) measure the twin's error on the experiment the canary ran, against
the twin's prediction *of that experiment*; because the slice's groups are a random draw from the
fleet (`edgetwin.loop.plan` draws them so) and the arms are randomized, the rectifier is
unbiased for the twin's error on the canary's configuration, whatever the twin's bias there.

**What it assumes.** That the twin's error *transports* from the canary's configuration to the
full switch: the twin may be wrong about each group's response, but wrong by the same amount
whether a few groups or all of them run the candidate. What the twin gets right about the
difference between the two (a candidate that sends work to the edge helps the few groups that run
it and congests the edge sites when every group does: interference) it keeps. An earlier version
rectified the full-switch predictions ``f_c``, ``f_b`` with the canary's measurements directly,
which assumed the same transport *and* no interference: where the twin rightly predicted the
fleet's congestion, the slice's uncongested measurement "corrected" it away (the closed-loop
benchmark's least-loaded candidates: SLO violations *ok* on the slice, +12-20 % on the whole
cluster). Without interference ``f^canary == f^full`` (on the arms' groups) and the two agree.
Transport is an assumption, not a theorem: no slice measures the fleet's congestion, and the
interval covers the full switch's change only as far as the twin's interference is right. The
interference is extrapolated where the logs are thinnest (a fleet that has switched), so the
interval carries the twin's own uncertainty about it: the spread of its members' predicted
interference (`interference_var`), which a twin whose members agree on a wrong interference does
not reveal.

**The verdict holds either way.** Because the twin's interference is the least checked thing it
predicts, the verdict does not rest on it alone: with a canary replay, each KPI also keeps the
estimate that assumes *no* interference (the full-switch predictions rectified directly, the earlier
version's; keys ``local:*``), and `ppi_verdict` decides on the *hull* of the two intervals. A KPI is
ok (or regressed) only when it is so whether the fleet will see the twin's predicted interference
or none; where they disagree the loop abstains and asks for more evidence. The hull covers the
change whenever the real interference lies between none and the twin's (each end is one of the
two estimates; in between, by the estimates' linearity in the interference), the
sensitivity-bound reading of an assumption nobody can test on a slice. Measured on the closed-loop
benchmark (docs/benchmarks/closed_loop, quick, production-like logs): each estimator alone was
confidently wrong on 3 pairs (the no-interference one *promoting* edge-congesting candidates, the
transporting one refusing an edge-heavy constant the twin thought would congest); the hull decided
15 of 36 and got 14 right (the one miss a false refusal both ends make), and with the rest of the
fleet as the control arm (`edgetwin.loop.rounds.canary_verdict`'s ``fleet_rows``) 13, all right.

Its 90 % interval has the variance of the three independent-sample terms
(``var(f_c − f_b)/N + var_cand(y − f^canary)/n_c + var_ctrl(y − f^canary)/n_b``) plus the members'
interference variance, on a **t reference with Welch-Satterthwaite degrees of freedom** over those
four terms (`welch_df`; the interference's with members − 1): with the demo's 4 candidate and 6
control groups the normal reference covered about 84 % instead of 90 %. The relative
change ``θ̂ / |μ̂_b|`` and its interval come from interval division (`finish_estimate`): the effect's
interval over every baseline level its own interval allows, not the delta method. Rounds are pooled with
weights fixed by the design (every day alike, a day's rounds by planned exposure: `design_weights`,
never by their estimated variances, which on a skewed KPI favour the draws that missed its tail),
with the terms they share (the fleet's and the interference's) added as perfectly correlated, not
as independent (`combine_estimates`), and each look of the loop spends its share of alpha
(`look_level`), so that stopping at whichever round decides keeps the level. When the twin is good,
``y − f`` varies less than ``y``, so the interval is narrower than the canary's own two-sample
interval; when it is biased (by the same amount on the slice as on the fleet), the interval is
still valid (the test with a twin biased by a known amount checks it).

Why not ``ppi-python``: it pulls numba and gdown (and its datasets' downloader) for what is, for
this estimator, the three lines above; its ``ppi_mean_ci`` also takes one labelled set, whereas a
canary has two randomized arms whose rectifiers are differenced.

`twin_group_predictions` computes ``f`` per service group by replaying the recent log's episodes in
the twin (`edgetwin.twin.whatif.engine.run_episode`, every member; a `CanaryAssignment` as one of
its policies gives ``f^canary``), and `ppi_verdict` turns the intervals into the gate's verdicts
(`edgetwin.policies.gate.check_verdict`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from edgetwin.contract.errors import InputError
from edgetwin.contract.margins import KPIMargin
from edgetwin.contract.relative_change import relative_change_interval
from edgetwin.loop.cuped_jackknife import cuped_adjusted
from edgetwin.loop.twin_series import twin_group_predictions, twin_group_series

LEVEL = 0.90
#: the fewest groups of each arm for a per-arm CUPED slope (``cuped="per_arm"``); below, the pooled one.
#: Simulated at the loop's arm sizes (docs/benchmarks/closed_loop, the design tables): with 50 groups per
#: arm a per-arm slope's 90 % interval covered 90.0-93.0 %; with 4 candidate groups, before this floor
#: (commit 767c351's table), 71.5-88.5 %
MIN_PER_ARM = 20
#: key prefix of the no-interference estimate kept beside a transporting one (module docstring)
LOCAL = "local:"
#: key of a round's planned exposure (the candidate arm's agent-steps, fixed before it ran): its
#: weight among the rounds of its day (`design_weights`)
EXPOSURE = "exposure"
_LOCAL_KEYS = ("diff", "diff_se", "base", "base_se", "rel", "rel_lo", "rel_hi", "df",
               "diff_var_shared", "diff_var_own", "base_var_shared", "base_var_own", "diff_var_day", "base_var_day",
               "day_df", "day")


@dataclass
class PPIEstimate:
    """One KPI's prediction-powered estimate of the fleet-wide change (candidate − baseline).

    Attributes:
        kpi: the KPI (a log column). better: ``"higher"`` / ``"lower"``.
        change, interval: relative change ``θ̂ / μ̂_b`` and its 90 % interval (fractions).
        diff, diff_se: ``θ̂`` in the KPI's units and its standard error.
        baseline: ``μ̂_b``. twin_change: the twin-alone relative change (``mean_N`` terms only).
        rectifier: ``θ̂ − twin diff`` (the twin's measured error on the change, KPI units).
        n_fleet, n_candidate, n_control: groups behind each term.
        worsening_interval: the interval signed so that positive is worse.
        allowed_change: the margin as a relative worsening; verdict: ``ok`` / ``regress`` / ``straddle``.
    """

    kpi: str
    better: str
    change: float
    interval: list[float]
    diff: float
    diff_se: float
    baseline: float
    twin_change: float
    rectifier: float
    n_fleet: int
    n_candidate: int
    n_control: int
    worsening_interval: list[float] = field(default_factory=list)
    allowed_change: float = float("nan")
    verdict: str = "straddle"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _var(x: np.ndarray) -> float:
    return float(np.var(x, ddof=1)) if len(x) > 1 else float("inf")


def welch_df(terms: Sequence[tuple[float, float]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of independent variance terms.

    ``terms``: ``(v_i, df_i)`` with ``v_i`` the term's variance (``s_i² / n_i``) and ``df_i`` its
    degrees of freedom (``n_i − 1``; ``inf`` for a term known exactly). Returns
    ``(Σ v_i)² / Σ v_i² / df_i`` (``inf`` when every term is known): with a handful of groups per
    arm (the demo's canary: 4 candidate, 6 control) the normal reference's 90 % interval covers
    about 84 %; the t reference at these degrees of freedom restores the level (tests/test_ppi.py
    checks it by simulation)."""
    tot = sum(v for v, _ in terms)
    den = sum(v * v / d for v, d in terms if math.isfinite(d) and d > 0 and v > 0)
    if not (tot > 0 and math.isfinite(tot)):
        return float("inf")
    return float(tot * tot / den) if den > 0 else float("inf")


def ppi_mean_difference(
    fleet_cand: np.ndarray,
    fleet_base: np.ndarray,
    y_cand: np.ndarray,
    f_cand: np.ndarray,
    y_ctrl: np.ndarray,
    f_ctrl: np.ndarray,
    level: float = LEVEL,
    x_cand: np.ndarray | None = None,
    x_ctrl: np.ndarray | None = None,
    transport_var: tuple[float, float] = (0.0, 0.0),
    transport_df: float = float("inf"),
    day_var: tuple[float, float] = (0.0, 0.0),
    day_df: float = float("inf"),
    paired: bool = False,
    cuped: str = "pooled",
) -> dict[str, float]:
    """The PPI estimate of ``E[Y_c] − E[Y_b]`` and ``E[Y_b]`` (see the module docstring).

    Args:
        fleet_cand, fleet_base: ``(N,)`` the twin's per-group predictions over the fleet.
        y_cand, f_cand: ``(n_c,)`` measured values and the twin's predictions of them on the
            candidate arm's groups; y_ctrl, f_ctrl: ``(n_b,)`` the same on the control arm. The
            predictions are of the experiment the canary ran (``f^canary``, the module docstring);
            the full-switch ones only where the slice does not interfere with the fleet.
        level: two-sided level of the intervals.
        x_cand, x_ctrl: optional pre-treatment covariates of the same groups (their mean KPI over
            the canary's pre-ticks, when every group was still on the current policy). Both arms'
            residuals are adjusted by ``β·(x − mean x)`` (CUPED; ``β`` from
            `edgetwin.edge.canary_guard.cuped_slope`, the one slope the guard uses too):
            randomization makes ``mean x`` the same in expectation on both arms, so the adjustment
            removes the groups' own levels from the rectifier's noise without biasing it (the
            slope's estimation error is O(1/n)); it costs the arms' terms one degree of freedom.
            The arms' variance terms are then the jackknife's (`edgetwin.loop.cuped_jackknife`):
            the slope is fitted on the same groups, and the plug-in variance of the adjusted
            residuals misses its error, badly where a few groups lie far out in ``x``.
        transport_var: variances added to the difference's and the baseline level's, for what
            the canary cannot measure: the twin's uncertainty about the interference it
            transports from the canary's configuration to the full switch (`interference_var`).
        transport_df: its degrees of freedom (members − 1; ``inf``: known).
        day_var: the day-to-day variance of the fleet-wide change and of the baseline level
            (`edgetwin.loop.verdict.day_to_day_variance`, the twin's replay of other days): the
            verdict is about the change averaged over the days the decision lives with, and one
            canary day's change is one draw around it (DESIGN.md, "What a verdict is about").
            Shared by rounds run on the same day. day_df: its degrees of freedom (days − 1).
        paired: the arms are matched pairs (`edgetwin.loop.plan.matched_pairs`: ``y_cand[i]``
            and ``y_ctrl[i]`` are pair ``i``, randomized within the pair): the arms' own term is
            the variance of the ``k`` within-pair differences of the rectifier, ``var(r_c − r_b)/k``
            on ``k − 1`` degrees of freedom (Imai 2008), instead of Welch's two independent terms.
            The pairing's gain (alike groups on both arms) is what this term no longer counts.
        cuped: ``"pooled"`` (one slope for both arms, `cuped_slope` over the arms: the guard's) or
            ``"per_arm"`` (each arm its own slope, both arms centred on the pooled covariate mean:
            Lin 2013's interacted adjustment, which is asymptotically never less precise than no
            adjustment; a pooled slope can be, when the arms are of very unequal sizes and the
            candidate changes how a group's canary mean follows its pre-period (Freedman 2008), as
            with the rest of the fleet as control: 50 candidate groups against 950). It costs each
            arm's term one degree of freedom; asymptotic, so only where both arms have at least
            `MIN_PER_ARM` groups (else the pooled slope).

    Returns:
        ``diff``, ``diff_se``, ``base``, ``base_se``, ``rel``, ``rel_lo``, ``rel_hi``, ``twin_diff``,
        and what pooling rounds needs (`combine_estimates`): ``df`` (Welch-Satterthwaite, the
        interval's t reference), ``diff_var_shared`` / ``base_var_shared`` (the fleet and
        interference terms, which rounds share: the same fleet and a twin that only learns
        slowly), ``diff_var_day`` / ``base_var_day`` / ``day_df`` (the day-to-day terms, shared by
        the rounds of one day and independent across days; ``day``: the day's index, 0 here, the
        loop sets it) and ``diff_var_own`` / ``base_var_own`` (the round's own rectifier).
    """
    if cuped not in ("pooled", "per_arm"):
        raise ValueError(f"unknown CUPED slope {cuped!r}; expected pooled or per_arm")
    arrs = [np.asarray(a, dtype=np.float64) for a in (fleet_cand, fleet_base, y_cand, f_cand, y_ctrl, f_ctrl)]
    fc, fb, yc, pc, yb, pb = arrs
    if len(fc) != len(fb) or len(yc) != len(pc) or len(yb) != len(pb):
        raise ValueError("prediction and measurement arrays must pair up")
    if len(fc) < 2 or len(yc) < 2 or len(yb) < 2:
        raise InputError(
            f"prediction-powered inference needs >= 2 groups per term (fleet {len(fc)}, candidate arm "
            f"{len(yc)}, control arm {len(yb)})", "canary"
        )
    twin_diff = float(np.mean(fc - fb))
    rc, rb = yc - pc, yb - pb
    lost = 0.0  # degrees of freedom the CUPED slope costs the arms' terms
    adj = None
    if x_cand is not None and x_ctrl is not None:
        xc, xb = np.asarray(x_cand, dtype=np.float64), np.asarray(x_ctrl, dtype=np.float64)
        if len(xc) != len(rc) or len(xb) != len(rb):
            raise ValueError("covariates must pair up with the measurements")
        if np.isfinite(xc).all() and np.isfinite(xb).all():
            per_arm = cuped == "per_arm" and min(len(xc), len(xb)) >= MIN_PER_ARM
            adj = cuped_adjusted(rc, xc, rb, xb, per_arm)
            rc, rb, lost = adj.rc, adj.rb, (1.0 if per_arm else 0.5)
    v_fleet = _var(fc - fb) / len(fc)
    # the arms' terms: the jackknife's where a fitted slope adjusted them (it counts the slope's own
    # error, which the plug-in variance of the adjusted residuals misses: `cuped_jackknife`)
    v_c, v_b, v_base = ((adj.var_c, adj.var_b, adj.var_base) if adj is not None
                        else (_var(rc) / len(rc), _var(rb) / len(rb), _var(rb) / len(rb)))  # fmt: skip
    diff = twin_diff + float(np.mean(rc) - np.mean(rb))
    diff_shared = v_fleet + float(transport_var[0])
    diff_own = v_c + v_b
    own_terms = [(v_c, len(rc) - 1 - lost), (v_b, len(rb) - 1 - lost)]
    if paired:
        if len(rc) != len(rb):
            raise ValueError("matched pairs need as many candidate as control groups")
        diff_own = _var(rc - rb) / len(rc)
        own_terms = [(diff_own, len(rc) - 1 - lost)]
    base = float(np.mean(fb) + np.mean(rb))
    vb_fleet = _var(fb) / len(fb)
    base_shared = vb_fleet + float(transport_var[1])
    df = welch_df([(v_fleet, len(fc) - 1), *own_terms, (float(transport_var[0]), transport_df),
                   (float(day_var[0]), day_df)])  # fmt: skip
    out = finish_estimate(diff, diff_shared + diff_own + float(day_var[0]), base,
                          base_shared + v_base + float(day_var[1]), level, df=df)  # fmt: skip
    out["twin_diff"] = twin_diff
    out["twin_rel"] = twin_diff / abs(base) if base else float("nan")
    out.update(diff_var_shared=diff_shared, diff_var_own=diff_own, base_var_shared=base_shared, base_var_own=v_base,
               diff_var_interference=float(transport_var[0]),
               diff_var_day=float(day_var[0]), base_var_day=float(day_var[1]), day_df=float(day_df),
               day_var=float(day_var[0]), paired=float(bool(paired)), day=0.0)
    return out


def day_term(day_var: Mapping[str, Sequence[float]] | None, column: str) -> tuple[float, float, float]:
    """One column's day-to-day term ``(var of the change, var of the baseline level, degrees of
    freedom)`` from a ``day_var`` map (`edgetwin.loop.verdict.day_to_day_variance`), ``(0, 0, inf)``
    without one. The one reader of that map: the verdict (`ppi_estimates`) and the plan's expected
    interval (`edgetwin.loop.plan.plan_canary`) carry the same term."""
    got = (day_var or {}).get(column)
    if got is None:
        return 0.0, 0.0, float("inf")
    return float(got[0]), float(got[1]), float(got[2])


def t_quantile(level: float, df: float) -> float:
    """The two-sided ``level`` quantile of Student's t at ``df`` (the normal's at ``inf``)."""
    q = 0.5 + level / 2
    return float(stats.norm.ppf(q)) if not math.isfinite(df) or df > 1e6 else float(stats.t.ppf(q, max(df, 1.0)))


def finish_estimate(
    diff: float, diff_var: float, base: float, base_var: float, level: float = LEVEL, df: float = float("inf")
) -> dict[str, float]:
    """The relative change ``diff / |base|`` and its ``level`` interval on a t reference with ``df``
    degrees of freedom (`welch_df`; ``inf``: the normal).

    The interval is the effect's ``diff ± q·se_d`` over every baseline level in ``|base| ± q·se_b``
    (`edgetwin.contract.relative_change.relative_change_interval`): each end is the ratio at which
    ``diff - r·|base|`` sits on the edge of its interval, that combination's standard error bounded
    by ``se_d + |r|·se_b`` (Cauchy-Schwarz: ``diff`` and ``base`` share the control arm's rectifier,
    their covariance is not estimated), so the verdict against a margin is the test of the margin's
    own hypothesis. It replaced the delta method, ``rel ± q·(se_d + |rel|·se_b)/|base|``, which
    evaluated the baseline's share at the estimate and undercovered large effects over noisy
    baselines (that module's docstring; tests/test_relative_change.py). Where the baseline's interval
    reaches 0 the side the effect may take is unbounded: the verdict abstains there, or decides by
    the bounded side when the effect's sign is known."""
    z = t_quantile(level, df)
    denom = abs(base)
    d_se, b_se = math.sqrt(max(diff_var, 0.0)), math.sqrt(max(base_var, 0.0))
    if denom <= 0 or not math.isfinite(denom):
        rel, rel_lo, rel_hi = float("nan"), -float("inf"), float("inf")
    else:
        rel = diff / denom
        rel_lo, rel_hi = relative_change_interval(diff - z * d_se, diff + z * d_se, base, z * b_se)
    return {
        "diff": diff, "diff_se": d_se, "base": base, "base_se": b_se,
        "rel": rel, "rel_lo": rel_lo, "rel_hi": rel_hi, "df": df, "level": level,
    }  # fmt: skip


def look_level(level: float, looks: int) -> float:
    """The level of each of ``looks`` looks so that the whole sequence holds at ``level``.

    Alpha spending by the union bound (Bonferroni over looks): look ``r`` of at most ``looks``
    spends ``(1 − level) / looks``, so whichever look the loop stops at (a verdict, the guard's
    early stop, the budget, futility), the chance that any look's interval missed is at most
    ``1 − level``. Why not an anytime-valid PPI confidence sequence (Kilian, Cortinovis, Caron 2025;
    neither ``confseq`` nor ``expectation`` is installable here: the first builds only from source
    with Boost, the second needs Python ≥ 3.12): the loop's looks are few and fixed in advance
    (`look_days`: doubling days, so ``D`` days cost ``⌈log2 D⌉ + 1`` looks), and at a handful of groups per
    arm a confidence sequence's boundary is much wider than the t quantile at ``1 − α/looks``
    (e.g. 90 % over 5 looks: each look at 98 %)."""
    return 1.0 - (1.0 - float(level)) / max(1, int(looks))


def look_days(max_days: int) -> tuple[int, ...]:
    """The canary days after which an extended canary is judged: 1, 2, 4, 8, … and ``max_days``.

    Each look spends ``(1 − level) / len(look_days(max_days))`` of alpha (`look_level`), fixed
    before the first day, so the verdict at whichever look decides holds at the level. Doubling
    keeps the number of looks logarithmic in the days (16 days: 5 looks, each at 98 % for 90 %),
    while a candidate that is clearly good or bad is still judged after its first day."""
    n = max(1, int(max_days))
    out, d = [], 1
    while d < n:
        out.append(d)
        d *= 2
    return (*out, n)


def design_weights(rounds: Sequence[Mapping[str, float]], prefix: str = "") -> np.ndarray:
    """``(k,)`` the rounds' pooling weights (summing to 1), fixed by the design, never by the outcomes:
    each of the ``D`` distinct days (``day``) weighs ``1/D``, split among that day's rounds in
    proportion to their planned exposure (`EXPOSURE`: the candidate arm's agent-steps,
    `edgetwin.loop.plan.CanaryPlan.agent_steps`, fixed before the round ran; a round without one
    counts 1, so equal rounds weigh equally).

    Why not inverse-variance weights (the pooling before issue 48): a round's variance is estimated
    from the same groups as its estimate, and on a skewed KPI the two move together: a draw that
    misses the far-out groups gives an estimate that is low *and* a variance that is small, so
    weights ``1/v̂`` favour the low draws and the pooled interval is biased towards them (seed 2's
    ``reward`` at 49 candidate groups: re-randomized over its 8 real days, 84.3 % coverage of a
    stated 90 %, mean z −0.90; equal day weights 92.7 %, benchmarks/_closed_loop_heavy.py). Weights
    that do not depend on the outcomes keep the pooled estimate unbiased whatever the skew. And the
    verdict's estimand is the change averaged over the days the decision lives with, every day
    alike (DESIGN.md, "What a verdict is about"): equal day weights aim at it, outcome-dependent
    ones at an average weighted towards the days that happened to measure precisely."""
    days = [float(r.get(f"{prefix}day", 0.0)) for r in rounds]
    expo = [max(float(r.get(EXPOSURE, 1.0)), 1e-300) for r in rounds]
    per_day: dict[float, float] = {}
    for d, e in zip(days, expo, strict=True):
        per_day[d] = per_day.get(d, 0.0) + e
    return np.array([e / per_day[d] / len(per_day) for d, e in zip(days, expo, strict=True)])


def _pool_terms(rounds: Sequence[Mapping[str, float]], key: str, prefix: str = "", weighting: str = "design") -> tuple[
        float, float, list[float], float, float]:
    """One quantity's (``key``: ``diff`` or ``base``) design-weighted pooled value over the rounds
    (`design_weights`) and its variance ``Σ w_i²·own_i`` plus the shared and day terms, with the
    terms it is made of: ``(value, variance, own terms, shared, day)`` (`_pool` says how each kind
    of term is pooled). ``weighting="inverse_variance"``: each quantity by its rounds' estimated
    total variances, the pooling before issue 48 (kept to measure against, `combine_estimates`)."""
    tot = [r[f"{prefix}{key}_se"] ** 2 for r in rounds]
    w = design_weights(rounds, prefix) if weighting == "design" else _inverse_variance_weights(tot)
    val = float(np.sum(w * np.array([r[f"{prefix}{key}"] for r in rounds])))
    shared = [float(r.get(f"{prefix}{key}_var_shared", 0.0)) for r in rounds]
    day = [float(r.get(f"{prefix}{key}_var_day", 0.0)) for r in rounds]
    own = [max(t - s - d, 0.0) for t, s, d in zip(tot, shared, day, strict=True)]
    by_day: dict[float, float] = {}
    for wi, d, r in zip(w, day, rounds, strict=True):
        k = float(r.get(f"{prefix}day", 0.0))
        by_day[k] = by_day.get(k, 0.0) + float(wi) * math.sqrt(d)
    shared_v = float(np.sum(w * np.sqrt(shared)) ** 2)
    day_v = float(sum(v * v for v in by_day.values()))
    own_terms = list(w * w * np.array(own))
    return val, float(np.sum(own_terms)) + shared_v + day_v, own_terms, shared_v, day_v


def paule_mandel_tau2(effects: Sequence[float], variances: Sequence[float], tol: float = 1e-12) -> float:
    """The Paule-Mandel estimate of the between-study variance ``tau²`` of a random-effects
    meta-analysis: the ``tau² >= 0`` at which the generalised Q statistic
    ``Σ (y_i − μ̂(tau²))² / (v_i + tau²)`` equals its expectation ``k − 1`` (0 when Q(0) is already
    below it). ``effects``: ``(k,)`` the studies' estimates; ``variances``: ``(k,)`` their
    within-study variances.

    Written here (a root of a monotone function, `scipy.optimize.brentq`) because statsmodels
    (`statsmodels.stats.meta_analysis.combine_effects`, ``method_re="pm"``, which
    tests/test_day_term.py checks it against) is not a dependency of the package; Paule-Mandel
    rather than DerSimonian-Laird because it is less biased downwards with few studies (Veroniki
    et al. 2016), which is the loop's case (2-16 canary days)."""
    from scipy.optimize import brentq

    y = np.asarray(effects, dtype=np.float64)
    v = np.maximum(np.asarray(variances, dtype=np.float64), 1e-300)
    k = len(y)
    if k < 2:
        return 0.0

    def excess(t2: float) -> float:
        w = 1.0 / (v + t2)
        mu = float(np.sum(w * y) / np.sum(w))
        return float(np.sum(w * (y - mu) ** 2)) - (k - 1)

    if excess(0.0) <= 0.0:
        return 0.0
    hi = float(np.var(y, ddof=1)) + float(np.max(v)) + 1e-300
    while excess(hi) > 0.0:
        hi *= 2.0
    return float(brentq(excess, 0.0, hi, xtol=tol * max(hi, 1e-300)))


def between_day_variance(rounds: Sequence[Mapping[str, float]], prefix: str = "") -> tuple[float, int]:
    """``(tau², k)``: the between-day variance of the change estimated from the rounds themselves
    (random-effects, `paule_mandel_tau2`) over their ``k`` distinct days, ``(0, k)`` for ``k < 2``.

    Each day's estimate is its rounds' mean of ``diff`` weighted by their planned exposure (the
    pooling's own weights within a day, `design_weights`) with the variance of their *own* terms
    only (the rectifiers, independent across days): the fleet's and the interference's terms are
    shared by every round (the same twin), so they move every day's estimate alike and do
    not spread the days apart; the day-to-day term is what is estimated. The days' spread beyond
    their own noise is the effect's spread over days (its estimand's variance, DESIGN.md "What a
    verdict is about"), measured on the canaries, with ``k − 1`` degrees of freedom."""
    days: dict[float, list[tuple[float, float, float]]] = {}
    for r in rounds:
        tot = float(r[f"{prefix}diff_se"]) ** 2
        own = max(tot - float(r.get(f"{prefix}diff_var_shared", 0.0)) - float(r.get(f"{prefix}diff_var_day", 0.0)), 1e-300)
        days.setdefault(float(r.get(f"{prefix}day", 0.0)), []).append(
            (float(r[f"{prefix}diff"]), own, max(float(r.get(EXPOSURE, 1.0)), 1e-300)))
    if len(days) < 2:
        return 0.0, len(days)
    ys, vs = [], []
    for pts in days.values():
        w = np.array([e for _, _, e in pts])
        w = w / w.sum()
        ys.append(float(np.sum(w * np.array([y for y, _, _ in pts]))))
        vs.append(float(np.sum(w * w * np.array([v for _, v, _ in pts]))))
    return paule_mandel_tau2(ys, vs), len(days)


def with_day_term(rounds: Sequence[Mapping[str, float]], prefix: str = "") -> list[dict[str, float]]:
    """The rounds with the day-to-day term of the change the pooled verdict carries. One day: each
    round's own (``diff_var_day``: the first look's, `edgetwin.loop.verdict.calibrated_day_variance`,
    the larger of the twin's calibrated replay and the bound on what the level cannot reveal). From
    >= 2 days: `edgetwin.loop.day_bound.pooled_day_term` (the larger of the revealed part, the rounds'
    own between-day variance `between_day_variance`, and their blend with the first look's bound
    counted as one day); each round's total variance (``diff_se``) and the term's degrees of freedom
    (``day_df``) follow the term chosen (a t reference on ``k − 1`` degrees of freedom for the
    rounds' term, as Knapp-Hartung's; its variance rescaling is not applied).

    Why never below the revealed part or the rounds' own: both estimate the same quantity from
    different evidence, and each can understate it in a way the other can catch. The twin's rests
    on days it replays, not measures; the rounds' is measured on the candidate itself but, over 2-4
    days, with 1-3 degrees of freedom (Paule-Mandel's ``tau²`` is then 0 more often than not even
    when the days differ). Rounds without ``diff_var_day_revealed``: the larger of their term and the
    rounds'. The baseline level's day term stays the calibrated one (observed in the logs)."""
    from edgetwin.loop.day_bound import pooled_day_term

    tau2, k = between_day_variance(rounds, prefix)
    out = []
    for r in rounds:
        r2 = dict(r)
        first = float(r.get(f"{prefix}diff_var_day", 0.0))
        r2[f"{prefix}diff_var_day_twin"], r2[f"{prefix}diff_var_day_rounds"] = first, tau2
        var, df = pooled_day_term(first, float(r.get(f"{prefix}diff_var_day_revealed", first)), tau2, k,
                                  float(r.get(f"{prefix}day_df", float("inf"))))  # fmt: skip
        if k >= 2 and var != first:
            r2[f"{prefix}diff_se"] = math.sqrt(max(float(r[f"{prefix}diff_se"]) ** 2 - first, 0.0) + var)
            r2[f"{prefix}diff_var_day"], r2[f"{prefix}day_df"] = var, df
        out.append(r2)
    return out


def _inverse_variance_weights(variances: Sequence[float]) -> np.ndarray:
    """``(k,)`` weights ``1/v_i`` normalized to sum 1: the pooling before issue 48 (`design_weights` says why
    not)."""
    w = np.array([1.0 / max(v, 1e-300) for v in variances])
    return w / w.sum()


def _pool(rounds: Sequence[Mapping[str, float]], prefix: str = "", weighting: str = "design") -> tuple[
        float, float, float, float, float]:
    """Design-weighted pooled ``(diff, diff_var, base, base_var, df)`` of one KPI's rounds: weights
    ``w_i`` fixed before the outcomes (`design_weights`: each day alike, its rounds by planned
    exposure; not their estimated inverse variances, which on a skewed KPI favour the draws that
    missed its tail), the estimate ``Σ w_i·x_i`` and its variance ``Σ w_i²·own_i`` plus the shared
    and day terms.

    Three kinds of term, pooled as what they are (`_pool_terms`):

    * the rounds' own rectifiers are independent (each round's canary is a new random slice,
      judged with the twin from before it): ``Σ w_i²·own_i``;
    * the fleet's and the interference's terms are shared by every round (the same twin that
      only learns slowly, the same kind of fleet): added as perfectly correlated,
      ``(Σ w_i·sd_i)²``, the conservative bound, never as independent (which would shrink them by
      the number of rounds);
    * the day-to-day term (``*_var_day``; the estimand is the change averaged over the days the
      decision lives with, one canary day's change is one draw around it) is shared by the rounds
      of one day (``day``, the day's index) and independent across days:
      ``Σ_days (Σ_{i in day} w_i·sd_i)²``. So more rounds on one day never shrink it; more days
      shrink it as ``1/days`` — the day-to-day variance shrinks only with more days. Once rounds
      ran on >= 2 days the term is the larger of the twin's and the rounds' own between-day
      variance (`with_day_term`): with one round a day and no shared terms the pooled estimate is
      the days' plain mean and its variance ``Σ (v_i + tau²) / D²`` (``tau²`` random-effects',
      Paule-Mandel; not its weights ``1/(v_i + tau²)``, which depend on the outcomes)."""
    rounds = with_day_term(rounds, prefix)
    diff, dv, own_terms, shared_v, day_v = _pool_terms(rounds, "diff", prefix, weighting)
    base, bv, _, _, _ = _pool_terms(rounds, "base", prefix, weighting)
    dfs = [float(r.get(f"{prefix}df", float("inf"))) for r in rounds]
    day_df = min((float(r.get(f"{prefix}day_df", float("inf"))) for r in rounds), default=float("inf"))
    df = welch_df([(v, d) for v, d in zip(own_terms, dfs, strict=True)] + [(shared_v, min(dfs)), (day_v, day_df)])
    return diff, dv, base, bv, df


def width_terms(rounds: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """What a pooled interval of the change is made of (issue 48: why a pair stays open), as
    variances of the difference in the KPI's units squared, beside the baseline level:

    ``own`` (the canaries' group split: the arms' rectifiers, shrinks with more groups or days),
    ``shared`` (the fleet's and the twin's interference terms, every round's at once: no number of
    canary days shrinks it), of which ``interference`` (the twin members' spread over the
    interference, `interference_var`, pooled as perfectly correlated like the rest of it), ``day``
    (the day-to-day term: shrinks as ``1/days``) and ``day_one`` (one day's day-to-day variance,
    the spread of the daily change itself; `with_day_term`'s: the larger of the twin's and the
    rounds' own), ``base`` (the pooled baseline level) and ``days``."""
    rounds = with_day_term(rounds)
    _, _, own_terms, shared_v, day_v = _pool_terms(rounds, "diff")
    base = _pool_terms(rounds, "base")[0]
    w = design_weights(rounds)
    interf = float(np.sum(w * np.sqrt([max(float(r.get("diff_var_interference", 0.0)), 0.0) for r in rounds])) ** 2)
    return {"own": float(np.sum(own_terms)), "shared": shared_v, "interference": min(interf, shared_v), "day": day_v,
            "day_one": float(max((float(r.get("diff_var_day", 0.0)) for r in rounds), default=0.0)),
            "day_one_twin": float(max((float(r.get("diff_var_day_twin", 0.0)) for r in rounds), default=0.0)),
            "day_one_rounds": float(max((float(r.get("diff_var_day_rounds", 0.0)) for r in rounds), default=0.0)),
            "base": base,
            "days": float(len({float(r.get("day", 0.0)) for r in rounds}))}  # fmt: skip


def combine_estimates(
    rounds: Sequence[Mapping[str, float]], level: float = LEVEL, weighting: str = "design"
) -> dict[str, float]:
    """Several rounds' estimates of one KPI (each from the twin *before* that round's canary, so that
    no round's rectifier is computed with a twin fitted on its own measurements) pooled by
    weights fixed by the design (`design_weights`: every day alike, the estimand's average over days;
    within a day by planned exposure), with their shared terms not treated as independent (`_pool`),
    and the interval recomputed at ``level`` (the loop passes each look's level, `look_level`). The
    twin-alone difference (``twin_diff``) is pooled with the same weights, so the rectifier
    (``diff − twin_diff``) stays the pooled rounds' own. ``weighting="inverse_variance"``: the
    pooling before issue 48 (weights ``1/v̂_i`` from the rounds' estimated variances, random-effects'
    ``1/(v̂_i + tau²)`` once the rounds' day term is the larger; `between_day_variance` averages a
    day's rounds by planned exposure either way, which differs from before only with several rounds
    on a day), kept only so that benchmarks measure the two side by side
    (benchmarks/_closed_loop_heavy.py); the loop never passes it."""
    if weighting not in ("design", "inverse_variance"):
        raise ValueError(f"unknown pooling weights {weighting!r}; expected design or inverse_variance")
    diff, dv, base, bv, df = _pool(rounds, "", weighting)
    out = finish_estimate(diff, dv, base, bv, level, df=df)
    tw = (design_weights(rounds) if weighting == "design"
          else _inverse_variance_weights([r["diff_se"] ** 2 for r in rounds]))  # fmt: skip
    out["twin_diff"] = float(np.sum(tw * np.array([r["twin_diff"] for r in rounds])))
    out["twin_rel"] = out["twin_diff"] / abs(base) if base else float("nan")
    out["rounds"] = float(len(rounds))
    out["days"] = float(len({float(r.get("day", 0.0)) for r in rounds}))
    out["day_var_rounds"], _k = between_day_variance(rounds)
    out["day_var_twin"] = float(max((float(r.get("diff_var_day", 0.0)) for r in rounds), default=0.0))
    if all(f"{LOCAL}diff" in r for r in rounds):
        ld, ldv, lb, lbv, ldf = _pool(rounds, LOCAL, weighting)
        local = finish_estimate(ld, ldv, lb, lbv, level, df=ldf)
        out.update({f"{LOCAL}{key}": local[key] for key in _LOCAL_KEYS if key in local})
    for k in ("n_fleet", "n_candidate", "n_control"):
        if all(k in r for r in rounds):
            out[k] = float(max(r[k] for r in rounds)) if k == "n_fleet" else float(sum(r[k] for r in rounds))
    return out


# ------------------------------------------------------------------------------ twin predictions
@dataclass(frozen=True)
class CanaryAssignment:
    """A canary's actual assignment, for the twin to replay (``f^canary``, the module docstring).

    Attributes:
        candidate: the `PolicySpec` the candidate arm ran. rest: the one every other group ran
            (the slice's control arm and the fleet outside the slice: the current policy).
        treated: the candidate arm's group ids.
    """

    candidate: Any
    rest: Any
    treated: frozenset[str]

    def spec_for(self, agents: Sequence[Any] | np.ndarray, name: str = "canary") -> Any:
        """The `PolicySpec` for an episode whose rows are ``agents`` (in row order)."""
        from edgetwin.twin.whatif import routed_policy

        mask = np.isin(np.asarray(agents).astype(str), np.array(sorted(self.treated), dtype=str))
        return routed_policy(name, self.candidate, self.rest, mask)


def replay_spec(name: str, policy: Any) -> Any:
    """A `PolicySpec` whose every replay starts the policy from the same state.

    `edgetwin.twin.whatif.fixed_policy` hands the *same* object to every replay; a policy that samples
    (`edgetwin.contract.policy.NoisyPolicy`, `RandomPolicy`) then continues its stream from wherever
    the previous replay left it, so two identical calls of `twin_group_series` answer differently
    (the closed-loop benchmark's levers run reproduced its stored day-1 verdicts on 81 of 84 pairs).
    Here each replay gets its own object: ``policy.reseeded(seed)`` where the policy offers it (a
    stream seeded from the replay's world seed, so members and episodes draw apart and an identical
    call draws the same), else a deep copy of ``policy`` as it was when the spec was made (its
    ``reset()`` called). ``shared`` is False: no state passes between episodes.
    """
    from edgetwin.twin.whatif import PolicySpec

    frozen = copy.deepcopy(policy)

    def build(seed: int, member: int, scen: np.ndarray) -> Any:
        if hasattr(frozen, "reseeded"):
            return frozen.reseeded(int(seed))
        fresh = copy.deepcopy(frozen)
        if hasattr(fresh, "reset"):
            fresh.reset()
        return fresh

    return PolicySpec(name, build)


def measured_group_means(canary_log: pd.DataFrame, kpis: Sequence[str], candidate: str, start_t: int = 0) -> pd.DataFrame:
    """Per group of a canary's log: its arm (``candidate`` if the candidate decided its rows, else
    ``control``), each KPI's mean over ticks ``t >= start_t`` (after the pre-canary ticks) and, as
    ``pre:<kpi>``, over the pre-canary ticks (NaN without them)."""
    missing = [c for c in ("agent", "t", "policy", *kpis) if c not in canary_log.columns]
    if missing:
        raise InputError(f"the canary log lacks column(s) {missing}", "canary log")
    rows = canary_log[canary_log["t"] >= start_t]
    if rows.empty:
        raise InputError(f"the canary log has no row at t >= {start_t}", "canary log")
    g = rows.groupby("agent")
    out = g[list(kpis)].mean()
    on_candidate = (rows["policy"].astype(str) == candidate).groupby(rows["agent"]).any().reindex(out.index)
    out["arm"] = np.where(on_candidate.to_numpy(dtype=bool), "candidate", "control")
    pre = canary_log[canary_log["t"] < start_t].groupby("agent")[list(kpis)].mean().reindex(out.index)
    for k in kpis:
        out[f"pre:{k}"] = pre[k]
    return out


def interference_var(
    member_predictions: Sequence[pd.DataFrame], is_cand: np.ndarray, groups: Sequence[Any], kpi: str,
    candidate: str, baseline: str, canary: str,
) -> tuple[float, float]:
    """The twin's own uncertainty about the interference it predicts on the slice, from its members.

    Each member ``m`` predicts the interference the estimator adds to a no-interference one,
    ``I_m = mean_cand(f_c^full − f^canary) − mean_ctrl(f_b^full − f^canary)`` (and the baseline
    level's ``J_m = −mean_ctrl(f_b^full − f^canary)``). The canary measures the twin's error in its
    own configuration, never in the full switch, so the error of ``I`` is the one term no
    measurement corrects; the members' spread is the twin's statement of how unsure it is
    (``var_m(I_m)·(1 + 1/M)``: the truth taken as one more draw beside the members' mean). It is 0
    without interference (every member's ``I_m = 0``) and when the members agree, and it does not
    cover an interference every member gets wrong the same way.

    Args:
        member_predictions: one `twin_group_predictions` frame per member (same columns).
        is_cand: ``(n,)`` bool, the candidate arm among ``groups`` (the canary's measured groups).

    Returns:
        ``(var of the difference, var of the baseline level)``, KPI units squared; ``(0, 0)`` with
        fewer than 2 members.
    """
    if len(member_predictions) < 2:
        return 0.0, 0.0
    return interference_spread(*member_interference(member_predictions, is_cand, groups, kpi, candidate, baseline,
                                                    canary))  # fmt: skip


def interference_spread(i_m: Sequence[float] | np.ndarray, j_m: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """`interference_var` from the members' ``I_m`` and ``J_m`` (each ``(members,)``, KPI units):
    ``(1 + 1/M)·var_m``, ``(0, 0)`` with fewer than 2 members."""
    if len(i_m) < 2:
        return 0.0, 0.0
    k = 1.0 + 1.0 / len(i_m)
    return k * float(np.var(i_m, ddof=1)), k * float(np.var(j_m, ddof=1))


def member_interference(
    member_predictions: Sequence[pd.DataFrame], is_cand: np.ndarray, groups: Sequence[Any], kpi: str,
    candidate: str, baseline: str, canary: str,
) -> tuple[np.ndarray, np.ndarray]:
    """``(I_m, J_m)``, each ``(members,)`` in KPI units: each member's interference on the change and
    on the baseline level (`interference_var`'s, which takes their spread). `member_interference_draws`
    with one draw, the arms given by ``is_cand`` over ``groups``."""
    is_cand = np.asarray(is_cand, dtype=bool)
    i_m, j_m = member_interference_draws(member_predictions, [(np.flatnonzero(is_cand), np.flatnonzero(~is_cand))],
                                         groups, kpi, candidate, baseline, canary)  # fmt: skip
    return i_m[:, 0], j_m[:, 0]


def member_interference_draws(
    member_predictions: Sequence[pd.DataFrame], arms: Sequence[tuple[np.ndarray, np.ndarray]], groups: Sequence[Any],
    kpi: str, candidate: str, baseline: str, canary: str,
) -> tuple[np.ndarray, np.ndarray]:
    """``(I, J)``, each ``(members, draws)`` in KPI units: `interference_var`'s ``I_m`` and ``J_m``
    for each of several arms over the same ``groups``. ``arms``: per draw, the row positions in
    ``groups`` of the candidate arm's and the control arm's groups. Why draws: the canary plan
    (`edgetwin.loop.plan_interference`) reads the term on several random arms of a replay, and one
    pandas reindex per member and draw made that most of its cost; each member's frame is reindexed
    once here. The arithmetic is the verdict's per draw (the same subtractions, the same means of
    the same elements in the same order: one draw gives `member_interference`'s numbers)."""
    out_i = np.empty((len(member_predictions), len(arms)))
    out_j = np.empty((len(member_predictions), len(arms)))
    for m, pr in enumerate(member_predictions):
        at = pr.reindex(list(groups))
        d_c = (at[(candidate, kpi)] - at[(canary, kpi)]).to_numpy()
        d_b = (at[(baseline, kpi)] - at[(canary, kpi)]).to_numpy()
        for a, (ic, ib) in enumerate(arms):
            out_i[m, a] = float(np.mean(d_c[ic]) - np.mean(d_b[ib]))
            out_j[m, a] = float(-np.mean(d_b[ib]))
    return out_i, out_j


def _rectified(
    predictions: pd.DataFrame, at: pd.DataFrame, measured: pd.DataFrame, is_c: np.ndarray, kpi: str,
    candidate: str, baseline: str, level: float, *, against: tuple[str, str],
    transport_var: tuple[float, float] = (0.0, 0.0),
    transport_df: float = float("inf"),
    day: tuple[float, float, float] = (0.0, 0.0, float("inf")),
    order: tuple[np.ndarray, np.ndarray] | None = None,
    cuped: str = "pooled",
) -> dict[str, float]:
    """`ppi_mean_difference` of one KPI: the full-switch predictions over the fleet, rectified on the
    measured groups against the prediction columns ``against`` (candidate arm's, control arm's);
    ``at``: ``predictions`` on the measured groups. ``order``: row positions of the candidate arm's
    and the control arm's groups, pair by pair (matched pairs, `pair_order`); None: unpaired."""
    pre = measured[f"pre:{kpi}"].to_numpy() if f"pre:{kpi}" in measured else None
    ic, ib = (np.flatnonzero(is_c), np.flatnonzero(~is_c)) if order is None else order
    return ppi_mean_difference(
        predictions[(candidate, kpi)].to_numpy(), predictions[(baseline, kpi)].to_numpy(),
        measured[kpi].to_numpy()[ic], at[(against[0], kpi)].to_numpy()[ic],
        measured[kpi].to_numpy()[ib], at[(against[1], kpi)].to_numpy()[ib],
        level,
        x_cand=None if pre is None else pre[ic], x_ctrl=None if pre is None else pre[ib],
        transport_var=transport_var, transport_df=transport_df, day_var=(day[0], day[1]), day_df=day[2],
        paired=order is not None, cuped=cuped,
    )  # fmt: skip


def pair_order(measured: pd.DataFrame, is_c: np.ndarray, pairs: Sequence[tuple[str, str]] | None) -> tuple[
        np.ndarray, np.ndarray] | None:
    """Row positions ``(candidate's, control's)`` of ``measured``'s groups pair by pair, when every
    group was measured, every pair was split between the arms and no other group is measured (the
    control arm is the slice's own); else None (the verdict then analyses the arms unpaired, which
    stays valid for a pair-randomized design, only wider)."""
    if not pairs:
        return None
    pos = {str(a): i for i, a in enumerate(measured.index)}
    ic, ib = [], []
    for a, b in pairs:
        if a not in pos or b not in pos or bool(is_c[pos[a]]) == bool(is_c[pos[b]]):
            return None
        c, k = (pos[a], pos[b]) if is_c[pos[a]] else (pos[b], pos[a])
        ic.append(c)
        ib.append(k)
    if len(ic) < 2 or len(ic) + len(ib) != len(measured):
        return None
    return np.asarray(ic), np.asarray(ib)


def ppi_estimates(
    predictions: pd.DataFrame,
    measured: pd.DataFrame,
    kpis: Mapping[str, str],
    candidate: str,
    baseline: str,
    level: float = LEVEL,
    canary: str | None = None,
    member_predictions: Sequence[pd.DataFrame] | None = None,
    day_var: Mapping[str, tuple[float, float, float]] | None = None,
    pairs: Sequence[tuple[str, str]] | None = None,
    cuped: str = "pooled",
) -> dict[str, dict[str, float]]:
    """PPI for each KPI (name -> direction) from `twin_group_predictions` and `measured_group_means`.

    Args:
        candidate, baseline: the full-switch prediction columns' policy names.
        canary: the policy name of the twin's replay of the canary's own assignment (a
            `CanaryAssignment` among `twin_group_predictions`' policies): the rectifier is
            measured against it. None: against the full-switch predictions, which assumes no
            interference between the slice and the rest of the fleet (the module docstring
            says why that is wrong for candidates that congest shared sites).
        member_predictions: with ``canary``, the same predictions per twin member: their
            spread over the interference widens the intervals (`interference_var`).
        day_var: per KPI, ``(var of the change, var of the baseline level, days − 1)`` from day to
            day (`edgetwin.loop.verdict.day_to_day_variance`); None or a KPI missing: the
            interval is about the canary's day only (``day_var`` 0 in the estimate says so).
        pairs: the plan's matched pairs (`edgetwin.loop.plan.matched_pairs`): the arms are
            analysed as pairs when the canary split every pair (`pair_order`; ``paired`` 1 in the
            estimate), else unpaired.
        cuped: the pre-period adjustment's slope (`ppi_mean_difference`'s ``cuped``).

    Groups the canary measured but the twin has no prediction for are an error (the canary ran on
    another fleet than the twin's log)."""
    unknown = sorted(set(measured.index) - set(predictions.index))
    if unknown:
        raise InputError(
            f"{len(unknown)} canary group(s) are not in the twin's log (e.g. {unknown[0]!r}): the canary ran on "
            "another fleet", "canary log"
        )
    is_c = (measured["arm"] == "candidate").to_numpy()
    at = predictions.reindex(measured.index)
    order = pair_order(measured, is_c, pairs)
    out = {}
    for k in kpis:
        args = (predictions, at, measured, is_c, k, candidate, baseline, level)
        day = day_term(day_var, k)
        if canary is None:
            out[k] = _rectified(*args, against=(candidate, baseline), day=day, order=order, cuped=cuped)
        else:
            out[k] = _rectified(*args, against=(canary, canary), transport_var=interference_var(
                member_predictions, is_c, list(measured.index), k, candidate, baseline, canary,
            ) if member_predictions else (0.0, 0.0), transport_df=max(len(member_predictions or ()) - 1, 1),
                day=day, order=order, cuped=cuped)  # fmt: skip
            # assumes no interference: the verdict's hull
            local = _rectified(*args, against=(candidate, baseline), day=day, order=order, cuped=cuped)
            out[k].update({f"{LOCAL}{key}": local[key] for key in _LOCAL_KEYS})
        out[k]["n_fleet"], out[k]["n_candidate"], out[k]["n_control"] = len(predictions), int(is_c.sum()), int((~is_c).sum())
    return out


def ppi_verdict(
    estimates: Mapping[str, Mapping[str, float]], guards: Sequence[KPIMargin], better: Mapping[str, str] | None = None
) -> tuple[str, list[PPIEstimate]]:
    """The gate's three verdicts from PPI intervals: any KPI whose whole worsening interval lies
    beyond its margin refuses; all within it promote; else abstain. An estimate that carries a
    no-interference estimate beside it (``local:*``, `ppi_estimates` with a canary replay) is
    judged on the hull of the two intervals, which ``interval`` then shows.

    **What each verdict is about (its estimand):** the fleet-wide relative change of a KPI if every
    group switched to the candidate, averaged over the days the decision lives with — not the
    canary's slice, and not the canary's day. The full switch is the twin's prediction rectified by
    the canary; the days enter through the day-to-day term (``day_var``, `ppi_mean_difference`); the
    interference a slice cannot see through the twin's members' spread and the hull.

    Args:
        estimates: from `ppi_estimates`. guards: the guarded KPIs' margins (`KPIMargin`, with
            their directions). better: KPI -> ``"higher"`` / ``"lower"`` overriding a margin's
            direction (None: the margins').
    """
    from edgetwin.policies.gate import check_verdict

    out = []
    for g in guards:
        if g.kpi not in estimates:
            raise InputError(f"no prediction-powered estimate for guarded KPI {g.kpi!r}", "--max-regression")
        e = estimates[g.kpi]
        direction = better[g.kpi] if better is not None else g.better
        sign = -1.0 if direction == "higher" else 1.0
        # with a no-interference estimate beside it, the hull of the two (module docstring)
        rel_lo, rel_hi = e["rel_lo"], e["rel_hi"]
        if f"{LOCAL}rel_lo" in e:
            rel_lo, rel_hi = min(rel_lo, e[f"{LOCAL}rel_lo"]), max(rel_hi, e[f"{LOCAL}rel_hi"])
        lo, hi = sorted((sign * rel_lo, sign * rel_hi))
        base = e["base"]
        allowed = g.max_regression + (g.min_delta / abs(base) if base else float("inf"))
        v = check_verdict([lo, hi], allowed, 0.0, 1.0)
        out.append(PPIEstimate(
            g.kpi, direction, e["rel"], [rel_lo, rel_hi], e["diff"], e["diff_se"], base,
            e["twin_rel"], e["diff"] - e["twin_diff"], int(e["n_fleet"]), int(e["n_candidate"]),
            int(e["n_control"]), [lo, hi], allowed, v,
        ))  # fmt: skip
    verdict = (
        "refuse" if any(c.verdict == "regress" for c in out)
        else "promote" if out and all(c.verdict == "ok" for c in out) else "abstain"
    )  # fmt: skip
    return verdict, out


__all__ = [
    "pair_order",
    "LEVEL",
    "CanaryAssignment",
    "PPIEstimate",
    "combine_estimates",
    "design_weights",
    "finish_estimate",
    "interference_var",
    "look_days",
    "interference_spread",
    "member_interference",
    "member_interference_draws",
    "look_level",
    "measured_group_means",
    "ppi_estimates",
    "ppi_mean_difference",
    "ppi_verdict",
    "twin_group_predictions",
    "twin_group_series",
    "welch_df",
    "width_terms",
]
