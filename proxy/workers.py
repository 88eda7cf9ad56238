"""Several server processes on one port (``CTXPROXY_WORKERS`` > 1) and the parent that
supervises them.

Each worker is a fresh interpreter (multiprocessing's ``spawn``) serving the whole app on
the same port with ``SO_REUSEPORT``: the kernel spreads new connections over the workers'
listeners. ``spawn`` rather than ``fork``: a worker inherits no threads, locks, open
database handles or event-loop state from the parent, and nothing the parent imported has to
be fork-safe; the cost is one import of the app per worker, once, at start-up.

The parent serves nothing. It forwards SIGTERM and SIGINT to the workers and waits for them
to finish their open streams (each drains as a single process does). A worker that exits
before it is listening stops the server with exit status 1 (a port, store or setting it
cannot use would fail every restart too); a worker that dies later is logged as an error and
replaced.

The workers reach each other over Unix sockets in a directory of the server's own
(``Peers``): a scrape of /metrics adds up every worker's registry.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Literal

from ctxproxy.config import logs

__all__ = ["STOP_GRACE_S", "Peers", "Ready", "supervise", "tag_logs"]

log = logging.getLogger("ctxproxy")

# A worker waits up to 30 s for its open streams, then closes its stores and queues; past
# this the parent kills what is left and exits 1.
STOP_GRACE_S = 60.0

Ready = Callable[[], None]
"""Called by a worker once it listens."""

Target = Callable[[int, Connection], int]
"""Run worker ``index`` (picklable: a module-level function or a partial of one); it sends
on the connection once it listens and returns its exit status."""

Event = Literal["ready", "exit", "stop"]


@dataclass(frozen=True, slots=True)
class Peers:
    """Where worker ``index`` of ``count`` and its siblings listen to each other: a Unix
    socket each in ``directory``, which only the server's user can enter (mode 0700)."""

    directory: Path
    count: int
    index: int

    def socket(self, index: int) -> Path:
        return self.directory / f"worker-{index}.sock"

    def others(self) -> list[Path]:
        return [self.socket(n) for n in range(self.count) if n != self.index]


@dataclass(eq=False)
class _Worker:
    index: int
    process: BaseProcess
    ready_conn: Connection
    ready: bool = False


def supervise(count: int, target: Target, **listening: object) -> int:
    """Run ``count`` workers until SIGTERM or SIGINT; the exit status for the parent.

    ``listening``: fields for the "ctxproxy listening" line, logged once all workers listen.
    """
    return asyncio.run(_Supervisor(count, target, listening).run())


def run_worker(target: Target, index: int, ready: Connection) -> None:
    """A worker process's entry point (module-level, so that ``spawn`` can pickle it)."""
    raise SystemExit(target(index, ready))


def ready_signal(conn: Connection) -> Ready:
    """A worker's ``Ready``: tell the parent once, then close the pipe."""

    def ready() -> None:
        conn.send(os.getpid())
        conn.close()

    return ready


def tag_logs(index: int) -> None:
    """Add the worker's index and pid to every log line it writes (lines interleave)."""
    tags = {"worker": index, "pid": os.getpid()}

    def tag(record: logging.LogRecord) -> bool:
        setattr(record, logs.FIELDS, {**tags, **(getattr(record, logs.FIELDS, None) or {})})
        return True

    for handler in logging.getLogger().handlers:
        handler.addFilter(tag)


class _Supervisor:
    def __init__(self, count: int, target: Target, listening: dict[str, object]) -> None:
        self._count = count
        self._target = target
        self._listening = listening
        self._context = multiprocessing.get_context("spawn")
        self._events: asyncio.Queue[tuple[Event, _Worker | None]] = asyncio.Queue()
        self._workers: dict[int, _Worker] = {}

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._events.put_nowait, ("stop", None))
        for index in range(self._count):
            self._spawn(index)
        announced = False
        while True:
            event, worker = await self._events.get()
            if event == "stop":
                return await self._stop(0)
            assert worker is not None
            if event == "ready" and not announced and all(
                    w.ready for w in self._workers.values()):
                announced = True
                pids = [w.process.pid for w in self._workers.values()]
                log.info("ctxproxy listening", extra=logs.fields(
                    **self._listening, workers=self._count, pids=pids))
            elif event == "ready" and announced:
                log.info("worker replaced", extra=self._fields(worker))
            elif event == "exit" and not worker.ready:
                log.error("worker exited before it was listening: stopping",
                          extra=self._fields(worker))
                return await self._stop(1)
            elif event == "exit":
                log.error("worker exited unexpectedly: starting another",
                          extra=self._fields(worker))
                self._spawn(worker.index)

    def _spawn(self, index: int) -> None:
        receive, send = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=run_worker, args=(self._target, index, send), name=f"ctxproxy-worker-{index}"
        )
        process.start()
        send.close()  # the worker holds the only sending end: its exit closes the pipe
        worker = self._workers[index] = _Worker(index, process, receive)
        loop = asyncio.get_running_loop()
        loop.add_reader(receive.fileno(), self._on_message, worker)
        loop.add_reader(process.sentinel, self._on_exit, worker)

    def _on_message(self, worker: _Worker) -> None:
        loop = asyncio.get_running_loop()
        try:
            worker.ready_conn.recv()
        except (EOFError, OSError):
            pass  # it exited; the sentinel reports that
        else:
            worker.ready = True
            self._events.put_nowait(("ready", worker))
        loop.remove_reader(worker.ready_conn.fileno())

    def _on_exit(self, worker: _Worker) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(worker.process.sentinel)
        if not worker.ready_conn.closed:
            if worker.ready_conn.poll():  # it said it was ready just before it died
                self._on_message(worker)
            else:
                loop.remove_reader(worker.ready_conn.fileno())
            worker.ready_conn.close()
        worker.process.join()
        if self._workers.get(worker.index) is worker:
            del self._workers[worker.index]
        self._events.put_nowait(("exit", worker))

    async def _stop(self, status: int) -> int:
        """SIGTERM every worker and wait for them: ``status``, or 1 if one fails to stop."""
        log.info("shutting down: the workers are finishing their open streams",
                 extra=logs.fields(workers=len(self._workers)))
        for worker in self._workers.values():
            worker.process.terminate()  # SIGTERM
        try:
            async with asyncio.timeout(STOP_GRACE_S):
                while self._workers:
                    event, gone = await self._events.get()
                    # One that was not listening yet may die of the SIGTERM: nothing was open.
                    if event == "exit" and gone is not None and gone.ready and (
                            gone.process.exitcode != 0):
                        log.error("worker failed to stop cleanly", extra=self._fields(gone))
                        status = 1
        except TimeoutError:
            log.error("workers still running after %.0f s: killing them", STOP_GRACE_S,
                      extra=logs.fields(pids=[w.process.pid for w in self._workers.values()]))
            for worker in self._workers.values():
                worker.process.kill()
                worker.process.join()
            status = 1
        return status

    @staticmethod
    def _fields(worker: _Worker) -> dict[str, object]:
        code = worker.process.exitcode
        return logs.fields(worker=worker.index, pid=worker.process.pid,
                           **({} if code is None else {"exit_code": code}))
