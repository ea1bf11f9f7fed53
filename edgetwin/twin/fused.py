"""`FusedTick`: the element-wise part of a twin's tick compiled into a few passes per row (numba).

A tick of `edgetwin.twin.simulation.Simulation` is the client network (torch's GEMMs, numpy's
``tanh``) and, around it, some 40 numpy passes over ``(N, 3-24)`` arrays: the actions' bounds and
z-values, the response noise, the outputs' scaler inverse (``expm1`` of the log columns) and bounds,
their z-values, the reward, ``z(state) + Δz``, the state's scaler inverse and bounds, the clock and
echo columns, the next state's z-values and the models' view of them. Each pass reads and writes
its arrays whole, so at 10,000 agents the passes together cost more than the GEMMs (issue 47's
profile: ~4 of a 7 ms tick). Here they are a few loops over rows (`numba.njit`, ``fastmath=False``),
each reading a row once and writing every array it feeds.

Why numba and not numexpr (which compiles the declared dynamics' expressions; the end of tick runs
those programs in one call, `FusedTick.declared`): the passes gather and scatter columns
(log columns, site-level columns, echoes), clip to per-column bounds and branch per column, which
numexpr's element-wise expressions cannot say. Why the transcendental functions stay numpy's:
numba calls the C library's scalar ``expm1`` / ``log1p`` (~9 ns a value here), numpy's SIMD ones
take ~1 ns; so a kernel writes the log columns' arguments into one packed array, numpy's ufunc runs
on it in place, and the next kernel reads it back.

What moves in the bits: nothing. Every kernel does the same IEEE operations, in the same order
and precision, as the numpy passes it replaces (subtraction, division, products and sums, ``max``
/ ``min`` against the same bounds with the same NaN and signed-zero outcomes, float32 casts where
numpy cast), and the transcendental functions are numpy's own, so the fused tick gives the numpy
tick's numbers to the bit (tests/test_fused_tick.py compares them; LLVM does not contract a
product and a sum into an FMA without fast-math). A row's numbers depend on its own row only (the
kernels loop over rows and never read another's), except the site means, which are over a site's
agents, as before: where the agents come site by site (a generated world) a compiled pass adds each
site's rows in numpy's own pairwise order (`_segment_means`: ``np.add.reduceat``'s bits, checked by
tests/test_fused_sums.py), elsewhere `World.site_means` runs.

The response noise by predicted level (`edgetwin.imitation.noise`: each draw mapped through its
scenario's table at the row's own mean) runs in the noise pass too (`_level_draws`, then
`_outputs_first`), with `noise_residuals`' numbers to the bit.

The network between the passes runs every scenario on a contiguous block of rows
(`edgetwin.twin.forward`): `FusedTick.legal_actions` writes the per-agent inputs in that order and
`FusedTick.outputs` reads the means back in row order, so no pass gathers or scatters by scenario.

When it applies (`FusedTick.of`): every state, action and output column is continuous (no discrete snapping), the
reward is the spec's weights or the predicted ``reward`` column, the state moves by the client's
``Δz`` (a learned transition without transition models or a site-state model, no spec transition
function). Otherwise the simulation runs its numpy passes, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numba
import numpy as np

from edgetwin.contract.dynamics_program import compile_program
from edgetwin.contract.spec import REWARD_COLUMN
from edgetwin.imitation.noise import _DZ, _Z0
from edgetwin.imitation.steps import segment_starts

if TYPE_CHECKING:
    from edgetwin.imitation.layout import ColumnScaler, Layout
    from edgetwin.imitation.world import World

__all__ = ["FusedTick"]

#: every kernel: IEEE arithmetic as written (no fast-math reassociation or FMA contraction), cached on disk
_kernel = numba.njit(fastmath=False, cache=True, nogil=True, boundscheck=False)


# ------------------------------------------------------------------------------ kernels
@_kernel
def _inverse_value(z: float, mean: float, std: float, log: bool, low: float, high: float) -> float:
    """`ColumnScaler.inverse` of one float64 z-value up to its ``expm1``: ``z * std + mean``, then a
    log column's clipped to ±50 (numpy's ``expm1`` runs on it next), any other clipped to its
    bounds, +0.0. Scalars in and out: a helper taking the arrays would cost their reference
    counts every call (measured: 27 instead of 2 ns a value)."""
    x = z * std
    x = x + mean
    if log:
        if x < -50.0:
            x = -50.0
        if x > 50.0:
            x = 50.0
        return x
    if x < low:
        x = low
    if x > high:
        x = high
    return x + 0.0


#: rows of one scenario that `_level_draws` maps at a time (its column buffers: ~25 KB at 11 outputs)
_LEVEL_CHUNK = 128


@_kernel
def _level_draws(
    means: np.ndarray, pos: np.ndarray, model: np.ndarray, eps: np.ndarray,
    knots: np.ndarray, table: np.ndarray, n_bins: np.ndarray,
) -> None:
    """In place: ``eps (n, Y)`` float32 row i's draws mapped through the noise table of its scenario
    ``model[i]`` at its own means ``means[pos[i]]`` (``(n, >= Y)`` float32, scenario order):
    `edgetwin.imitation.noise.noise_residuals` to the bit (the same float64 operations in the same
    order; tests/test_fused_noise.py). A row reads nothing of another.

    Why not that function: its bin search branches on the data (a loop until the next knot is
    above the mean, an interpolation only inside), which mispredicts about once a value: 1.9 ms of
    a 10,000-agent tick (110,000 values). Here the bin is a count of the knots below the mean and
    the rest selects; the count is the index the search finds because a table's knots are
    non-decreasing (bin centres; `OutputNoise.from_dict` refuses others) and an output's padding
    repeats its last real knot, so inside the outer knots no knot from ``nb - 1`` on is below the mean.

    The rows are taken scenario by scenario (in row order within one, which a tick's ``pos`` makes
    the means' order), up to `_LEVEL_CHUNK` of one scenario at a time, copied column by column into float64 buffers: the grid segments and the knot counts
    are then passes over a column against one table's constants, and the table lookups read one
    (scenario, output)'s table for a whole column (issue 47, third round: 1.34 -> 1.08 ms at 10,000
    agents, 0.135 -> 0.099 ms at 1,000, timed on its own on 12 ticks' inputs; row by row it was
    ~12 ns a value, mostly the per-value indexing of the 4-d table and knot arrays)."""
    n, ny = eps.shape
    g = table.shape[3]
    kk = knots.shape[2]
    ch = _LEVEL_CHUNK
    n_models = knots.shape[0]
    start = np.zeros(n_models + 1, np.int64)  # the rows grouped by scenario, in row order within one
    for i in range(n):
        start[model[i] + 1] += 1
    for s in range(n_models):
        start[s + 1] += start[s]
    perm = np.empty(n, np.int64)
    for i in range(n):
        perm[start[model[i]]] = i
        start[model[i]] += 1
    mbuf = np.empty(ny * ch)
    tbuf = np.empty(ny * ch)
    kbuf = np.empty(ch, np.int64)
    cbuf = np.empty(ch, np.int64)
    obuf = np.empty(ch * ny, np.float32)
    a0 = 0
    while a0 < n:
        mi = model[perm[a0]]
        a1 = a0 + 1
        while a1 < n and a1 - a0 < ch and model[perm[a1]] == mi:
            a1 += 1
        r = a1 - a0
        for q in range(r):  # the chunk's rows, column by column
            mr = means[pos[perm[a0 + q]]]
            er = eps[perm[a0 + q]]
            for j in range(ny):
                mbuf[j * ch + q] = np.float64(mr[j])
                tbuf[j * ch + q] = np.float64(er[j])
        for j in range(ny):
            mcol = mbuf[j * ch : (j + 1) * ch]
            tcol = tbuf[j * ch : (j + 1) * ch]
            for q in range(r):  # the draw's grid segment (the end segments extended)
                t = (tcol[q] - _Z0) / _DZ
                tcol[q] = t
                k = int(np.floor(t))
                kbuf[q] = max(0, min(k, g - 2))
                cbuf[q] = 0
            for kq in range(1, kk - 1):  # the search's index (inside: knots from nb - 1 on are >= m)
                kv = knots[mi, j, kq]
                for q in range(r):
                    cbuf[q] += kv < mcol[q]
            nb = n_bins[mi, j]
            kn = knots[mi, j]
            tb = table[mi, j].ravel()
            for q in range(r):
                m = mcol[q]
                c = cbuf[q]
                hi_c = min(c + 1, kk - 1)
                k0 = kn[c]
                span = kn[hi_c] - k0
                wi = (m - k0) / (span if span > 0.0 else 1.0)  # (used only where span > 0)
                interior = (nb > 1) & (m > kn[0]) & (m < kn[nb - 1])
                top = (nb > 1) & (m >= kn[nb - 1])
                w = wi if (interior & (span > 0.0)) else 0.0
                lo = c if interior else (nb - 1 if top else 0)
                hi = hi_c if w > 0.0 else lo
                k = kbuf[q]
                f = tcol[q] - k
                ia = lo * g + k
                ib = hi * g + k
                va = tb[ia] + f * (tb[ia + 1] - tb[ia])
                vb = tb[ib] + f * (tb[ib + 1] - tb[ib])
                v = va + w * (vb - va)
                obuf[q * ny + j] = np.float32(v if w > 0.0 else va)
        for q in range(r):
            er = eps[perm[a0 + q]]
            for j in range(ny):
                er[j] = obuf[q * ny + j]
        a0 = a1


@_kernel
def _legal_actions(
    action: np.ndarray, lo1: np.ndarray, hi1: np.ndarray, lo2: np.ndarray, hi2: np.ndarray,
    mean: np.ndarray, std: np.ndarray, mzs: np.ndarray, za: np.ndarray, pos: np.ndarray, agent_x: np.ndarray,
) -> None:
    """In place: ``action (n, A)`` float64 clipped to the twin's bounds then the scaler's (+0.0);
    ``za (n, A)`` float32 its z-values; row ``pos[i]`` of ``agent_x (n, S+A)`` float32 row i's
    ``[mzs, za]`` (the rows in scenario order, `edgetwin.twin.forward.ScenarioOrder`)."""
    n, a = action.shape
    s = mzs.shape[1]
    for i in range(n):
        p = pos[i]
        for j in range(s):
            agent_x[p, j] = np.float32(mzs[i, j])
        for j in range(a):
            v = action[i, j]
            if v < lo1[j]:
                v = lo1[j]
            if v > hi1[j]:
                v = hi1[j]
            if v < lo2[j]:
                v = lo2[j]
            if v > hi2[j]:
                v = hi2[j]
            v = v + 0.0
            action[i, j] = v
            z = np.float32((v - mean[j]) / std[j])
            za[i, j] = z
            agent_x[p, s + j] = z


@_kernel
def _outputs_first(
    means: np.ndarray, pos: np.ndarray, y: np.ndarray, noise: np.ndarray, std_rows: np.ndarray, noisy: bool,
    level: bool, mean: np.ndarray, std: np.ndarray, slot: np.ndarray, low: np.ndarray, high: np.ndarray,
    zlo: np.ndarray, zhi: np.ndarray, out: np.ndarray, packed: np.ndarray, zy: np.ndarray,
) -> None:
    """The network's means back in row order, the response noise and the first half of the
    outputs' scaler inverse, row by row.

    ``y (n, m)`` float32 row i: row ``pos[i]`` of ``means (n, m)`` (the network's, in scenario
    order), its first ``Y`` columns ``clip(noise * std + mean, -10, 10)`` when ``noisy``; ``zy (n, Y)``
    float32 their legal z-values (`ColumnScaler.legal_z`); ``out (n, Y)`` float64 the raw legal
    value of every column without a log (``slot[j] < 0``); ``packed (n, k)`` the log columns'
    ``clip(y * std + mean, -50, 50)`` for numpy's ``expm1`` (`_unpack_legal`).

    With ``level``, ``noise`` is already the noise itself (`_level_draws`: the noise model by
    predicted level), added to the means as it is.
    """
    n, m = y.shape
    ny = out.shape[1]
    for i in range(n):
        p = pos[i]
        for j in range(ny, m):
            y[i, j] = means[p, j]
        for j in range(ny):
            v = means[p, j]
            if noisy:
                v = noise[i, j] if level else noise[i, j] * std_rows[i, j]  # (level: x * 1.0f is x)
                v = v + means[p, j]
                if v < np.float32(-10.0):
                    v = np.float32(-10.0)
                if v > np.float32(10.0):
                    v = np.float32(10.0)
            y[i, j] = v
            z = v
            if z < zlo[j]:
                z = zlo[j]
            if z > zhi[j]:
                z = zhi[j]
            zy[i, j] = z + np.float32(0.0)
            k = slot[j]
            x = _inverse_value(np.float64(v), mean[j], std[j], k >= 0, low[j], high[j])
            if k >= 0:
                packed[i, k] = x
            else:
                out[i, j] = x


@_kernel
def _unpack_legal(packed: np.ndarray, cols: np.ndarray, low: np.ndarray, high: np.ndarray, out: np.ndarray) -> None:
    """``out[:, cols[k]]`` = ``packed[:, k]`` clipped to the column's bounds, +0.0."""
    n = out.shape[0]
    for i in range(n):
        for k in range(cols.shape[0]):
            j = cols[k]
            x = packed[i, k]
            if x < low[j]:
                x = low[j]
            if x > high[j]:
                x = high[j]
            out[i, j] = x + 0.0


