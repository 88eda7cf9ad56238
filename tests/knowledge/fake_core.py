"""A remote core on loopback for the proxy to discover from: answers well, slowly, or badly."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

Mode = Literal["ok", "slow", "garbage"]


@dataclass
class FakeCore:
    mode: Mode = "ok"
    items: list[dict[str, Any]] = field(default_factory=list)
    bindings: list[dict[str, Any]] = field(default_factory=list)
    calls: list[tuple[str, dict[str, str], Any]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v3/knowledge/list", self._list)
        app.router.add_post("/v3/meta/agent-fixed-asset/list-with-detail", self._agent)
        return app

    async def _answer(self, request: web.Request, items: list[dict[str, Any]]) -> web.Response:
        self.calls.append((request.path, dict(request.headers), await request.json()))
        if self.mode == "slow":
            await self.release.wait()  # set at teardown; the proxy gives up long before
        if self.mode == "garbage":
            return web.Response(text="<html>502 from a load balancer</html>")
        return web.json_response({"code": 0, "message": "ok", "data": {"items": items}})

    async def _list(self, request: web.Request) -> web.Response:
        return await self._answer(request, self.items)

    async def _agent(self, request: web.Request) -> web.Response:
        return await self._answer(request, self.bindings)
