"""The federated twin's output noise by predicted level, from per-site aggregates (issue 44).

The centralised twin draws each output's noise from the residual's distribution given the predicted
level (`edgetwin.imitation.noise.OutputNoise`, fitted per member on rows). A federated coordinator
never sees a row, so each site sends, in the ``residual`` round it already answers (the pooled
squared residuals that set the models' one std), per scenario, output and bin of the predicted
z-value: the count, the sum of the residuals, of their squares and of the predictions. Summed over
sites they are the pooled rows' per-bin moments, exactly (up to the float32 the round travels in),
so the coordinator builds a ``"gaussian"`` `OutputNoise` (each bin's residual mean and population
std, as `OutputNoise.fit` with ``kind="gaussian"`` computes them) without any row leaving a site.

Which model's residuals: the ``residual`` round's, the behaviour-cloned client models' (the same round
that sets their one std); MAIL's adversarial rounds after it refine the models without a new round,
as they do for the one std, and a scenario whose client the federated causal fit replaces drops its
table (`TwinAssembler.set_causal`: the causal model keeps its own std). The residuals are of the rows a
member's bootstrap drew at each site (training rows: the spread is understated by the models' own
fitting error, as `Member.noise_source` says).

Why fixed bins: quantile bins (what `OutputNoise.fit` uses) need the pooled prediction's quantiles,
another round and a disclosure of them; fixed edges in the standardised prediction (every party
knows them) need nothing, and bins with fewer than `MIN_ROWS` pooled rows are merged into their
neighbour by the coordinator, so a sparse tail does not get a spread of its own.
"""

from __future__ import annotations

import numpy as np

from edgetwin.imitation.noise import Z_GRID, OutputNoise

__all__ = ["EDGES", "MIN_ROWS", "N_BINS", "binned_residual_sums", "noise_from_sums"]

#: edges of the bins of the predicted value (standardised units), the same at every party
EDGES = np.array([-1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5])
N_BINS = len(EDGES) + 1
#: at least this many pooled rows per bin (as `OutputNoise.fit`'s default); fewer: merged
MIN_ROWS = 200


def binned_residual_sums(mu: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """One site's per-bin sums of predictions ``mu (n, Y)`` against targets ``y (n, Y)``: ``n``,
    ``s1`` (Σ residual), ``ss`` (Σ residual²), ``smu`` (Σ prediction), each ``(Y, N_BINS)``. Rows
    with a non-finite value are left out."""
    mu, y = np.asarray(mu, np.float64), np.asarray(y, np.float64)
    width = mu.shape[1] if mu.ndim == 2 else 0
    out = {k: np.zeros((width, N_BINS)) for k in ("n", "s1", "ss", "smu")}
    for j in range(width):
        ok = np.isfinite(mu[:, j]) & np.isfinite(y[:, j])
        m, r = mu[ok, j], y[ok, j] - mu[ok, j]
        b = np.searchsorted(EDGES, m, side="right")
        out["n"][j] = np.bincount(b, minlength=N_BINS)
        out["s1"][j] = np.bincount(b, weights=r, minlength=N_BINS)
        out["ss"][j] = np.bincount(b, weights=r * r, minlength=N_BINS)
        out["smu"][j] = np.bincount(b, weights=m, minlength=N_BINS)
    return out


def _merged(n: np.ndarray, min_rows: int) -> list[list[int]]:
    """Groups of adjacent bins with at least ``min_rows`` rows each (a short last group joins the
    one before); empty bins are dropped."""
    groups: list[list[int]] = []
    cur: list[int] = []
    for b in range(len(n)):
        if n[b] <= 0:
            continue
        cur.append(b)
        if n[cur].sum() >= min_rows:
            groups.append(cur)
            cur = []
    if cur:
        if groups:
            groups[-1] += cur
        else:
            groups.append(cur)
    return groups


def noise_from_sums(sums: dict[str, np.ndarray], min_rows: int = MIN_ROWS) -> OutputNoise | None:
    """The pooled ``"gaussian"`` noise model of one scenario from the sites' summed
    `binned_residual_sums` (``(Y, N_BINS)`` each): per output, bins merged to ``min_rows`` rows,
    each with its residual mean and population std at `Z_GRID` and its mean prediction as its knot.
    None when an output has fewer than 2 pooled rows."""
    n, s1, ss, smu = (np.asarray(sums[k], np.float64) for k in ("n", "s1", "ss", "smu"))
    width = n.shape[0]
    per_output = []
    for j in range(width):
        if n[j].sum() < 2:
            return None
        knots: list[float] = []
        table: list[np.ndarray] = []
        for g in _merged(n[j], min_rows):
            c = n[j, g].sum()
            mean = s1[j, g].sum() / c
            std = float(np.sqrt(max(ss[j, g].sum() / c - mean * mean, 0.0)))
            knot = smu[j, g].sum() / c
            if knots and knot <= knots[-1]:  # equal centres (float sums): keep the bins apart by a hair
                knot = np.nextafter(knots[-1], np.inf)
            knots.append(float(knot))
            table.append(mean + std * Z_GRID)
        per_output.append((knots, table))
    k_max = max(len(k) for k, _ in per_output)
    knots_a = np.zeros((width, k_max))
    table_a = np.zeros((width, k_max, len(Z_GRID)))
    n_bins = np.zeros(width, np.int64)
    for j, (k, t) in enumerate(per_output):
        m = len(k)
        knots_a[j, :m], table_a[j, :m] = k, t
        knots_a[j, m:], table_a[j, m:] = k[-1], t[-1]
        n_bins[j] = m
    return OutputNoise(knots_a, table_a, n_bins, "gaussian", int(n.sum(axis=1).max()))
