"""The time grid of an import: ``n`` evaluation times ``start + k * step``, ``k = 0 .. n-1``.

The range is half-open, ``[start, end)``: a day is ``--start 2026-03-01T00:00:00Z --end
2026-03-02T00:00:00Z --step 1m`` = 1,440 steps, and the next day's import starts where this one
ended without sharing a step. Both sources (`edgetwin.contract.prometheus.http`, the server's
``/api/v1/query_range``; `edgetwin.contract.prometheus.dump`, a file) give each series as one value
per grid step (NaN where the series has none), so the table is assembled the same way from either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from edgetwin.contract.errors import InputError

#: Prometheus refuses a query_range answer of more than 11,000 points per series.
MAX_POINTS = 11_000


def parse_time(text: str | float | int, where: str) -> float:
    """Unix seconds from RFC 3339 (``2026-03-01T00:00:00Z``; no zone = UTC) or a number of seconds."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    else:
        s = str(text).strip()
        try:
            value = float(s)
        except ValueError:
            try:
                dt = datetime.fromisoformat(s)
            except ValueError:
                raise InputError(
                    f"expected a time as RFC 3339 (2026-03-01T00:00:00Z) or unix seconds, got {text!r}", where
                ) from None
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=UTC)
            value = dt.timestamp()
    if not math.isfinite(value):
        raise InputError(f"not a finite time: {text!r}", where)
    return value


@dataclass(frozen=True)
class Grid:
    """Evaluation times ``start + k * step`` for ``k < n`` (seconds since the epoch, UTC).

    Attributes:
        start: the first evaluation time.
        step: seconds between evaluation times (the log's ``t`` advances by one per step).
        n: number of steps.
    """

    start: float
    step: float
    n: int

    @classmethod
    def over(cls, start: float, end: float, step: float, step_source: str = "--step") -> Grid:
        """The grid of ``[start, end)``; the step must divide the range (1 ms tolerance).

        Raises:
            InputError: end not after start, or a step that does not divide the range (named by
                ``step_source``: the flag, or the mapping's ``step``).
        """
        if not end > start:
            raise InputError(f"--end ({_iso(end)}) must be after --start ({_iso(start)})", "--end")
        span = end - start
        n = round(span / step)
        if n < 1 or abs(n * step - span) > 1e-3:
            raise InputError(
                f"a step of {step:g} s does not divide the range {_iso(start)} .. {_iso(end)} ({span:g} s = "
                f"{span / step:.4g} steps); choose a step that divides it, or move --end",
                step_source,
            )
        return cls(float(start), float(step), int(n))

    @property
    def times(self) -> np.ndarray:
        """(n,) float64 evaluation times."""
        return self.start + self.step * np.arange(self.n, dtype=np.float64)

    def index_of(self, ts: np.ndarray) -> np.ndarray:
        """Grid indices (int64) of times on the grid (rounded: servers return them as floats)."""
        return np.rint((np.asarray(ts, dtype=np.float64) - self.start) / self.step).astype(np.int64)

    def chunks(self, max_points: int = MAX_POINTS) -> list[tuple[int, int]]:
        """``[(k0, k1), ...]``: step ranges of at most ``max_points`` steps each, covering the grid."""
        if max_points < 1:
            raise InputError(f"max_points must be >= 1, got {max_points}", "max_points")
        return [(k, min(k + max_points, self.n)) for k in range(0, self.n, max_points)]


def _iso(ts: float) -> str:
    try:
        return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        return f"{ts:g}"
