"""The aiohttp application: routes, the relay, and the app's lifecycle."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from ctxproxy.config import Settings
from ctxproxy.config.logs import fields
from ctxproxy.proxy import bodies, targets
from ctxproxy.proxy.auth import PRINCIPAL, client_auth, load_client_keys
from ctxproxy.proxy.errors import BodyTooLarge, ClientClosed, ProxyError, error_response
from ctxproxy.proxy.headers import (
    Credential,
    check_utf8,
    request_headers,
    response_headers,
    upstream_credential,
)
from ctxproxy.proxy.keys import (
    ACCESS,
    ANTHROPIC,
    CHAT_UPSTREAM,
    CLOCK,
    EXCHANGE,
    KEYED,
    METRICS,
    PEERS,
    PIPELINE,
    READY,
    READY_CHECKS,
    SENT,
    SETTINGS,
    UPSTREAM,
    ReadyCheck,
)
from ctxproxy.proxy.local import gc_ctx, healthz, loop_lag_ctx, metrics_route, readyz, switch_ctx
from ctxproxy.proxy.metrics import Metrics
from ctxproxy.proxy.origin import gate
from ctxproxy.proxy.passthrough import ROUTES, Routes, refusal, upstream_path
from ctxproxy.proxy.pipeline import Pipeline
from ctxproxy.proxy.sse import BodyTap, UsageTap
from ctxproxy.proxy.sse_chat import ChatTap
from ctxproxy.proxy.sse_messages import MessagesTap
from ctxproxy.proxy.upstream import Idle, Upstream
from ctxproxy.request import Access, Answer, End, Exchange, NotAResponsesRequest, Sent, Step
from ctxproxy.request.protocol import CHAT, MESSAGES, RESPONSES, Protocol
from ctxproxy.window.step import WindowStep

log = logging.getLogger("ctxproxy")
access_log = logging.getLogger("ctxproxy.access")

__all__ = [
    "ACCESS", "ANTHROPIC", "CHAT_UPSTREAM", "CLOCK", "EXCHANGE", "KEYED", "METRICS", "PEERS",
    "PIPELINE", "READY", "READY_CHECKS", "SENT", "SETTINGS", "UPSTREAM", "ReadyCheck",
    "add_passthrough", "create_app", "relay",
]


StepsFactory = Callable[[web.Application], Sequence[Step]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def default_steps(app: web.Application) -> Sequence[Step]:
    return [WindowStep.from_settings(app[SETTINGS])]


def create_app(
    settings: Settings,
    *,
    steps: StepsFactory = default_steps,
    upstream: Upstream | None = None,
    anthropic: Upstream | None = None,
    chat: Upstream | None = None,
    clock: Callable[[], float] = time.time,
) -> web.Application:
    """Build the proxy app. Clients open in cleanup contexts; nothing runs at import time.

    Other sides (knowledge, memory) add their own cleanup contexts and routes to the app
    before it starts; ``steps`` is called once at start-up, after every context is open.
    ``upstream`` replaces the client to the real API (tests give it their own connector);
    ``anthropic`` and ``chat`` the clients to ANTHROPIC_URL and CHAT_URL.
    Over 60 lines: the app's keys, contexts and routes are listed in one place.
    """
    client_keys = load_client_keys(settings.client_keys)
    # outermost first: a request from a web page is refused before any credential is read
    keyed = bool(client_keys)
    middlewares: list[Any] = [access_middleware, gate(settings, client_keys=keyed)]
    if client_keys:
        middlewares.append(client_auth(client_keys))
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=middlewares)
    app[SETTINGS] = settings
    app[KEYED] = keyed
    app[ROUTES] = Routes.from_settings(settings, client_keys=keyed)  # for add_passthrough
    app[METRICS] = metrics = Metrics()
    app[PIPELINE] = Pipeline([])
    app[READY] = {"ready": False}
    app[READY_CHECKS] = {}
    app[CLOCK] = clock

    async def upstream_ctx(app: web.Application) -> AsyncIterator[None]:
        client = upstream or Upstream(
            settings.upstream_url,
            settings.upstream_connect_timeout_s,
            settings.upstream_read_timeout_s,
        )
        other = anthropic or Upstream(
            settings.anthropic_url,
            settings.upstream_connect_timeout_s,
            settings.upstream_read_timeout_s,
        )
        chat_client = chat or (Upstream(
            settings.chat_url, settings.upstream_connect_timeout_s,
            settings.upstream_read_timeout_s) if settings.chat_url else None)
        started = [c for c in (client, other, chat_client) if c is not None]
        for one in started:
            await one.start()
        app[UPSTREAM] = client
        app[ANTHROPIC] = other
        app[CHAT_UPSTREAM] = chat_client or client
        yield
        for one in started:
            await one.close()

    async def on_startup(app: web.Application) -> None:
        # on_startup handlers run after every cleanup context has opened.
        app[PIPELINE] = Pipeline(
            steps(app), on_failure=lambda step, reason: metrics.step_failures.labels(
                step, reason).inc(),
        )
        app[READY]["ready"] = True

    async def on_shutdown(app: web.Application) -> None:
        app[READY]["ready"] = False  # stop taking new traffic; open streams finish

    app.cleanup_ctx.append(gc_ctx)
    app.cleanup_ctx.append(switch_ctx)
    app.cleanup_ctx.append(loop_lag_ctx)
    app.cleanup_ctx.append(upstream_ctx)
    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)

    app.router.add_get("/healthz", healthz, name="healthz")
    app.router.add_get("/readyz", readyz, name="readyz")
    app.router.add_get("/metrics", metrics_route, name="metrics")
    app.router.add_post("/v1/responses", responses, name="responses")
    app.router.add_post("/responses", responses, name="responses:bare")
    app.router.add_post("/v1/messages", messages, name="messages")
    app.router.add_post("/v1/chat/completions", chat_completions, name="chat")
    app.router.add_post("/chat/completions", chat_completions, name="chat:bare")
    app.router.add_route("*", "/v1/messages/{tail:.*}", anthropic_passthrough,
                         name="anthropic")
    return app


def add_passthrough(app: web.Application) -> None:
    """The catch-all route; added last, after any local routes the other sides mount."""
    app.router.add_route("*", "/{tail:.*}", passthrough, name="passthrough")


# --- middleware ------------------------------------------------------------------------------


@web.middleware
async def access_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map errors to OpenAI-shaped JSON and write one access-log line per request."""
    start = time.perf_counter()
    request[ACCESS] = info = Access()
    status = 500
    try:
        check_utf8(request.headers)
        response = await handler(request)
        status = response.status
        return response
    except ProxyError as exc:
        status = exc.status
        info.error = exc.message
        return exc.response(_protocol(request))
    except web.HTTPException as exc:
        status = exc.status
        if exc.status == 413:
            return BodyTooLarge(str(exc.text or "request body too large")).response(
                _protocol(request))
        return error_response(exc.status, exc.reason, "invalid_request_error", str(exc.status),
                              _protocol(request))
    except ClientClosed:
        # The client hung up mid-answer: nothing to answer, and no failure of the upstream's.
        status = ClientClosed.status
        info.error = "client_closed"
        return web.Response(status=status)  # never sent: aiohttp drops it quietly
    except asyncio.CancelledError:
        # handler_cancellation: aiohttp cancels the handler once the client's connection is
        # gone (or, at shutdown, once the grace period is over and it closes it).
        status = ClientClosed.status
        info.error = "client_closed"
        raise
    finally:
        elapsed = time.perf_counter() - start
        metrics = request.app[METRICS]
        route = _route_name(request)
        metrics.requests.labels(route, str(status)).inc()
        metrics.duration.observe(elapsed)
        if route not in ("healthz", "readyz", "metrics"):
            access_log.info(
                "request",
                extra=fields(
                    request_id=request.headers.get("x-client-request-id")
                    or request.headers.get("x-request-id"),
                    method=request.method,
                    path="/ctxproxy/outputs/{id}" if route == "outputs" else request.path,
                    status=status,
                    total_ms=round(elapsed * 1000, 2),
                    route=route,
                    **info.fields(),
                ),
            )
        if route in ("responses", "messages", "chat"):  # after the line: its cost never delays it
            request.app[PIPELINE].ended(End(request.get(EXCHANGE), request.get(SENT), info,
                                            status, request.get(PRINCIPAL)))


