"""The proxy's own errors, each mapped once, at the edge, to JSON in the client protocol's
shape (OpenAI's, or Anthropic's for /v1/messages)."""

from __future__ import annotations

from aiohttp import web

from ctxproxy.request.protocol import RESPONSES, Protocol


class ProxyError(Exception):
    """An error ctxproxy answers itself, before any byte of an upstream answer was sent."""

    status = 500
    type = "server_error"
    code = "proxy_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def response(self, protocol: Protocol = RESPONSES) -> web.Response:
        return error_response(self.status, self.message, self.type, self.code, protocol)


class BadRequest(ProxyError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class BodyTooLarge(ProxyError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class UnsupportedEncoding(ProxyError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_content_encoding"


class UpstreamUnreachable(ProxyError):
    status = 502
    type = "upstream_error"
    code = "upstream_unreachable"


class UpstreamTimeout(ProxyError):
    status = 504
    type = "upstream_error"
    code = "upstream_timeout"


class NoUpstreamKey(ProxyError):
    """The proxy has no credential of its own for the upstream a request goes to."""

    status = 500
    type = "server_error"
    code = "upstream_key_missing"


class Unauthorized(ProxyError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class Forbidden(ProxyError):
    status = 403
    type = "invalid_request_error"
    code = "identity_not_allowed"


class OriginNotAllowed(ProxyError):
    status = 403
    type = "invalid_request_error"
    code = "origin_not_allowed"


class HostNotAllowed(ProxyError):
    status = 421  # Misdirected Request: the Host names another server
    type = "invalid_request_error"
    code = "host_not_allowed"


class NotJson(ProxyError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_content_type"


class ClientClosed(Exception):
    """The client hung up while the answer was being relayed: nothing more can be sent."""

    status = 499  # nginx's "client closed request", for the access log and metrics


def error_body(message: str, type_: str, code: str, protocol: Protocol = RESPONSES) -> bytes:
    """An error in the client protocol's own shape (OpenAI's by default)."""
    return protocol.error_body(message, type_, code)


def error_response(
    status: int, message: str, type_: str, code: str, protocol: Protocol = RESPONSES,
) -> web.Response:
    return web.Response(
        status=status, body=error_body(message, type_, code, protocol),
        content_type="application/json",
    )
