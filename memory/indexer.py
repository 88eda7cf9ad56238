"""Embedding memories, off the request path: what ingest and distillation wrote, and backfill.

Ingest hands the records it stored to ``Indexer.notify``; a task of the indexer's own embeds
them in batches (``CTXPROXY_EMBEDDINGS_BATCH`` texts a call), each chunk looked up by its
digest first, so the same text is never embedded twice. Pending records are bounded: what
overflows, or fails, is left for the next ``reindex`` (``ctxproxy memory reindex``), which
walks the records by id, indexes those with no vector or chunked otherwise than today, and
can stop and start again at any point.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from ctxproxy.memory import lanes
from ctxproxy.memory.embed import Embedder, EmbedError
from ctxproxy.memory.health import Health
from ctxproxy.memory.model import Memory, Store, StoreError
from ctxproxy.memory.vectors import VectorRow, chunks, content_digest, pack

__all__ = ["EMBEDDED", "Indexer"]

EMBEDDED = ("episodic", "semantic")  # what recall searches
PENDING = 10_000
RETRY_S = 5.0
REINDEX_PAGE = 500  # records read at a time to compare their chunks with today's
BATCH_TIMEOUT_FACTOR = 10  # an ingest batch may take this many query timeouts

log = logging.getLogger("ctxproxy.memory")


class Indexer:
    """Embeds memories and stores their chunks' vectors; ``notify`` to queue, ``index`` now."""

    def __init__(
        self,
        store: Store,
        embedder: Embedder,
        *,
        batch: int,
        timeout_s: float,
        health: Health | None = None,
        on_embedded: Callable[[int, int], None] = lambda texts, cached: None,
    ) -> None:
        self._store = store
        self._embedder = embedder
        self._batch = batch
        self._timeout_s = timeout_s * BATCH_TIMEOUT_FACTOR
        self._health = health or Health()
        self._on_embedded = on_embedded
        self._pending: OrderedDict[str, Memory] = OrderedDict()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0

    @property
    def model(self) -> str:
        return self._embedder.model

    def notify(self, memories: Iterable[Memory]) -> None:
        """These records were written: embed them soon (the newest text of each wins)."""
        for memory in memories:
            if memory.type not in EMBEDDED:
                continue
            self._pending.pop(memory.memory_id, None)
            self._pending[memory.memory_id] = memory
        while len(self._pending) > PENDING:
            self._pending.popitem(last=False)
            self.dropped += 1  # left for reindex
        if self._pending:
            self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="ctxproxy-indexer")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def drain(self) -> None:
        """Embed everything pending now (tests, shutdown of a CLI)."""
        while self._pending:
            await self._step()

    async def _loop(self) -> None:
        lanes.background()  # no request waits for it
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                try:
                    ok = await self._step()
                except Exception:
                    log.exception("embedding memories failed")
                    ok = False
                if not ok:
                    await asyncio.sleep(RETRY_S)

    async def _step(self) -> bool:
        """Embed one batch of pending records; False when it failed (they stay pending)."""
        batch: list[Memory] = []
        for memory_id in list(self._pending)[: self._batch]:
            batch.append(self._pending.pop(memory_id))
        try:
            await self.index(batch)
        except (EmbedError, StoreError) as exc:
            self._health.failed("embeddings", exc)
            for memory in batch:  # back in front, unless a newer text came meanwhile
                self._pending.setdefault(memory.memory_id, memory)
                self._pending.move_to_end(memory.memory_id, last=False)
            return False
        self._health.ok("embeddings")
        return True

    async def index(self, memories: Sequence[Memory]) -> int:
        """Embed ``memories`` and store their vectors; returns how many texts were embedded
        (not found by digest). Raises EmbedError or StoreError."""
        model = self._embedder.model
        planned: list[tuple[Memory, int, int, int, str, str]] = []
        for memory in memories:
            for n, (start, end) in enumerate(chunks(memory.text)):
                text = memory.text[start:end]
                planned.append((memory, n, start, end, content_digest(model, text), text))
        if not planned:
            return 0
        vectors = await self._store.cached_vectors(model, [p[4] for p in planned])
        cached = len({p[4] for p in planned if p[4] in vectors})
        todo = list({p[4]: p[5] for p in planned if p[4] not in vectors}.items())
        for at in range(0, len(todo), self._batch):
            part = todo[at : at + self._batch]
            embedded = await self._embedder.embed([t for _, t in part], timeout_s=self._timeout_s)
            for (digest, _), vector in zip(part, embedded, strict=True):
                vectors[digest] = pack(vector)
        self._on_embedded(len(todo), cached)
        await self._store.put_vectors([
            VectorRow(memory.memory_id, n, start, end, model, digest, vectors[digest])
            for memory, n, start, end, digest, _ in planned
        ])
        return len(todo)

    async def reindex(
        self, *, progress: Callable[[int], None] = lambda n: None
    ) -> int:
        """Bring every stored record's vectors under the model to today's chunking: a record
        with none, and one chunked otherwise (say, before statements had vectors of their
        own), is indexed again; the chunks it already had are found by digest. Returns how
        many records were indexed; ``progress`` gets how many were looked at, after each
        batch. Walks by id and writes each batch before the next: stopped anywhere, the next
        run finds what is left."""
        after = ""
        looked = done = 0
        while True:
            page = await self._store.vector_spans(self.model, after=after, limit=REINDEX_PAGE)
            if not page:
                return done
            stale: list[Memory] = []
            for at, (memory, spans) in enumerate(page, 1):
                if spans != chunks(memory.text):
                    stale.append(memory)
                if len(stale) == self._batch or at == len(page):
                    await self.index(stale)
                    done += len(stale)
                    stale = []
                    progress(looked + at)
            after = page[-1][0].memory_id
            looked += len(page)
