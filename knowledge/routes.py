"""The embedded core's HTTP routes, mounted on the proxy itself so the model can curl them.

Same paths, envelope and service-id rule as KERNEL_API.md. The discovery calls need the core
token when one is set; the wiki tools do not (the model calls them and must never see it).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import sqlite3
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from aiohttp import web

from ctxproxy.config.settings import SERVICE_ID_PATTERN
from ctxproxy.knowledge.capability import HEADER, CapabilityKey, Grant, check
from ctxproxy.knowledge.local import LocalAssets
from ctxproxy.knowledge.params import Body
from ctxproxy.knowledge.service import EmbeddedCore, ServiceError

__all__ = ["EMBEDDED", "TOOL_ROUTES", "add_routes", "add_tool_routes"]

EMBEDDED = web.AppKey("knowledge_embedded", EmbeddedCore)
_SERVICE_ID = re.compile(SERVICE_ID_PATTERN)

log = logging.getLogger("ctxproxy.knowledge")

# (core, service id, request headers, body) -> data; run in a worker thread.
Operation = Callable[[EmbeddedCore, str, Mapping[str, str], dict[str, Any]], dict[str, Any]]


def envelope(code: int, message: str, data: Any = None) -> web.Response:
    body: dict[str, Any] = {"code": code, "message": message, "request_id": uuid.uuid4().hex}
    if data is not None:
        body["data"] = data
    status = 200 if code == 0 else code
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _authorised(request: web.Request, token: str | None) -> bool:
    if token is None:
        return True
    expected = f"Bearer {token}".encode()
    return hmac.compare_digest(request.headers.get("authorization", "").encode(), expected)


# The proxy's own assets' side of a tools route: (assets, grant, session, body) -> data.
LocalOperation = Callable[[LocalAssets, Grant, str | None, Body], Awaitable[Body]]


def _route(
    op: Operation | None, *, token: str | None, capability: CapabilityKey | None = None,
    local: LocalAssets | None = None, local_op: LocalOperation | None = None,
) -> Callable[[web.Request], Any]:
    """A handler for ``op``; ``token`` is the core token its caller must present (None: no
    token needed); with ``capability``, the caller presents a capability for the asset
    instead (the model's curl lines: see knowledge.capability). An asset ``local`` owns goes
    to ``local_op`` instead of the core (``op`` None: no core here, only those assets)."""

    async def handler(request: web.Request) -> web.Response:
        service_id = request.headers.get("x-tdai-service-id", "")
        if not _SERVICE_ID.match(service_id):
            return envelope(400, "x-tdai-service-id is missing or not ^[A-Za-z0-9_-]{1,200}$")
        if not _authorised(request, token):
            return envelope(401, "missing or wrong bearer token")
        grant = None
        if capability is not None:
            grant = check(capability, request.headers.get(HEADER), now=time.time())
            if grant is None:
                return envelope(401, "missing or expired capability: run the command from the "
                                     "newest <knowledge_tools> block")
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return envelope(400, "the body is not JSON")
        if not isinstance(body, dict):
            return envelope(400, "the body is not a JSON object")
        asset = body.get("knowledge_id")
        if local is not None and local_op is not None and isinstance(asset, str) \
                and local.owns(asset):
            if grant is None or grant.knowledge_id != asset or grant.service_id != service_id:
                return envelope(403, "the capability token is for another asset or service")
            try:
                data = await local_op(local, grant, request.headers.get("x-conversation-id"),
                                      body)
            except ServiceError as exc:
                return envelope(exc.code, exc.message)
            return envelope(0, "ok", data)
        if op is None:
            return envelope(404, f"unknown knowledge_id {asset!r}")
        core = request.app[EMBEDDED]
        try:
            if grant is not None:
                await asyncio.to_thread(core.authorise, service_id, grant, body)
            data = await asyncio.to_thread(op, core, service_id, request.headers, body)
        except ServiceError as exc:
            return envelope(exc.code, exc.message)
        except sqlite3.Error as exc:
            log.warning("knowledge store error: %s: %s", type(exc).__name__, exc)
            return envelope(500, "the knowledge store failed; see the proxy's log")
        return envelope(0, "ok", data)

    return handler


ROUTE = "knowledge"  # the access log's route name


TOOL_ROUTES = frozenset({f"{ROUTE}:tools_list", f"{ROUTE}:tools_call"})


def _local_list(local: LocalAssets, grant: Grant, session: str | None, body: Body
                ) -> Awaitable[Body]:
    return local.tools_list(grant, body)


def _local_call(local: LocalAssets, grant: Grant, session: str | None, body: Body
                ) -> Awaitable[Body]:
    return local.tools_call(grant, session, body)


def add_tool_routes(app: web.Application, capability: CapabilityKey, local: LocalAssets) -> None:
    """Only the tools paths, for the proxy's own assets (with a remote core, whose assets
    the model calls at the core's own URL)."""
    for path, name, local_op in (("/v3/tools/list", "tools_list", _local_list),
                                 ("/v3/tools/call", "tools_call", _local_call)):
        app.router.add_post(path, _route(None, token=None, capability=capability, local=local,
                                         local_op=local_op), name=f"{ROUTE}:{name}")


def add_routes(
    app: web.Application, core_token: str | None, capability: CapabilityKey | None = None,
    local: LocalAssets | None = None,
) -> None:
    """The four KERNEL_API.md paths; added before the proxy's catch-all passthrough. The
    discovery calls need ``core_token`` when one is set; the tools never do: with
    ``capability`` they need a capability for their asset and scope instead."""
    locals_: dict[str, LocalOperation] = {"tools_list": _local_list, "tools_call": _local_call}
    routes: list[tuple[str, str, Operation, str | None, CapabilityKey | None]] = [
        ("/v3/knowledge/list", "list",
         lambda core, sid, headers, body: core.list_knowledge(sid, body), core_token, None),
        ("/v3/meta/agent-fixed-asset/list-with-detail", "agent_assets",
         lambda core, sid, headers, body: core.agent_assets(
             sid, headers.get("x-tdai-user-key"), body), core_token, None),
        ("/v3/tools/list", "tools_list",
         lambda core, sid, headers, body: core.tools_list(sid, body), None, capability),
        ("/v3/tools/call", "tools_call",
         lambda core, sid, headers, body: core.tools_call(sid, body), None, capability),
    ]
    for path, name, op, token, cap in routes:
        local_op = locals_.get(name) if cap is not None else None
        app.router.add_post(path, _route(op, token=token, capability=cap, local=local,
                                         local_op=local_op),
                            name=f"{ROUTE}:{name}")
