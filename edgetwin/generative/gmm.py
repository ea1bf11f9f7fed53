"""GMM baseline (seed 004 §4.2.1): a Gaussian mixture per scenario on the transformed features.

Each scenario gets a `sklearn.mixture.GaussianMixture` (10 components, full covariance, as in the
paper) fitted on `ProfileTransformer.transform_codes`: normal scores for continuous and
heavy-tailed columns, standardised numeric codes for discrete ones, which are snapped to the
nearest allowed value when sampling.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from sklearn.mixture import GaussianMixture
from threadpoolctl import threadpool_limits

from edgetwin.generative.base import PopulationModel

GMM_FILE = "gmm.npz"


def fit_mixtures(
    x: np.ndarray,
    labels: np.ndarray,
    scenarios: list[str],
    n_components: int = 10,
    reg_covar: float = 1e-4,
    seed: int = 0,
    progress: bool = False,
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """One full-covariance `GaussianMixture` per scenario on the code rows ``x (N, D)``.

    Returns:
        Per scenario (in ``scenarios`` order): weights ``(K,)``, means ``(K, D)`` and lower
        Cholesky factors of the covariances ``(K, D, D)``, ``K = min(n_components, rows // 2)``.
    """
    from tqdm.auto import tqdm

    params = []
    for s in tqdm(scenarios, desc="gmm", disable=not progress):
        xs = x[labels == s]
        k = max(1, min(n_components, len(xs) // 2))
        gm = GaussianMixture(
            n_components=k, covariance_type="full", reg_covar=reg_covar, random_state=seed, max_iter=300
        )
        # One BLAS thread: EM on small matrices is ~30x slower with spinning BLAS threads on a
        # small shared machine, and gains nothing from more.
        with threadpool_limits(limits=1, user_api="blas"):
            gm.fit(xs)
        chol = np.linalg.cholesky(gm.covariances_)
        params.append((gm.weights_ / gm.weights_.sum(), gm.means_, chol))
    return params


def select_components(
    x: np.ndarray,
    labels: np.ndarray,
    scenarios: list[str],
    candidates: list[int],
    reg_covar: float = 1e-4,
    seed: int = 0,
    val_fraction: float = 0.2,
) -> tuple[int, dict[int, float]]:
    """Pick the number of mixture components by log-likelihood on a validation split.

    The split is carved out of the rows given (the TRAINING rows; held-out rows stay unseen):
    a seeded ``val_fraction`` of each scenario's rows. For each candidate ``K`` one mixture per
    scenario is fitted on the rest and scored on the validation rows.

    Returns:
        ``(best K, {K: mean validation log-likelihood per row, in nats})``.
    """
    rng = np.random.default_rng([seed, 0x5E1])
    val = rng.random(len(x)) < val_fraction
    scores: dict[int, float] = {}
    for k in candidates:
        params = fit_mixtures(x[~val], labels[~val], scenarios, int(k), reg_covar, seed)
        total = 0.0
        for s, (w, mu, chol) in zip(scenarios, params, strict=True):
            xv = x[val & (labels == s)]
            if len(xv):
                total += float(_mixture_logpdf(xv, w, mu, chol).sum())
        scores[int(k)] = total / max(int(val.sum()), 1)
    return max(scores, key=lambda k: scores[k]), scores


def _mixture_logpdf(x: np.ndarray, w: np.ndarray, mu: np.ndarray, chol: np.ndarray) -> np.ndarray:
    """``log sum_k w_k N(x; mu_k, L_k L_k^T)`` of rows ``x (N, D)``."""
    from scipy.linalg import solve_triangular
    from scipy.special import logsumexp

    d = x.shape[1]
    comps = []
    for wk, mk, lk in zip(w, mu, chol, strict=True):
        y = solve_triangular(lk, (x - mk).T, lower=True)
        logdet = 2.0 * np.log(np.diag(lk)).sum()
        comps.append(np.log(wk) - 0.5 * ((y * y).sum(axis=0) + logdet + d * np.log(2 * np.pi)))
    return logsumexp(np.stack(comps), axis=0)


class GMMPopulation(PopulationModel):
    """Per-scenario Gaussian mixtures; parameters are kept as arrays (weights, means, Cholesky)."""

    name: ClassVar[str] = "gmm"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Per scenario: weights (K,), means (K, D), lower Cholesky factors of covariances (K, D, D).
        self.params: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def fit(self, profiles: pd.DataFrame, seed: int = 0, progress: bool = False) -> GMMPopulation:
        self.hyper.setdefault("calibrate", False)
        n_components = int(self.hyper.setdefault("n_components", 10))
        reg = float(self.hyper.setdefault("reg_covar", 1e-4))
        x_all = self.transformer.transform_codes(profiles, rng=np.random.default_rng(seed))
        labels = profiles["scenario"].astype(str).to_numpy()
        self.params = fit_mixtures(x_all, labels, self.scenarios, n_components, reg, seed, progress)
        return self

    def _sample_raw(self, scenario_idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Mixture draws ``(N, n_columns)`` in the code space of `ProfileTransformer.transform_codes`."""
        d = len(self.transformer.codecs)
        z = np.zeros((len(scenario_idx), d))
        for s, (w, mu, chol) in enumerate(self.params):
            rows = np.flatnonzero(scenario_idx == s)
            if rows.size == 0:
                continue
            comp = rng.choice(len(w), size=rows.size, p=w)
            eps = rng.standard_normal((rows.size, d))
            z[rows] = mu[comp] + np.einsum("nij,nj->ni", chol[comp], eps)
        return z

    def _calibration_target(
        self, profiles: pd.DataFrame, rng: np.random.Generator
    ) -> tuple[np.ndarray, list[int], list[tuple[int, int]]]:
        # Every code is quantile-mapped, discrete ones too: onto the training codes' step-shaped
        # quantile function, so after snapping the category shares match the training rows.
        target = self.transformer.transform_codes(profiles, rng=rng)
        return target, list(range(target.shape[1])), []

    def _sample_profiles(self, scenario_idx: np.ndarray, rng: np.random.Generator, seed: int) -> np.ndarray:
        z = self._sample_raw(scenario_idx, rng)
        if self.calibration is not None:
            z = self.calibration.apply(z, scenario_idx)
        return self.transformer.inverse_codes_array(z)

    def _save_params(self, path: Path) -> None:
        arrays = {}
        for s, (w, mu, chol) in enumerate(self.params):
            arrays[f"{s}|w"], arrays[f"{s}|mu"], arrays[f"{s}|chol"] = w, mu, chol
        # the numpy stub lets **kwds fill `allow_pickle: bool`: a false arg-type error
        np.savez(path / GMM_FILE, **arrays)  # type: ignore[arg-type]

    def _load_params(self, path: Path) -> None:
        with np.load(path / GMM_FILE, allow_pickle=False) as z:
            self.params = [(z[f"{s}|w"], z[f"{s}|mu"], z[f"{s}|chol"]) for s in range(len(self.scenarios))]
