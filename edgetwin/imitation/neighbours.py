"""Nearest-neighbour queries of a fitted `sklearn.neighbors.NearestNeighbors` without its wrapper.

A twin's episode reset asks fitted neighbour indexes (the logged initial states per scenario, the
profiles' support) a few small questions: tens to hundreds of rows against banks of tens to
thousands. ``NearestNeighbors.kneighbors`` validates its input and dispatches through joblib for
every call, ~0.3-0.4 ms each, several times the tree query itself at these sizes (issue 47: the
reset's support check and initial states were a quarter of it). For an index whose fitted method
is a tree (``kd_tree`` / ``ball_tree``, what ``algorithm="auto"`` picks for these widths),
`kneighbors` asks the tree directly: the call ``kneighbors`` makes in one job, so the same
neighbours in the same order and the same distances to the bit. Anything else (a brute-force
index, non-finite rows that ``kneighbors`` refuses, an sklearn without the tree attribute) goes
through ``NearestNeighbors.kneighbors`` itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.neighbors import NearestNeighbors

__all__ = ["kneighbors"]


def kneighbors(nn: NearestNeighbors, x: np.ndarray, k: int, return_distance: bool = True) -> Any:
    """``nn.kneighbors(x, n_neighbors=k, return_distance=...)`` for query rows ``x (n, D)``.

    Returns what ``kneighbors`` returns: ``(distances (n, k), indices (n, k))``, or the indices
    alone without ``return_distance``.
    """
    tree = getattr(nn, "_tree", None)
    x = np.asarray(x)
    if (
        tree is None
        or getattr(nn, "_fit_method", None) not in ("kd_tree", "ball_tree")
        or x.ndim != 2
        or len(x) == 0
        or not 0 < k <= nn.n_samples_fit_
        or x.dtype.kind != "f"
        or not np.isfinite(x).all()
    ):
        return nn.kneighbors(x, n_neighbors=k, return_distance=return_distance)
    return tree.query(np.ascontiguousarray(x), k, return_distance)