@_kernel
def _weighted_reward(
    profile: np.ndarray, state: np.ndarray, action: np.ndarray, outputs: np.ndarray,
    block: np.ndarray, col: np.ndarray, weight: np.ndarray, reward: np.ndarray,
) -> None:
    """``reward (n,)`` = the weighted sum of the named columns, added in the weights' order from 0.0
    as `TwinSpec.reward_fn`'s ``weighted`` adds them (block 0 profile, 1 state, 2 action, 3 outputs)."""
    n = reward.shape[0]
    for i in range(n):
        total = 0.0
        for k in range(block.shape[0]):
            b = block[k]
            if b == 0:
                v = profile[i, col[k]]
            elif b == 1:
                v = state[i, col[k]]
            elif b == 2:
                v = action[i, col[k]]
            else:
                v = outputs[i, col[k]]
            total = total + weight[k] * v
        reward[i] = total


@_kernel
def _next_z(
    za: np.ndarray, zy: np.ndarray, zs: np.ndarray, y: np.ndarray, ny: int, cat: np.ndarray, z_next: np.ndarray,
) -> None:
    """``cat (n, A+Y)`` float64 ``[za, zy]`` (whose site means become the next lag) and
    ``z_next (n, S)`` float64 ``zs + Δz`` (``y[:, ny:]``), row by row."""
    n, a = za.shape
    s = zs.shape[1]
    for i in range(n):
        for j in range(a):
            cat[i, j] = np.float64(za[i, j])
        for j in range(zy.shape[1]):
            cat[i, a + j] = np.float64(zy[i, j])
        for j in range(s):
            z_next[i, j] = np.float64(zs[i, j]) + np.float64(y[i, ny + j])