def _protocol(request: web.Request) -> Protocol:
    """The protocol whose shape the request's errors take: the route's, else (another
    route) the client's, by its headers."""
    if request.path.startswith("/v1/messages"):
        return MESSAGES
    if request.path.endswith("/chat/completions"):
        return CHAT
    if request.path.startswith(("/v1/responses", "/responses")):
        return RESPONSES
    return MESSAGES if _anthropic(request) else RESPONSES


# Headers only Anthropic's clients send (Claude Code, the anthropic SDK): their other calls,
# GET /v1/models say, go to the Anthropic API too.
ANTHROPIC_HEADERS = ("anthropic-version", "x-api-key")


# Anthropic's own paths outside /v1: Claude Code warms its connection with HEAD
# {ANTHROPIC_BASE_URL}/api/hello, which has no place at the OpenAI upstream.
ANTHROPIC_ONLY = "/api/"


def _anthropic(request: web.Request) -> bool:
    return any(name in request.headers for name in ANTHROPIC_HEADERS)


def _route_name(request: web.Request) -> str:
    """The matched route's name up to its first colon ("responses", "knowledge", ...)."""
    name = request.match_info.route.name
    return name.partition(":")[0] if name else "other"


# --- forwarded routes ------------------------------------------------------------------------


async def read_body(request: web.Request) -> bytes:
    """The body as the upstream gets it: decoded (see proxy.bodies), at most MAX_BODY_MB."""
    # Every forwarded route reads its body first: refuse a target it would not forward
    # before any work is done for it.
    targets.origin_path(request.raw_path)
    limit = request.app[SETTINGS].max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(f"request body is over {limit} bytes")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise BodyTooLarge(f"request body is over {limit} bytes") from exc
    return await bodies.decode_request_body(request, raw, limit)


