"""The runner ctxproxy serves with: aiohttp's, with the limits its connections lack.

aiohttp answers a malformed request line or header with a plain-text 400 that quotes the
offending bytes, and logs them at ERROR: for ``Authorization Bearer sk-...`` (a colon
missing) that is the client's key, echoed and logged. Here such a request gets an
OpenAI-shaped 400 that quotes nothing, and one WARNING line naming only the error's kind.

aiohttp also waits for a request's headers for as long as they trickle in, and accepts every
connection offered. Here (``Limits``) a request's line and headers must arrive within a
time, counted from the connection's opening or from the next request's first byte, and a
process holds a bounded number of connections: one more is closed as soon as it is accepted,
the open ones untouched. Closed at once rather than left in the listen backlog: with several
workers on one port the kernel hands a connection to a worker however busy it is, and one
stuck in a full worker's backlog would wait while its siblings had room.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from ctxproxy.proxy.errors import error_body, error_response

__all__ = ["Limits", "Runner"]

log = logging.getLogger("ctxproxy.server")

WARN_EVERY_S = 60.0  # a full server is a warning once a minute, not per connection

_LATE_BODY = error_body("the request line and headers did not arrive in time",
                        "invalid_request_error", "request_timeout")
# Written straight to the socket: no request was parsed, so no handler can answer it.
_LATE = (b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
         b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_LATE_BODY), _LATE_BODY))


@dataclass(frozen=True, slots=True)
class Limits:
    """What one connection and one process may take: ``None`` is no limit. ``closed`` is
    told why a connection was closed by them (``header_timeout``, ``over_limit``)."""

    header_timeout_s: float | None = None
    keepalive_s: float | None = None  # aiohttp's own default (an hour) when None
    max_connections: int | None = None
    closed: Callable[[str], object] | None = None

    def close(self, reason: str) -> None:
        if self.closed is not None:
            self.closed(reason)


class _Handler(RequestHandler):
    __slots__ = ("_body", "_headers_due", "_limits")

    def __init__(self, manager: web.Server, *, limits: Limits, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._limits = limits
        self._headers_due: asyncio.TimerHandle | None = None
        self._body: StreamReader | None = None  # the last request's, till it has all come

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        manager = self._manager
        assert isinstance(manager, _Server)
        if not manager.admits():
            self._manager = None  # so that connection_lost leaves the server alone
            transport.close()
            return
        super().connection_made(transport)
        self._await_headers()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._headers_in()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # aiohttp calls this with b"" itself whenever a handler reads some of a body (to let
        # its parser go on): not a byte of the client's, so no header time begins there.
        if data and self._headers_due is None and (self._body is None or self._body.is_eof()):
            self._await_headers()  # the first byte of the next request
        count = self._request_count
        super().data_received(data)
        if self._request_count != count and self._messages:
            self._body = self._messages[-1][1]
            self._headers_in()

    def _await_headers(self) -> None:
        timeout = self._limits.header_timeout_s
        if timeout is not None:
            self._headers_due = self._loop.call_later(timeout, self._headers_late)

    def _headers_in(self) -> None:
        if self._headers_due is not None:
            self._headers_due.cancel()
            self._headers_due = None

    def _headers_late(self) -> None:
        self._headers_due = None
        if self.transport is None:
            return
        log.debug("a request's line and headers did not arrive in time: connection closed")
        self._limits.close("header_timeout")
        if not self._request_in_progress and not self._messages:
            self.transport.write(_LATE)  # else an answer is on the way: a 408 would cut in
        self.force_close()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status == HTTPStatus.INTERNAL_SERVER_ERROR:
            return super().handle_error(request, status, exc, message)
        # The parser's message and the exception quote the request's bytes: neither is kept.
        log.warning("malformed request refused: %s (%s)", status, type(exc).__name__)
        response = error_response(status, "malformed HTTP request line or header",
                                  "invalid_request_error", "malformed_request")
        response.force_close()
        return response


class _Server(web.Server):
    limits: Limits
    warned_at: float

    def __call__(self) -> RequestHandler:
        return _Handler(self, loop=self._loop, limits=self.limits, **self._kwargs)

    def admits(self) -> bool:
        """Whether one more connection fits (connections are made one at a time)."""
        most = self.limits.max_connections
        if most is None or len(self._connections) < most:
            return True
        self.limits.close("over_limit")
        now = time.monotonic()
        if now - self.warned_at >= WARN_EVERY_S:
            self.warned_at = now
            log.warning("%d connections open: new ones are closed (CTXPROXY_MAX_CONNECTIONS)",
                        most)
        return False


class Runner(web.AppRunner):
    """``web.AppRunner`` whose connections answer unparseable requests quietly, within
    ``limits``."""

    __slots__ = ("_limits",)

    def __init__(self, app: web.Application, *, limits: Limits | None = None,
                 **kwargs: Any) -> None:
        self._limits = limits or Limits()
        if self._limits.keepalive_s is not None:
            # An idle kept-alive connection holds a place under max_connections.
            kwargs["keepalive_timeout"] = self._limits.keepalive_s
        super().__init__(app, **kwargs)

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _Server  # same layout: what _Server adds is set here
        assert isinstance(server, _Server)
        server.limits = self._limits
        server.warned_at = -WARN_EVERY_S
        return server
