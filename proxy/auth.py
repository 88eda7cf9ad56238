"""Inbound auth for shared deployments: a caller's key decides who it is and what it may claim.

``CTXPROXY_CLIENT_KEYS`` lists the accepted keys. Each entry is a key, then optional
``name=value`` fields separated by spaces:

    ck-alice principal=alice teams=team-a agents=coder,reviewer users=any
    ck-ci    principal=ci    teams=team-a,team-b users=none

``principal`` names the caller (default: a digest of the key, never the key): it is part of
every memory scope the caller reads and writes, so two keys never share memory whatever
identity headers they send. ``teams`` and ``agents`` list what ``x-team-id`` and
``x-agent-id`` may say (``*``, the default: anything); ``users`` what ``x-tdai-user-key`` may
be: ``any`` (the default), ``none``, or user keys (or their ``u_...`` digests). A header
beyond the key's claims gets 403. The bare word ``admin`` marks an operator's key: the
dashboard and explain show it every principal's data (other keys see only their own).
Entries are separated by newlines (``@FILE``) or ``;``; a spec with neither ``;`` nor ``=`` is
the older ``key1,key2`` list. A caller sends its key as ``Authorization: Bearer KEY`` or, as
Claude Code and the anthropic SDK do, as ``x-api-key: KEY``; either way it never goes upstream
(``proxy.headers.upstream_credential``).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from aiohttp import web
from multidict import CIMultiDict

from ctxproxy.knowledge.routes import ROUTE, TOOL_ROUTES
from ctxproxy.proxy.errors import Forbidden, Unauthorized
from ctxproxy.request import user_digest

__all__ = ["ADMIN", "OPEN_PATHS", "OUTPUTS_ROUTE", "PRINCIPAL", "ClientKey", "client_auth",
           "load_client_keys"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
# The masked-output route (proxy/outputs.py) and the embedded core's tools are called by the
# model's shell, which has no client key: the unguessable id and the session header it must
# match, and the capability token (knowledge/capability.py), are their credentials.
OUTPUTS_ROUTE = "outputs"
# A browser cannot send a bearer key: the dashboard's sign-in page (open) puts the key in this
# cookie, which counts like the bearer key on /ui pages and nowhere else.
UI_COOKIE = "ctxproxy_key"
UI_LOGIN_ROUTES = frozenset({"ui:login", "ui:login-post"})
SHELL_ROUTES = frozenset({OUTPUTS_ROUTE, *TOOL_ROUTES})
# The embedded core's discovery calls name a team and an agent in their body.
DISCOVERY_ROUTES = frozenset({f"{ROUTE}:list", f"{ROUTE}:agent_assets"})
# Where the middleware leaves the caller's principal on the request, and whether its key is an
# operator's (absent without client keys: the one-user sidecar, which is its own operator).
PRINCIPAL = web.RequestKey("principal", str)
ADMIN = web.RequestKey("admin", bool)
_ANY = "*"


@dataclass(frozen=True, slots=True)
class ClientKey:
    """One accepted key: who it is and which identity headers it may send (None: any)."""

    key: bytes = field(repr=False)
    principal: str
    teams: frozenset[str] | None = None
    agents: frozenset[str] | None = None
    users: frozenset[str] | None = None  # user key digests; empty: no user key at all
    admin: bool = False

    def refusal(self, headers: Mapping[str, str]) -> str | None:
        """Why ``headers`` claim more than this key may (None: they do not)."""
        team, agent = headers.get("x-team-id"), headers.get("x-agent-id")
        if team and self.teams is not None and team not in self.teams:
            return f"this client key may not act for team {team!r}"
        if agent and self.agents is not None and agent not in self.agents:
            return f"this client key may not act as agent {agent!r}"
        user_key = headers.get("x-tdai-user-key")
        if user_key and self.users is not None and user_digest(user_key) not in self.users:
            return "this client key may not act for that user key"  # never echo the key
        return None


def _principal_of(key: str) -> str:
    return "key-" + hashlib.sha256(b"ctxproxy-client-key\0" + key.encode()).hexdigest()[:12]


def _names(value: str) -> frozenset[str] | None:
    names = frozenset(v.strip() for v in value.split(",") if v.strip())
    return None if _ANY in names else names


def _users(value: str) -> frozenset[str] | None:
    if value == "any" or value == _ANY:
        return None
    if value == "none":
        return frozenset()
    keys = (v.strip() for v in value.split(",") if v.strip())
    return frozenset(k if k.startswith("u_") else user_digest(k) for k in keys)


def _entry(text: str) -> ClientKey:
    key, *options = text.split()
    admin = "admin" in options
    fields: dict[str, str] = {}
    for option in (o for o in options if o != "admin"):
        name, sep, value = option.partition("=")
        if not sep or name not in ("principal", "teams", "agents", "users") or name in fields:
            # The key itself is never part of the message.
            raise ValueError(f"CTXPROXY_CLIENT_KEYS: bad field {name!r} (expected principal=, "
                             "teams=, agents=, users=, each once, or admin)")
        fields[name] = value
    return ClientKey(
        key=key.encode(),
        principal=fields.get("principal") or _principal_of(key),
        teams=_names(fields.get("teams", _ANY)),
        agents=_names(fields.get("agents", _ANY)),
        users=_users(fields.get("users", "any")),
        admin=admin,
    )


def load_client_keys(spec: str | None) -> tuple[ClientKey, ...]:
    """The keys of ``spec`` (see the module docstring); () without a spec."""
    if not spec:
        return ()
    if spec.startswith("@"):
        entries = Path(spec[1:]).read_text().splitlines()
    elif ";" in spec or "=" in spec:
        entries = spec.replace("\n", ";").split(";")
    else:
        entries = spec.split(",")
    lines = (e.strip() for e in entries)
    return tuple(_entry(line) for line in lines if line and not line.startswith("#"))


async def _body_claims(request: web.Request) -> dict[str, str]:
    """The team and agent a discovery call's body asks about, as the headers would say them
    (the route reads the same cached body and answers a bad one)."""
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(body, dict):
        return {}
    names = {"team_id": "x-team-id", "agent_id": "x-agent-id"}
    return {header: v for key, header in names.items() if isinstance(v := body.get(key), str)}


def client_auth(keys: tuple[ClientKey, ...]) -> Middleware:
    """A middleware answering 401 to a caller without a known key (a bearer Authorization, or
    x-api-key as Anthropic's clients send it), 403 to one whose identity headers claim more
    than its key allows; it leaves the key's principal on the request."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        # match_info is resolved before the middlewares run: only the matched route counts.
        route = request.match_info.route.name
        if request.path in OPEN_PATHS or route in SHELL_ROUTES or route in UI_LOGIN_ROUTES:
            return await handler(request)
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        if not presented and (api_key := request.headers.get("x-api-key")):
            scheme, presented = "bearer", api_key  # Claude Code's and the anthropic SDK's way
        if not presented and (route or "").startswith("ui") and UI_COOKIE in request.cookies:
            scheme, presented = "bearer", request.cookies[UI_COOKIE]
        token = presented.strip().encode()
        # Compare against every key, so timing does not tell which one nearly matched.
        usable = scheme.lower() == "bearer" and token != b""
        matches = [hmac.compare_digest(token, k.key) for k in keys]
        found = next((k for k, ok in zip(keys, matches, strict=True) if ok), None)
        if not usable or found is None:
            raise Unauthorized("missing or unknown client key")
        claims: CIMultiDict[str] = CIMultiDict(request.headers)
        if route in DISCOVERY_ROUTES:
            claims.update(await _body_claims(request))
        refusal = found.refusal(claims)
        if refusal is not None:
            raise Forbidden(refusal)
        request[PRINCIPAL] = found.principal
        request[ADMIN] = found.admin
        return await handler(request)

    return middleware
