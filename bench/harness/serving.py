"""aiohttp apps served in this process on a loopback port: the proxy as ``ctxproxy serve``
serves it, or a fake upstream."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web

from ctxproxy.proxy.app import SETTINGS
from ctxproxy.proxy.assemble import limits
from ctxproxy.proxy.bodies import SERVER_OPTIONS
from ctxproxy.proxy.server import Runner


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
    """``app`` with the server options ``ctxproxy serve`` uses; the proxy within its
    settings' limits, as served, a fake without."""
    runner = Runner(app, limits=limits(app) if SETTINGS in app else None,
                    handler_cancellation=True, access_log=None, shutdown_timeout=2,
                    **SERVER_OPTIONS)
    await runner.setup()
    port = port or free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    return Running(app, runner, f"http://127.0.0.1:{port}")


@asynccontextmanager
async def serving(app: web.Application, port: int = 0) -> AsyncIterator[str]:
    """``app`` on a plain aiohttp runner for the block; yields its base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def serve_plain(app: web.Application) -> tuple[web.AppRunner, str]:
    """``app`` on a plain aiohttp runner on a free port: the runner and its base URL."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"