@_kernel
def _state_first(
    z_next: np.ndarray, site_cols: np.ndarray, site_means: np.ndarray, site: np.ndarray,
    mean: np.ndarray, std: np.ndarray, slot: np.ndarray, low: np.ndarray, high: np.ndarray,
    nxt: np.ndarray, packed: np.ndarray,
) -> None:
    """The first half of the state's scaler inverse: site-level columns replaced by their site's
    mean (``site_means (n_sites, len(site_cols))``), then ``z * std + mean``; columns without a log
    clipped into ``nxt (n, S)``, the log columns' clipped arguments into ``packed``."""
    n, s = z_next.shape
    for i in range(n):
        for k in range(site_cols.shape[0]):
            z_next[i, site_cols[k]] = site_means[site[i], k]
        for j in range(s):
            k = slot[j]
            x = _inverse_value(z_next[i, j], mean[j], std[j], k >= 0, low[j], high[j])
            if k >= 0:
                packed[i, k] = x
            else:
                nxt[i, j] = x


@_kernel
def _clocks_echoes(
    state: np.ndarray, nxt: np.ndarray, outputs: np.ndarray,
    clock_cols: np.ndarray, clock_step: np.ndarray, clock_low: np.ndarray, clock_period: np.ndarray,
    echo_cols: np.ndarray, echo_of: np.ndarray, low: np.ndarray, high: np.ndarray,
) -> None:
    """`Layout.roll_clocks` (``period`` NaN: unbounded) then `Layout.roll_echoes`, row by row."""
    n = nxt.shape[0]
    for i in range(n):
        for k in range(clock_cols.shape[0]):
            j = clock_cols[k]
            moved = state[i, j] + clock_step[k]
            p = clock_period[k]
            if np.isnan(p):
                nxt[i, j] = moved
            else:
                nxt[i, j] = clock_low[k] + (moved - clock_low[k]) % p
        for k in range(echo_cols.shape[0]):
            j = echo_cols[k]
            v = outputs[i, echo_of[k]]
            if v < low[j]:
                v = low[j]
            if v > high[j]:
                v = high[j]
            nxt[i, j] = v + 0.0


