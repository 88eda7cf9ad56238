"""Where the memory side's CPU work runs: never on the event loop.

Redaction, statement extraction, turn splitting and rendering, snippets, token counts and
distillation parsing all scan text whose size a request decides. On the loop, one long
history would hold up every other session's requests; in a worker the loop keeps serving
(CPython hands the GIL back every few milliseconds, and tiktoken and SQLite release it).
The functions run are the same pure functions, so the results are the same bytes.

The memory runtime owns one small thread pool and shuts it down with the side; the classes
take an ``Offload`` through their constructors and default to ``asyncio.to_thread``. The
background work (storing episodes, distillation's parsing) no request waits for runs in a
child process of the worker when ``CTXPROXY_MEMORY_PROCESS`` is on (``Child``): there it
does not hold the worker's GIL. So, with the same setting, do the SQLite store's searches, which
a request waits for, in processes of their own at the worker's priority (``Served``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import logging
import multiprocessing
import os
import pickle
import queue
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

from ctxproxy.injectors.redact import redact
from ctxproxy.memory.lanes import Lane, name_os_thread

__all__ = [
    "SMALL", "SMALL_BODY", "SMALL_ITEMS", "THREADS", "Child", "ChildUnavailable", "NoChild",
    "Offload", "Pool", "Served", "fits", "placed", "sized", "small_history", "warm",
]

log = logging.getLogger("ctxproxy.memory")

P = ParamSpec("P")
T = TypeVar("T")
# Two: the threads share the GIL with the loop, so more only take turns at it (bench/load.py
# could not tell 4 from 1: bench/RESULTS.md, Load); two keep a turn's recall from waiting behind one
# long ingest job.
THREADS = 2
# Characters of input below which a call runs in place: from microseconds (a query's
# questions) to a few milliseconds (a recall's snippets and token counts). Its trip to a
# thread cost a new turn far more than such work under bench/load.py's chat shape (the thread
# waits for the GIL, up to the switch interval, and its answer for the loop; bench/RESULTS.md,
# Load), and pure Python holds the GIL in the thread as on the loop:
# a thread only cuts long work into slices. The bound keeps what the loop does per call a
# constant.
SMALL = 32 * 1024
# A pass over a request's history (splitting it into turns, keying its answered turn) runs in
# place below both: each item costs a few microseconds of Python, and the text it digests
# (at C speed) is at most the request's bytes.
SMALL_ITEMS = 512
SMALL_BODY = 256 * 1024


class Offload(Protocol):
    """Runs ``fn(*args, **kwargs)`` off the event loop and returns its result."""

    def __call__(
        self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> Awaitable[T]: ...


async def sized(
    offload: Offload, size: int, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
) -> T:
    """``fn(*args, **kwargs)`` in place when its input (``size`` characters) is SMALL, else
    through ``offload``."""
    return await placed(offload, fits(size), fn, *args, **kwargs)


def fits(size: int) -> bool:
    """Whether work on ``size`` characters runs in place (SMALL), not through the offload."""
    return size <= SMALL


async def placed(
    offload: Offload, here: bool, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
) -> T:
    """``fn(*args, **kwargs)`` in place when ``here`` (its input is small: ``sized``,
    ``small_history``), else through ``offload``. In place, nothing is awaited."""
    if here:
        return fn(*args, **kwargs)
    return await offload(fn, *args, **kwargs)


def small_history(items: int, size: int) -> bool:
    """Whether a pass over a history of ``items`` items in a request of ``size`` bytes runs
    in place (SMALL_ITEMS, SMALL_BODY)."""
    return items <= SMALL_ITEMS and size <= SMALL_BODY


class Pool:
    """The memory side's worker threads: ``run`` for the work a request waits for (a turn's
    recall), ``background`` for what none waits for (storing episodes, distillation), on a
    thread of its own so that under load a turn's recall never queues behind a backlog of
    writes."""

    def __init__(
        self, threads: int = THREADS, background_threads: int = 1, *, process: bool = False
    ) -> None:
        # Lanes: the oldest user turn's work first (memory.lanes).
        self._executor = Lane(threads, "ctxproxy-memory-cpu")
        self._background = Lane(background_threads, "ctxproxy-memory-bg")
        self._child = Child() if process else None

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    async def background(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn`` (a module's function, its arguments picklable) in the child process when
        there is one; on the background thread when there is none, or it died."""
        call = functools.partial(fn, *args, **kwargs)
        if self._child is not None:
            try:
                return await self._child.run(call)
            except NoChild as exc:  # this machine cannot start one: do not try every call
                self._child = None
                log.warning("memory background work in a thread of the worker: %s", exc)
            except ChildUnavailable as exc:  # it died: this call here, the next in another
                log.warning("memory background work in a thread of the worker: %s", exc)
        return await asyncio.get_running_loop().run_in_executor(self._background, call)

    async def start(self) -> None:
        """The child now, and ready (``Child.start``), rather than on the first episode."""
        if self._child is not None:
            await self._child.start()

    async def close(self) -> None:
        """Stop taking work; what runs in the threads finishes on its own (the side's tasks
        are gone), and the child process has ended when this returns."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._background.shutdown(wait=False, cancel_futures=True)
        if self._child is not None:
            await asyncio.to_thread(self._child.close, wait=True)


class ChildUnavailable(Exception):
    """The child process cannot run a call: it died, or none can be started (``NoChild``).
    The call has not run (or died with the child): run it elsewhere."""


class NoChild(ChildUnavailable):
    """No child process can be started here (no ``/dev/shm`` for its queue's lock, a process
    limit, ...)."""


NICE = 19  # the lowest: the child works when the worker, and whatever else, leave a core idle
PARENT_POLL_S = 1.0


class Child:
    """The background work (storing episodes, distillation's parsing) in one child process
    of the worker, spawned on first use and again after it died.

    In a thread of the worker, that work holds the worker's GIL: each system call of the event
    loop (a relayed chunk's read and write) waits for it (bench/gil_convoy.py), and after a
    restart the backlog of the sessions' episodes slowed every stream (bench/RESULTS.md,
    Load). Here it takes the same cores at the lowest priority, not the
    GIL. The functions are pure: the same records come back as a thread would make."""

    def __init__(self) -> None:
        self._executor: ProcessPoolExecutor | None = None

    async def start(self) -> None:
        """Spawn the child now and wait, up to START_WAIT_S, until it is ``warm``: spawned on
        the first turns after a start, it took long enough over their episodes that
        bench.recall's sessions had asked for them (bench/RESULTS.md, Memory recall). A
        failure is left for the first call to find."""
        try:
            started = self._submit(warm)
        except ChildUnavailable:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.wrap_future(started), START_WAIT_S)

    async def run(self, call: Callable[[], T]) -> T:
        future = self._submit(call)
        try:
            return await asyncio.wrap_future(future)
        except BrokenProcessPool as exc:  # it died with the call, or before it
            self.close()
            raise ChildUnavailable("the child process died") from exc

    def _submit(self, call: Callable[[], T]) -> Future[T]:
        try:
            if self._executor is None:
                self._executor = ProcessPoolExecutor(
                    1, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start_child, initargs=(os.getpid(),),
                )
            return self._executor.submit(call)
        except BrokenProcessPool as exc:  # it died since the last call
            self.close()
            raise ChildUnavailable("the child process died") from exc
        except (OSError, ImportError, NotImplementedError, RuntimeError) as exc:
            self.close()
            raise NoChild(f"no child process: {exc}") from exc

    def close(self, *, wait: bool = False) -> None:
        """Stop the child; ``wait``: until it has ended. A worker process must wait (its
        exit would otherwise race the executor's manager thread: once the process's exit
        has closed the child's call queue, the manager's stop message never reaches the
        child, and the exit waits for the child for ever)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=wait, cancel_futures=True)


