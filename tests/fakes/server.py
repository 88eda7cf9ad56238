"""Run an aiohttp app on a loopback port, the way ``ctxproxy serve`` does."""

from __future__ import annotations

import asyncio
import socket
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
    # SERVER_OPTIONS as ctxproxy serve uses them; the fake upstream so records bodies as sent.
    # The proxy within its settings' limits, as served; the fakes without.
    runner = Runner(app, limits=limits(app) if SETTINGS in app else None,
                    handler_cancellation=True, access_log=None, shutdown_timeout=2,
                    **SERVER_OPTIONS)
    await runner.setup()
    port = port or free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    return Running(app, runner, f"http://127.0.0.1:{port}")


async def raw_request(
    url: str, head: str | bytes, body: bytes = b"", *, timeout_s: float = 5.0
) -> tuple[int, bytes]:
    """Send ``head`` (the request line and any headers) byte for byte: no client normalises
    the target or refuses a header's bytes. The status and the body as it came (a chunked
    one is not joined)."""
    host, port = url.removeprefix("http://").split(":")
    raw_head = head.encode() if isinstance(head, str) else head
    extra = f"Content-Length: {len(body)}\r\n" if body else ""
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(raw_head + f"\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n".encode()
                 + body)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), timeout_s)
    writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]
