"""The bounded write queue: memory writes leave the request path and are done here, in order.

Owned by the app: one worker task, started and drained in the app's cleanup context. A full
queue drops the write (the next request of the session derives it again); a failed write is
reported and the worker carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from memory.health import Health
from memory.model import StoreError

__all__ = ["Job", "WriteQueue"]

log = logging.getLogger("ctxproxy.memory")

Job = Callable[[], Awaitable[object]]


class WriteQueue:
    """At most ``size`` pending jobs, run one at a time by one worker task."""

    def __init__(
        self, size: int, health: Health, on_depth: Callable[[int], None] = lambda n: None
    ) -> None:
        self._queue: asyncio.Queue[Job] = asyncio.Queue(size)
        self._health = health
        self._on_depth = on_depth
        self._worker: asyncio.Task[None] | None = None
        self.dropped = 0

    def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.create_task(self._work(), name="ctxproxy-memory-writes")

    def put(self, job: Job) -> bool:
        """Queue ``job``; False (and the job dropped) when the queue is full."""
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            self.dropped += 1
            self._health.failed("write queue", StoreError("the memory write queue is full"))
            return False
        self._on_depth(self._queue.qsize())
        return True

    async def join(self) -> None:
        """Wait until every queued job has run (tests and shutdown use it)."""
        await self._queue.join()

    async def close(self, timeout_s: float = 5.0) -> None:
        """Drain what is queued (for at most ``timeout_s``), then stop the worker."""
        if self._worker is None:
            return
        try:
            await asyncio.wait_for(self._queue.join(), timeout_s)
        except TimeoutError:
            log.warning("memory writes still queued at shutdown were dropped: %d",
                        self._queue.qsize())
        self._worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._worker
        self._worker = None

    async def _work(self) -> None:
        while True:
            job = await self._queue.get()
            try:
                await job()
                self._health.ok("write queue")
            except StoreError as exc:
                self._health.failed("write queue", exc)
            except Exception:
                # A bug in one write must not stop every later one.
                log.exception("memory write failed")
            finally:
                self._queue.task_done()
                self._on_depth(self._queue.qsize())
