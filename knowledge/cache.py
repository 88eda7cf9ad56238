"""A small TTL cache whose misses are single-flight: concurrent lookups share one load."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from ctxproxy.plumbing.lru import SizedLRU

__all__ = ["How", "TtlCache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
How = Literal["hit", "miss", "shared"]


@dataclass(slots=True)
class _Entry(Generic[V]):
    value: V
    expires: float
    size: int  # as the cache's size_of counts it


class TtlCache(Generic[K, V]):
    """Values live for the TTL their loader returns with them (so failures can be short).

    At most ``max_entries`` values, and ``max_bytes`` of them as ``size_of`` counts them:
    past either the least recently used go; one larger than ``max_bytes`` is not kept."""

    def __init__(
        self, *, max_entries: int = 4096, max_bytes: int = 64 * 1024 * 1024,
        size_of: Callable[[V], int] = lambda value: 1, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._entries: SizedLRU[K, _Entry[V]] = SizedLRU(
            max_entries, max_bytes, size_of=lambda entry: entry.size)
        self._size_of = size_of
        self._inflight: dict[K, asyncio.Task[V]] = {}
        self._clock = clock

    async def get(self, key: K, load: Callable[[], Awaitable[tuple[V, float]]]) -> tuple[V, How]:
        """The cached value, or the result of ``load()`` (value, ttl in seconds), shared."""
        entry = self._entries.get(key)
        if entry is not None and entry.expires > self._clock():
            return entry.value, "hit"
        task = self._inflight.get(key)
        how: How = "shared"
        if task is None:
            how = "miss"
            task = asyncio.create_task(self._fill(key, load))
            task.add_done_callback(_retrieve)
            self._inflight[key] = task
        # Shielded: a caller that goes away (client hung up) must not cancel the others' load.
        return await asyncio.shield(task), how

    async def _fill(self, key: K, load: Callable[[], Awaitable[tuple[V, float]]]) -> V:
        try:
            value, ttl = await load()
            self._store(key, value, ttl)
            return value
        finally:
            self._inflight.pop(key, None)

    @property
    def bytes(self) -> int:
        """The values' bytes as ``size_of`` counts them."""
        return self._entries.bytes

    def _store(self, key: K, value: V, ttl: float) -> None:
        self._entries.put(key, _Entry(value, self._clock() + ttl, self._size_of(value)))

    def clear(self) -> None:
        """Forget every value. Loads under way still store theirs when they end: a caller
        that must not be served one keys its lookups anew (as ``Discovery`` does)."""
        self._entries.clear()

    async def close(self) -> None:
        """Cancel loads still running (at shutdown) and wait for them to end."""
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _retrieve(task: asyncio.Task[object]) -> None:
    # Every waiter may have gone: read the outcome so asyncio never reports it as lost.
    if not task.cancelled():
        task.exception()
