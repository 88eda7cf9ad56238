"""What each piece of the proxy's own hot path costs per request, measured in process.

    python -m bench components

Each row times the real function on the benchmark request (bench/harness/session.py) and answer
(bench/harness/upstream.py) and keeps the best of several repeats: the cost without the noise of a
shared machine. The end-to-end figures (bench/overhead.py) include everything else: aiohttp's
server and client, the event loop, the kernel's loopback.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import time
import timeit
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from bench.harness import session as bench_session
from bench.harness.upstream import answer_events
from ctxproxy.config import load_settings
from ctxproxy.config.logs import JsonFormatter, fields
from ctxproxy.proxy.headers import Credential, request_headers, response_headers
from ctxproxy.proxy.metrics import Metrics
from ctxproxy.proxy.sse import UsageTap
from ctxproxy.request import Exchange, has_lossy_number
from ctxproxy.window.policy import window

TURNS = 30


def best_us(fn: Callable[[], object], number: int, repeat: int = 7) -> float:
    """Microseconds per call, the best of ``repeat`` runs of ``number`` calls."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def free_us(raw: bytes, count: int = 200) -> float:
    """Microseconds to free one parsed body (reference counting, when the request ends)."""
    times = []
    for _ in range(count):
        body = orjson.loads(raw)
        start = time.perf_counter()
        del body
        times.append(time.perf_counter() - start)
    return min(times) * 1e6


def measure() -> list[tuple[str, float]]:
    settings = load_settings(env={})
    keep = settings.keep_turns
    raw = bench_session.encode(bench_session.request(TURNS))
    headers = CIMultiDictProxy(CIMultiDict(bench_session.headers(TURNS)))
    body = orjson.loads(raw)
    cut = window(body["input"], keep)
    windowed = {**body, "input": cut.items}
    events = answer_events()
    answer_headers = CIMultiDictProxy(CIMultiDict({
        "Content-Type": "text/event-stream", "x-request-id": "req_1", "openai-processing-ms": "9",
        "Transfer-Encoding": "chunked", "Date": "Mon, 30 Nov 2026 00:00:00 GMT"}))

    def tap() -> None:
        usage = UsageTap()
        for event in events:  # one event per read, as a paced stream arrives
            usage.feed(event)
        usage.usage()

    log_us = _access_line_us(len(raw), len(cut.cut))

    metrics = Metrics()

    def observe() -> None:
        metrics.requests.labels("responses", "200").inc()
        metrics.duration.observe(0.003)
        metrics.ttfb.observe(0.001)
        metrics.turns_cut.inc(25)
        metrics.tokens.labels("input").inc(36211)
        metrics.tokens.labels("cached").inc(30720)

    gc.disable()  # the collector's share is measured end to end, not here
    try:
        return [
            (f"parse the {len(raw) // 1024} KB body (orjson) and the identity",
             best_us(lambda: Exchange.parse(raw, headers, settings), 200)),
            (f"window: cut {cut.turns_in} turns to {cut.turns_kept}",
             best_us(lambda: window(body["input"], keep), 200)),
            ("check for integers orjson turned into floats", best_us(
                lambda: has_lossy_number(windowed), 500)),
            (f"serialise the cut body ({len(orjson.dumps(windowed)) // 1024} KB)",
             best_us(lambda: orjson.dumps(windowed), 500)),
            ("free the parsed body", free_us(raw)),
            ("copy request and response headers", best_us(
                lambda: (request_headers(headers, Credential()), response_headers(answer_headers)),
                5000)),
            (f"usage tap over {len(events)} events, then parse usage", best_us(tap, 500)),
            ("access-log line (JSON)", log_us),
            ("metrics", best_us(observe, 5000)),
        ]
    finally:
        gc.enable()


def _access_line_us(bytes_in: int, items_cut: int) -> float:
    """One access-log line, formatted as JSON and written to /dev/null."""
    access = logging.Logger("bench.access")
    with open(os.devnull, "w") as devnull:
        handler = logging.StreamHandler(devnull)
        handler.setFormatter(JsonFormatter())
        access.addHandler(handler)
        line: dict[str, Any] = {
            "request_id": bench_session.SESSION_ID, "method": "POST", "path": "/v1/responses",
            "status": 200, "total_ms": 3.1, "route": "responses",
            "session_id": bench_session.SESSION_ID,
            "turns_in": 30, "turns_forwarded": 5, "items_cut": items_cut, "bytes_in": bytes_in,
            "bytes_forwarded": 37070, "forwarded_ratio": 0.25, "ttfb_ms": 1.2,
            "input_tokens": 36211, "cached_tokens": 30720, "output_tokens": 412}
        log_us = best_us(lambda: access.info("request", extra=fields(**line)), 2000)
    return log_us


def table(*runs: list[tuple[str, float]]) -> str:
    """The markdown table; with several runs of measure(), each row's best."""
    runs = runs or (measure(),)
    rows = [(name, min(run[i][1] for run in runs)) for i, (name, _) in enumerate(runs[0])]
    lines = ["| the proxy's own work, per request | µs |", "|---|---|"]
    lines += [f"| {name} | {us:.1f} |" for name, us in rows]
    lines.append(f"| **sum** | **{sum(us for _, us in rows):.0f}** |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    print(table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
