"""`OutputNoise`: a response model's output noise as a function of the output's predicted level.

A client model is a Gaussian with ONE std per output for every input (`GaussianModel.std`,
`CausalResponseModel.noise_std`): the twin's tick draws ``mean + std * eps``. On a heavy-tailed
output modelled in ``log1p`` space (revenue, task time) the residual's spread grows several-fold
from the bottom to the top of the prediction (measured, quick twin of seed 0, teacher forced on
held-out days: 0.07 to 0.58 ``log1p`` units across the deciles of the prediction, against one std of
0.29-0.34), and its centre moves too (-0.18 in the middle deciles, +0.14 in the top one). The
``expm1`` of one std everywhere gives too thin an upper tail where the raw mean is made, so the
twin's raw level (and every change a policy makes by moving groups up or down that range) is low.

The noise model here replaces the one std by the residual's own distribution given the predicted
z-value of the same output, per output and scenario:

- the rows are cut into up to ``bins`` quantile bins of the predicted z-value (at least
  ``min_rows`` rows each); each bin keeps its residual (target minus prediction, standardised
  units) at the normal scores ``Z_GRID`` — either the empirical quantiles at ``Phi(Z_GRID)``
  (``kind="quantile"``: the bin's centre, spread, skew and tail as logged) or ``mean + std *
  Z_GRID`` (``kind="gaussian"``: the bin's centre and spread only);
- a draw maps the tick's standard normal ``eps`` through that table (linear between grid points,
  the end segments' slopes beyond ``±3``), with the table of a row interpolated linearly between
  the two bins whose centres bracket its predicted value (constant beyond the outer centres), so
  the noise is a continuous, monotone function of ``eps`` and the prediction.

Why this and not a heteroscedastic network head: it is fitted after the response model from its
residuals (no change to MAIL-MMSG's adversarial rounds or to the models' files), a table is data
(JSON in the twin's member directory, covered by its manifest), and one binned quantile fit per
output costs milliseconds; statsmodels and scikit-learn offer quantile regression per level, not a
joint monotone table a sampler can read in one pass. A row's noise depends on its own prediction
and its own normal draw only, so the tick's properties hold (one row independent of the others;
the same seed, the same draws).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

from edgetwin.imitation.mail import OUTPUT_CLIP

__all__ = ["KINDS", "OutputNoise", "Z_GRID", "noise_residuals", "noise_from_json", "noise_to_json"]

#: normal scores at which a bin's residual distribution is kept (25 points, step 0.25): the
#: empirical quantile levels run from Phi(-3) = 0.13 % to 99.87 %
Z_GRID = np.linspace(-3.0, 3.0, 25)
_Z0 = float(Z_GRID[0])
_DZ = float(Z_GRID[1] - Z_GRID[0])
#: the fits a table can hold
KINDS = ("quantile", "gaussian")
_FORMAT = 1


@dataclass
class OutputNoise:
    """One scenario's noise model of a response model's ``Y`` outputs (standardised units).

    Attributes:
        knots: ``(Y, K)`` float64, per output the predicted z-values at its bins' centres (the
            bins' medians of the prediction), non-decreasing; an output with fewer bins repeats
            its last knot and table (``n_bins`` says how many are real).
        table: ``(Y, K, G)`` float64, per output and bin the residual at each normal score of
            `Z_GRID` (non-decreasing along ``G``).
        n_bins: ``(Y,)`` int64, the real bins per output (1..K).
        kind: ``"quantile"`` or ``"gaussian"`` (how the table was fitted; the sampler is the same).
        n_rows: rows the fit saw.
        matched: ``(Y,)`` bool, the outputs whose bins were mean-matched in raw units.
    """

    knots: np.ndarray
    table: np.ndarray
    n_bins: np.ndarray
    kind: str
    n_rows: int
    matched: np.ndarray | None = None

    @classmethod
    def fit(
        cls, mu: np.ndarray, y: np.ndarray, kind: str = "quantile", bins: int = 10, min_rows: int = 200,
        raw: Callable[[np.ndarray, int], np.ndarray] | None = None, match: np.ndarray | None = None,
    ) -> OutputNoise:
        """The noise model of predictions ``mu (n, Y)`` against targets ``y (n, Y)`` (standardised).

        Args:
            kind: ``"quantile"`` (each bin's empirical residual quantiles) or ``"gaussian"`` (its
                residual mean and std).
            bins: at most this many quantile bins of the prediction per output.
            min_rows: at least this many rows per bin (fewer rows: fewer bins, one at least).
            raw: the outputs' inverse transform, ``(z (n,), j) -> raw (n,)`` of output ``j`` (e.g.
                `ColumnScaler.inverse_column`: ``expm1`` of a log column, bounds), for ``match``.
            match: ``(Y,)`` bool, the outputs to mean-match (None: none).

        Raises:
            ValueError: an unknown ``kind``, shapes that differ, or no rows.
        """
        if kind not in KINDS:
            raise ValueError(f"unknown noise kind {kind!r} (one of {', '.join(KINDS)})")
        mu = np.asarray(mu, np.float64)
        y = np.asarray(y, np.float64)
        if mu.shape != y.shape or mu.ndim != 2:
            raise ValueError(f"predictions {mu.shape} and targets {y.shape} must be the same (n, Y)")
        ok = np.isfinite(mu).all(axis=1) & np.isfinite(y).all(axis=1)
        mu, y = mu[ok], y[ok]
        n, width = mu.shape
        if n == 0:
            raise ValueError("no finite rows to fit the output noise on")
        k_max = int(max(1, min(bins, n // max(min_rows, 1))))
        knots = np.zeros((width, k_max))
        table = np.zeros((width, k_max, len(Z_GRID)))
        n_bins = np.ones(width, np.int64)
        levels = _normal_cdf(Z_GRID)
        for j in range(width):
            order = np.argsort(mu[:, j], kind="stable")
            parts = [p for p in np.array_split(order, k_max) if len(p)]
            # ties (a column the model predicts constant over a range) can give equal centres: merged
            centres: list[float] = []
            groups: list[np.ndarray] = []
            for p in parts:
                c = float(np.median(mu[p, j]))
                if centres and c <= centres[-1]:
                    groups[-1] = np.concatenate([groups[-1], p])
                    continue
                centres.append(c)
                groups.append(p)
            for b, p in enumerate(groups):
                r = y[p, j] - mu[p, j]
                if kind == "quantile":
                    table[j, b] = np.quantile(r, levels)
                else:
                    table[j, b] = r.mean() + r.std() * Z_GRID
                knots[j, b] = centres[b]
            m = len(groups)
            knots[j, m:] = knots[j, m - 1]
            table[j, m:] = table[j, m - 1]
            n_bins[j] = m
            if raw is not None and match is not None and match[j]:
                # bin by bin, twice: a bin's rows between two centres draw from its neighbour too
                for _ in range(2):
                    for b, p in enumerate(groups):
                        table[j, b] = _match_raw_mean(knots[j], table[j], m, b, mu[p, j], y[p, j], _column(raw, j))
                table[j, m:] = table[j, m - 1]
        matched = np.zeros(width, bool) if raw is None or match is None else np.asarray(match, bool).copy()
        return cls(knots, table, n_bins, kind, int(n), matched)

    @classmethod
    def homoscedastic(cls, std: np.ndarray) -> OutputNoise:
        """The model the twin drew from before: ``std * eps`` for every prediction (one bin)."""
        std = np.asarray(std, np.float64).reshape(-1)
        width = len(std)
        return cls(np.zeros((width, 1)), std[:, None, None] * Z_GRID[None, None, :], np.ones(width, np.int64),
                   "gaussian", 0)

    @property
    def width(self) -> int:
        return int(self.knots.shape[0])

    def residual(self, mu: np.ndarray, eps: np.ndarray) -> np.ndarray:
        """``(n, Y)`` float32 the noise of rows with predictions ``mu (n, Y)`` and standard normal
        draws ``eps (n, Y)``."""
        mu = np.ascontiguousarray(mu, np.float32)
        out = np.empty(mu.shape, np.float32)
        pos = np.arange(len(mu), dtype=np.int64)
        knots, table, n_bins = stack_tables([self])
        noise_residuals(mu, pos, np.zeros(len(mu), np.int64), np.ascontiguousarray(eps, np.float32),
                        knots, table, n_bins, out)
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain lists (JSON): `from_dict` reads them back to the same floats."""
        matched = np.zeros(self.width, bool) if self.matched is None else self.matched
        return {"kind": self.kind, "n_rows": self.n_rows, "matched": matched.tolist(), "n_bins": self.n_bins.tolist(),
                "knots": self.knots.tolist(), "table": self.table.tolist()}

    @classmethod
    def from_dict(cls, d: Any, width: int | None = None) -> OutputNoise:
        """Read `to_dict`'s output, checking every shape and that each table is monotone.

        Raises:
            ValueError: a missing key, a wrong shape, a non-finite or decreasing table.
        """
        if not isinstance(d, dict):
            raise ValueError("a noise model must be a JSON object")
        kind = d.get("kind")
        if kind not in KINDS:
            raise ValueError(f"unknown noise kind {kind!r}")
        knots = np.asarray(d.get("knots"), np.float64)
        table = np.asarray(d.get("table"), np.float64)
        n_bins = np.asarray(d.get("n_bins"), np.int64)
        if knots.ndim != 2 or table.shape != (*knots.shape, len(Z_GRID)) or n_bins.shape != knots.shape[:1]:
            raise ValueError(f"noise table shapes {knots.shape} / {table.shape} / {n_bins.shape} do not fit")
        if width is not None and knots.shape[0] != width:
            raise ValueError(f"noise model has {knots.shape[0]} outputs, the twin {width}")
        if not (np.isfinite(knots).all() and np.isfinite(table).all()):
            raise ValueError("noise table is not finite")
        if knots.shape[1] == 0 or (n_bins < 1).any() or (n_bins > knots.shape[1]).any():
            raise ValueError("noise bins out of range")
        if (np.diff(knots, axis=1) < 0).any() or (np.diff(table, axis=2) < 0).any():
            raise ValueError("noise table is not monotone")
        n_rows = d.get("n_rows", 0)
        matched = np.asarray(d.get("matched", [False] * knots.shape[0]), bool)
        if matched.shape != knots.shape[:1]:
            raise ValueError("noise 'matched' does not fit the outputs")
        return cls(knots, table, n_bins, str(kind), int(n_rows) if isinstance(n_rows, int) else 0, matched)


