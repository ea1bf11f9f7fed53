"""Serving decisions for the edge runtime: observations checked, the served version acts (shielded)."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.edge.runtime_core import Decision, NoPolicyLoaded
from edgetwin.edge.runtime_rollback import KPIRollback

log = logging.getLogger("edgetwin.runtime")


class Serving(KPIRollback):
    """Answering decisions from the Python API: checked observations, the served version, counters."""

    def _check_obs(self, obs: Any) -> np.ndarray:
        try:
            x = np.asarray(obs, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise InputError(f"observations must be numbers ({e})", where="obs") from None
        if x.ndim == 1:
            x = x[None, :]
        a = self._active
        width = len(a.observation_columns) if a else None
        if x.ndim != 2 or (width is not None and x.shape[1] != width):
            raise InputError(f"expected observations of shape (N, {width}), got {x.shape}", where="obs")
        if not np.isfinite(x).all():
            raise InputError("observations contain NaN or inf", where="obs")
        return x

    def decide_with_info(self, obs: np.ndarray) -> Decision:
        """Like `decide`, with the version that answered."""
        x = self._check_obs(obs)
        served = self._active  # one read: a concurrent swap does not affect this call
        if served is None:
            raise NoPolicyLoaded(
                f"site {self.site!r} has no verified policy yet (scopes {self.scopes}); see the log"
            )
        t0 = time.perf_counter()
        actions = served.act(x)
        if self.metrics is not None:
            self.metrics.observe_decision(served.version, len(x), time.perf_counter() - t0, arm="fleet")
        with self._stats_lock:  # `+=` from several threads would lose counts
            self.stats.decisions += 1
            self.stats.rows += len(x)
            self.stats.by_version[served.version] += 1
        return Decision(actions, served.version, served.scope, served.revision)

    def decide(self, obs: np.ndarray) -> np.ndarray:
        """Actions ``(N, A)`` (float64, spec units, shielded) for observations ``(N, O)``.

        Thread-safe and non-blocking (no I/O); works while the registry and bus are down.

        Raises:
            InputError: observations of the wrong width, or not finite.
            NoPolicyLoaded: nothing verified to serve yet.
        """
        return self.decide_with_info(obs).actions
