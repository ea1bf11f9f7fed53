"""Rounds that never hang: close on k-of-n plus a grace period, or at a hard timeout.

`RoundCollector` gathers one round's updates as they arrive (from bus handlers):

- all expected clients in -> closes at once;
- ``quorum`` (k) in -> waits up to ``grace_s`` more for the rest, then closes;
- ``timeout_s`` after opening -> closes with whatever it has (``quorum_met`` False if < k);
- a client that reports it cannot answer (`RoundCollector.fail`) is not waited for: once so many
  have failed that k can no longer be reached, the round closes at once (reason ``"failed"``).

Updates arriving after the close are kept in ``late`` (with their round) for staleness-aware
mixing in a later round; duplicates and unknown senders are refused and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from edgetwin.contract.errors import InputError
from edgetwin.federation.aggregation.base import ClientUpdate

__all__ = ["RoundCollector", "RoundOutcome"]


@dataclass
class RoundOutcome:
    """How a round closed.

    Attributes:
        round: the round number.
        updates: the updates it closed with, in arrival order.
        missing: expected clients that did not report in time.
        quorum_met: at least ``quorum`` updates arrived.
        reason: ``"complete"``, ``"quorum+grace"``, ``"timeout"`` or ``"failed"`` (too many
            clients reported a failure for the quorum to be reached).
        elapsed_s: time from open to close.
        failed: expected clients that reported they could not answer (also in ``missing``).
    """

    round: int
    updates: list[ClientUpdate]
    missing: list[str]
    quorum_met: bool
    reason: str
    elapsed_s: float
    refused: dict[str, int] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)


class RoundCollector:
    """Collect one round's updates with a k-of-n quorum, a grace period and a hard timeout.

    Args:
        round: the round number (updates' ``base_round`` may be older: they are late ones).
        expected: the client ids asked to report.
        quorum: k, an int in [1, n], or a share of n in (0, 1].
        grace_s: how long to wait for stragglers once the quorum is reached.
        timeout_s: the round closes at the latest this long after `open`.
    """

    def __init__(self, round: int, expected: Collection[str], quorum: int | float, grace_s: float = 1.0,
                 timeout_s: float = 30.0) -> None:
        self.expected = list(dict.fromkeys(expected))
        n = len(self.expected)
        if n == 0:
            raise InputError("a round needs at least one expected client", where="expected")
        if isinstance(quorum, float) and not isinstance(quorum, bool):
            if not 0.0 < quorum <= 1.0:
                raise InputError(f"a quorum share must be in (0, 1], got {quorum}", where="quorum")
            k = max(1, int(-(-quorum * n // 1)))  # ceil
        else:
            k = int(quorum)
        if not 1 <= k <= n:
            raise InputError(f"quorum must be in [1, {n}] (expected clients), got {quorum}", where="quorum")
        if not grace_s >= 0 or not timeout_s > 0:
            raise InputError(f"need grace_s >= 0 and timeout_s > 0, got {grace_s}, {timeout_s}", where="timeout_s")
        self.round, self.quorum, self.grace_s, self.timeout_s = int(round), k, float(grace_s), float(timeout_s)
        self.updates: dict[str, ClientUpdate] = {}
        self.failed: list[str] = []
        self.late: list[tuple[int, ClientUpdate]] = []
        self.refused: dict[str, int] = {"duplicate": 0, "unknown": 0}
        self._closed = False
        self._changed: asyncio.Event | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, update: ClientUpdate) -> bool:
        """Offer an update; True if it counts for this round."""
        if self._closed:
            self.late.append((self.round, update))
            return False
        if update.client_id not in self.expected:
            self.refused["unknown"] += 1
            return False
        if update.client_id in self.updates or update.client_id in self.failed:
            self.refused["duplicate"] += 1
            return False
        self.updates[update.client_id] = update
        if self._changed is not None:
            self._changed.set()
        return True

    def fail(self, client_id: str) -> bool:
        """``client_id`` reports it cannot answer this round: stop waiting for it. True if it
        counts (an expected client that has not answered yet, in an open round)."""
        if self._closed or client_id not in self.expected or client_id in self.updates or client_id in self.failed:
            return False
        self.failed.append(client_id)
        if self._changed is not None:
            self._changed.set()
        return True

    async def wait(self) -> RoundOutcome:
        """Block until the round closes (never longer than ``timeout_s``) and return the outcome."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + self.timeout_s
        self._changed = asyncio.Event()
        reason = "timeout"
        quorum_at: float | None = None
        while True:
            if len(self.expected) - len(self.failed) < self.quorum:
                reason = "failed"
                break
            if len(self.updates) + len(self.failed) == len(self.expected):
                reason = "complete"
                break
            now = loop.time()
            if len(self.updates) >= self.quorum and quorum_at is None:
                quorum_at = now
            until = deadline if quorum_at is None else min(deadline, quorum_at + self.grace_s)
            if now >= until:
                reason = "quorum+grace" if quorum_at is not None and quorum_at + self.grace_s < deadline else "timeout"
                break
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), until - now)
        self._closed = True
        ups = list(self.updates.values())
        return RoundOutcome(
            round=self.round,
            updates=ups,
            missing=[c for c in self.expected if c not in self.updates],
            quorum_met=len(ups) >= self.quorum,
            reason=reason,
            elapsed_s=loop.time() - start,
            refused=dict(self.refused),
            failed=list(self.failed),
        )

    def summary(self) -> dict[str, Any]:
        """Counts so far (for logs)."""
        return {"round": self.round, "received": len(self.updates), "expected": len(self.expected), "quorum": self.quorum}
