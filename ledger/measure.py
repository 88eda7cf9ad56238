"""Counting and pricing the ledger's rows, and where that runs.

Every request's bodies are measured part by part: each part serialised and digested, its
tokens counted once (``ledger.counterfactual``). That is CPU in proportion to the bodies,
most of it holding the GIL (orjson keeps it). In a thread of the worker it makes every system
call of the worker's event loop wait for the GIL (bench/gil_convoy.py: pipe round trips drop
by an order of magnitude beside it; bench/RESULTS.md, The event loop beside worker threads),
and the loop relays every stream. So the
workers count in a child process of their own (``InProcess``): the same cores, not the same
GIL. The child takes the bytes and parses them again, which costs more CPU than counting the
bodies the worker already parsed (``InThread``, for the tests and for
``CTXPROXY_STATS_PROCESS=false``); it runs at the lowest priority, so a saturated machine
serves the streams first and lets the rows wait (the recorder drops what does not fit,
counted). Measured with bench/load.py (agent shape, 2 workers): a lower added TTFB p99 than
counting in a thread, and than a child at a milder priority (bench/RESULTS.md, Load; Ledger
CPU).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from typing import Any, Protocol

import orjson

from ctxproxy.injectors import tokens
from ctxproxy.ledger.counterfactual import DirectCache, Nodes, PartCounter, cacheable
from ctxproxy.ledger.model import LedgerError, Record
from ctxproxy.request.protocol import PROTOCOLS, RESPONSES

__all__ = ["Bodies", "Counting", "InProcess", "InThread", "Known", "Measurer", "NodeRow",
           "Pending"]

log = logging.getLogger("ctxproxy.ledger")

# The ledger store's chain nodes of a batch's sessions (None: the store could not say), and
# the nodes a batch tells it back: (session, link, last used).
Known = dict[str, Nodes] | None
NodeRow = tuple[str, bytes, float]
NICE = 19  # the lowest: the child counts when the workers, and whatever else, leave a core idle
PARENT_POLL_S = 1.0


@dataclass(frozen=True, slots=True)
class Bodies:
    """A request's bodies as the proxy already parsed them, counted without a second parse.
    Read in the worker thread: nothing may change them once handed over."""

    client: dict[str, Any]  # the client's body (its own keys: not what the steps put in)
    forwarded: dict[str, Any] | None  # the body that was serialised upstream; None: the client's
    size: int  # the bytes both were parsed from: what the queue's byte budget counts


@dataclass(frozen=True, slots=True)
class Pending:
    """A request the relay is done with: its row so far, and the bodies to count."""

    record: Record
    raw: bytes  # the client's body (b"" when ``bodies`` holds it)
    forwarded: bytes | None  # what went upstream; None: the client's bytes, as sent
    parsed: bool  # the client's body is a Responses request (else: tokens unknown)
    # The same, parsed: counted in place of the bytes, which the row then does not keep
    # (parsed, a body takes about twice its bytes' memory: keeping both would double a row's).
    # Never sent to a child process: there the bytes go, cheaper to send than the objects.
    bodies: Bodies | None = None

    @property
    def size(self) -> int:
        """The bytes the row's bodies came from: what the recorder's byte budget counts."""
        if self.bodies is not None:
            return self.bodies.size
        return len(self.raw) + (len(self.forwarded) if self.forwarded is not None else 0)


class Measurer:
    """Counts a row's tokens and prices the direct counterfactual, remembering each part's
    count and each session's chain (so rows must come in the order the requests ended)."""

    def __init__(self, counter: PartCounter, direct: DirectCache | None = None) -> None:
        self._counter = counter
        self._direct = direct or DirectCache()

    def measure_all(self, batch: list[Pending]) -> list[Record]:
        """Count and price a batch, in arrival order (no event loop here). A body that
        cannot be counted (an item nested deeper than the serialiser goes) leaves its row
        without token counts, and the others are counted."""
        records = []
        for pending in batch:
            try:
                records.append(self.measure(pending))
            except Exception as exc:
                log.warning("ledger: a request's tokens could not be counted: %s",
                            type(exc).__name__)
                records.append(pending.record)
        return records

    def measure_known(self, batch: list[Pending], known: Known
                      ) -> tuple[list[Record], list[NodeRow]]:
        """``measure_all``, each session's direct cache first taken from ``known`` (the
        store's: what every replica sent of it), and the nodes the store must now be told."""
        if known is None:
            return self.measure_all(batch), []
        for session, nodes in known.items():
            self._direct.seed(session, nodes)
        records = self.measure_all(batch)
        writes = [(session, link, used) for session, nodes in known.items()
                  for link, used in self._direct.changed(session, nodes)]
        return records, writes

    def measure(self, pending: Pending) -> Record:
        record = pending.record
        if not pending.parsed:
            return record
        bodies = pending.bodies
        if bodies is None:
            # Bytes in the client's protocol, counted as its provider reads a prompt (the
            # proxy's own parsed bodies are Responses ones).
            shape = PROTOCOLS.get(record.protocol, RESPONSES)
            bodies = Bodies(
                shape.counted(orjson.loads(pending.raw)),
                None if pending.forwarded is None
                else shape.counted(orjson.loads(pending.forwarded)),
                pending.size,
            )
        client, forwarded_tokens = self._counter.measure_pair(bodies.client, bodies.forwarded)
        shared = 0
        if record.status < 400:
            # A request the upstream refused would not have warmed its cache either.
            shared = self._direct.read_and_store(record.session_id, client, record.at)
        if record.input_tokens is None:
            return replace(record, client_tokens=client.tokens,
                           forwarded_tokens=forwarded_tokens)
        scale = record.input_tokens / forwarded_tokens if forwarded_tokens else 1.0
        return replace(
            record, client_tokens=client.tokens, forwarded_tokens=forwarded_tokens,
            direct_input=round(client.tokens * scale),
            direct_cached=cacheable(round(shared * scale)) if scale != 1.0 else shared,
        )


