"""A durable consumer's task stops on `unsubscribe` even when a cancellation is lost.

nats-py's pull ``fetch`` waits in ``asyncio.wait_for``; on Python 3.11 a cancel that arrives with the
message is swallowed (CPython gh-86296) and the consumer loop would long-poll forever: a federation
test hung 25 minutes in its teardown that way. The fake subscription here swallows every cancel the
same way (returns an empty batch instead of raising), so only the stop flag can end the loop.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from edgetwin.edge.bus.nats_bus import _NatsDurableSub


class _CancelSwallowingPull:
    """A pull subscription whose ``fetch`` returns ``[]`` when cancelled, as the lost cancel does."""

    def __init__(self) -> None:
        self.fetches = 0
        self.unsubscribed = False
        self.closed = False  # the test's own way out, so that a failing run ends instead of hanging

    async def fetch(self, batch: int, timeout: float) -> list:
        self.fetches += 1
        if self.closed:
            raise asyncio.CancelledError
        try:
            await asyncio.sleep(timeout)
        except asyncio.CancelledError:
            return []
        raise TimeoutError

    async def unsubscribe(self) -> None:
        self.unsubscribed = True


def test_unsubscribe_ends_a_consumer_whose_cancel_is_swallowed() -> None:
    async def scenario() -> tuple[bool, _NatsDurableSub, _CancelSwallowingPull]:
        bus = SimpleNamespace(name="test", config=SimpleNamespace(fetch_timeout_s=0.2))
        pull = _CancelSwallowingPull()
        sub = _NatsDurableSub(bus, "subj", "durable", pull, handler=None)  # type: ignore[arg-type]
        await asyncio.sleep(0.05)  # the loop is inside fetch
        stop = asyncio.ensure_future(sub.unsubscribe())
        done, _ = await asyncio.wait({stop}, timeout=10.0)
        pull.closed = True  # lets a consumer that ignored the stop end, so the test reports instead of hanging
        await stop
        return bool(done), sub, pull

    in_time, sub, pull = asyncio.run(scenario())
    assert in_time, "unsubscribe did not return within 10 s: the consumer loop outlived its cancellation"
    assert sub.task.done() and pull.unsubscribed
    assert pull.fetches >= 1