def noise_to_json(models: dict[int, OutputNoise], source: str = "") -> str:
    """A member's noise models per scenario id as JSON text, with where their residuals came from."""
    return json.dumps({"format": _FORMAT, "z_grid": Z_GRID.tolist(), "source": source,
                       "scenarios": {str(s): m.to_dict() for s, m in sorted(models.items())}})


def noise_from_json(text: str, n_scenarios: int) -> tuple[dict[int, OutputNoise], str]:
    """`noise_to_json`'s text back (the models and their source), every scenario's model checked
    (`OutputNoise.from_dict`) and all of one width.

    Raises:
        ValueError: another format or grid, a scenario the twin does not have, a bad table.
    """
    d = json.loads(text)
    if not isinstance(d, dict) or d.get("format") != _FORMAT:
        raise ValueError(f"output noise format {d.get('format') if isinstance(d, dict) else None!r}, "
                         f"this edgetwin reads format {_FORMAT}")
    if not np.array_equal(np.asarray(d.get("z_grid"), np.float64), Z_GRID):
        raise ValueError("output noise was tabled on another grid of normal scores")
    scen = d.get("scenarios")
    if not isinstance(scen, dict):
        raise ValueError("output noise has no 'scenarios' object")
    out: dict[int, OutputNoise] = {}
    width: int | None = None
    for key, m in scen.items():
        if not key.isdigit() or int(key) >= n_scenarios:
            raise ValueError(f"output noise of scenario {key!r}, the twin has {n_scenarios}")
        out[int(key)] = OutputNoise.from_dict(m, width)
        width = out[int(key)].width
    source = d.get("source", "")
    return out, source if isinstance(source, str) else ""


