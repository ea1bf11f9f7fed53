"""Fidelity metrics: how close a generated table is to a real (held-out) one.

Shared by the population models (GAN-SMMSG and its baselines), the response model and the twin's
fidelity report, so every model is judged with the same binning, smoothing and bandwidths.

* `kl_marginal` / `kl_categorical`: KL(real || generated) of one column, as in seed 004 Table 1.
* `mmd_rbf`: squared maximum mean discrepancy with an RBF kernel (joint distribution).
* `c2st_auc`: classifier two-sample test; ROC AUC of a classifier told to separate real from
  generated rows (0.5 = indistinguishable, 1.0 = perfectly separable).
* `correlation_distance`: how far the rank-correlation structure of the two tables is apart.
* `fidelity_report`: all of the above for chosen columns of a spec.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import spearmanr
from threadpoolctl import threadpool_limits

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import Feature, TwinSpec

#: Additive smoothing of histogram probabilities before renormalising (keeps KL finite).
EPS = 1e-6
#: Quantiles of the real data that bound the equal-width bins (outliers go to the edge bins).
RANGE_QUANTILES = (0.001, 0.999)


def _as_1d(x: Any, what: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    if a.size == 0:
        raise InputError(f"{what} is empty", what)
    if not np.all(np.isfinite(a)):
        raise InputError(f"{what} has {int((~np.isfinite(a)).sum())} non-finite values", what)
    return a


def _as_2d(x: Any, what: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2 or a.shape[0] < 2:
        raise InputError(f"{what} must be a (N, D) array with N >= 2, got shape {a.shape}", what)
    if not np.all(np.isfinite(a)):
        raise InputError(f"{what} has {int((~np.isfinite(a)).sum())} non-finite values", what)
    return a


def _smooth(counts: np.ndarray) -> np.ndarray:
    p = counts / max(counts.sum(), 1.0)
    p = p + EPS
    return p / p.sum()


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    return float(np.sum(p * np.log(p / q)))


def log_offset(real: np.ndarray, low: float | None = None) -> tuple[float, float]:
    """The ``(low, offset)`` of `log_space` for a heavy-tailed column, from its real values.

    ``low`` is the feature's lower bound, or the real minimum when it has none; ``offset`` is 1 %
    of the median distance of the real values above ``low`` (1.0 when all sit on it), so values
    far below 1 (e.g. task times of milliseconds) are spread as well as large ones.
    """
    real = np.asarray(real, dtype=np.float64)
    base = float(np.min(real)) if low is None else float(low)
    above = real - base
    above = above[above > 0]
    return base, (0.01 * float(np.median(above)) if above.size else 1.0)


def log_space(x: np.ndarray, low: float = 0.0, offset: float = 1.0) -> np.ndarray:
    """The log space heavy-tailed features are binned and compared in: ``log(x - low + offset)``.

    Values below ``low`` are mirrored (``log(offset) - log1p((low - x) / offset)``) so the map is
    monotone and continuous on all of R. With ``offset=1`` it is ``log1p(x - low)``.
    """
    y = np.asarray(x, dtype=np.float64) - low
    return np.log(offset) + np.sign(y) * np.log1p(np.abs(y) / offset)


def marginal_histograms(
    real: np.ndarray, gen: np.ndarray, feature: Feature | None = None, bins: int = 50
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The two smoothed histograms `kl_marginal` compares, and the bin edges or values.

    Binning:
      * discrete / categorical / binary features: one bin per allowed value; a value that is not
        allowed counts for the nearest allowed one.
      * continuous: ``bins`` equal-width bins over the real data's [q0.1 %, q99.9 %] range; values
        outside the range are counted in the first / last bin.
      * heavy_tailed: the same, in ``log(x - low + offset)`` space, ``low`` the feature's bound
        (or the real minimum) and ``offset`` 1 % of the real median above it (see `log_offset`).
      * no feature: treated as continuous.

    Smoothing: probabilities + 1e-6 each, then renormalised to sum 1.

    Returns:
        ``(p_real (B,), p_gen (B,), edges (B+1,) or allowed values (B,))``.
    """
    real = _as_1d(real, "real")
    gen = _as_1d(gen, "generated")
    values = feature.allowed_values() if feature is not None else None
    if values is not None:
        vals = np.asarray(sorted(values), dtype=np.float64)
        # Nearest allowed value, via midpoints between sorted values.
        mids = (vals[1:] + vals[:-1]) / 2.0
        cr = np.bincount(np.searchsorted(mids, real), minlength=len(vals)).astype(np.float64)
        cg = np.bincount(np.searchsorted(mids, gen), minlength=len(vals)).astype(np.float64)
        return _smooth(cr), _smooth(cg), vals
    if feature is not None and feature.kind == "heavy_tailed":
        low, offset = log_offset(real, feature.low)
        real, gen = log_space(real, low, offset), log_space(gen, low, offset)
    lo, hi = np.quantile(real, RANGE_QUANTILES)
    if not hi > lo:  # a (nearly) constant column: widen so the bins are well-defined
        lo, hi = lo - 0.5, hi + 0.5
    edges = np.linspace(lo, hi, bins + 1)
    inner = edges[1:-1]  # np.digitize on inner edges puts outliers in the edge bins
    cr = np.bincount(np.digitize(real, inner), minlength=bins).astype(np.float64)
    cg = np.bincount(np.digitize(gen, inner), minlength=bins).astype(np.float64)
    return _smooth(cr), _smooth(cg), edges


