"""A least-recently-used map bounded by entries and by bytes, for the sides' caches.

An ``OrderedDict`` underneath: its lookups and moves are C calls, where cachetools' LRUCache
spends microseconds of Python on each. Not thread-safe: a cache read from threads holds its
own lock around it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar, overload

__all__ = ["SizedLRU"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
D = TypeVar("D")


class SizedLRU(Generic[K, V]):
    """At most ``max_entries`` values and ``max_bytes`` of them as ``size_of`` counts them
    (the key's bytes included, if it counts them; None: no bound of that kind); past either,
    the least recently used go.
    A value larger than ``max_bytes`` on its own is not kept. ``get`` and ``put`` make an
    entry the most recently used."""

    def __init__(self, max_entries: int | None, max_bytes: int | None = None,
                 size_of: Callable[[V], int] = lambda value: 0) -> None:
        if max_entries is not None and max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        return iter(self._entries)

    @overload
    def get(self, key: K) -> V | None: ...
    @overload
    def get(self, key: K, default: D) -> V | D: ...

    def get(self, key: K, default: object = None) -> object:
        entry = self._entries.get(key)
        if entry is None:
            return default
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: K, value: V) -> bool:
        """Keep ``value`` under ``key`` (replacing what was there); False if it is too large
        to keep at all (then nothing is kept under ``key``)."""
        self.pop(key)
        size = self._size_of(value)
        if self.max_bytes is not None and size > self.max_bytes:
            return False
        entries = self._entries
        most = self.max_entries
        while entries and ((most is not None and len(entries) >= most) or (
                self.max_bytes is not None and self.bytes + size > self.max_bytes)):
            _, (_, gone) = entries.popitem(last=False)
            self.bytes -= gone
        entries[key] = (value, size)
        self.bytes += size
        return True

    def pop(self, key: K) -> V | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self.bytes -= entry[1]
        return entry[0]

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0
