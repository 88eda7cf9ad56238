"""Optional inbound auth for shared deployments: only callers with a known key get through."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from proxy.errors import Unauthorized

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
# The masked-output route (proxy/outputs.py) is called by the model's shell, which has no
# client key: the unguessable id and the session header it must match are its credential.
OUTPUTS_ROUTE = "outputs"
# A browser cannot send a bearer key: the dashboard's sign-in page (open) puts the key in this
# cookie, which counts like the bearer key on /ui pages and nowhere else.
UI_COOKIE = "ctxproxy_key"
UI_LOGIN_ROUTES = frozenset({"ui:login", "ui:login-post"})


def load_client_keys(spec: str | None) -> tuple[bytes, ...]:
    """``key1,key2`` or ``@/path/to/file`` (one key a line, # comments)."""
    if not spec:
        return ()
    if spec.startswith("@"):
        lines = Path(spec[1:]).read_text().splitlines()
    else:
        lines = spec.split(",")
    keys = (line.strip() for line in lines)
    return tuple(k.encode() for k in keys if k and not k.startswith("#"))


def client_auth(keys: tuple[bytes, ...]) -> Middleware:
    """A middleware answering 401 to any caller whose bearer key is not in ``keys``."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        # match_info is resolved before the middlewares run: only the matched route counts.
        route = request.match_info.route.name
        if request.path in OPEN_PATHS or route == OUTPUTS_ROUTE or route in UI_LOGIN_ROUTES:
            return await handler(request)
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        if not presented and (route or "").startswith("ui") and UI_COOKIE in request.cookies:
            scheme, presented = "bearer", request.cookies[UI_COOKIE]
        token = presented.strip().encode()
        # Compare against every key, so timing does not tell which one nearly matched.
        ok = scheme.lower() == "bearer" and token != b""
        ok = ok and any([hmac.compare_digest(token, key) for key in keys])
        if not ok:
            raise Unauthorized("missing or unknown client key")
        return await handler(request)

    return middleware
