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
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from aiohttp import web

from config.settings import SERVICE_ID_PATTERN
from knowledge.capability import HEADER, CapabilityKey, check
from knowledge.service import EmbeddedCore, ServiceError

__all__ = ["EMBEDDED", "TOOL_ROUTES", "add_routes"]

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


def _route(
    op: Operation, *, token: str | None, capability: CapabilityKey | None = None
) -> Callable[[web.Request], Any]:
    """A handler for ``op``; ``token`` is the core token its caller must present (None: no
    token needed); with ``capability``, the caller presents a capability for the asset
    instead (the model's curl lines: see knowledge.capability)."""

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


def add_routes(
    app: web.Application, core_token: str | None, capability: CapabilityKey | None = None
) -> None:
    """The four KERNEL_API.md paths; added before the proxy's catch-all passthrough. The
    discovery calls need ``core_token`` when one is set; the tools never do: with
    ``capability`` they need a capability for their asset and scope instead."""
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
        app.router.add_post(path, _route(op, token=token, capability=cap),
                            name=f"{ROUTE}:{name}")
