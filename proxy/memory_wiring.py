"""How the memory side plugs into the app: its resources, routes and pipeline step."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import Counter

from ctxproxy.injectors import memory_blocks, tokens
from ctxproxy.memory.cpu import Pool, warm
from ctxproxy.memory.distill import Distiller
from ctxproxy.memory.embed import embedder_from
from ctxproxy.memory.health import Health
from ctxproxy.memory.indexer import Indexer
from ctxproxy.memory.ingest import Ingester
from ctxproxy.memory.model import Memory, Store, StoreError
from ctxproxy.memory.queue import WriteQueue
from ctxproxy.memory.recall import Recaller, Weights
from ctxproxy.memory.step import MemoryStep
from ctxproxy.memory.stores import make_store
from ctxproxy.memory.working import Working
from ctxproxy.proxy.app import METRICS, READY_CHECKS, SETTINGS
from ctxproxy.request import Step

__all__ = ["MEMORY", "Runtime", "install", "step"]


@dataclass(slots=True)
class Runtime:
    """The memory side of one app: what it owns, for the step and for tests to wait on."""

    store: Store
    queue: WriteQueue
    distiller: Distiller
    step: MemoryStep
    health: Health
    pool: Pool  # the side's CPU work, off the event loop
    opening: asyncio.Task[None] | None = None  # retrying a store that failed to open
    indexer: Indexer | None = None  # embeddings on (CTXPROXY_EMBEDDINGS_URL)


MEMORY = web.AppKey("memory", Runtime)
REOPEN_S = 30.0
PROBE_EVERY_S = 1.0
PROBE_TIMEOUT_S = 2.0
MIB = 1024 * 1024

log = logging.getLogger("ctxproxy.memory")


def install(app: web.Application) -> None:
    """Add the memory side's cleanup contexts and local routes to app."""
    if app[SETTINGS].memory_enabled:
        app.cleanup_ctx.append(_memory_ctx)


def step(app: web.Application) -> Step | None:
    """The memory pipeline step (called at start-up, after every context is open)."""
    runtime = app.get(MEMORY)
    return runtime.step if runtime is not None else None


def _cost(memory: Memory) -> int:
    return tokens.count(memory_blocks.item(memory)) + 1


async def _keep_opening(store: Store, health: Health) -> None:
    """Retry a store that could not open at start-up (a database that comes up later)."""
    while True:
        await asyncio.sleep(REOPEN_S)
        try:
            await store.open()
        except StoreError as exc:
            health.failed("store", exc)
            continue
        health.ok("store")
        return


class StoreProbe:
    """Whether the store answers a primary-key read, asked at most once a PROBE_EVERY_S:
    /readyz takes no credential, and its callers must not become load on the database."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = asyncio.Lock()
        self._at = -PROBE_EVERY_S
        self._ok = True

    async def __call__(self) -> bool:
        async with self._lock:
            if time.monotonic() - self._at >= PROBE_EVERY_S:
                try:
                    await asyncio.wait_for(self._store.get("ctxproxy-ready-probe"),
                                           PROBE_TIMEOUT_S)
                    self._ok = True
                except (StoreError, TimeoutError):
                    self._ok = False
                self._at = time.monotonic()
            return self._ok


def _count_embedded(counter: Counter) -> Callable[[int, int], None]:
    def count(embedded: int, cached: int) -> None:
        counter.labels("embedded").inc(embedded)
        counter.labels("cached").inc(cached)

    return count


async def _memory_ctx(app: web.Application) -> AsyncIterator[None]:
    """The memory side, built in the order its parts need each other, and closed in the
    reverse order (over 60 lines: the opening and the closing read as one list)."""
    settings, metrics = app[SETTINGS], app[METRICS]
    health = Health(lambda: metrics.degraded.labels("memory").inc())
    store = make_store(settings, serving=True)
    reopen: asyncio.Task[None] | None = None
    try:
        await store.open()
    except StoreError as exc:
        # The proxy still serves; turns go without memory blocks until the store opens.
        health.failed("store", exc)
        reopen = asyncio.create_task(_keep_opening(store, health), name="ctxproxy-store-open")
    queue = WriteQueue(
        settings.ingest_queue_size, health, metrics.queue_depth.set,
        max_bytes=int(settings.ingest_queue_mb * MIB), on_bytes=metrics.queue_bytes.set,
        on_drop=lambda reason: metrics.queue_dropped.labels(reason).inc(),
        on_superseded=metrics.queue_superseded.inc,
    )
    pool = Pool(process=settings.memory_process)
    embedder = embedder_from(settings)
    indexer = None
    if embedder is not None:
        indexer = Indexer(
            store, embedder, batch=settings.embeddings_batch,
            timeout_s=settings.embeddings_timeout_ms / 1000, health=health,
            on_embedded=_count_embedded(metrics.embedded),
        )
    written = indexer.notify if indexer is not None else (lambda memories: None)
    distiller = Distiller(
        store, threshold=settings.semantic_threshold, interval_s=settings.distill_interval_s,
        health=health, offload=pool.background, on_written=written,
    )
    recaller = Recaller(
        store,
        weights=Weights.from_settings(settings),
        k=settings.recall_k,
        budget=settings.memory_tokens,
        cost=_cost,
        overhead=lambda kind: tokens.count(memory_blocks.block_overhead(kind)),
        offload=pool.run,
        embedder=embedder,
        query_timeout_s=settings.embeddings_timeout_ms / 1000,
        min_similarity=settings.embeddings_min_similarity,
        elsewhere_min_score=settings.recall_elsewhere_min_score,
        on_degraded=lambda exc: health.failed("embeddings", exc),
    )
    memory_step = MemoryStep(
        settings,
        working=Working(store, queue, settings.working_ttl_s, offload=pool.run),
        ingester=Ingester(store, on_new=distiller.notify, offload=pool.background,
                          on_written=written),
        recaller=recaller,
        queue=queue,
        health=health,
        recall_seconds=metrics.recall_seconds,
        recalled=metrics.recall_hits,
        offload=pool.run,
        recall_modes=metrics.recall_modes,
        forwarded_whole=metrics.forwarded_whole,
        placements=store,
    )
    # The tokenizer and the redaction patterns load in about a second: now, off the loop,
    # not on the first turn; meanwhile the child process for the background work starts
    # and loads what it needs (cpu.warm).
    await asyncio.gather(pool.start(), asyncio.to_thread(warm),
                         asyncio.to_thread(tokens.encoding_name))
    queue.start()
    distiller.start()
    if indexer is not None:
        indexer.start()
    app[MEMORY] = Runtime(store, queue, distiller, memory_step, health, pool, reopen, indexer)
    app[READY_CHECKS]["memory store"] = StoreProbe(store)
    try:
        yield
    finally:
        if reopen is not None:
            reopen.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reopen
        await memory_step.close()
        await queue.close()
        await distiller.close()
        if indexer is not None:
            await indexer.close()
        if embedder is not None:
            await embedder.aclose()
        await store.close()
        await pool.close()