async def responses(request: web.Request) -> web.StreamResponse:
    """POST /v1/responses: apply the pipeline, then relay."""
    return await through_pipeline(request, RESPONSES)


async def messages(request: web.Request) -> web.StreamResponse:
    """POST /v1/messages (Anthropic Messages, Claude Code): apply the pipeline, then relay to
    ANTHROPIC_URL."""
    return await through_pipeline(request, MESSAGES)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions (opencode, Aider, Continue, ...; also without /v1, as some
    clients send it): apply the pipeline, then relay to CHAT_URL."""
    return await through_pipeline(request, CHAT)


async def anthropic_passthrough(request: web.Request) -> web.StreamResponse:
    """The other /v1/messages/... routes (count_tokens, batches), forwarded unchanged to
    ANTHROPIC_URL."""
    path = targets.origin_path(request.raw_path)
    if not request.app[ROUTES].allows(request.method, upstream_path(path)):
        return refusal(MESSAGES)
    credential = _credential(request, MESSAGES)
    body = await read_body(request) if request.body_exists else None
    return await relay(request, path, body, protocol=MESSAGES, credential=credential)


def _credential(request: web.Request, protocol: Protocol) -> Credential:
    """The credential the request's upstream gets (raises NoUpstreamKey before any work is
    done for a request that could not be forwarded)."""
    app = request.app
    return upstream_credential(app[SETTINGS], anthropic=protocol is MESSAGES,
                               chat=protocol is CHAT, keyed=app[KEYED])


async def through_pipeline(request: web.Request, protocol: Protocol) -> web.StreamResponse:
    """Parse the body in its protocol, apply the pipeline, then relay.

    Only a body the proxy cannot parse (or re-serialise losslessly) goes out as the client's
    own bytes; a step that fails is undone alone and the others' work goes out.
    """
    app = request.app
    info = request[ACCESS]
    at = app[CLOCK]()
    began = time.perf_counter()
    credential = _credential(request, protocol)
    raw = await read_body(request)
    body = raw
    ex: Exchange | None = None
    client_body: dict[str, Any] | None = None
    try:
        ex = request[EXCHANGE] = await _off_loop_if_large(
            raw, Exchange.parse, raw, request.headers, app[SETTINGS], request.get(PRINCIPAL),
            protocol)
    except NotAResponsesRequest as exc:
        _forward_as_sent(app, info, exc)
    if ex is not None:
        client_body = dict(ex.body)  # steps may replace its keys, never the values in them
        failed = await app[PIPELINE].run(ex)
        try:
            body = await _off_loop_if_large(raw, ex.serialise)
        except NotAResponsesRequest as exc:
            _forward_as_sent(app, info, exc)
        info.session_id = ex.identity.session_id
        info.turns_in = ex.history.turns
        info.turns_forwarded = ex.turns_forwarded
        info.items_cut = len(ex.cut)
        info.notes = ex.notes
        info.steps_failed = failed or None
        if ex.first_turn:
            app[METRICS].turns_cut.inc(ex.first_turn)
    # Bytes, not tokens: no tokenizer on the request path (tokens: input_tokens below).
    info.bytes_in = len(raw)
    info.bytes_forwarded = len(body)
    info.forwarded_ratio = round(len(body) / len(raw), 4) if raw else 1.0
    request[SENT] = Sent(at, raw, body, ex, client_body,
                         ex.body if ex is not None and body is not raw else None, protocol.name)
    info.prepare_ms = round((time.perf_counter() - began) * 1000, 2)
    return await relay(request, protocol.upstream_path, body, tap_usage=True, ex=ex,
                       protocol=protocol, credential=credential)


T = TypeVar("T")
# Parsing and writing back a body grows with its size (bench/RESULTS.md, Proxy overhead): past
# this size it runs in a thread, so that other sessions' requests are served meanwhile.
LARGE_BODY = 1024 * 1024


async def _off_loop_if_large(
    raw: bytes, fn: Callable[..., T], *args: Any
) -> T:
    if len(raw) > LARGE_BODY:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


def _forward_as_sent(app: web.Application, info: Access, exc: NotAResponsesRequest) -> None:
    reason = type(exc).__name__
    app[METRICS].fail_open.labels(reason).inc()
    log.info("forwarding the request as sent: %s", exc)
    info.fail_open = reason


async def passthrough(request: web.Request) -> web.StreamResponse:
    """Every other method and path, forwarded unchanged under UPSTREAM_URL (under client
    keys, only the routes ``proxy.passthrough`` allows); the model list asked by an Anthropic
    client (its headers say so) and Anthropic's /api/ paths, under ANTHROPIC_URL."""
    if request.headers.get("upgrade"):
        # Codex tries a WebSocket first when configured to; 426 makes it fall back to HTTP.
        return error_response(
            426,
            "WebSocket transport is not supported by this proxy; use HTTP",
            "invalid_request_error",
            "websocket_not_supported",
        )
    # The target as the client sent it (still percent-encoded), so that nothing is decoded
    # and re-encoded differently on the way; Upstream.url refuses dot segments.
    origin = targets.origin_path(request.raw_path)
    path = upstream_path(origin)
    models = path == "/models" or path.startswith("/models/")
    anthropic = (models and _anthropic(request)) or origin.startswith(ANTHROPIC_ONLY)
    protocol = MESSAGES if anthropic else RESPONSES
    if not request.app[ROUTES].allows(request.method, path):
        return refusal(protocol)  # before the body is read: nothing of it goes anywhere
    credential = _credential(request, protocol)
    body = await read_body(request) if request.body_exists else None
    # Anthropic's base URL has no /v1: its path is the client's.
    return await relay(request, origin if protocol is MESSAGES else path, body,
                       protocol=protocol, credential=credential)