def kl_marginal(real: np.ndarray, gen: np.ndarray, feature: Feature | None = None, bins: int = 50) -> float:
    """KL(real || generated) of one column's marginal distribution, in nats.

    Args:
        real: ``(N,)`` real (held-out) values.
        gen: ``(M,)`` generated values.
        feature: the spec feature, which chooses the binning (see `marginal_histograms`); None
            bins as continuous.
        bins: number of equal-width bins for continuous and heavy-tailed features.

    Returns:
        ``sum_b p_real(b) * log(p_real(b) / p_gen(b))`` over smoothed histograms (>= 0).
    """
    p, q, _ = marginal_histograms(real, gen, feature, bins)
    return _kl(p, q)


def kl_categorical(real_labels: Sequence[Any] | np.ndarray, gen_labels: Sequence[Any] | np.ndarray) -> float:
    """KL(real || generated) between the label frequencies of two samples, in nats.

    Categories are the union of both samples' labels; probabilities are smoothed with +1e-6
    and renormalised, so a label the generator never produces costs ``p * log(p / 1e-6)``.
    """
    r = pd.Series(np.asarray(real_labels).reshape(-1)).astype(str)
    g = pd.Series(np.asarray(gen_labels).reshape(-1)).astype(str)
    if r.empty or g.empty:
        raise InputError("labels are empty", "real" if r.empty else "generated")
    cats = sorted(set(r.unique()) | set(g.unique()))
    cr = r.value_counts().reindex(cats, fill_value=0).to_numpy(np.float64)
    cg = g.value_counts().reindex(cats, fill_value=0).to_numpy(np.float64)
    return _kl(_smooth(cr), _smooth(cg))


def _subsample(x: np.ndarray, max_n: int, rng: np.random.Generator) -> np.ndarray:
    if len(x) <= max_n:
        return x
    return x[rng.choice(len(x), size=max_n, replace=False)]


