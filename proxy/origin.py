"""Which requests reach the proxy at all: the Host they name, the Origin a browser sends with
them, and the bodies ``/v1`` takes.

A web page can make its visitor's browser call a proxy on the visitor's machine: a "simple"
cross-site POST (``text/plain``, no preflight, and a sidecar without client keys asks for no
credential), or, after DNS rebinding, a request under the page's own name, which the browser
then holds for same-origin. Each is refused before anything reads it: a Host that does not
name this proxy (421), an Origin that is neither its own nor allowed (403), a ``/v1`` body that
is not JSON (415). /healthz and /readyz stay open to probes: they read and write nothing.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Awaitable, Callable
from urllib.parse import SplitResult, urlsplit

from aiohttp import web

from ctxproxy.config import Settings
from ctxproxy.proxy.auth import OPEN_PATHS
from ctxproxy.proxy.errors import HostNotAllowed, NotJson, OriginNotAllowed

__all__ = ["WILDCARD_BINDS", "Gate", "gate"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]
# A bind address that names no host: the proxy cannot tell every name it is reached by.
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})
_DEFAULT_PORTS = {"http": 80, "https": 443}
JSON = "application/json"


def _names(spec: str | None) -> frozenset[str]:
    return frozenset(n.strip().lower().rstrip(".") for n in (spec or "").split(",") if n.strip())


def host_port(host: str) -> tuple[str, int | None] | None:
    """A Host value's name (lowercased) and port: ``name[:port]`` or ``[v6][:port]``; None
    when it is neither."""
    if host.startswith("["):
        name, close, rest = host[1:].partition("]")
        if not close or (rest and not rest.startswith(":")):
            return None
        port = rest[1:]
    else:
        name, _, port = host.partition(":")
    if port and not (port.isascii() and port.isdigit() and len(port) <= 5):
        return None
    name = name.lower().rstrip(".")
    return (name, int(port) if port else None) if name else None


@functools.lru_cache(maxsize=256)  # the names a proxy is reached by are few
def _loopback(name: str) -> bool:
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback  # 127.0.0.0/8 and ::1
    except ValueError:
        return False


def _parsed_origin(value: str) -> SplitResult | None:
    """An Origin (``scheme://host[:port]``) split; None when it is not one (``null``, ...)."""
    try:
        parts = urlsplit(value.strip())
        parts.port  # noqa: B018 (raises ValueError on a port that is no number)
    except ValueError:
        return None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/"):
        return None
    return parts


def _origin_key(value: str) -> tuple[str, str, int] | None:
    """(scheme, host, port, the scheme's default filled in) of an Origin; None if not one."""
    parts = _parsed_origin(value)
    if parts is None or parts.hostname is None:
        return None
    return parts.scheme, parts.hostname.rstrip("."), parts.port or _DEFAULT_PORTS[parts.scheme]


class Gate:
    """The Host names and Origins one proxy accepts (see the module docstring)."""

    def __init__(self, settings: Settings, *, client_keys: bool) -> None:
        hosts = _names(settings.allowed_hosts)
        bind = settings.host.strip("[]").lower()
        # Bound to every interface, the proxy is reached by names it cannot list: with client
        # keys every caller needs a key a web page does not have, so any Host may pass;
        # without them only the names it knows (and ALLOWED_HOSTS) do.
        self._any_host = "*" in hosts or (bind in WILDCARD_BINDS and client_keys)
        own = set(hosts)
        if bind not in WILDCARD_BINDS:
            own.add(bind)
        origins = {_origin_key(o) for o in (settings.allowed_origins or "").split(",")}
        if settings.public_url:
            public = _origin_key(settings.public_url)
            origins.add(public)
            own.add(public[1] if public is not None else "")
        self._hosts = frozenset(own - {""})
        self._origins = frozenset(o for o in origins if o is not None)

    def check(self, request: web.Request) -> None:
        """Raise the error ``request`` gets, if any."""
        host = host_port(request.headers.get("Host", ""))
        if host is None or not (self._any_host or _loopback(host[0]) or host[0] in self._hosts):
            raise HostNotAllowed(
                "this proxy does not answer for that Host; its operator may add the name to "
                "CTXPROXY_ALLOWED_HOSTS")
        origin = request.headers.get("Origin")
        if origin is not None and not self._origin_allowed(origin, host):
            raise OriginNotAllowed(
                "requests from this web origin are not allowed; its operator may add it to "
                "CTXPROXY_ALLOWED_ORIGINS")
        if request.method == "POST" and _is_api(request) and request.body_exists and (
                request.content_type != JSON):
            raise NotJson(f"request bodies must be {JSON}")

    def _origin_allowed(self, origin: str, host: tuple[str, int | None]) -> bool:
        key = _origin_key(origin)
        if key is None:
            return False
        # The proxy's own pages (the dashboard) post from the origin they were served from:
        # the Host the request names, which passed above.
        same = key[1:] == (host[0], host[1] or _DEFAULT_PORTS[key[0]])
        return same or key in self._origins


def _is_api(request: web.Request) -> bool:
    path = request.path
    return path in ("/v1", "/responses", "/chat/completions") or path.startswith("/v1/")


def gate(settings: Settings, *, client_keys: bool) -> Middleware:
    """The middleware answering 421, 403 or 415 (see the module docstring)."""
    checks = Gate(settings, client_keys=client_keys)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in OPEN_PATHS:
            checks.check(request)
        return await handler(request)

    return middleware