async def relay(
    request: web.Request, path: str, body: bytes | None, *, tap_usage: bool = False,
    credential: Credential, ex: Exchange | None = None, protocol: Protocol = RESPONSES,
) -> web.StreamResponse:
    """Send to the upstream and copy its answer back chunk by chunk, as it arrives; the
    pipeline's steps are told the answer's status (``ex``: the request's exchange) before,
    and the answer once whole.

    One function over 60 lines on purpose: the upstream response is released or closed in
    one ``finally``, and every way out of the copy (the client gone, the upstream broken, the
    end) reads beside it."""
    app = request.app
    info = request[ACCESS]
    upstream = _upstream(app, protocol)
    headers = request_headers(
        request.headers, credential, body_decoded=request.get(bodies.DECODED, False))
    url = upstream.url(path, request.raw_path.partition("?")[2])

    start = time.perf_counter()
    upstream_response = await upstream.send(request.method, url, headers, body)
    completed = False
    # The steps' answering phase is failure-isolated and synchronous: it cannot raise here.
    hold = app[PIPELINE].answering(ex, upstream_response.status) if ex is not None else None
    tap = _tap(upstream_response, protocol) if tap_usage else None
    try:
        response = web.StreamResponse(
            status=upstream_response.status,
            reason=upstream_response.reason,
            headers=response_headers(upstream_response.headers),
        )
        await response.prepare(request)
        first = True
        idle = Idle(upstream_response, upstream.read_timeout_s)
        try:
            async for chunk in upstream_response.content.iter_any():
                if first:
                    first = False
                    ttfb = time.perf_counter() - start
                    info.ttfb_ms = round(ttfb * 1000, 2)
                    app[METRICS].ttfb.observe(ttfb)
                idle.writing()
                if tap is not None:
                    tap.feed(chunk)
                if hold is not None and (tap is None or tap.answer_due):
                    await hold()  # the answer ends once what the request brought is kept
                    hold = None
                try:
                    await response.write(chunk)
                except ConnectionResetError as exc:  # aiohttp's ClientConnectionResetError
                    raise ClientClosed from exc  # a ClientError too: not the upstream's
                idle.moved()
        except (aiohttp.ClientError, TimeoutError) as exc:
            # The upstream broke mid-answer: end the client's connection the same way, so it
            # sees a broken stream (and retries) rather than a clean end.
            info.upstream_error = type(exc).__name__
            log.warning("upstream stream broke: %s", type(exc).__name__)
            if request.transport is not None:
                request.transport.close()
            return response
        finally:
            idle.cancel()
        if hold is not None:  # a stream that ended without its completed event's blank line
            await hold()
        await response.write_eof()
        completed = True
        app[METRICS].upstream.observe(time.perf_counter() - start)
        return response
    except ConnectionResetError as exc:  # writing the status line or the end to the client
        raise ClientClosed from exc
    finally:
        if tap is not None:
            _record_usage(app, info, tap, ex)
            _count_unread(app, tap)
        if completed:
            upstream_response.release()
        else:
            upstream_response.close()  # client gone or stream broken: drop the connection now


