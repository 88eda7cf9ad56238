"""The aiohttp application: routes, the relay, and the app's lifecycle."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from config import Settings
from proxy import pipeline
from proxy.auth import client_auth, load_client_keys
from proxy.errors import BodyTooLarge, ProxyError, error_response
from proxy.headers import request_headers, response_headers
from proxy.logs import fields
from proxy.metrics import Metrics
from proxy.request import Exchange
from proxy.sse import UsageTap
from proxy.upstream import Upstream

log = logging.getLogger("ctxproxy")
access_log = logging.getLogger("ctxproxy.access")

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
UPSTREAM = web.AppKey("upstream", Upstream)
STEPS = web.AppKey("steps", Sequence[pipeline.Step])  # in order
READY = web.AppKey("ready", dict)

# What the access log reads from request.get(...), set by the handlers.
LOG_FIELDS = web.RequestKey("log_fields", dict)

StepsFactory = Callable[[web.Application], Sequence[pipeline.Step]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def default_steps(app: web.Application) -> Sequence[pipeline.Step]:
    settings = app[SETTINGS]
    return [pipeline.WindowStep.from_settings(settings)]


def create_app(settings: Settings, *, steps: StepsFactory = default_steps) -> web.Application:
    """Build the proxy app. Clients open in cleanup contexts; nothing runs at import time.

    Other sides (knowledge, memory) add their own cleanup contexts and routes to the app
    before it starts; ``steps`` is called once at start-up, after every context is open.
    """
    middlewares: list[Any] = [access_middleware]  # outermost first
    client_keys = load_client_keys(settings.client_keys)
    if client_keys:
        middlewares.append(client_auth(client_keys))
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=middlewares)
    app[SETTINGS] = settings
    app[METRICS] = Metrics()
    app[STEPS] = []
    app[READY] = {"ready": False}

    async def upstream_ctx(app: web.Application) -> AsyncIterator[None]:
        upstream = Upstream(
            settings.upstream_url,
            settings.upstream_connect_timeout_s,
            settings.upstream_read_timeout_s,
        )
        await upstream.start()
        app[UPSTREAM] = upstream
        yield
        await upstream.close()

    async def on_startup(app: web.Application) -> None:
        # on_startup handlers run after every cleanup context has opened.
        app[STEPS] = list(steps(app))
        app[READY]["ready"] = True

    async def on_shutdown(app: web.Application) -> None:
        app[READY]["ready"] = False  # stop taking new traffic; open streams finish

    app.cleanup_ctx.append(gc_ctx)
    app.cleanup_ctx.append(upstream_ctx)
    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/responses", responses)
    app.router.add_post("/responses", responses)
    return app


# Every request in flight holds its parsed body alive (thousands of dicts and lists). With
# CPython's default threshold of 700 net new objects, 32 concurrent requests trigger young
# collections all the time and push the bodies into the old generation, whose full collections
# then walk every one of them: 18% of the proxy's CPU at 32 requests in flight. Parsed JSON has
# no reference cycles (reference counting frees it either way), so a higher threshold only
# delays finding the rare real cycle (bench/RESULTS.md).
GC_YOUNG_THRESHOLD = 50_000


async def gc_ctx(app: web.Application) -> AsyncIterator[None]:
    """Raise the young-generation GC threshold while the app serves; restore it after."""
    previous = gc.get_threshold()
    gc.set_threshold(max(previous[0], GC_YOUNG_THRESHOLD), *previous[1:])
    yield
    gc.set_threshold(*previous)


def add_passthrough(app: web.Application) -> None:
    """The catch-all route; added last, after any local routes the other sides mount."""
    app.router.add_route("*", "/{tail:.*}", passthrough)


# --- middleware ------------------------------------------------------------------------------


@web.middleware
async def access_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map errors to OpenAI-shaped JSON and write one access-log line per request."""
    start = time.perf_counter()
    request[LOG_FIELDS] = info = {}
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except ProxyError as exc:
        status = exc.status
        info["error"] = exc.message
        return exc.response()
    except web.HTTPException as exc:
        status = exc.status
        if exc.status == 413:
            return BodyTooLarge(str(exc.text or "request body too large")).response()
        return error_response(exc.status, exc.reason, "invalid_request_error", str(exc.status))
    finally:
        elapsed = time.perf_counter() - start
        metrics = request.app[METRICS]
        route = info.get("route", "other")
        metrics.requests.labels(route, str(status)).inc()
        metrics.duration.observe(elapsed)
        if request.path not in ("/healthz", "/readyz", "/metrics"):
            access_log.info(
                "request",
                extra=fields(
                    request_id=request.headers.get("x-client-request-id")
                    or request.headers.get("x-request-id"),
                    method=request.method,
                    path=request.path,
                    status=status,
                    total_ms=round(elapsed * 1000, 2),
                    **info,
                ),
            )


# --- local routes ----------------------------------------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    ready = request.app[READY]["ready"]
    return web.json_response({"ready": ready}, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[METRICS].render(), content_type="text/plain")


