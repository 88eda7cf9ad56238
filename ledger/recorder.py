"""Writes the ledger's rows off the request path: the relay hands over what it saw and goes
on; one worker task counts the tokens (in a thread), prices the direct counterfactual and
inserts the rows in batches. Bounded by rows and bytes; what does not fit is dropped and
counted, never waited for. Owned by the app: started and drained in its cleanup context."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import orjson

from ledger.counterfactual import DirectCache, PartCounter, cacheable
from ledger.model import Ledger, LedgerError, Record

__all__ = ["Bodies", "DropReason", "Pending", "Recorder"]

log = logging.getLogger("ctxproxy.ledger")

DropReason = Literal["full", "failed"]
Offload = Callable[..., Awaitable[Any]]
BATCH = 200
PRUNE_EVERY_S = 3600.0
DAY_S = 86_400.0


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
    bodies: Bodies | None = None


class Recorder:
    """At most ``max_rows`` rows and ``max_bytes`` of bodies waiting; one worker."""

    def __init__(
        self,
        ledger: Ledger,
        counter: PartCounter,
        *,
        direct: DirectCache | None = None,
        retention_days: float = 30.0,
        max_rows: int = 10_000,
        max_bytes: int = 256 * 1024 * 1024,
        offload: Offload = asyncio.to_thread,
        on_drop: Callable[[DropReason, int], None] = lambda reason, n: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._ledger = ledger
        self._counter = counter
        self._direct = direct or DirectCache()
        self._retention_s = retention_days * DAY_S
        self._queue: asyncio.Queue[Pending] = asyncio.Queue(max_rows)
        self._max_bytes = max_bytes
        self._offload = offload
        self._on_drop = on_drop
        self._clock = clock
        self._worker: asyncio.Task[None] | None = None
        self._pruned_at = 0.0
        self.bytes = 0
        self.written = 0
        self.dropped = 0

    def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.create_task(self._work(), name="ctxproxy-ledger")

    def put(self, pending: Pending) -> bool:
        """Queue one row (never waits); False when it was dropped (counted)."""
        size = _size(pending)
        if self.bytes + size > self._max_bytes and not self._queue.empty():
            self._drop("full", 1)
            return False
        try:
            self._queue.put_nowait(pending)
        except asyncio.QueueFull:
            self._drop("full", 1)
            return False
        self.bytes += size
        return True

    async def join(self) -> None:
        """Wait until every queued row is written (tests, shutdown)."""
        await self._queue.join()

    async def close(self, timeout_s: float = 5.0) -> None:
        if self._worker is None:
            return
        try:
            await asyncio.wait_for(self._queue.join(), timeout_s)
        except TimeoutError:
            log.warning("ledger rows still queued at shutdown were dropped: %d",
                        self._queue.qsize())
        self._worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._worker
        self._worker = None

    def _drop(self, reason: DropReason, n: int) -> None:
        self.dropped += n
        self._on_drop(reason, n)

    async def _work(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await self._write(batch)
            finally:
                for pending in batch:
                    self.bytes -= _size(pending)
                    self._queue.task_done()

    async def _write(self, batch: list[Pending]) -> None:
        try:
            records = await self._offload(self.measure_all, batch)
        except Exception:
            log.exception("measuring ledger rows failed")
            self._drop("failed", len(batch))
            return
        try:
            await self._ledger.insert(records)
            self.written += len(records)
            await self._prune_now_and_then()
        except LedgerError as exc:
            log.warning("ledger write failed: %s", exc)
            self._drop("failed", len(batch))
        except Exception:
            # A bug in one batch must not stop the worker, and every later row with it.
            log.exception("ledger write failed")
            self._drop("failed", len(batch))

    async def _prune_now_and_then(self) -> None:
        now = time.monotonic()
        if self._retention_s <= 0 or now - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        gone = await self._ledger.prune(self._clock() - self._retention_s)
        if gone:
            log.info("ledger: %d rows past the retention removed", gone)

    def measure_all(self, batch: list[Pending]) -> list[Record]:
        """Count and price a batch, in arrival order (a thread: no event loop here). A body
        that cannot be counted (an item nested deeper than the serialiser goes) leaves its
        row without token counts, and the others are counted."""
        records = []
        for pending in batch:
            try:
                records.append(self.measure(pending))
            except Exception as exc:
                log.warning("ledger: a request's tokens could not be counted: %s",
                            type(exc).__name__)
                records.append(pending.record)
        return records

    def measure(self, pending: Pending) -> Record:
        record = pending.record
        if not pending.parsed:
            return record
        bodies = pending.bodies
        if bodies is None:
            bodies = Bodies(
                orjson.loads(pending.raw),
                None if pending.forwarded is None else orjson.loads(pending.forwarded),
                _size(pending),
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


def _size(pending: Pending) -> int:
    if pending.bodies is not None:
        return pending.bodies.size
    return len(pending.raw) + (len(pending.forwarded) if pending.forwarded is not None else 0)
