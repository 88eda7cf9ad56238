"""A bounded batch writer: rows handed in never wait; one task writes them in batches.

The ledger's rows and the masked outputs leave the request path this way. Bounded by rows
and by bytes: a row that does not fit is refused (the caller counts it), never waited for,
except that an empty queue takes any row, so one very large row is still written. Owned by
the app: started and drained in its cleanup context.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["BatchWriter"]

log = logging.getLogger("ctxproxy")

T = TypeVar("T")


class BatchWriter(Generic[T]):
    """At most ``max_rows`` rows and ``max_bytes`` of them waiting; ``write`` gets at most
    ``batch_rows`` rows (and ``batch_bytes``, once it holds one) at a time, one call at a time.
    ``write`` handles the failures it knows; anything else it raises is logged, its rows
    counted to ``on_failed``, and the next batch still goes."""

    def __init__(
        self, write: Callable[[list[T]], Awaitable[None]], *, name: str,
        size_of: Callable[[T], int], max_rows: int, max_bytes: int, batch_rows: int,
        batch_bytes: int | None = None,
        on_failed: Callable[[int], None] = lambda n: None,
    ) -> None:
        self._write = write
        self._name = name
        self._size_of = size_of
        self._max_rows, self._max_bytes = max_rows, max_bytes
        self._batch_rows, self._batch_bytes = batch_rows, batch_bytes
        self._on_failed = on_failed
        self._rows: deque[tuple[T, int]] = deque()
        self._lock = threading.Lock()  # ``put`` may come from a worker thread
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self.bytes = 0  # of the rows put and not yet written

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._work(), name=self._name)

    def put(self, row: T) -> bool:
        """Queue ``row`` (from any thread; never waits); False when it does not fit."""
        size = self._size_of(row)
        with self._lock:
            if len(self._rows) >= self._max_rows or (
                    self._rows and self.bytes + size > self._max_bytes):
                return False
            self._rows.append((row, size))
            self.bytes += size
        if threading.get_ident() == self._loop_thread:
            self._signal()
        else:
            self._loop.call_soon_threadsafe(self._signal)
        return True

    def _signal(self) -> None:
        self._idle.clear()
        self._wake.set()

    async def join(self) -> None:
        """Wait until every row put is written (tests, shutdown)."""
        while self._rows or not self._idle.is_set():
            await self._idle.wait()
            await asyncio.sleep(0)  # a put from a thread may be on its way to ``_signal``

    async def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued (for at most ``timeout_s``), then stop."""
        if self._task is None:
            return
        try:
            await asyncio.wait_for(self.join(), timeout_s)
        except TimeoutError:
            log.warning("%s: rows still queued at shutdown were dropped: %d",
                        self._name, len(self._rows))
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    def _take(self) -> tuple[list[T], int]:
        batch: list[T] = []
        size = 0
        with self._lock:
            while self._rows and len(batch) < self._batch_rows and (
                    self._batch_bytes is None or size < self._batch_bytes):
                row, n = self._rows.popleft()
                batch.append(row)
                size += n
        return batch, size

    async def _work(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while True:
                batch, size = self._take()
                if not batch:
                    break
                try:
                    await self._write(batch)
                except Exception:
                    # A bug in one batch must not stop the worker, and every later row with it.
                    log.exception("%s: writing a batch failed", self._name)
                    self._on_failed(len(batch))
                finally:
                    with self._lock:
                        self.bytes -= size
            if not self._rows:
                self._idle.set()
