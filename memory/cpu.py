"""Where the memory side's CPU work runs: never on the event loop.

Redaction, statement extraction, turn splitting and rendering, snippets, token counts and
distillation parsing all scan text whose size a request decides. On the loop, one long
history would hold up every other session's requests; in a worker the loop keeps serving
(CPython hands the GIL back every few milliseconds, and tiktoken and SQLite release it).
The functions run are the same pure functions, so the results are the same bytes.

The memory runtime owns one small thread pool and shuts it down with the side; the classes
take an ``Offload`` through their constructors and default to ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, Protocol, TypeVar

from memory.lanes import Lane

__all__ = ["THREADS", "Offload", "Pool"]

P = ParamSpec("P")
T = TypeVar("T")
# Two: the threads share the GIL with the loop, so more only take turns at it (4 and 1
# measured the same under bench/load.py); two keep a turn's recall from waiting behind one
# long ingest job.
THREADS = 2


class Offload(Protocol):
    """Runs ``fn(*args, **kwargs)`` off the event loop and returns its result."""

    def __call__(
        self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> Awaitable[T]: ...


class Pool:
    """The memory side's worker threads: ``run`` for the work a request waits for (a turn's
    recall), ``background`` for what none waits for (storing episodes, distillation), on a
    thread of its own so that under load a turn's recall never queues behind a backlog of
    writes."""

    def __init__(self, threads: int = THREADS, background_threads: int = 1) -> None:
        # Lanes: the oldest user turn's work first (memory.lanes).
        self._executor = Lane(threads, "ctxproxy-memory-cpu")
        self._background = Lane(background_threads, "ctxproxy-memory-bg")

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    async def background(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._background,
                                          functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Stop taking work; what runs finishes on its own (the side's tasks are gone)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._background.shutdown(wait=False, cancel_futures=True)
