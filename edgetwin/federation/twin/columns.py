"""Column transforms the sites and the coordinator must compute identically: log1p of the
non-negative part, the heavy-tailed columns' lower bounds, each (episode, agent)'s first row, the
profile values in the space their codes standardise, and the population mixture marginalised to
the profile (the twin's population model)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from edgetwin.contract.spec import TwinSpec


def log1p_pos(x: np.ndarray) -> np.ndarray:
    return np.log1p(np.maximum(x, 0.0))


def heavy_low(spec: TwinSpec, name: str) -> float:
    f = spec.feature(name)
    return float(f.low) if f.low is not None else 0.0


def first_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Each (episode, agent)'s first row."""
    return df[df["t"] == df.groupby(["episode", "agent"])["t"].transform("min")]


def profile_marginal(gmm: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], P: int
                     ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each scenario's mixture over ``[profile codes, z(state)]`` marginalised to the first ``P`` dims."""
    out = []
    for w, mu, chol in gmm:
        cov = np.einsum("kij,klj->kil", chol, chol)[:, :P, :P]
        out.append((np.asarray(w), mu[:, :P], np.linalg.cholesky(cov + 1e-9 * np.eye(P))))
    return out


def column_means(table: np.ndarray, width: int) -> np.ndarray:
    """Column means of a site's units ``(U, W)`` ignoring NaN (0 for an all-NaN column)."""
    if table.shape != (table.shape[0], width) or not len(table):
        return np.zeros(width)
    ok = np.isfinite(table)
    return np.where(ok, table, 0.0).sum(axis=0) / np.maximum(ok.sum(axis=0), 1)


def profile_y(spec: TwinSpec, cols: list[str], prof: np.ndarray, context: Mapping[str, Any]) -> np.ndarray:
    """Profile values in the space their code standardises, centred on the pooled centre ``prof_c``."""
    from edgetwin.contract.metrics import log_space

    y = np.zeros_like(prof)
    for j, c in enumerate(cols):
        f = spec.feature(c)
        if f.kind == "heavy_tailed" and f.allowed_values() is None:
            y[:, j] = log_space(prof[:, j], context["prof_low"][j], context["prof_offset"][j])
        else:
            y[:, j] = prof[:, j]
    return y - np.asarray(context["prof_c"])
