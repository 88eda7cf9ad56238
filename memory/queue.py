"""The bounded write queue: memory writes leave the request path and are done here.

Owned by the app: one worker task, started and drained in the app's cleanup context. Jobs of
one key (a session's) run one at a time, in the order they came; jobs of different keys run
side by side, up to ``concurrency`` at once: a job spends most of its time waiting (for a
worker thread, a read, the store's writer), and one at a time the queue fell behind the
sessions under load. The queue is bounded twice: by jobs and by bytes (each job says about
how much it holds: an ingest job keeps its request's parsed history alive until it runs). A
job that would pass either bound is refused: counted, reported to the health, and made good
by the session's next request, which derives the same writes again. A job whose write fails
is retried once; only when the retry fails too is it dropped, counted the same way. Nothing
is dropped silently.

A job may say what it ``covers`` (an ingest job: the complete turns of its history). One not
started yet is superseded, and does not run, when a later job of its key covers all of it: the
later one writes the same and more. Behind a backlog (a restart, a store slower than the
sessions), a session's queued ingest jobs were each a full pass over its history, and the
store fell further behind (bench/RESULTS.md, Load).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Literal, cast

from ctxproxy.memory import lanes
from ctxproxy.memory.health import Health
from ctxproxy.memory.model import StoreError

__all__ = ["DropReason", "Job", "WriteQueue"]

log = logging.getLogger("ctxproxy.memory")

Job = Callable[[], Awaitable[object]]
# jobs: the job bound; bytes: the byte budget; failed: the write and its retry failed.
DropReason = Literal["jobs", "bytes", "failed"]
RETRY_S = 1.0
CONCURRENCY = 4


@dataclass
class _Lane:
    """The jobs of one key not yet done: they run one at a time, in the order put."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    jobs: int = 0
    # The jobs not started yet that a later job may supersede: what each covers, its bytes.
    waiting: dict[asyncio.Task[None], tuple[frozenset[Hashable], int]] = field(
        default_factory=dict)


class WriteQueue:
    """At most ``size`` pending jobs and ``max_bytes`` of them, run once started: up to
    ``concurrency`` at once, one at a time per key. A job larger than the whole budget is
    taken only into an empty queue (so one very long session is still stored), never behind
    others."""

    def __init__(
        self,
        size: int,
        health: Health,
        on_depth: Callable[[int], None] = lambda n: None,
        *,
        max_bytes: int | None = None,
        on_bytes: Callable[[int], None] = lambda n: None,
        on_drop: Callable[[DropReason], None] = lambda reason: None,
        on_superseded: Callable[[], None] = lambda: None,
        retry_s: float = RETRY_S,
        concurrency: int = CONCURRENCY,
    ) -> None:
        self._size = size
        self._slots = asyncio.Semaphore(concurrency)
        self._lanes: dict[Hashable, _Lane] = {}
        self._jobs: set[asyncio.Task[None]] = set()  # put and not done
        self._started = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._health = health
        self._on_depth = on_depth
        self._on_bytes = on_bytes
        self._on_drop = on_drop
        self._on_superseded = on_superseded
        self._max_bytes = max_bytes
        self._retry_s = retry_s
        self.bytes = 0  # the estimated size of the jobs not done
        self.dropped = 0
        self.superseded = 0

    def start(self) -> None:
        self._started.set()

    def put(self, job: Job, size: int = 0, *, key: Hashable = None,
            covers: frozenset[Hashable] | None = None) -> bool:
        """Queue ``job`` (about ``size`` bytes; after the jobs of its ``key``); False (the
        job refused, counted) when it would pass the job bound or the byte budget. A job
        that ``covers`` something supersedes its key's jobs not started yet that cover no
        more (they are cancelled, counted), and is bounded without them."""
        stale = self._stale(key, covers)
        others = len(self._jobs) - len(stale)
        if (self._max_bytes is not None and others
                and self.bytes - sum(stale.values()) + size > self._max_bytes):
            self._drop("bytes", StoreError("the memory write queue is over its byte budget"))
            return False
        if others >= self._size:
            self._drop("jobs", StoreError("the memory write queue is full"))
            return False
        lane = self._lanes.setdefault(key, _Lane())
        for older in stale:
            del lane.waiting[older]
            older.cancel()  # its done callback frees its place and its bytes
            self.superseded += 1
            self._on_superseded()
        lane.jobs += 1
        # Started in the order put: a key's jobs wait on its lock in that order.
        task = asyncio.create_task(self._one(job, lane))
        task.add_done_callback(functools.partial(self._done, key, lane, size))
        self._jobs.add(task)
        if covers is not None:
            lane.waiting[task] = (covers, size)
        self._idle.clear()
        self.bytes += size
        self._on_depth(len(self._jobs))
        self._on_bytes(self.bytes)
        return True

    def _stale(self, key: Hashable, covers: frozenset[Hashable] | None) -> dict[
            asyncio.Task[None], int]:
        """The jobs of ``key`` not started yet that a job covering ``covers`` supersedes,
        with their bytes."""
        lane = self._lanes.get(key)
        if covers is None or lane is None:
            return {}
        return {older: size for older, (covered, size) in lane.waiting.items()
                if covered <= covers}

    def _drop(self, reason: DropReason, exc: StoreError) -> None:
        self.dropped += 1
        self._on_drop(reason)
        self._health.failed("write queue", exc)

    async def join(self) -> None:
        """Wait until every queued job has run (tests and shutdown use it)."""
        await self._idle.wait()

    async def close(self, timeout_s: float = 5.0) -> None:
        """Drain what is queued (for at most ``timeout_s``, once started), then cancel the
        rest."""
        if self._started.is_set():
            try:
                await asyncio.wait_for(self._idle.wait(), timeout_s)
            except TimeoutError:
                log.warning("memory writes still queued at shutdown were dropped: %d",
                            len(self._jobs))
        jobs = list(self._jobs)
        for task in jobs:
            task.cancel()
        for task in jobs:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _one(self, job: Job, lane: _Lane) -> None:
        # No request waits for a queued write: its store work goes after the turns' own.
        lanes.background()
        await self._started.wait()
        async with lane.lock, self._slots:
            # Started: no later job supersedes it now.
            lane.waiting.pop(cast("asyncio.Task[None]", asyncio.current_task()), None)
            await self._run(job)

    def _done(self, key: Hashable, lane: _Lane, size: int, task: asyncio.Task[None]) -> None:
        """A job's task ended: run, failed, or cancelled (a cancelled task may never have
        started, so this is its done callback, not a ``finally``)."""
        lane.waiting.pop(task, None)
        lane.jobs -= 1
        if not lane.jobs:
            del self._lanes[key]
        self._jobs.discard(task)
        self.bytes -= size
        self._on_depth(len(self._jobs))
        self._on_bytes(self.bytes)
        if not self._jobs:
            self._idle.set()

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