def _start_child(parent: int) -> None:
    # The worker's stop (SIGTERM, Ctrl-C to the group) ends the child through its parent's
    # shutdown, not by an interrupt in the middle of a call.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.nice(NICE)
    threading.Thread(target=_end_with, args=(parent,), name="ctxproxy-memory-parent",
                     daemon=True).start()


def warm() -> None:
    """Load what the background work (episodes, distillation's parsing) would load on its
    first call: the modules and the redaction patterns (compiled once). Not the tokenizer:
    that work counts no tokens, and it would take tens of MiB more a child."""
    importlib.import_module("ctxproxy.memory.ingest")
    importlib.import_module("ctxproxy.memory.distill")
    redact("")


def _end_with(parent: int) -> None:
    """A parent killed outright shuts nothing down: the child looks for itself."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(0)


class Served(Generic[T]):
    """One function served by ``processes`` child processes, a call at a time each, to the
    threads that call ``call`` (a lane's). For work a request waits for that would hold the
    worker's GIL: in a thread, each of its steps in Python waits for the event loop and makes
    the loop wait (bench/gil_convoy.py); here it runs beside the loop.

    ``make(*args)`` runs in each child once, and returns the function its calls run (it
    opens what they share: a database connection). A child that dies fails the call it had
    (``ChildUnavailable``: run it elsewhere) and is spawned again by the next; a child ends
    when the process that spawned it closes its pipe (``close``, or any exit)."""

    def __init__(
        self, processes: int, make: Callable[..., Callable[..., T]], *args: Any, name: str
    ) -> None:
        self._make, self._args, self._name = make, args, name
        self._context = multiprocessing.get_context("spawn")
        # Each child is a slot: (its process, our end of its pipe), or None until spawned.
        self._idle: queue.SimpleQueue[tuple[BaseProcess, Connection] | None] = (
            queue.SimpleQueue())
        self._slots = processes
        self._children: set[tuple[BaseProcess, Connection]] = set()
        self._lock = threading.Lock()
        for _ in range(processes):
            self._idle.put(None)

    def start(self) -> None:
        """Spawn every child now and wait until each is ready, rather than on first use.
        Raises NoChild when none can be started here, ChildUnavailable when one died
        starting (the next call tries again)."""
        slots = [self._idle.get() for _ in range(self._slots)]
        try:
            for n, slot in enumerate(slots):
                slots[n] = slot or self._spawn()
        finally:
            for slot in slots:
                self._idle.put(slot)

    def call(self, *args: Any) -> T:
        """``fn(*args)`` in an idle child (waiting for one), ``fn`` being what ``make`` gave.
        Its exception is raised here. Raises ChildUnavailable when the child died, NoChild
        when none can be started."""
        slot = self._idle.get()
        try:
            if slot is None:
                slot = self._spawn()
            _, pipe = slot
            try:
                pipe.send(args)
                ok, out = pipe.recv()
            except (EOFError, OSError) as exc:
                self._retire(slot)
                slot = None
                raise ChildUnavailable(f"{self._name} process died") from exc
        finally:
            self._idle.put(slot)
        if not ok:
            raise out
        return out  # type: ignore[no-any-return]

    def pids(self) -> list[int]:
        """The children's process ids (the ones alive or not yet found dead)."""
        with self._lock:
            return [p.pid for p, _ in self._children if p.pid is not None]

    def close(self) -> None:
        """End every child: each reads the end of its pipe once its call is done. Call it
        when no call is under way; a later call spawns a child again."""
        slots = [self._idle.get() for _ in range(self._slots)]
        with self._lock:
            children, self._children = self._children, set()
        for _ in slots:
            self._idle.put(None)
        for process, pipe in children:
            pipe.close()
            process.join(CLOSE_WAIT_S)
            if process.is_alive():
                process.kill()
                process.join()

    def _spawn(self) -> tuple[BaseProcess, Connection]:
        ours, theirs = self._context.Pipe()
        process = self._context.Process(
            target=_serve, args=(theirs, self._name, self._make, self._args),
            name=self._name, daemon=True)
        try:
            process.start()
        except (OSError, ImportError, NotImplementedError, RuntimeError) as exc:
            ours.close()
            raise NoChild(f"no {self._name} process: {exc}") from exc
        finally:
            theirs.close()
        slot = (process, ours)
        # Ready once its modules are loaded and ``make`` has run: a call never waits for that.
        try:
            if not ours.poll(START_WAIT_S):
                raise EOFError(f"not ready in {START_WAIT_S:g} s")
            ours.recv()
        except (EOFError, OSError) as exc:
            self._retire(slot)
            raise ChildUnavailable(f"{self._name} process did not start: {exc}") from exc
        with self._lock:
            self._children.add(slot)
        return slot

    def _retire(self, slot: tuple[BaseProcess, Connection]) -> None:
        process, pipe = slot
        with self._lock:
            self._children.discard(slot)
        pipe.close()
        if process.is_alive():
            process.kill()
        process.join()


START_WAIT_S = 30.0
CLOSE_WAIT_S = 5.0


def _serve(pipe: Connection, name: str, make: Callable[..., Callable[..., Any]],
           args: tuple[Any, ...]) -> None:
    """A ``Served`` child: the calls off its pipe until the pipe ends."""
    # The worker's stop (SIGTERM, Ctrl-C to the group) ends the child through its pipe, once
    # the worker is done with it, not by an interrupt in the middle of a call.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    name_os_thread(name)
    fn = make(*args)
    pipe.send(None)  # ready
    while True:
        try:
            call = pipe.recv()
        except (EOFError, OSError):
            return
        try:
            reply: tuple[bool, Any] = (True, fn(*call))
        except Exception as exc:
            reply = (False, exc)
        try:
            pipe.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            pipe.send((False, RuntimeError(f"{name}: unpicklable reply: {exc!r}")))
        except (EOFError, OSError):
            return