def mmd_rbf(real: np.ndarray, gen: np.ndarray, max_n: int = 2000, seed: int = 0) -> float:
    """Squared MMD between two samples with an RBF kernel (unbiased estimate).

    Both samples are standardised with the real sample's mean and std (so every feature counts
    alike), subsampled to at most ``max_n`` rows each (seeded), and compared with
    ``k(a, b) = exp(-|a - b|^2 / (2 h^2))`` where ``h`` is the median pairwise distance of the
    pooled subsample (median heuristic).

    Args:
        real: ``(N, D)`` real rows.
        gen: ``(M, D)`` generated rows, same columns.

    Returns:
        The unbiased MMD^2 estimate; ~0 (it can be slightly negative) when the distributions
        are equal, larger the further apart they are.
    """
    real = _as_2d(real, "real")
    gen = _as_2d(gen, "generated")
    if real.shape[1] != gen.shape[1]:
        raise InputError(f"real has {real.shape[1]} columns, generated has {gen.shape[1]}", "generated")
    rng = np.random.default_rng(seed)
    x = _subsample(real, max_n, rng)
    y = _subsample(gen, max_n, rng)
    mu = real.mean(axis=0)
    sd = real.std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)
    x = (x - mu) / sd
    y = (y - mu) / sd
    z = np.concatenate([x, y])
    sq = np.sum(z * z, axis=1)
    with threadpool_limits(limits=1, user_api="blas"):  # see c2st_auc: spinning threads on 2 cores
        gram = z @ z.T
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * gram, 0.0)
    iu = np.triu_indices(len(z), k=1)
    h2 = float(np.median(d2[iu]))
    if h2 <= 0:
        h2 = 1.0
    k = np.exp(-d2 / (2.0 * h2))
    n, m = len(x), len(y)
    kxx = k[:n, :n]
    kyy = k[n:, n:]
    kxy = k[:n, n:]
    term_x = (kxx.sum() - np.trace(kxx)) / (n * (n - 1))
    term_y = (kyy.sum() - np.trace(kyy)) / (m * (m - 1))
    return float(term_x + term_y - 2.0 * kxy.mean())


def c2st_auc(real: np.ndarray, gen: np.ndarray, seed: int = 0, max_n: int = 5000, folds: int = 5) -> float:
    """Classifier two-sample test: cross-validated ROC AUC of telling real from generated rows.

    Takes a balanced set (``min(N, M, max_n)`` rows of each, seeded subsample), labels real 1 and
    generated 0, and scores out-of-fold probabilities of a
    `sklearn.ensemble.HistGradientBoostingClassifier` under stratified ``folds``-fold CV.

    Args:
        real: ``(N, D)`` real rows.
        gen: ``(M, D)`` generated rows, same columns.

    Returns:
        The AUC: 0.5 means the classifier cannot tell them apart (perfect generator), 1.0 that
        it always can. Noise can put it slightly below 0.5.
    """
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    real = _as_2d(real, "real")
    gen = _as_2d(gen, "generated")
    if real.shape[1] != gen.shape[1]:
        raise InputError(f"real has {real.shape[1]} columns, generated has {gen.shape[1]}", "generated")
    rng = np.random.default_rng(seed)
    n = min(len(real), len(gen), max_n)
    if n < 2 * folds:
        raise InputError(f"C2ST needs at least {2 * folds} rows of each, got {n}", "real")
    x = np.concatenate([_subsample(real, n, rng), _subsample(gen, n, rng)])
    y = np.concatenate([np.ones(n), np.zeros(n)])
    clf = HistGradientBoostingClassifier(max_iter=100, learning_rate=0.1, random_state=seed)
    cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    # One OpenMP thread: on a small shared machine spinning OpenMP workers make this 30x slower.
    with threadpool_limits(limits=1, user_api="openmp"):
        proba = cross_val_predict(clf, x, y, cv=cv, method="predict_proba")[:, 1]
    return float(roc_auc_score(y, proba))


def _rank_corr(x: np.ndarray) -> np.ndarray:
    d = x.shape[1]
    if d == 1:
        return np.ones((1, 1))
    with np.errstate(invalid="ignore", divide="ignore"):
        c = spearmanr(x).statistic
    c = np.asarray(c, dtype=np.float64)
    if c.ndim == 0:  # spearmanr returns a scalar for two columns
        c = np.array([[1.0, float(c)], [float(c), 1.0]])
    return np.nan_to_num(c, nan=0.0)  # a constant column correlates with nothing


