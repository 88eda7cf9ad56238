"""Run an aiohttp app on a loopback port, the way ``ctxproxy serve`` does."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from aiohttp import web

from proxy.bodies import SERVER_OPTIONS
from proxy.server import Runner


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Running:
    app: web.Application
    runner: web.AppRunner
    url: str

    async def close(self) -> None:
        await self.runner.cleanup()


async def serve(app: web.Application, port: int | None = None) -> Running:
    # SERVER_OPTIONS as ctxproxy serve uses them; the fake upstream so records bodies as sent.
    runner = Runner(app, handler_cancellation=True, access_log=None, shutdown_timeout=2,
                           **SERVER_OPTIONS)
    await runner.setup()
    port = port or free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    return Running(app, runner, f"http://127.0.0.1:{port}")
