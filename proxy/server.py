"""The runner ctxproxy serves with: aiohttp's, except for requests it cannot parse.

aiohttp answers a malformed request line or header with a plain-text 400 that quotes the
offending bytes, and logs them at ERROR: for ``Authorization Bearer sk-...`` (a colon
missing) that is the client's key, echoed and logged. Here such a request gets an
OpenAI-shaped 400 that quotes nothing, and one WARNING line naming only the error's kind.
"""

from __future__ import annotations

import logging
from http import HTTPStatus

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from proxy.errors import error_response

__all__ = ["Runner"]

log = logging.getLogger("ctxproxy.server")


class _Handler(RequestHandler):
    __slots__ = ()

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
    def __call__(self) -> RequestHandler:
        handler = super().__call__()
        handler.__class__ = _Handler  # same layout: _Handler adds no state
        return handler


class Runner(web.AppRunner):
    """``web.AppRunner`` whose connections answer unparseable requests quietly."""

    __slots__ = ()

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _Server
        return server