@_kernel
def _state_z_first(state: np.ndarray, slot: np.ndarray, packed: np.ndarray) -> None:
    """The log columns of ``state`` floored at 0 into ``packed`` for numpy's ``log1p``."""
    n, s = state.shape
    for i in range(n):
        for j in range(s):
            k = slot[j]
            if k >= 0:
                v = state[i, j]
                if v < 0.0:
                    v = 0.0
                packed[i, k] = v


@_kernel
def _state_z_second(
    state: np.ndarray, slot: np.ndarray, packed: np.ndarray, mean: np.ndarray, std: np.ndarray,
    clip_lo: np.ndarray, clip_hi: np.ndarray, clipped: np.ndarray, zs: np.ndarray, mzs: np.ndarray,
) -> None:
    """``zs (n, S)`` float32 the state's z-values (`ColumnScaler.transform`) and ``mzs`` float64 as
    the models see them (`Layout.model_state`: the ``clipped`` columns clipped to their range)."""
    n, s = state.shape
    for i in range(n):
        for j in range(s):
            k = slot[j]
            x = packed[i, k] if k >= 0 else state[i, j]
            x = x - mean[j]
            x = x / std[j]
            z = np.float32(x)
            zs[i, j] = z
            m = np.float64(z)
            if clipped[j]:
                if m < clip_lo[j]:
                    m = clip_lo[j]
                if m > clip_hi[j]:
                    m = clip_hi[j]
                m = m + 0.0
            mzs[i, j] = m


