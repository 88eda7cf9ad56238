"""Writes the ledger's rows off the request path: the relay hands over what it saw and goes
on; one worker task (``plumbing.batches``) has the tokens counted and the direct
counterfactual priced (in a child process, or a thread: ``ledger.measure``) and inserts the
rows in batches. The direct estimate's state is read from the store before each batch and
written back with its rows, so that any replica continues a session's estimate. Bounded by
rows and bytes; what does not fit is dropped and counted, never waited for. Owned by the
app: started and drained in its cleanup context."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Literal

from ctxproxy.ledger.counterfactual import TTL_S
from ctxproxy.ledger.measure import Counting, Known, Pending
from ctxproxy.ledger.model import Ledger, LedgerError
from ctxproxy.plumbing.batches import BatchWriter

__all__ = ["DropReason", "Recorder"]

log = logging.getLogger("ctxproxy.ledger")

DropReason = Literal["full", "failed"]
BATCH = 200
BATCH_BYTES = 8 * 1024 * 1024  # of bodies: what one hand-over to the counting process copies
PRUNE_EVERY_S = 3600.0
DAY_S = 86_400.0


class Recorder:
    """At most ``max_rows`` rows and ``max_bytes`` of bodies waiting; one worker."""

    def __init__(
        self,
        ledger: Ledger,
        counting: Counting,
        *,
        retention_days: float = 30.0,
        max_rows: int = 10_000,
        max_bytes: int = 256 * 1024 * 1024,
        on_drop: Callable[[DropReason, int], None] = lambda reason, n: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._ledger = ledger
        self.counting = counting
        self._retention_s = retention_days * DAY_S
        self._on_drop = on_drop
        self._clock = clock
        self._rows = BatchWriter(
            self._write, name="ctxproxy-ledger", size_of=lambda p: p.size,
            max_rows=max_rows, max_bytes=max_bytes, batch_rows=BATCH,
            batch_bytes=BATCH_BYTES, on_failed=lambda n: self._drop("failed", n))
        self._pruned_at = -PRUNE_EVERY_S  # the first write prunes, whatever the uptime
        self.written = 0
        self.dropped = 0

    def start(self) -> None:
        self._rows.start()

    def put(self, pending: Pending) -> bool:
        """Queue one row (never waits); False when it was dropped (counted)."""
        if self._rows.put(pending):
            return True
        self._drop("full", 1)
        return False

    async def join(self) -> None:
        """Wait until every queued row is written (tests, shutdown)."""
        await self._rows.join()

    async def close(self, timeout_s: float = 5.0) -> None:
        await self._rows.close(timeout_s)
        await self.counting.close()

    def _drop(self, reason: DropReason, n: int) -> None:
        self.dropped += n
        self._on_drop(reason, n)

    async def _known(self, batch: list[Pending]) -> Known:
        """The store's direct-cost state of the batch's sessions (what every replica recorded
        of them), or None when it cannot be read: then this process's own is used."""
        sessions = sorted({p.record.session_id for p in batch if p.parsed})
        if not sessions:
            return {}
        try:
            return await self._ledger.direct_nodes(
                sessions, min(p.record.at for p in batch) - TTL_S)
        except LedgerError as exc:
            log.warning("ledger: the direct-cost state could not be read: %s", exc)
            return None

    async def _write(self, batch: list[Pending]) -> None:
        try:
            records, nodes = await self.counting.measure_known(batch, await self._known(batch))
        except LedgerError as exc:
            log.warning("ledger rows could not be measured: %s", exc)
            self._drop("failed", len(batch))
            return
        except Exception:
            log.exception("measuring ledger rows failed")
            self._drop("failed", len(batch))
            return
        try:
            await self._ledger.insert(records, nodes)
            self.written += len(records)
            await self._prune_now_and_then(min(r.at for r in records))
        except LedgerError as exc:
            log.warning("ledger write failed: %s", exc)
            self._drop("failed", len(batch))

    async def _prune_now_and_then(self, oldest: float) -> None:
        """Drop what is past its time: the direct-cost state older than the TTL before the
        oldest row just written (by the rows' clock, which the next batch's rows read by),
        and rows past the retention."""
        now = time.monotonic()
        if now - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        await self._ledger.prune_direct(oldest - TTL_S)
        if self._retention_s <= 0:
            return
        gone = await self._ledger.prune(self._clock() - self._retention_s)
        if gone:
            log.info("ledger: %d rows past the retention removed", gone)
