"""Thread lanes that serve the oldest user turn first.

A new turn's memory goes through a chain of hops, one after another: split the history (a CPU
thread), write working memory (the store's writer), read the standing memory and search (the
store's readers), pick (a CPU thread), render. Each hop has a queue of its own. Served first
come, first served, a turn that waited at one hop queues again at the next behind every turn
that arrived meanwhile, and its write to the store waits behind every episode write handed in
before it. So a lane serves work by when the user turn it is for began (``turn``): a turn
under way goes before one that just arrived, at every hop. Measured: a turn's write behind a
restart's backlog of episode writes waits less (bench/lanes.py; bench/RESULTS.md, A turn's
write behind episode writes); bench/load.py did not tell the two orders apart, its lanes
seldom hold a queue (bench/RESULTS.md, Load).

A turn's work is due when the turn began only while its request can still use it: once the
turn's budget has passed (``turn``'s ``budget_s``), its request has gone without this turn's
memory, and what is left is for the turn's next request. Oldest first would then keep every
later turn waiting for work no request is waiting for, and under a burst more than the cores can
do in a budget (a restart: every session new to the process at once) every turn would be late
(the lanes' domino). So a lane taking a late turn's work puts it back, due when it found it
late: behind the turns that can still be in time, before the turns and the background work
that come after it.

Work that no request waits for (storing episodes, distillation, refreshing TTLs: ``background``)
is due ``BACKGROUND_DELAY_S`` after it was handed in: a turn's writes go before the episode
writes handed in less than that before them, and the backlog still moves, waiting at most that
much longer than request work handed in at the same time. Work of neither kind is due when it
is handed in. Measured on a restart (bench/load.py's warm-up, agent shape, 2 workers;
bench/RESULTS.md, Load): fewer turns went without memory in time with both than with a
shorter delay and no late turns put back, or with either change alone.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import heapq
import itertools
import math
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

__all__ = ["BACKGROUND_DELAY_S", "Lane", "background", "due", "name_os_thread", "turn"]

P = ParamSpec("P")
T = TypeVar("T")

BACKGROUND_DELAY_S = 5.0
_BACKGROUND = (-1.0, math.inf)  # the mark of background work (monotonic times are never negative)

# When the user turn the current task works for began (time.monotonic()) and when its budget
# runs out, or _BACKGROUND.
_turn_mark: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar(
    "ctxproxy_turn_mark", default=None
)


def turn(began: float, budget_s: float = math.inf) -> None:
    """Mark the current task (and the tasks it starts from now on) as preparing a user turn
    that began at ``began`` (``time.monotonic()``), whose request waits ``budget_s`` at most."""
    _turn_mark.set((began, began + budget_s))


def background() -> None:
    """Mark the current task (and the tasks it starts from now on) as work no request waits
    for."""
    _turn_mark.set(_BACKGROUND)


def due() -> tuple[float, float]:
    """When work handed in now by the current task is due (the lanes' order), and when it
    is late (its turn's budget has run out)."""
    mark = _turn_mark.get()
    now = time.monotonic()
    if mark is None:
        return now, math.inf
    if mark == _BACKGROUND:
        return now + BACKGROUND_DELAY_S, math.inf
    return mark


_PR_SET_NAME = 15
OS_NAME_BYTES = 15  # Linux keeps 15 bytes of a thread's name


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` where ``top -H``, ``ps -L`` and ``/proc`` show it
    (Linux; Python 3.11 names only its own thread objects, so every thread shows as
    "python"). The ``ctxproxy-`` prefix is left out: it would take most of the 15 bytes."""
    if not sys.platform.startswith("linux"):
        return
    short = name.removeprefix("ctxproxy-").encode()[:OS_NAME_BYTES]
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(short), 0, 0, 0)


class Lane(Executor):
    """``threads`` worker threads taking work earliest ``due()`` first (ties: in the order
    handed in). ``submit`` reads ``due()`` in the caller's context: the event loop's thread,
    where the task's marks are."""

    def __init__(self, threads: int, name: str) -> None:
        # (due, order handed in, late, the future, the call)
        self._ready: list[tuple[float, int, float, Future[Any], Callable[[], Any]]] = []
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._closed = False
        # Daemons: a lane nobody shut down does not hold up the interpreter's exit (the owners
        # shut theirs down on close; a store write cut at exit is a transaction not made).
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}_{n}", daemon=True)
            for n in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        return self._put(due(), fn, *args, **kwargs)

    def submit_last(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """``submit``, due after all work handed in before it (closing a connection the
        queued work still needs)."""
        return self._put((math.inf, math.inf), fn, *args, **kwargs)

    def _put(self, when: tuple[float, float], fn: Callable[P, T], /, *args: P.args,
             **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        at, late = when
        with self._changed:
            if self._closed:
                raise RuntimeError("cannot schedule new work after shutdown")
            heapq.heappush(self._ready, (at, next(self._order), late, future,
                                         lambda: fn(*args, **kwargs)))
            self._changed.notify()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more work; with ``cancel_futures`` drop what has not started; the threads
        end once the lane is empty (``wait``: this returns when they have)."""
        with self._changed:
            self._closed = True
            if cancel_futures:
                for *_, future, _ in self._ready:
                    future.cancel()
                self._ready.clear()
            self._changed.notify_all()
        if wait:
            for thread in self._threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _work(self) -> None:
        name_os_thread(threading.current_thread().name)
        while True:
            with self._changed:
                while not self._ready and not self._closed:
                    self._changed.wait()
                if not self._ready:
                    return  # closed and empty
                _, order, late, future, call = heapq.heappop(self._ready)
                now = time.monotonic()
                if late <= now and self._ready:
                    # Its request went without it: due now, as if handed in now (once:
                    # from now on it is late for no one).
                    heapq.heappush(self._ready, (now, order, math.inf, future, call))
                    continue
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = call()
            except BaseException as exc:  # handed to whoever awaits the future
                future.set_exception(exc)
            else:
                future.set_result(result)