@_kernel
def _pairwise_sum(v: np.ndarray, j: int, start: int, n: int) -> float:
    """numpy's pairwise sum (``pairwise_sum_DOUBLE``) of ``v[start:start + n, j]``: below 8 values
    one by one from -0.0, up to 128 in 8 interleaved partial sums, above that the halves (split at
    a multiple of 8) summed recursively: the order numpy's ``add.reduce`` / ``add.reduceat`` add a
    column in, so the sums are theirs to the bit (tests/test_fused_tick.py checks it)."""
    if n < 8:
        res = -0.0
        for i in range(n):
            res = res + v[start + i, j]
        return res
    if n <= 128:
        r0, r1, r2, r3 = v[start, j], v[start + 1, j], v[start + 2, j], v[start + 3, j]
        r4, r5, r6, r7 = v[start + 4, j], v[start + 5, j], v[start + 6, j], v[start + 7, j]
        i = 8
        stop = n - n % 8
        while i < stop:
            a = start + i
            r0 = r0 + v[a, j]
            r1 = r1 + v[a + 1, j]
            r2 = r2 + v[a + 2, j]
            r3 = r3 + v[a + 3, j]
            r4 = r4 + v[a + 4, j]
            r5 = r5 + v[a + 5, j]
            r6 = r6 + v[a + 6, j]
            r7 = r7 + v[a + 7, j]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < n:
            res = res + v[start + i, j]
            i += 1
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise_sum(v, j, start, n2) + _pairwise_sum(v, j, start + n2, n - n2)


@_kernel
def _segment_means(v: np.ndarray, cols: np.ndarray, starts: np.ndarray, counts: np.ndarray, out: np.ndarray) -> None:
    """``out (n_groups, len(cols))`` = `segment_means` of ``v[:, cols]`` (rows grouped in runs
    beginning at ``starts``): ``np.add.reduceat``'s sums (a run's first row plus the pairwise sum
    of the rest) divided by ``max(count, 1)``, to the bit, without the column copy.

    A run's columns are added together, row by row (issue 47, fifth round): each column's eight
    partial sums, their tree and the tail take `_pairwise_sum`'s additions in its order, so every
    column's sum is the one `_pairwise_sum` gives it; only the loop nest differs (rows outer,
    columns inner: a run's rows are read once, across the row, instead of once per column down it).
    Runs of more than 129 rows (numpy's halves) go column by column through `_pairwise_sum`."""
    g = starts.shape[0]
    n_all = v.shape[0]
    nc = cols.shape[0]
    r = np.empty((8, nc))
    x = np.empty(nc)
    for k in range(g):
        a = starts[k]
        e = starts[k + 1] if k + 1 < g else n_all
        c = max(counts[k], 1.0)
        s0 = a + 1
        n = e - a - 1
        if n > 128:
            for m in range(nc):
                j = cols[m]
                out[k, m] = (v[a, j] + _pairwise_sum(v, j, s0, n)) / c
            continue
        if n < 8:  # one by one from -0.0
            for m in range(nc):
                x[m] = -0.0
            for i in range(n):
                for m in range(nc):
                    x[m] = x[m] + v[s0 + i, cols[m]]
        else:  # eight interleaved partial sums, their tree, then the tail one by one
            for t in range(8):
                for m in range(nc):
                    r[t, m] = v[s0 + t, cols[m]]
            i = 8
            stop = n - n % 8
            while i < stop:
                for t in range(8):
                    row = s0 + i + t
                    for m in range(nc):
                        r[t, m] = r[t, m] + v[row, cols[m]]
                i += 8
            for m in range(nc):
                x[m] = ((r[0, m] + r[1, m]) + (r[2, m] + r[3, m])) + ((r[4, m] + r[5, m]) + (r[6, m] + r[7, m]))
            while i < n:
                for m in range(nc):
                    x[m] = x[m] + v[s0 + i, cols[m]]
                i += 1
        for m in range(nc):
            out[k, m] = (v[a, cols[m]] + x[m]) / c


# ------------------------------------------------------------------------------ the tick
def _slots(log: np.ndarray) -> np.ndarray:
    """Per column its position among the log columns, -1 for the others."""
    slot = np.full(len(log), -1, np.int64)
    slot[np.asarray(log, bool)] = np.arange(int(np.sum(log)))
    return slot


def _continuous(scaler: ColumnScaler) -> bool:
    return all(v is None for v in scaler.values)


