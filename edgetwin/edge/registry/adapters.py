"""Running a registry from the other side of async: `BlockingRegistry` runs an async registry from
sync code (its client's event loop in another thread), `ThreadedRegistry` a sync one from async code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from edgetwin.edge.registry.base import AsyncPolicyRegistry, PointerChange, PolicyRegistry
from edgetwin.edge.signing import (
    Manifest,
)

T = TypeVar("T")


class BlockingRegistry(PolicyRegistry):
    """Sync facade over an `AsyncPolicyRegistry` whose client runs on ``loop`` in another thread.

    Args:
        inner: the async registry (e.g. `NatsRegistry`).
        loop: the running event loop its client belongs to (not the calling thread's).
        timeout: seconds to wait for each call.
    """

    def __init__(self, inner: AsyncPolicyRegistry, loop: asyncio.AbstractEventLoop, timeout: float = 60.0) -> None:
        self.inner, self.loop, self.timeout = inner, loop, timeout

    def __repr__(self) -> str:
        return f"BlockingRegistry({self.inner!r})"

    def _run(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(self.timeout)  # type: ignore[arg-type]

    def _store(self, version: str, packed: bytes, manifest: Manifest) -> None:
        self._run(self.inner._store(version, packed, manifest))

    def _load(self, version: str) -> tuple[bytes, Manifest]:
        return self._run(self.inner._load(version))

    def manifest(self, version: str) -> Manifest:
        return self._run(self.inner.manifest(version))

    def list_versions(self) -> list[str]:
        return self._run(self.inner.list_versions())

    def current(self, scope: str) -> str | None:
        return self._run(self.inner.current(scope))

    def set_current(
        self, scope: str, version: str, *, expected: str | None, reason: str = "", kind: str = "promote"
    ) -> PointerChange:
        return self._run(self.inner.set_current(scope, version, expected=expected, reason=reason, kind=kind))

    def history(self, scope: str) -> list[PointerChange]:
        return self._run(self.inner.history(scope))

    def scopes(self) -> list[str]:
        return self._run(self.inner.scopes())


class ThreadedRegistry(AsyncPolicyRegistry):
    """Async facade over a sync `PolicyRegistry` (each call in a worker thread), for async edge code."""

    def __init__(self, inner: PolicyRegistry) -> None:
        self.inner = inner

    def __repr__(self) -> str:
        return f"ThreadedRegistry({self.inner!r})"

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def _store(self, version: str, packed: bytes, manifest: Manifest) -> None:
        await self._call(self.inner._store, version, packed, manifest)

    async def _load(self, version: str) -> tuple[bytes, Manifest]:
        return await self._call(self.inner._load, version)

    async def manifest(self, version: str) -> Manifest:
        return await self._call(self.inner.manifest, version)

    async def list_versions(self) -> list[str]:
        return await self._call(self.inner.list_versions)

    async def current(self, scope: str) -> str | None:
        return await self._call(self.inner.current, scope)

    async def set_current(
        self, scope: str, version: str, *, expected: str | None, reason: str = "", kind: str = "promote"
    ) -> PointerChange:
        return await self._call(self.inner.set_current, scope, version, expected=expected, reason=reason, kind=kind)

    async def history(self, scope: str) -> list[PointerChange]:
        return await self._call(self.inner.history, scope)

    async def scopes(self) -> list[str]:
        return await self._call(self.inner.scopes)