def correlation_distance(real: np.ndarray, gen: np.ndarray) -> float:
    """RMS difference of the Spearman rank-correlation matrices over off-diagonal pairs.

    ``sqrt(mean_{i != j} (C_real[i, j] - C_gen[i, j])^2)``, in correlation units [0, 2]. Rank
    correlation keeps heavy-tailed columns from dominating; a constant column counts as
    uncorrelated. One column gives 0.
    """
    real = _as_2d(real, "real")
    gen = _as_2d(gen, "generated")
    if real.shape[1] != gen.shape[1]:
        raise InputError(f"real has {real.shape[1]} columns, generated has {gen.shape[1]}", "generated")
    d = real.shape[1]
    if d < 2:
        return 0.0
    diff = _rank_corr(real) - _rank_corr(gen)
    off = ~np.eye(d, dtype=bool)
    return float(np.sqrt(np.mean(diff[off] ** 2)))


def joint_matrix(
    df: pd.DataFrame, spec: TwinSpec, columns: list[str], ref: pd.DataFrame | None = None
) -> np.ndarray:
    """``(N, D)`` float array of the columns, heavy-tailed ones in `log_space` (for MMD / C2ST).

    ``ref`` (the real table; default ``df``) fixes each heavy-tailed column's ``(low, offset)``.
    """
    ref = df if ref is None else ref
    cols = []
    for c in columns:
        x = df[c].to_numpy(np.float64)
        try:
            f = spec.feature(c)
        except KeyError:
            f = None
        if f is not None and f.kind == "heavy_tailed":
            x = log_space(x, *log_offset(ref[c].to_numpy(np.float64), f.low))
        cols.append(x)
    return np.stack(cols, axis=1)


def fidelity_report(
    real: pd.DataFrame,
    gen: pd.DataFrame,
    spec: TwinSpec,
    columns: list[str],
    seed: int = 0,
    label_column: str | None = "scenario",
    bins: int = 50,
) -> dict[str, Any]:
    """Every fidelity metric of ``gen`` against ``real`` on ``columns``.

    Args:
        real: real (held-out) rows.
        gen: generated rows.
        spec: gives each column's kind for the binning (`marginal_histograms`).
        columns: numeric columns to compare (spec features or not).
        label_column: a categorical column (e.g. the scenario) compared with `kl_categorical`;
            skipped when absent from either table or None.

    Returns:
        ``{"kl": {column: KL}, "kl_label": KL or None, "kl_mean": mean over columns,
        "kl_max": max over columns, "mmd": MMD^2, "c2st_auc": AUC, "corr_dist": distance,
        "n_real": N, "n_gen": M}``; MMD, C2ST and correlations use the columns jointly, heavy-tailed
        ones in log space. With a label column, MMD and C2ST also see it one-hot encoded.
    """
    missing = [(c, name) for name, df in (("real", real), ("generated", gen)) for c in columns if c not in df]
    if missing:
        c, name = missing[0]
        raise InputError(f"column {c!r} is missing", name)
    kl: dict[str, float] = {}
    for c in columns:
        try:
            f = spec.feature(c)
        except KeyError:
            f = None
        kl[c] = kl_marginal(real[c].to_numpy(), gen[c].to_numpy(), f, bins=bins)
    xr = joint_matrix(real, spec, columns)
    xg = joint_matrix(gen, spec, columns, ref=real)
    kl_label = None
    if label_column is not None and label_column in real and label_column in gen:
        kl_label = kl_categorical(real[label_column].to_numpy(), gen[label_column].to_numpy())
        labels = sorted(set(real[label_column].astype(str)) | set(gen[label_column].astype(str)))
        if len(labels) > 1:
            oh_r = (real[label_column].astype(str).to_numpy()[:, None] == np.asarray(labels)).astype(float)
            oh_g = (gen[label_column].astype(str).to_numpy()[:, None] == np.asarray(labels)).astype(float)
            xr, xg = np.hstack([xr, oh_r]), np.hstack([xg, oh_g])
    return {
        "kl": kl,
        "kl_label": kl_label,
        "kl_mean": float(np.mean(list(kl.values()))) if kl else None,
        "kl_max": float(np.max(list(kl.values()))) if kl else None,
        "mmd": mmd_rbf(xr, xg, seed=seed),
        "c2st_auc": c2st_auc(xr, xg, seed=seed),
        "corr_dist": correlation_distance(xr[:, : len(columns)], xg[:, : len(columns)]),
        "n_real": len(real),
        "n_gen": len(gen),
    }
