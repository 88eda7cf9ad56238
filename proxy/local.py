"""What the proxy answers itself (health, readiness, metrics) and the process settings it
holds while it serves (the GC threshold, the GIL's switch interval, the loop-lag sampler)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
from aiohttp import web

from ctxproxy.proxy.keys import METRICS, PEERS, READY, READY_CHECKS
from ctxproxy.proxy.metrics import Metrics, combine, sample_loop_lag

# Every request in flight holds its parsed body alive (thousands of dicts and lists). With
# CPython's default threshold of 700 net new objects, 32 concurrent requests trigger young
# collections all the time and push the bodies into the old generation, whose full collections
# then walk every one of them (bench/RESULTS.md, Proxy overhead: Changes made). Parsed JSON has
# no reference cycles (reference counting frees it either way), so a higher threshold only
# delays finding the rare real cycle.
GC_YOUNG_THRESHOLD = 50_000


async def gc_ctx(app: web.Application) -> AsyncIterator[None]:
    """Raise the young-generation GC threshold while the app serves; restore it after."""
    previous = gc.get_threshold()
    gc.set_threshold(max(previous[0], GC_YOUNG_THRESHOLD), *previous[1:])
    yield
    gc.set_threshold(*previous)


# The GIL's switch interval while the app serves (CPython's default is 5 ms): how long a thread
# that wants the GIL waits while another runs Python before it asks for it. The loop coming
# back from each socket write, and a memory thread with a turn's search done, wait so; a
# shorter interval brings a search's result to its turn sooner and lowered the added p99 for
# the same CPU a request (bench/RESULTS.md, Load).
SWITCH_INTERVAL_S = 0.001


async def switch_ctx(app: web.Application) -> AsyncIterator[None]:
    """Shorten the GIL's switch interval while the app serves; restore it after."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(min(previous, SWITCH_INTERVAL_S))
    yield
    sys.setswitchinterval(previous)


async def loop_lag_ctx(app: web.Application) -> AsyncIterator[None]:
    """Sample the event loop's scheduling delay into ctxproxy_event_loop_lag_seconds."""
    task = asyncio.create_task(sample_loop_lag(app[METRICS].loop_lag), name="ctxproxy-loop-lag")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    if not request.app[READY]["ready"]:
        return web.json_response({"ready": False}, status=503)
    checks = request.app[READY_CHECKS]
    answers = await asyncio.gather(*(check() for check in checks.values()))
    failing = [name for name, ok in zip(checks, answers, strict=True) if not ok]
    if failing:
        return web.json_response({"ready": False, "failing": failing}, status=503)
    return web.json_response({"ready": True})


PEER_SCRAPE_TIMEOUT_S = 2.0


async def metrics_route(request: web.Request) -> web.Response:
    """This process's metrics; in a worker of several, every worker's added up (a worker
    that does not answer in time, being replaced say, is left out: see
    ctxproxy_workers_scraped). ``?worker=this``: this worker's alone."""
    metrics = request.app[METRICS]
    peers = request.app.get(PEERS)
    if peers is None or request.query.get("worker") == "this":
        return web.Response(body=metrics.render(), content_type="text/plain")
    others = await asyncio.gather(*(_scrape(path) for path in peers.others()))
    own = metrics.render().decode()
    body = combine([own, *(text for text in others if text is not None)])
    return web.Response(body=body, content_type="text/plain")


def sibling_app(metrics: Metrics) -> web.Application:
    """What a worker serves its siblings on its socket: its own metrics, nothing else."""

    async def own(request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", own)
    return app


async def _scrape(path: Path) -> str | None:
    """A sibling worker's own metrics, over its Unix socket; None if it does not answer."""
    timeout = aiohttp.ClientTimeout(total=PEER_SCRAPE_TIMEOUT_S)
    try:
        async with aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=str(path)), timeout=timeout
        ) as session, session.get("http://worker/metrics") as r:
            return await r.text() if r.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None
