"""The bounded write queue: memory writes leave the request path and are done here, in order.

Owned by the app: one worker task, started and drained in the app's cleanup context. The
queue is bounded twice: by jobs and by bytes (each job says about how much it holds: an
ingest job keeps its request's parsed history alive until it runs). A job that would pass
either bound is refused: counted, reported to the health, and made good by the session's
next request, which derives the same writes again. A job whose write fails is retried once;
only when the retry fails too is it dropped, counted the same way. Nothing is dropped
silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Literal

from memory.health import Health
from memory.model import StoreError

__all__ = ["DropReason", "Job", "WriteQueue"]

log = logging.getLogger("ctxproxy.memory")

Job = Callable[[], Awaitable[object]]
# jobs: the job bound; bytes: the byte budget; failed: the write and its retry failed.
DropReason = Literal["jobs", "bytes", "failed"]
RETRY_S = 1.0


class WriteQueue:
    """At most ``size`` pending jobs and ``max_bytes`` of them, run one at a time by one
    worker task. A job larger than the whole budget is taken only into an empty queue (so
    one very long session is still stored), never behind others."""

    def __init__(
        self,
        size: int,
        health: Health,
        on_depth: Callable[[int], None] = lambda n: None,
        *,
        max_bytes: int | None = None,
        on_bytes: Callable[[int], None] = lambda n: None,
        on_drop: Callable[[DropReason], None] = lambda reason: None,
        retry_s: float = RETRY_S,
    ) -> None:
        self._queue: asyncio.Queue[tuple[Job, int]] = asyncio.Queue(size)
        self._health = health
        self._on_depth = on_depth
        self._on_bytes = on_bytes
        self._on_drop = on_drop
        self._max_bytes = max_bytes
        self._retry_s = retry_s
        self._worker: asyncio.Task[None] | None = None
        self.bytes = 0  # the estimated size of the jobs waiting
        self.dropped = 0

    def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.create_task(self._work(), name="ctxproxy-memory-writes")

    def put(self, job: Job, size: int = 0) -> bool:
        """Queue ``job`` (about ``size`` bytes); False (the job refused, counted) when it would
        pass the job bound or the byte budget."""
        if (
            self._max_bytes is not None
            and self.bytes + size > self._max_bytes
            and not self._queue.empty()
        ):
            self._drop("bytes", StoreError("the memory write queue is over its byte budget"))
            return False
        try:
            self._queue.put_nowait((job, size))
        except asyncio.QueueFull:
            self._drop("jobs", StoreError("the memory write queue is full"))
            return False
        self.bytes += size
        self._on_depth(self._queue.qsize())
        self._on_bytes(self.bytes)
        return True

    def _drop(self, reason: DropReason, exc: StoreError) -> None:
        self.dropped += 1
        self._on_drop(reason)
        self._health.failed("write queue", exc)

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
            job, size = await self._queue.get()
            try:
                await self._run(job)
            finally:
                self.bytes -= size
                self._queue.task_done()
                self._on_depth(self._queue.qsize())
                self._on_bytes(self.bytes)

    async def _run(self, job: Job) -> None:
        """Run ``job``; a store failure gets one retry, then the job is dropped (counted)."""
        for attempt in (1, 2):
            try:
                await job()
                self._health.ok("write queue")
                return
            except StoreError as exc:
                if attempt == 2:
                    self._drop("failed", exc)
                    return
                self._health.failed("write queue", exc)
                await asyncio.sleep(self._retry_s)
            except Exception:
                # A bug in one write must not stop every later one.
                log.exception("memory write failed")
                return