class Counting(Protocol):
    """Where the recorder's batches are measured."""

    takes_bodies: bool  # whether rows may hand over parsed bodies (else only bytes)

    def measure_all(self, batch: list[Pending]) -> Awaitable[list[Record]]: ...

    def measure_known(self, batch: list[Pending], known: Known
                      ) -> Awaitable[tuple[list[Record], list[NodeRow]]]: ...

    async def close(self) -> None: ...


class InThread:
    """In a thread of this process, from the bodies the proxy parsed."""

    takes_bodies = True

    def __init__(self, measurer: Measurer,
                 offload: Callable[..., Awaitable[Any]] = asyncio.to_thread) -> None:
        self.measurer = measurer
        self._offload = offload

    async def measure_all(self, batch: list[Pending]) -> list[Record]:
        records: list[Record] = await self._offload(self.measurer.measure_all, batch)
        return records

    async def measure_known(self, batch: list[Pending], known: Known
                            ) -> tuple[list[Record], list[NodeRow]]:
        done: tuple[list[Record], list[NodeRow]] = await self._offload(
            self.measurer.measure_known, batch, known)
        return done

    async def close(self) -> None:
        pass


class InProcess:
    """In one child process, started by ``start`` (spawned: a fork of a process with threads
    and a loop is not safe) and again on the next batch after it died. A batch the child
    died with is lost (the recorder counts it failed)."""

    takes_bodies = False

    def __init__(self, nice: int = NICE) -> None:
        self._nice = nice
        self._executor: ProcessPoolExecutor | None = None

    def start(self) -> None:
        """The child now, its tokenizer loading, rather than on the first row. LedgerError:
        this machine cannot start one (no ``/dev/shm`` for its queue's lock, say)."""
        self._submit(_warm_child)

    def _submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """``fn(*args)`` in the child, started now if there is none (LedgerError: it cannot
        be; the next call tries again)."""
        try:
            if self._executor is None:
                self._executor = ProcessPoolExecutor(
                    1, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start_child, initargs=(self._nice, os.getpid()),
                )
            return self._executor.submit(fn, *args)  # the child is spawned here
        except (OSError, ImportError, NotImplementedError) as exc:
            executor, self._executor = self._executor, None
            if executor is not None:
                executor.shutdown(wait=False)
            raise LedgerError(f"no process for the counting: {exc}") from exc

    async def measure_all(self, batch: list[Pending]) -> list[Record]:
        records, _ = await self.measure_known(batch, None)
        return records

    async def measure_known(self, batch: list[Pending], known: Known
                            ) -> tuple[list[Record], list[NodeRow]]:
        # One batch at a time (the recorder has one worker): the pool that broke is this one.
        try:
            done: tuple[list[Record], list[NodeRow]] = await asyncio.wrap_future(
                self._submit(_measure_in_child, batch, known))
        except BrokenProcessPool as exc:  # it died with the batch, or before it
            self._executor = None  # the next batch starts another
            raise LedgerError("the counting process died with the batch") from exc
        return done

    async def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.to_thread(executor.shutdown, wait=True, cancel_futures=True)


# --- in the child ------------------------------------------------------------------------

_measurer: Measurer | None = None


def _start_child(nice: int, parent: int) -> None:
    global _measurer
    # The worker's stop (SIGTERM, Ctrl-C to the group) ends the child through its parent's
    # shutdown, not by a KeyboardInterrupt in the middle of a batch.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.nice(nice)
    threading.Thread(target=_end_with, args=(parent,), name="ctxproxy-ledger-parent",
                     daemon=True).start()
    _measurer = Measurer(PartCounter(tokens.count))


def _end_with(parent: int) -> None:
    """A parent killed outright (SIGKILL, the OOM killer) shuts nothing down, and the child
    holds its own queue's both ends, so it would never read an end of file: it looks."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(0)


def _warm_child() -> None:
    tokens.encoding_name()


def _measure_in_child(batch: list[Pending], known: Known
                      ) -> tuple[list[Record], list[NodeRow]]:
    assert _measurer is not None, "the child's initializer did not run"
    return _measurer.measure_known(batch, known)