# --- forwarded routes ------------------------------------------------------------------------


async def read_body(request: web.Request) -> bytes:
    limit = request.app[SETTINGS].max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(f"request body is over {limit} bytes")
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise BodyTooLarge(f"request body is over {limit} bytes") from exc


async def responses(request: web.Request) -> web.StreamResponse:
    """POST /v1/responses: apply the pipeline, then relay."""
    app = request.app
    settings = app[SETTINGS]
    info = request[LOG_FIELDS]
    info["route"] = "responses"
    raw = await read_body(request)
    body = raw
    ex: Exchange | None = None
    try:
        ex = Exchange.parse(raw, request.headers, settings)
        await pipeline.run(app[STEPS], ex)
        body = ex.serialise()
    except Exception as exc:
        # Fail open: whatever went wrong is ours, not the agent's; forward its own bytes.
        reason = type(exc).__name__
        app[METRICS].fail_open.labels(reason).inc()
        log.warning("pipeline failed, forwarding the request unchanged: %s: %s", reason, exc)
        info["fail_open"] = reason
        body = raw
    if ex is not None:
        info.update(
            session_id=ex.identity.session_id,
            turns_in=ex.turns_in,
            turns_forwarded=ex.turns_forwarded,
            items_cut=len(ex.cut),
            **ex.notes,
        )
        if ex.cut:
            app[METRICS].turns_cut.inc(ex.turns_in - ex.turns_forwarded)
    # Bytes, not tokens: no tokenizer on the request path (tokens: input_tokens below).
    info.update(
        bytes_in=len(raw),
        bytes_forwarded=len(body),
        forwarded_ratio=round(len(body) / len(raw), 4) if raw else 1.0,
    )
    return await relay(request, "responses", body, tap_usage=True)


async def passthrough(request: web.Request) -> web.StreamResponse:
    """Every other method and path, forwarded unchanged under UPSTREAM_URL."""
    request[LOG_FIELDS]["route"] = "passthrough"
    if request.headers.get("upgrade"):
        # Codex tries a WebSocket first when configured to; 426 makes it fall back to HTTP.
        return error_response(
            426,
            "WebSocket transport is not supported by this proxy; use HTTP",
            "invalid_request_error",
            "websocket_not_supported",
        )
    # The target as the client sent it (still percent-encoded), so that nothing is decoded
    # and re-encoded differently on the way.
    path = request.raw_path.partition("?")[0]
    if path == "/v1" or path.startswith("/v1/"):
        path = path[3:]
    body = await read_body(request) if request.body_exists else None
    return await relay(request, path, body)


async def relay(
    request: web.Request, path: str, body: bytes | None, *, tap_usage: bool = False
) -> web.StreamResponse:
    """Send to the upstream and copy its answer back chunk by chunk, as it arrives."""
    app = request.app
    settings = app[SETTINGS]
    info: dict[str, Any] = request[LOG_FIELDS]
    upstream = app[UPSTREAM]
    key = settings.upstream_api_key
    headers = request_headers(request.headers, f"Bearer {key.get_secret_value()}" if key else None)
    url = upstream.url(path, request.raw_path.partition("?")[2])

    start = time.perf_counter()
    upstream_response = await upstream.send(request.method, url, headers, body)
    completed = False
    tap = UsageTap() if tap_usage and _is_sse(upstream_response) else None
    try:
        response = web.StreamResponse(
            status=upstream_response.status,
            reason=upstream_response.reason,
            headers=response_headers(upstream_response.headers),
        )
        await response.prepare(request)
        first = True
        try:
            async for chunk in upstream_response.content.iter_any():
                if first:
                    first = False
                    ttfb = time.perf_counter() - start
                    info["ttfb_ms"] = round(ttfb * 1000, 2)
                    app[METRICS].ttfb.observe(ttfb)
                await response.write(chunk)
                if tap is not None:
                    tap.feed(chunk)
        except (aiohttp.ClientError, TimeoutError) as exc:
            # The upstream broke mid-answer: end the client's connection the same way, so it
            # sees a broken stream (and retries) rather than a clean end.
            info["upstream_error"] = type(exc).__name__
            log.warning("upstream stream broke: %s", type(exc).__name__)
            if request.transport is not None:
                request.transport.close()
            return response
        await response.write_eof()
        completed = True
        app[METRICS].upstream.observe(time.perf_counter() - start)
        return response
    finally:
        if tap is not None:
            _record_usage(app, info, tap)
        if completed:
            upstream_response.release()
        else:
            upstream_response.close()  # client gone or stream broken: drop the connection now


def _is_sse(response: aiohttp.ClientResponse) -> bool:
    return response.content_type == "text/event-stream"


def _record_usage(app: web.Application, info: dict[str, Any], tap: UsageTap) -> None:
    usage = tap.usage()
    if usage is None:
        return
    info.update(usage)
    metrics = app[METRICS]
    metrics.tokens.labels("input").inc(usage.get("input_tokens", 0))
    metrics.tokens.labels("cached").inc(usage.get("cached_tokens", 0))
