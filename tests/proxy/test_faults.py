"""Upstream faults, seen from the client: what it would have seen direct, or an OpenAI-shaped
502/504, and never a hang. (Plain pass-through of 400/401/429/5xx JSON errors, refused
connections, a timeout before the headers and a stream cut mid-way are in test_relay.py.)"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import (
    FakeUpstream,
    Handler,
    Received,
    event,
    message_item,
    stream_events,
)

GUARD_S = 10  # a client that waits longer than this has hung: the test fails, not stalls
# Headers a client acts on; they must arrive as the upstream sent them.
HEADERS_THAT_MATTER = ("content-type", "content-encoding", "retry-after", "retry-after-ms",
                       "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
                       "x-request-id", "openai-processing-ms", "www-authenticate")


async def fetch(base: str, body: bytes, path: str = "/v1/responses",
                method: str = "POST") -> tuple[int, CIMultiDict[str], bytes]:
    async with aiohttp.ClientSession(auto_decompress=False) as s, s.request(
            method, base + path, data=body, headers=codex.headers()) as r:
        return r.status, CIMultiDict(r.headers), await r.read()


async def read_until_break(resp: aiohttp.ClientResponse) -> tuple[bytes, bool]:
    """Every byte the client got, and whether the stream broke instead of ending cleanly."""
    got = bytearray()
    try:
        async for chunk in resp.content.iter_any():
            got += chunk
    except aiohttp.ClientPayloadError:
        return bytes(got), True
    return bytes(got), False


def raw_answer(status: int, body: bytes, headers: dict[str, str]) -> Handler:
    async def handler(request: web.Request, rec: Received) -> web.StreamResponse:
        return web.Response(status=status, body=body, headers=headers)
    return handler


ERROR_ANSWERS = {
    "gateway_html_502": (502, b"<html><body><h1>502 Bad Gateway</h1></body></html>\n",
                         {"Content-Type": "text/html"}),
    "empty_500": (500, b"", {"x-request-id": "req_empty"}),
    "gzip_json_400": (400, gzip.compress(b'{"error": {"message": "bad input", "code": "x"}}'),
                      {"Content-Type": "application/json", "Content-Encoding": "gzip"}),
    "rate_limit_429": (429, b'{"error": {"message": "slow down", "type": "requests"}}',
                       {"Content-Type": "application/json", "retry-after": "20",
                        "retry-after-ms": "20000", "x-ratelimit-remaining-requests": "0",
                        "x-ratelimit-reset-requests": "20s", "x-request-id": "req_429"}),
    "auth_401": (401, b'{"error": {"message": "bad key"}}',
                 {"Content-Type": "application/json", "www-authenticate": "Bearer"}),
}


@pytest.mark.parametrize("name", sorted(ERROR_ANSWERS))
async def test_error_answers_are_what_the_client_would_get_direct(
        upstream: FakeUpstream, start_proxy: ProxyFactory, name: str) -> None:
    status, body, headers = ERROR_ANSWERS[name]
    upstream.then(raw_answer(status, body, headers)).then(raw_answer(status, body, headers))
    proxy = await start_proxy()
    request = json.dumps(codex.request(codex.session(2))).encode()
    direct = await fetch(upstream.url, request)  # type: ignore[attr-defined]
    proxied = await fetch(proxy.url, request)
    assert proxied[0] == direct[0] == status
    assert proxied[2] == direct[2] == body
    for name_ in HEADERS_THAT_MATTER:
        assert proxied[1].get(name_) == direct[1].get(name_), name_


async def test_error_event_inside_a_stream_reaches_the_client_unchanged(
        upstream: FakeUpstream, start_proxy: ProxyFactory) -> None:
    failed = {"type": "response.failed", "response": {
        "id": "resp_x", "status": "failed",
        "error": {"code": "server_error", "message": "the model fell over"}}}
    chunks = [event({"type": "response.created", "response": {"id": "resp_x"}}), event(failed)]
    upstream.then_raw_sse(chunks)
    proxy = await start_proxy()
    status, headers, body = await fetch(proxy.url, json.dumps(codex.request([])).encode())
    assert status == 200
    assert headers["Content-Type"] == "text/event-stream"
    assert body == b"".join(chunks)


async def test_upstream_hanging_up_before_answering_gives_a_502(
        upstream: FakeUpstream, start_proxy: ProxyFactory) -> None:
    async def hang_up(request: web.Request, rec: Received) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.close()
        return web.Response()
    upstream.then(hang_up)
    proxy = await start_proxy()
    status, headers, body = await fetch(proxy.url, json.dumps(codex.request([])).encode())
    assert status == 502
    assert headers["Content-Type"].startswith("application/json")
    assert json.loads(body)["error"]["code"] == "upstream_unreachable"


@pytest.fixture
async def garbage_server() -> AsyncIterator[str]:
    """A TCP server that answers every request with bytes that are not HTTP."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)
        writer.write(b"SSH-2.0-OpenSSH_9.6 not http at all\r\n\r\n")
        await writer.drain()
        writer.close()
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/v1"
    server.close()
    await server.wait_closed()


