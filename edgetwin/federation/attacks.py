"""A Byzantine client's tampering with its update, for robustness tests and benchmarks."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edgetwin.contract.errors import InputError

__all__ = [
    "Attack",
]


@dataclass
class Attack:
    """A Byzantine client's tampering with its update (for robustness tests and benchmarks).

    Attributes:
        kind: ``"scaled"`` (send ``scale · delta``, e.g. -10: a boosted sign flip) or
            ``"random"`` (Gaussian noise of ``scale`` times the honest update's RMS per coordinate).
        scale: see kind.
    """

    kind: str = "scaled"
    scale: float = -10.0

    def __post_init__(self) -> None:
        if self.kind not in ("scaled", "random"):
            raise InputError(
                f"attack kind must be 'scaled' or 'random', got {self.kind!r}", where="attack.kind"
            )
        if not math.isfinite(self.scale):
            raise InputError("attack scale must be finite", where="attack.scale")

    def apply(self, delta: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The tampered update (D,) float32."""
        if self.kind == "scaled":
            return (self.scale * delta).astype(np.float32)
        rms = float(np.sqrt(np.mean(delta.astype(np.float64) ** 2))) + 1e-3
        return rng.normal(0.0, abs(self.scale) * rms, delta.shape).astype(np.float32)