def stack_tables(models: list[OutputNoise]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(knots (M, Y, K), table (M, Y, K, G), n_bins (M, Y))`` of several models of the same
    width, padded to the largest ``K`` (the last bin repeated), for `noise_residuals`."""
    k = max(m.knots.shape[1] for m in models)
    width = models[0].width
    knots = np.zeros((len(models), width, k))
    table = np.zeros((len(models), width, k, len(Z_GRID)))
    n_bins = np.zeros((len(models), width), np.int64)
    for i, m in enumerate(models):
        kk = m.knots.shape[1]
        knots[i, :, :kk] = m.knots
        knots[i, :, kk:] = m.knots[:, -1:]
        table[i, :, :kk] = m.table
        table[i, :, kk:] = m.table[:, -1:]
        n_bins[i] = m.n_bins
    return knots, table, n_bins


@numba.njit(fastmath=False, cache=True, nogil=True, boundscheck=False)
def noise_residuals(
    mu: np.ndarray, pos: np.ndarray, model: np.ndarray, eps: np.ndarray,
    knots: np.ndarray, table: np.ndarray, n_bins: np.ndarray, out: np.ndarray,
) -> None:
    """``out (n, Y)`` float32: row i's noise of output j, from its prediction ``mu[pos[i], j]``
    (``mu (n, >= Y)`` float32, e.g. a tick's means in scenario order), its draw ``eps[i, j]`` and
    the table of model ``model[i]`` (`stack_tables`). Row by row: a row reads nothing of another.

    Why a compiled loop: a row's two bracketing bins and its grid segment are a search and two
    gathers per value, which numpy would do in some ten passes over ``(n, Y)`` arrays."""
    n, width = out.shape
    g = table.shape[3]
    for i in range(n):
        p = pos[i]
        mi = model[i]
        for j in range(width):
            m = np.float64(mu[p, j])
            nb = n_bins[mi, j]
            # the two bins whose centres bracket m, and the weight of the upper one
            lo = 0
            w = 0.0
            if nb > 1 and m > knots[mi, j, 0]:
                if m >= knots[mi, j, nb - 1]:
                    lo = nb - 1
                else:
                    while knots[mi, j, lo + 1] < m:
                        lo += 1
                    span = knots[mi, j, lo + 1] - knots[mi, j, lo]
                    w = (m - knots[mi, j, lo]) / span if span > 0.0 else 0.0
            hi = lo + 1 if w > 0.0 else lo
            # the grid segment of the draw (the end segments extended)
            e = np.float64(eps[i, j])
            t = (e - _Z0) / _DZ
            k = int(np.floor(t))
            if k < 0:
                k = 0
            if k > g - 2:
                k = g - 2
            f = t - k
            a = table[mi, j, lo, k] + f * (table[mi, j, lo, k + 1] - table[mi, j, lo, k])
            if hi != lo:
                b = table[mi, j, hi, k] + f * (table[mi, j, hi, k + 1] - table[mi, j, hi, k])
                a = a + w * (b - a)
            out[i, j] = np.float32(a)


def _column(raw: Callable[[np.ndarray, int], np.ndarray], j: int) -> Callable[[np.ndarray], np.ndarray]:
    """``raw`` of output ``j``."""
    return lambda z: raw(z, j)


#: normal scores and weights of the quadrature `_match_raw_mean` integrates a draw over
_NODES = np.linspace(-6.0, 6.0, 121)
_WEIGHTS = np.exp(-0.5 * _NODES**2) / np.exp(-0.5 * _NODES**2).sum()
#: predictions of a bin `_match_raw_mean` integrates the draw at (evenly spaced in their order beyond it)
_MATCH_ROWS = 300
#: the range of the upper tail's stretch `_match_raw_mean` may choose
_STRETCH = (0.25, 4.0)


def _match_raw_mean(
    knots: np.ndarray, table: np.ndarray, n_bins: int, b: int, mu: np.ndarray, y: np.ndarray,
    raw: Callable[[np.ndarray], np.ndarray],
) -> np.ndarray:
    """Bin ``b``'s residual table of one output (``knots (K,)``, ``table (K, G)``) with its upper
    half stretched about its median, ``r(0) + c * (r(e) - r(0))`` for ``e > 0``, so that the raw
    mean of the sampler's draw at the bin's predictions ``mu (n,)`` (the other bins as they are:
    a row between two centres draws from both) equals the raw mean of its targets ``y (n,)``
    (``raw``: z-values of this output to raw values).

    Why: a table kept to ``Phi(3)`` and extended linearly beyond holds the logged tail only as far
    as a few thousand rows reach, and on a log-modelled output the raw mean is made in that tail
    (the quick twin of seed 0: the top decile of task time drew 0.36-0.89 of its logged raw mean
    with the quantile table alone). This is Duan's smearing (a mean-matched inverse of the log
    transform per predicted-level bin) done on the distribution the twin samples rather than on
    its point prediction: the median and the lower half are kept, the raw mean is the logged one.
    The stretch is found by bisection in ``[0.25, 4]`` (kept at a bound the target lies beyond).
    """
    target = float(np.mean(raw(y)))  # every row: the tail is where the mean is made
    row = table[b]
    if not np.isfinite(target):
        return row
    if len(mu) > _MATCH_ROWS:
        mu = np.sort(mu)[np.linspace(0, len(mu) - 1, _MATCH_ROWS).astype(np.int64)]
    mus = np.repeat(np.asarray(mu, np.float32), len(_NODES))[:, None]
    eps = np.tile(_NODES.astype(np.float32), len(mu))[:, None]
    pos = np.arange(len(mus), dtype=np.int64)
    model = np.zeros(len(mus), np.int64)
    out = np.empty((len(mus), 1), np.float32)
    work = table.copy()
    grid_up = Z_GRID > 0
    mid = float(row[~grid_up][-1])  # Z_GRID[12] = 0

    def stretched(c: float) -> np.ndarray:
        r = row.copy()
        r[grid_up] = mid + c * (row[grid_up] - mid)
        return r

    def drawn_mean(c: float) -> float:
        work[b] = stretched(c)
        noise_residuals(mus, pos, model, eps, knots[None, None], work[None, None], np.array([[n_bins]]), out)
        zz = np.clip(mus[:, 0] + out[:, 0], -OUTPUT_CLIP, OUTPUT_CLIP)
        return float((raw(zz).reshape(len(mu), len(_NODES)) @ _WEIGHTS).mean())

    lo, hi = _STRETCH
    if drawn_mean(lo) >= target:
        return stretched(lo)
    if drawn_mean(hi) <= target:
        return stretched(hi)
    for _ in range(14):
        c = 0.5 * (lo + hi)
        if drawn_mean(c) < target:
            lo = c
        else:
            hi = c
    return stretched(0.5 * (lo + hi))


def _normal_cdf(z: np.ndarray) -> np.ndarray:
    from scipy.special import ndtr

    return np.asarray(ndtr(z), np.float64)