def _upstream(app: web.Application, protocol: Protocol) -> Upstream:
    """Where a protocol's requests go (their credential: ``_credential``); CHAT_UPSTREAM is
    UPSTREAM's client unless CHAT_URL is set."""
    if protocol is MESSAGES:
        return app[ANTHROPIC]
    return app[CHAT_UPSTREAM] if protocol is CHAT else app[UPSTREAM]


Tap = UsageTap | BodyTap | MessagesTap | ChatTap


def _tap(response: aiohttp.ClientResponse, protocol: Protocol) -> Tap | None:
    """What reads the answer's usage and output on the side: a stream's events, or a
    non-streamed answer's JSON body."""
    encoding = response.headers.get("Content-Encoding")
    if response.content_type == "text/event-stream":
        return (MessagesTap(encoding) if protocol is MESSAGES
                else ChatTap(encoding) if protocol is CHAT else UsageTap(encoding))
    if response.content_type == "application/json":
        return BodyTap(encoding, None if protocol is RESPONSES else protocol)
    return None


def _count_unread(app: web.Application, tap: Tap) -> None:
    if tap.skipped:
        log.debug("answer events or bodies too large to read for usage: %d relayed unread",
                  tap.skipped)
        app[METRICS].events_unread.inc(tap.skipped)


def _record_usage(
    app: web.Application, info: Access, tap: Tap, ex: Exchange | None
) -> None:
    usage = tap.usage()
    if ex is not None and (output := tap.output()) is not None:
        app[PIPELINE].completed(ex, Answer(output, tap.size, usage))
    if usage is None:
        return
    info.input_tokens = usage.get("input_tokens")
    info.cached_tokens = usage.get("cached_tokens")
    info.cache_write_tokens = usage.get("cache_write_tokens")
    info.output_tokens = usage.get("output_tokens")
    metrics = app[METRICS]
    metrics.tokens.labels("input").inc(usage.get("input_tokens", 0))
    metrics.tokens.labels("cached").inc(usage.get("cached_tokens", 0))
    if info.cache_write_tokens is not None:
        metrics.tokens.labels("cache_write").inc(info.cache_write_tokens)
