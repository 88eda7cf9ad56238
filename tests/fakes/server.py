"""Run an aiohttp app on a loopback port, the way ``ctxproxy serve`` does (the bench
harness's ``serve``), and talk to it byte for byte."""

from __future__ import annotations

import asyncio

from bench.harness.serving import Running, free_port, serve

__all__ = ["Running", "free_port", "raw_request", "serve"]


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
