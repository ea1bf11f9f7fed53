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


class GMMPopulation(PopulationModel):
    """Per-scenario Gaussian mixtures; parameters are kept as arrays (weights, means, Cholesky)."""

    name: ClassVar[str] = "gmm"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Per scenario: weights (K,), means (K, D), lower Cholesky factors of covariances (K, D, D).
        self.params: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def fit(self, profiles: pd.DataFrame, seed: int = 0, progress: bool = False) -> GMMPopulation:
        from tqdm.auto import tqdm

        n_components = int(self.hyper.setdefault("n_components", 10))
        reg = float(self.hyper.setdefault("reg_covar", 1e-4))
        x_all = self.transformer.transform_codes(profiles, rng=np.random.default_rng(seed))
        labels = profiles["scenario"].astype(str).to_numpy()
        self.params = []
        for s in tqdm(self.scenarios, desc="gmm", disable=not progress):
            x = x_all[labels == s]
            k = max(1, min(n_components, len(x) // 2))
            gm = GaussianMixture(
                n_components=k, covariance_type="full", reg_covar=reg, random_state=seed, max_iter=300
            )
            # One BLAS thread: EM on small matrices is ~30x slower with spinning BLAS threads on a
            # small shared machine, and gains nothing from more.
            with threadpool_limits(limits=1, user_api="blas"):
                gm.fit(x)
            chol = np.linalg.cholesky(gm.covariances_)
            self.params.append((gm.weights_ / gm.weights_.sum(), gm.means_, chol))
        return self

    def _sample_profiles(self, scenario_idx: np.ndarray, rng: np.random.Generator, seed: int) -> pd.DataFrame:
        d = len(self.transformer.codecs)
        z = np.zeros((len(scenario_idx), d))
        for s, (w, mu, chol) in enumerate(self.params):
            rows = np.flatnonzero(scenario_idx == s)
            if rows.size == 0:
                continue
            comp = rng.choice(len(w), size=rows.size, p=w)
            eps = rng.standard_normal((rows.size, d))
            z[rows] = mu[comp] + np.einsum("nij,nj->ni", chol[comp], eps)
        return self.transformer.inverse_codes(z)

    def _save_params(self, path: Path) -> None:
        arrays = {}
        for s, (w, mu, chol) in enumerate(self.params):
            arrays[f"{s}|w"], arrays[f"{s}|mu"], arrays[f"{s}|chol"] = w, mu, chol
        np.savez(path / GMM_FILE, **arrays)

    def _load_params(self, path: Path) -> None:
        with np.load(path / GMM_FILE) as z:
            self.params = [(z[f"{s}|w"], z[f"{s}|mu"], z[f"{s}|chol"]) for s in range(len(self.scenarios))]
