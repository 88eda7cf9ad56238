"""The floor for comparison: the least an aiohttp proxy can do, run as its own process.

    python -m bench.harness.naive --port 18091 --upstream http://127.0.0.1:18090/v1 [--client httpx]

It reads the body, forwards it with one pooled client, and copies the answer back chunk by
chunk: no parsing, no window, no header filtering, no logs, no metrics. What ctxproxy costs
above this is the cost of its own features; what this costs above the upstream is aiohttp's.
``--client httpx`` forwards with httpx instead of aiohttp's client, to compare the two.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import aiohttp
import httpx
from aiohttp import web

SESSION = web.AppKey("session", aiohttp.ClientSession)
HTTPX = web.AppKey("httpx", httpx.AsyncClient)
_DROP = frozenset({"host", "content-length", "transfer-encoding", "connection"})


def create_app(upstream: str, client: str = "aiohttp") -> web.Application:
    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        # No cap on connections (aiohttp's default is 100): ctxproxy has none either.
        app[SESSION] = aiohttp.ClientSession(
            auto_decompress=False, connector=aiohttp.TCPConnector(limit=0))
        yield
        await app[SESSION].close()

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
        async with request.app[SESSION].post(upstream + "/responses", data=body,
                                             headers=headers) as answer:
            response = web.StreamResponse(status=answer.status, headers={
                k: v for k, v in answer.headers.items() if k.lower() not in _DROP})
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def httpx_ctx(app: web.Application) -> AsyncIterator[None]:
        app[HTTPX] = httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=None))
        yield
        await app[HTTPX].aclose()

    async def relay_httpx(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
        client = request.app[HTTPX]
        outgoing = client.build_request("POST", upstream + "/responses", content=body,
                                        headers=headers)
        answer = await client.send(outgoing, stream=True)
        try:
            response = web.StreamResponse(status=answer.status_code, headers={
                k: v for k, v in answer.headers.items() if k.lower() not in _DROP})
            await response.prepare(request)
            async for chunk in answer.aiter_raw():
                await response.write(chunk)
            await response.write_eof()
            return response
        finally:
            await answer.aclose()

    app = web.Application(client_max_size=64 * 1024 * 1024)
    if client == "httpx":
        app.cleanup_ctx.append(httpx_ctx)
        app.router.add_post("/v1/responses", relay_httpx)
    else:
        app.cleanup_ctx.append(session_ctx)
        app.router.add_post("/v1/responses", relay)
    app.router.add_get("/healthz", healthz)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://host:port/v1")
    parser.add_argument("--client", choices=("aiohttp", "httpx"), default="aiohttp")
    args = parser.parse_args()
    web.run_app(create_app(args.upstream.rstrip("/"), args.client), host="127.0.0.1",
                port=args.port, access_log=None, print=None, backlog=1024)


if __name__ == "__main__":
    main()