async def test_upstream_speaking_garbage_gives_a_502(garbage_server: str,
                                                     start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy(upstream_url=garbage_server)
    status, _, body = await fetch(proxy.url, json.dumps(codex.request([])).encode())
    assert status == 502
    assert json.loads(body)["error"]["type"] == "upstream_error"


async def test_stream_cut_midway_gives_the_client_every_byte_before_the_cut(
        upstream: FakeUpstream, start_proxy: ProxyFactory) -> None:
    chunks = stream_events([message_item("one two three four five six")], 10)
    upstream.then_raw_sse(chunks, break_after=5)
    proxy = await start_proxy()
    async with aiohttp.ClientSession() as s, s.post(
            proxy.url + "/v1/responses", json=codex.request([]), headers=codex.headers()) as r:
        got, broke = await asyncio.wait_for(read_until_break(r), GUARD_S)
    assert r.status == 200
    assert broke
    assert got == b"".join(chunks[:5])
    assert b"response.completed" not in got  # Codex retries a stream without it


async def test_stream_stalling_past_the_read_timeout_breaks_instead_of_hanging(
        upstream: FakeUpstream, start_proxy: ProxyFactory) -> None:
    chunks = stream_events([message_item("never finished")], 10)
    upstream.then_raw_sse(chunks, stall_after=2)
    proxy = await start_proxy(upstream_read_timeout_s=0.5)
    async with aiohttp.ClientSession() as s, s.post(
            proxy.url + "/v1/responses", json=codex.request([]), headers=codex.headers()) as r:
        got, broke = await asyncio.wait_for(read_until_break(r), GUARD_S)
    assert r.status == 200
    assert broke
    assert got == b"".join(chunks[:2])
    # The proxy let go of the stalled upstream request too.
    await asyncio.wait_for(upstream.closed_early.wait(), GUARD_S)


async def test_slow_first_byte_and_slow_stream_within_the_timeout_pass(
        upstream: FakeUpstream, start_proxy: ProxyFactory) -> None:
    # The read timeout is between bytes, not for the whole answer: every gap here is under
    # it while the whole answer takes longer than it.
    chunks = stream_events([message_item("slow but steady")], 10)[:4]

    async def slow(request: web.Request, rec: Received) -> web.StreamResponse:
        await asyncio.sleep(0.4)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in chunks:
            await resp.write(chunk)
            await asyncio.sleep(0.3)
        await resp.write_eof()
        return resp
    upstream.then(slow)
    proxy = await start_proxy(upstream_read_timeout_s=1.0)
    status, _, body = await asyncio.wait_for(
        fetch(proxy.url, json.dumps(codex.request([])).encode()), GUARD_S)
    assert status == 200
    assert body == b"".join(chunks)


async def test_a_client_slower_than_the_read_timeout_is_not_a_silent_upstream(
        upstream: FakeUpstream, start_proxy: ProxyFactory) -> None:
    # The upstream sends 16 MB at once; the client reads nothing for three read timeouts, so
    # the proxy's writes wait on it while the upstream has long finished. The read timeout is
    # the upstream's silence, not the client's: the answer arrives whole.
    chunk = bytes(range(256)) * 256  # 64 KiB

    async def big(request: web.Request, rec: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await resp.prepare(request)
        for _ in range(256):
            await resp.write(chunk)
        await resp.write_eof()
        return resp
    upstream.then(big)
    proxy = await start_proxy(upstream_read_timeout_s=0.3)
    async with aiohttp.ClientSession() as s, s.get(
            proxy.url + "/v1/files/f/content", headers=codex.headers()) as r:
        await asyncio.sleep(1.0)
        body = await asyncio.wait_for(r.read(), GUARD_S)
    assert r.status == 200
    assert body == chunk * 256


async def test_errors_on_other_routes_pass_through_too(upstream: FakeUpstream,
                                                      start_proxy: ProxyFactory) -> None:
    upstream.then_error(503, {"error": {"message": "models down"}}, {"retry-after": "5"})
    proxy = await start_proxy()
    status, headers, body = await fetch(proxy.url, b"", path="/v1/models", method="GET")
    assert status == 503
    assert headers["retry-after"] == "5"
    assert json.loads(body) == {"error": {"message": "models down"}}
    assert upstream.last.path == "/v1/models"


async def test_proxy_serves_normally_after_broken_and_stalled_streams(
        upstream: FakeUpstream, start_proxy: ProxyFactory) -> None:
    chunks = stream_events([message_item("x y z")], 10)
    upstream.then_raw_sse(chunks, break_after=2).then_raw_sse(chunks, stall_after=2)
    proxy = await start_proxy(upstream_read_timeout_s=0.5)
    request = json.dumps(codex.request(codex.session(1))).encode()
    async with aiohttp.ClientSession() as s:
        for _ in range(2):
            async with s.post(proxy.url + "/v1/responses", data=request,
                              headers=codex.headers()) as r:
                _, broke = await asyncio.wait_for(read_until_break(r), GUARD_S)
                assert broke
        async with s.post(proxy.url + "/v1/responses", data=request,
                          headers=codex.headers()) as r:
            body = await asyncio.wait_for(r.read(), GUARD_S)
    assert r.status == 200
    assert b"response.completed" in body
    assert b"FAKE-ANSWER to: turn 1" in body
    assert len(upstream.received) == 3
