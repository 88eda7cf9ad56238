"""Which routes the catch-all forwards under client keys.

Every forwarded request carries ``UPSTREAM_API_KEY``, which all client keys share: at the
provider, one key's files and stored responses are every key's. So under client keys only what
an agent needs goes through (``GET /v1/models``, one model, Anthropic's token count), plus
what ``CTXPROXY_PASSTHROUGH`` lists; without client keys (the one-user sidecar) every route
is forwarded.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from ctxproxy.config import Settings
from ctxproxy.proxy.errors import error_response
from ctxproxy.request.protocol import RESPONSES, Protocol

__all__ = ["ROUTES", "Routes", "refusal", "upstream_path"]

# Claude Code counts tokens (stateless at the provider: nothing one key leaves for another).
AGENT_ROUTES = ("GET /v1/models", "GET /v1/models/*", "POST /v1/messages/count_tokens")
ANY = "*"


def upstream_path(path: str) -> str:
    """A client's path as it is joined under ``UPSTREAM_URL`` (whose base ends in /v1)."""
    return path[3:] if path == "/v1" or path.startswith("/v1/") else path


@dataclass(frozen=True, slots=True)
class Rule:
    """One ``METHOD /path`` entry: an exact path, or with ``prefix`` every path it starts."""

    method: str
    path: str
    prefix: bool

    @classmethod
    def parse(cls, entry: str) -> Rule:
        method, pattern = entry.split(maxsplit=1)
        prefix = pattern.endswith(ANY)
        return cls(method.upper(), upstream_path(pattern.removesuffix(ANY)), prefix)

    def allows(self, method: str, path: str) -> bool:
        if self.method not in (ANY, method):
            return False
        return path.startswith(self.path) if self.prefix else path == self.path


@dataclass(frozen=True, slots=True)
class Routes:
    """The routes forwarded; ``rules`` None: all of them."""

    rules: tuple[Rule, ...] | None

    @classmethod
    def from_settings(cls, settings: Settings, *, client_keys: bool) -> Routes:
        if not client_keys:
            return cls(None)
        listed = [e.strip() for e in (settings.passthrough or "").split(",") if e.strip()]
        return cls(tuple(Rule.parse(e) for e in (*AGENT_ROUTES, *listed)))

    def allows(self, method: str, path: str) -> bool:
        """Whether ``method`` on ``path`` (as ``upstream_path`` gives it) is forwarded."""
        return self.rules is None or any(r.allows(method, path) for r in self.rules)


ROUTES = web.AppKey("passthrough_routes", Routes)


def refusal(protocol: Protocol = RESPONSES) -> web.Response:
    """What a route that is not forwarded gets (in the client protocol's shape; the path is
    not quoted)."""
    return error_response(
        403, "this route is not forwarded under client keys (CTXPROXY_PASSTHROUGH lists the "
        "ones that are)", "invalid_request_error", "route_not_forwarded", protocol)
