"""The CUPED-adjusted rectifier of a canary's two arms and its jackknife variance.

`edgetwin.loop.ppi.ppi_mean_difference` adjusts each arm's rectifier ``r = y − f`` (a group's canary
mean minus the twin's prediction of it) by a slope on the group's pre-period mean ``x`` (CUPED):
``r − β·(x − x̄)``, with one slope over both arms (``pooled``, the guard's) or one per arm
(``per_arm``, Lin 2013's interacted adjustment). Until issue 48 the variance of the adjusted
difference was the plug-in ``var(r_c')/n_c + var(r_b')/n_b`` of the adjusted residuals, as if the
slope were known. It is not: it is fitted on the same groups, and where a few groups lie far out in
``x`` (the closed-loop benchmark's ``reward``, a two-signed sum near 0 that a congested group drives
to −10 … −40) the fit passes close to them, so their residuals — and their share of the plug-in
variance — vanish while the estimate still swings with which arm they fell in. Re-randomizing the
49-group candidate arm over each canary day's 951 control groups of the seed-2, 1,000-group loop
(all on the current policy, the truth 0; 8 days, 400 draws a day), the per-arm slope's stated 90 %
interval covered 74.8-88.2 % with the plug-in variance and 82.2-91.8 % with this one
(docs/benchmarks/closed_loop/README.md, "CUPED's slope and heavy tails", from
benchmarks/_closed_loop_heavy.py). At the demo's 4 and 6 groups (pooled slope) it is conservative:
the coverage experiment's A/A coverage went from 88.2 % to 95.8 % at a stated 90 %.

The jackknife (leave one group out, refit the slope, recompute the estimate; Quenouille-Tukey) counts
the slope's estimation error and the groups' leverage; for a plain difference of means it equals the
plug-in ``s²/n`` exactly, and for a regression-adjusted mean it is close to the leverage-corrected
sandwich (HC3, MacKinnon and White 1985), the small-sample choice for Lin's estimator. Each arm's
deletions give that arm's share of the variance (the Welch-Satterthwaite terms keep their arms). The
leave-one-out fits are closed-form downdates of each arm's sums, ``O(n)`` for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Adjusted", "cuped_adjusted"]


@dataclass(frozen=True)
class Adjusted:
    """Two arms' CUPED-adjusted rectifiers and their jackknife variances.

    Attributes:
        rc, rb: ``(n_c,)``, ``(n_b,)`` the adjusted residuals ``r − β·(x − x̄)`` (``x̄``: both arms'
            mean covariate), whose means give the estimate (their difference: the rectifier's part
            of the change; ``mean(rb)``: the control arm's part of the baseline level).
        var_c, var_b: the difference's jackknife variance from deleting each candidate-arm group
            (resp. control-arm group), KPI units squared; ``var_c + var_b`` is its variance.
        var_base: the jackknife variance of ``mean(rb)`` over deletions in both arms (the slope and
            ``x̄`` move with either).
    """

    rc: np.ndarray
    rb: np.ndarray
    var_c: float
    var_b: float
    var_base: float


def _slope(sxr: np.ndarray | float, sxx: np.ndarray | float) -> np.ndarray:
    """Least-squares slope from centred sums; 0 where ``x`` has no spread (`cuped_slope`'s rule)."""
    sxx_a, sxr_a = np.asarray(sxx, dtype=np.float64), np.asarray(sxr, dtype=np.float64)
    ok = sxx_a > 1e-12 * max(float(np.max(np.abs(sxx_a), initial=0.0)), 1e-300)
    return np.where(ok, sxr_a / np.where(ok, sxx_a, 1.0), 0.0)


def _sums(x: np.ndarray, r: np.ndarray) -> tuple[float, float, float, float]:
    """One arm's ``(mean x, mean r, Σ(x − x̄)², Σ(x − x̄)(r − r̄))``."""
    x0, r0 = x - x.mean(), r - r.mean()
    return float(x.mean()), float(r.mean()), float(x0 @ x0), float(x0 @ r0)


def _left_out(x: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, ...]:
    """The same four quantities with each group left out in turn, each ``(n,)`` (downdates of the
    centred sums: Σ over the others of ``(x − x̄₋ᵢ)(r − r̄₋ᵢ) = S_xr − x₀ᵢr₀ᵢ − s_x s_r / (n − 1)`` with
    ``x₀ = x − x̄`` and ``s_x = −x₀ᵢ`` the others' sum of ``x₀``)."""
    m = len(x) - 1
    x0, r0 = x - x.mean(), r - r.mean()
    sx, sr = -x0, -r0
    sxx = float(x0 @ x0) - x0 * x0 - sx * sx / m
    sxr = float(x0 @ r0) - x0 * r0 - sx * sr / m
    return sx / m + x.mean(), sr / m + r.mean(), sxx, sxr


def _jack_var(theta: np.ndarray) -> float:
    """The jackknife variance ``(n − 1)/n · Σ (θ₋ᵢ − θ̄)²`` of ``n`` leave-one-out estimates."""
    n = len(theta)
    return float((n - 1) / n * np.sum((theta - theta.mean()) ** 2)) if n > 1 else 0.0


def cuped_adjusted(rc: np.ndarray, xc: np.ndarray, rb: np.ndarray, xb: np.ndarray, per_arm: bool) -> Adjusted:
    """Adjust both arms' rectifiers by the CUPED slope and give the jackknife variances (module docstring).

    Args:
        rc, xc: ``(n_c,)`` the candidate arm's rectifier and pre-period covariate; rb, xb: ``(n_b,)``
            the control arm's. Every value finite; at least 2 groups per arm.
        per_arm: each arm its own slope (Lin 2013) if True, else one slope pooled within arms
            (`edgetwin.edge.canary_guard.cuped_slope`, the guard's). Both centre on ``x̄``.
    """
    from edgetwin.edge.canary_guard import cuped_slope

    rc, xc, rb, xb = (np.asarray(a, dtype=np.float64) for a in (rc, xc, rb, xb))
    n_all, sx_all = len(xc) + len(xb), float(xc.sum() + xb.sum())
    xm = sx_all / n_all
    if per_arm:
        b_c, b_b = cuped_slope([xc], [rc]), cuped_slope([xb], [rb])
    else:
        b_c = b_b = cuped_slope([xc, xb], [rc, rb])
    adj_c, adj_b = rc - b_c * (xc - xm), rb - b_b * (xb - xm)
    (xcm, rcm, sxxc, sxrc), (xbm, rbm, sxxb, sxrb) = _sums(xc, rc), _sums(xb, rb)

    def means(c: tuple[object, ...], b: tuple[object, ...], x_mean: object) -> tuple[np.ndarray, np.ndarray]:
        """Both arms' adjusted means from their (possibly leave-one-out) sums and ``x̄``."""
        cx, cr, cxx, cxr = (np.asarray(v, dtype=np.float64) for v in c)
        bx, br, bxx, bxr = (np.asarray(v, dtype=np.float64) for v in b)
        xmv = np.asarray(x_mean, dtype=np.float64)
        sc, sb = (_slope(cxr, cxx), _slope(bxr, bxx)) if per_arm else (_slope(cxr + bxr, cxx + bxx),) * 2
        return cr - sc * (cx - xmv), br - sb * (bx - xmv)

    full_c, full_b = (xcm, rcm, sxxc, sxrc), (xbm, rbm, sxxb, sxrb)
    c_out, b_stay = means(_left_out(xc, rc), full_b, (sx_all - xc) / (n_all - 1))
    c_stay, b_out = means(full_c, _left_out(xb, rb), (sx_all - xb) / (n_all - 1))
    return Adjusted(adj_c, adj_b, _jack_var(c_out - b_stay), _jack_var(c_stay - b_out),
                    _jack_var(b_stay) + _jack_var(b_out))  # fmt: skip
