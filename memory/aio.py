"""Futures for reads that go out at once.

A store read that is a future (the SQLite store's: handed to a lane in the step that asks)
needs no task to run it, and ``joined`` passes the results of several on in the turn of the
loop where the last one ends. Each level of tasks or gathers between a read's end and the
code waiting for it is one more turn of the event loop, and a turn of a busy loop takes
every other ready callback's time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

__all__ = ["done", "joined"]

T = TypeVar("T")


def done(value: T) -> asyncio.Future[T]:
    """``value`` as a future that has it already (a read with nothing to ask)."""
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


def joined(reads: Sequence[Awaitable[Any]], make: Callable[[list[Any]], T]) -> asyncio.Future[T]:
    """``make`` of the results of ``reads``, in their order, once every one has ended: what
    awaiting ``asyncio.gather`` and then calling ``make`` does, a turn of the loop sooner. A
    read that is a coroutine gets a task. The first failure (or a cancelled read) ends it,
    the others' failures are retrieved when they end; cancelling it cancels the reads."""
    loop = asyncio.get_running_loop()
    parts = [asyncio.ensure_future(read, loop=loop) for read in reads]
    out: asyncio.Future[T] = loop.create_future()
    left = len(parts)

    def ended(part: asyncio.Future[Any]) -> None:
        nonlocal left
        left -= 1
        if part.cancelled():
            if not out.done():
                out.cancel()
            return
        failure = part.exception()  # retrieved: a failure after the first is seen too
        if out.done():
            return
        if failure is not None:
            out.set_exception(failure)
        elif not left:
            try:
                out.set_result(make([p.result() for p in parts]))
            except Exception as exc:  # make's own bug reaches whoever waits
                out.set_exception(exc)

    def stopped(_: asyncio.Future[T]) -> None:
        if out.cancelled():
            for part in parts:
                part.cancel()

    if not parts:
        out.set_result(make([]))
        return out
    for part in parts:
        part.add_done_callback(ended)
    out.add_done_callback(stopped)
    return out