@dataclass
class FusedTick:
    """The fused passes of one layout's tick, with their per-column constants (see the module).

    Built by `of`, which says whether a twin's tick can run fused; the arrays are the scalers'
    statistics and bounds in the dtypes the numpy passes use, so the kernels meet the same values.
    """

    layout: Layout
    reward: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    predicted_reward: int | None

    def __getstate__(self) -> dict[str, Any]:
        """The constants only: the kept work arrays and column tables are rebuilt where it lands."""
        return {k: self.__dict__[k] for k in ("layout", "reward", "predicted_reward")}

    @staticmethod
    def of(twin: Any, member: int) -> FusedTick | None:
        """A `FusedTick` for ``twin``'s tick with ``member`` acting, or None where the numpy passes must run."""
        lay: Layout = twin.layout
        spec = lay.spec
        if not all(_continuous(lay.scalers[role]) for role in ("state", "action", "outputs")):
            return None
        if spec.reward_function is not None or spec.transition is not None or not lay.learn_transition:
            return None
        if twin.member_transitions[member] is not None:
            return None
        if twin.members and twin.members[member].site_model is not None:
            return None
        if lay.scalers["action"].log.any():
            return None
        reward = None
        predicted = None
        if spec.reward_weights:
            blocks = (lay.profile, lay.state, lay.action, lay.outputs)
            b, c, w = [], [], []
            for name, weight in dict(spec.reward_weights).items():
                where = [(k, names.index(name)) for k, names in enumerate(blocks) if name in names]
                if not where:
                    return None  # a weight on a column the layout does not carry: the numpy path says so
                b.append(where[0][0])
                c.append(where[0][1])
                w.append(float(weight))
            reward = (np.asarray(b, np.int64), np.asarray(c, np.int64), np.asarray(w, np.float64))
        elif REWARD_COLUMN in lay.outputs:
            predicted = lay.outputs.index(REWARD_COLUMN)
        return FusedTick(lay, reward, predicted)

    # ---------------------------------------------------------------- respond
    def legal_actions(
        self, action: np.ndarray, low: np.ndarray, high: np.ndarray, mzs: np.ndarray, pos: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(legal action (n, A) float64, za (n, A) float32, agent inputs (n, S+A) float32)`` of raw
        ``action`` under the twin's bounds ``low``/``high`` and the action scaler's, and the rows'
        model z(state) ``mzs (n, S)`` (`World.client_agent_inputs`' columns, to the bit); row i's
        agent inputs are row ``pos[i]`` (scenario order, `edgetwin.twin.forward.ScenarioOrder`), a
        work array the next call overwrites."""
        sc = self.layout.scalers["action"]
        act = np.array(action, dtype=np.float64, order="C")
        n, a = act.shape
        za = np.empty((n, a), np.float32)
        agent_x = self._scratch("agent_x", (n, mzs.shape[1] + a), np.float32)
        _legal_actions(act, _f64(low), _f64(high), sc.low, sc.high, sc.mean, sc.std, _f64(mzs), za,
                       np.ascontiguousarray(pos, np.int64), agent_x)
        return act, za, agent_x

    def outputs(
        self, means: np.ndarray, pos: np.ndarray, noise: np.ndarray | None, std_rows: np.ndarray | None,
        level: tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(raw legal outputs (n, Y) float64, their z-values (n, Y) float32, y (n, n_model_outputs)
        float32)`` of the network's means ``means (n, n_model_outputs)`` float32 in scenario order
        (row i's at ``pos[i]``): ``y`` the means in row order with ``noise * std_rows`` (float32
        ``(n, Y)``, None: the means) added to the outputs, clipped to ±10 (what `Simulation._respond`
        did), a fresh array. ``level``: ``(scenario of each row (n,), the acting member's stacked noise
        tables)``: the noise is ``noise`` mapped through them at each row's mean instead (``std_rows``
        unused), as `Simulation._level_noise` and then this did in two passes."""
        sc = self.layout.scalers["outputs"]
        n, ny = len(means), sc.width
        slot = self._slot("outputs")
        out = np.empty((n, ny), np.float64)
        packed = self._scratch("packed_outputs", (n, int(sc.log.sum())), np.float64)
        zy = np.empty((n, ny), np.float32)
        y = np.empty(means.shape, np.float32)
        zlo, zhi = self._zbounds(sc)
        noisy = noise is not None and (std_rows is not None or level is not None)
        pos = np.ascontiguousarray(pos, np.int64)
        if noise is not None and level is not None:  # (noise is this tick's own draw: mapped in place)
            _level_draws(means, pos, np.ascontiguousarray(level[0], np.int64), noise, *level[1])
        _outputs_first(means, pos, y, noise if noise is not None else zy, std_rows if std_rows is not None else zy,
                       noisy, level is not None, sc.mean, sc.std, slot, sc.low, sc.high, zlo, zhi, out, packed, zy)
        if packed.shape[1]:
            np.expm1(packed, out=packed)
            _unpack_legal(packed, self._log_cols(sc), sc.low, sc.high, out)
        return out, zy, y

    def reward_of(self, profile: np.ndarray, state: np.ndarray, action: np.ndarray, outputs: np.ndarray) -> np.ndarray:
        """``(n,)`` float64 the spec's reward (`Simulation._reward`, to the bit)."""
        n = len(action)
        if self.reward is not None:
            r = np.empty(n, np.float64)
            _weighted_reward(_f64(profile), _f64(state), _f64(action), _f64(outputs), *self.reward, r)
            return r
        if self.predicted_reward is not None:
            return outputs[:, self.predicted_reward].astype(np.float64)
        return np.zeros(n)

    # ---------------------------------------------------------------- end of tick
    def end_tick(
        self, world: World, action: np.ndarray, y: np.ndarray, za: np.ndarray, zy: np.ndarray, outputs: np.ndarray
    ) -> np.ndarray:
        """`World.apply` of the tick (the clients' ``Δz`` moving the state), fused: moves ``world`` to
        t+1 with the next state's z-values already computed, returns the next raw state ``(N, S)``."""
        lay = self.layout
        n = world.n
        zs = world.zstate()
        a, ny, s = len(lay.action), lay.n_outputs, len(lay.state)
        cat = self._scratch("cat", (n, a + ny), np.float64)
        z_next = self._scratch("z_next", (n, s), np.float64)
        _next_z(za, zy, zs, y, ny, cat, z_next)
        site_cols = lay.site_state_columns
        runs = self._site_runs(world)
        if runs is not None:  # agents site by site (a generated world): one compiled pass per array
            site_now = np.empty((len(runs[0]), a + ny), np.float64)
            _segment_means(cat, self._arange(a + ny), runs[0], runs[1], site_now)
            means = np.empty((len(runs[0]), len(site_cols)), np.float64)
            if len(site_cols):
                _segment_means(z_next, np.asarray(site_cols, np.int64), runs[0], runs[1], means)
        else:
            site_now = world.site_means(cat)
            means = world.site_means(z_next[:, site_cols]) if len(site_cols) else np.zeros((world.n_sites, 0))
        sc = lay.scalers["state"]
        slot = self._slot("state")
        nxt = np.empty((n, s), np.float64)
        packed = self._scratch("packed_state", (n, int(sc.log.sum())), np.float64)
        _state_first(z_next, np.asarray(site_cols, np.int64), means, world.site.astype(np.int64, copy=False),
                     sc.mean, sc.std, slot, sc.low, sc.high, nxt, packed)
        if packed.shape[1]:
            np.expm1(packed, out=packed)
            _unpack_legal(packed, self._log_cols(sc), sc.low, sc.high, nxt)
        cols, step, low, period, echo_cols, echo_of = self._rolls()
        _clocks_echoes(world.state, nxt, outputs, cols, step, low, period, echo_cols, echo_of, sc.low, sc.high)
        nxt = self.declared(world, action, outputs, nxt)
        zs_next, mzs_next = self.state_z(nxt)
        world.lag = site_now
        zs_means = None
        if runs is not None:  # the next tick's site means of the models' z(state), as `World.site_means` takes them
            zs_means = np.empty((len(runs[0]), s), np.float64)
            _segment_means(mzs_next, self._arange(s), runs[0], runs[1], zs_means)
        world.moved_to(nxt, zs_next, mzs_next, zs_means)
        return nxt

    def declared(self, world: World, action: np.ndarray, outputs: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        """``nxt (N, S)`` with the declared state columns computed from the tick (`Layout.apply_declared`,
        to the bit): by the spec's declarations compiled into one call (`DeclaredProgram`) where they
        compile, else by `Layout.apply_declared`."""
        lay = self.layout
        if not any(lay.declared):
            return nxt
        hit = self.__dict__.get("_declared_memo")
        if hit is None or hit[0] is not lay.spec:
            dynamics = lay.spec.declared_dynamics()
            program = None if dynamics is None else compile_program(
                dynamics, (lay.profile, lay.state, lay.action, lay.outputs), lay.state)
            hit = self.__dict__["_declared_memo"] = (lay.spec, program)
        if hit[1] is None or world.n == 0:
            return lay.apply_declared(world.profile, world.state, action, outputs, world.site, nxt, n_sites=world.n_sites)
        return hit[1].apply(world.profile, world.state, action, outputs, world.site, nxt, world.n_sites)

    def state_z(self, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(zs (N, S) float32, mzs (N, S) float64)``: `ColumnScaler.transform` of raw ``state`` and
        `Layout.model_state` of it, in two passes around numpy's ``log1p``."""
        lay = self.layout
        sc = lay.scalers["state"]
        n, s = state.shape
        slot = self._slot("state")
        packed = self._scratch("packed_state", (n, int(sc.log.sum())), np.float64)
        state = _f64(state)
        if packed.shape[1]:
            _state_z_first(state, slot, packed)
            np.log1p(packed, out=packed)
        zs = np.empty((n, s), np.float32)
        mzs = np.empty((n, s), np.float64)
        _state_z_second(state, slot, packed, sc.mean, sc.std, *self._model_clip(), zs, mzs)
        return zs, mzs

    # ---------------------------------------------------------------- constants
    def _scratch(self, name: str, shape: tuple[int, int], dtype: Any) -> np.ndarray:
        """A work array of ``shape`` kept from the last tick of the same size: only for arrays no
        caller keeps (fresh ones would cost their page faults every tick at 10,000 agents)."""
        memo: dict[str, np.ndarray] = self.__dict__.setdefault("_scratch_memo", {})
        hit = memo.get(name)
        if hit is None or hit.shape != shape or hit.dtype != dtype:
            hit = memo[name] = np.empty(shape, dtype)
        return hit

    def _slot(self, role: str) -> np.ndarray:
        key = f"slot_{role}"
        hit = self.__dict__.get(key)
        if hit is None:
            hit = self.__dict__[key] = _slots(self.layout.scalers[role].log)
        return hit

    def _site_runs(self, world: World) -> tuple[np.ndarray, np.ndarray] | None:
        """``(starts (n_sites,) int64, counts (n_sites,) float64)`` of ``world``'s sites when its
        agents come site by site (`segment_starts`, as `World.site_means` uses them), else None;
        kept per site array."""
        hit = self.__dict__.get("_runs_memo")
        if hit is None or hit[0] is not world.site:
            n_sites = world.n_sites
            starts = segment_starts(world.site, n_sites)
            runs = None if starts is None else (
                starts.astype(np.int64), np.bincount(world.site, minlength=n_sites).astype(np.float64))
            hit = self.__dict__["_runs_memo"] = (world.site, runs)
        return hit[1]

    def _arange(self, k: int) -> np.ndarray:
        memo: dict[int, np.ndarray] = self.__dict__.setdefault("_arange_memo", {})
        hit = memo.get(k)
        if hit is None:
            hit = memo[k] = np.arange(k, dtype=np.int64)
        return hit

    def _log_cols(self, sc: ColumnScaler) -> np.ndarray:
        """The log columns of ``sc`` (int64), kept per scaler."""
        memo: dict[int, tuple[ColumnScaler, np.ndarray]] = self.__dict__.setdefault("_log_cols_memo", {})
        hit = memo.get(id(sc))
        if hit is None or hit[0] is not sc:
            hit = memo[id(sc)] = (sc, np.flatnonzero(sc.log).astype(np.int64))
        return hit[1]

    def _zbounds(self, sc: ColumnScaler) -> tuple[np.ndarray, np.ndarray]:
        """`ColumnScaler.legal_z`'s float32 bounds (computed there, kept on the scaler; looked up
        without a call while its statistics are the same arrays)."""
        hit = sc.__dict__.get("_zbounds")
        if hit is None or hit[0] is not sc.mean or hit[1] is not sc.std:
            sc.legal_z(np.zeros((0, sc.width), np.float32))
            hit = sc.__dict__["_zbounds"]
        return hit[2], hit[3]

    def _rolls(self) -> tuple[np.ndarray, ...]:
        hit = self.__dict__.get("_rolls_memo")
        if hit is None:
            from edgetwin.imitation.layout import _period

            lay = self.layout
            cols = [j for j, st in enumerate(lay.clock) if st is not None]
            steps = [float(lay.clock[j]) for j in cols]  # type: ignore[arg-type]
            lows = [float(lay.spec.feature(lay.state[j]).low or 0.0) for j in cols]
            periods = [_period(lay.spec, lay.state[j]) for j in cols]
            echo = [(j, k) for j, k in enumerate(lay.echo) if k is not None]
            hit = self.__dict__["_rolls_memo"] = (
                np.asarray(cols, np.int64), np.asarray(steps, np.float64), np.asarray(lows, np.float64),
                np.asarray([np.nan if p is None else p for p in periods], np.float64),
                np.asarray([j for j, _ in echo], np.int64), np.asarray([k for _, k in echo], np.int64),
            )
        return hit

    def _model_clip(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        hit = self.__dict__.get("_clip_memo")
        if hit is None:
            lay = self.layout
            s = len(lay.state)
            lo, hi = np.zeros(s), np.zeros(s)
            on = np.zeros(s, np.bool_)
            if any(lay.declared) and len(lay.input_range) == s:
                for j in np.flatnonzero(lay.declared):
                    lo[j], hi[j] = lay.input_range[j]
                    on[j] = True
            hit = self.__dict__["_clip_memo"] = (lo, hi, on)
        return hit


def _f64(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64)
