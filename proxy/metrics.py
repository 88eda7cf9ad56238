"""Prometheus metrics, one registry per app (so that tests and replicas never share one).

With several workers (``CTXPROXY_WORKERS``) a scrape reaches one of them, which adds up every
worker's registry (``combine``): /metrics counts the whole server, whichever worker answers.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
LAG_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
LAG_INTERVAL_S = 0.1


class Metrics:
    def __init__(self) -> None:
        """Every metric the proxy exports, declared in one place: a list read top to bottom,
        over 60 lines on purpose."""
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "ctxproxy_requests", "Requests by route and status.", ["route", "status"], registry=r
        )
        self.ttfb = Histogram(
            "ctxproxy_upstream_ttfb_seconds", "Upstream time to first byte.",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.upstream = Histogram(
            "ctxproxy_upstream_seconds", "Upstream time from sending to the end of its answer.",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.duration = Histogram(
            "ctxproxy_request_seconds", "Whole request time.", buckets=LATENCY_BUCKETS, registry=r
        )
        self.turns_cut = Counter("ctxproxy_turns_cut", "User turns cut by the window.", registry=r)
        self.fail_open = Counter(
            "ctxproxy_fail_open", "Requests forwarded unchanged because a step failed.",
            ["reason"], registry=r,
        )
        self.step_failures = Counter(
            "ctxproxy_step_failures", "Pipeline steps that raised and were undone alone.",
            ["step", "reason"], registry=r,
        )
        self.degraded = Counter(
            "ctxproxy_degraded", "Knowledge or memory failures that left a block out.",
            ["source"], registry=r,
        )
        self.knowledge_cache = Counter(
            "ctxproxy_knowledge_cache", "Knowledge discovery cache lookups.", ["result"], registry=r
        )
        self.recall_seconds = Histogram(
            "ctxproxy_memory_recall_seconds", "Memory recall latency.",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.recall_hits = Counter(
            "ctxproxy_memory_recalled", "Memories injected by recall.", registry=r
        )
        self.recall_modes = Counter(
            "ctxproxy_memory_recall_mode",
            "User turns recalled, by how: hybrid (full text and embeddings), lexical (no "
            "embeddings configured), lexical-degraded (the embeddings endpoint or vector "
            "search failed that turn).", ["mode"], registry=r,
        )
        self.forwarded_whole = Counter(
            "ctxproxy_memory_forwarded_whole",
            "Requests that got no memory in time, or whose store failed, and so went out with "
            "the history the window would have cut: nothing it cut is lost.", registry=r,
        )
        self.embedded = Counter(
            "ctxproxy_memory_embedded",
            "Memory chunks indexed for hybrid recall: embedded (an embeddings call) or cached "
            "(the same text's vector found by its digest).", ["source"], registry=r,
        )
        self.queue_depth = Gauge(
            "ctxproxy_ingest_queue_depth", "Memory writes waiting.", registry=r
        )
        self.queue_bytes = Gauge(
            "ctxproxy_ingest_queue_bytes", "Estimated bytes of the memory writes waiting.",
            registry=r,
        )
        self.queue_dropped = Counter(
            "ctxproxy_ingest_queue_dropped",
            "Memory writes dropped: refused over the job bound (jobs) or the byte budget "
            "(bytes), or failed twice (failed).",
            ["reason"], registry=r,
        )
        self.queue_superseded = Counter(
            "ctxproxy_ingest_queue_superseded",
            "Memory writes not run because a later one of the same session, queued behind "
            "them, writes all they would have (nothing lost).",
            registry=r,
        )
        self.loop_lag = Histogram(
            "ctxproxy_event_loop_lag_seconds",
            "How late the event loop woke a task that slept a fixed interval: the time every "
            "request waited behind work on the loop.",
            buckets=LAG_BUCKETS, registry=r,
        )
        self.ledger_dropped = Counter(
            "ctxproxy_ledger_dropped",
            "Request rows for ctxproxy stats not written: the queue was full, or the write "
            "failed.",
            ["reason"], registry=r,
        )
        self.outputs_unstored = Counter(
            "ctxproxy_masked_outputs_unstored",
            "Masked tool outputs not written to the store (only this process can answer their "
            "fetch line): the writer's queue was full, or the write failed.",
            ["reason"], registry=r,
        )
        self.connections_closed = Counter(
            "ctxproxy_connections_closed",
            "Client connections the server closed: its request's line and headers came too "
            "slowly (header_timeout), or it was one over CTXPROXY_MAX_CONNECTIONS (over_limit).",
            ["reason"], registry=r,
        )
        self.events_unread = Counter(
            "ctxproxy_stream_events_unread",
            "Upstream stream events larger than the usage reader holds: relayed whole, not read "
            "(a response.completed among them leaves its request without usage).",
            registry=r,
        )
        self.tokens = Counter(
            "ctxproxy_upstream_tokens", "Input tokens reported by the upstream.", ["kind"],
            registry=r,
        )

    def render(self) -> bytes:
        """This process's metrics."""
        return generate_latest(self.registry)


class _Families:
    """A collector of metric families already made (a registry collects from it)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def combine(expositions: Sequence[str]) -> bytes:
    """The workers' expositions as one: each sample summed over the workers (counters,
    histogram buckets, sums and counts, and the gauges, which are amounts: writes waiting,
    their bytes), a ``_created`` time the earliest; and ``ctxproxy_workers_scraped``, how many
    workers went in. (Each is parsed from text, the worker's own too: the text format makes
    a series' ``_created`` a family of its own, where a registry keeps it in the series'.)"""
    merged: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for family in (f for text in expositions for f in text_string_to_metric_families(text)):
        if family.name not in merged:
            merged[family.name] = Metric(family.name, family.documentation, family.type)
            values[family.name] = {}
        into = values[family.name]
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            if sample.name.endswith("_created"):
                into[key] = min(into.get(key, math.inf), sample.value)
            else:
                into[key] = into.get(key, 0.0) + sample.value
    for name, family in merged.items():
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
    scraped = Metric("ctxproxy_workers_scraped",
                     "Worker processes whose metrics this scrape adds up.", "gauge")
    scraped.add_sample("ctxproxy_workers_scraped", {}, len(expositions))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families([*merged.values(), scraped]))
    return generate_latest(registry)


async def sample_loop_lag(lag: Histogram, interval_s: float = LAG_INTERVAL_S) -> None:
    """Observe the loop's scheduling delay every ``interval_s``, until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        start = loop.time()
        await asyncio.sleep(interval_s)
        lag.observe(max(0.0, loop.time() - start - interval_s))
