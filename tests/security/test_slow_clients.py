"""Issue 43, class 11: a client that trickles its request's headers is closed once the header
time is up, with a 408, while others are served; a process holds a bounded number of
connections, closing one more at once and keeping the open ones. Seen from raw sockets."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import aiohttp
import orjson
import pytest

from ctxproxy.config import SettingsError, load_settings
from ctxproxy.proxy.app import METRICS
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.server import Running
from tests.fakes.upstream import FakeUpstream
from tests.proxy.test_shutdown import GUARD_S, serving

TIMEOUT_S = 0.5
CAP = 3
ASK = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
# Never ends (no blank line): only the server's timer can end it.
SLOW_HEAD = b"POST /v1/responses HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 500

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def connect(url: str) -> Conn:
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def ask(conn: Conn, request: bytes = ASK) -> tuple[int, bytes]:
    """Send a whole request on a kept-alive connection; the status and body answered."""
    reader, writer = conn
    writer.write(request)
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GUARD_S)
    lines = head.decode().split("\r\n")
    length = next((int(line.split(":")[1]) for line in lines
                   if line.lower().startswith("content-length:")), None)
    if length is None:  # a stream, chunked: read to its last chunk
        body = await asyncio.wait_for(reader.readuntil(b"\r\n0\r\n\r\n"), GUARD_S)
    else:
        body = await reader.readexactly(length)
    return int(lines[0].split()[1]), body


async def trickle(conn: Conn, head: bytes = SLOW_HEAD, every_s: float = 0.05) -> bytes:
    """Send ``head`` a byte at a time until the server closes; all it answered."""
    reader, writer = conn

    async def send() -> None:
        for at in range(len(head)):
            writer.write(head[at : at + 1])
            await writer.drain()
            await asyncio.sleep(every_s)

    sender = asyncio.create_task(send())
    try:
        return await asyncio.wait_for(reader.read(), GUARD_S)
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await sender
        writer.close()


def timed_out(answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.startswith(b"HTTP/1.1 408 ") and (
        orjson.loads(body)["error"]["code"] == "request_timeout")


async def post(url: str) -> int:
    async with aiohttp.ClientSession() as http, http.post(
            url + "/v1/responses", data=orjson.dumps(codex.request(codex.session(1))),
            headers=codex.headers()) as resp:
        await resp.read()
        return resp.status


def closed(proxy: Running, reason: str) -> float | None:
    """How many connections the proxy closed for ``reason``, as /metrics counts them."""
    return proxy.app[METRICS].registry.get_sample_value(
        "ctxproxy_connections_closed_total", {"reason": reason})


async def closed_at_once(url: str) -> bool:
    """Whether a new connection is closed before it asks anything."""
    reader, writer = await connect(url)
    try:
        return await asyncio.wait_for(reader.read(), GUARD_S) == b""
    finally:
        writer.close()


async def answered(url: str) -> bool:
    """Whether a new connection is answered."""
    try:
        reader, writer = await connect(url)
        writer.write(ASK.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        answer = await asyncio.wait_for(reader.read(), GUARD_S)
    except ConnectionError:
        return False
    writer.close()
    return answer.startswith(b"HTTP/1.1 200 ")


@pytest.fixture
async def proxy(start_proxy: ProxyFactory) -> Running:
    return await start_proxy(header_timeout_s=TIMEOUT_S)


def test_the_limits_are_settings_read_from_the_environment() -> None:
    defaults = load_settings(env={})
    assert (defaults.header_timeout_s, defaults.keepalive_s, defaults.max_connections) == (
        10.0, 75.0, 1024)
    given = load_settings(env={"CTXPROXY_HEADER_TIMEOUT_S": "2.5", "CTXPROXY_KEEPALIVE_S": "4",
                               "CTXPROXY_MAX_CONNECTIONS": "7"})
    assert (given.header_timeout_s, given.keepalive_s, given.max_connections) == (2.5, 4, 7)
    for name, value in [("CTXPROXY_HEADER_TIMEOUT_S", "0"), ("CTXPROXY_MAX_CONNECTIONS", "0"),
                        ("CTXPROXY_KEEPALIVE_S", "0"),
                        ("CTXPROXY_MAX_CONNECTIONS", "many")]:
        with pytest.raises(SettingsError, match=name):
            load_settings(env={name: value})


async def test_a_client_trickling_its_headers_is_closed_while_another_is_answered(
    proxy: Running, upstream: FakeUpstream
) -> None:
    slow = asyncio.create_task(trickle(await connect(proxy.url)))
    answered = 0
    while not slow.done():  # requests of others all the while
        assert await post(proxy.url) == 200
        answered += 1
    assert timed_out(await slow)
    assert answered >= 1 and len(upstream.received) == answered  # the slow one went nowhere
    assert closed(proxy, "header_timeout") == 1


async def test_the_header_time_starts_again_at_a_kept_alive_connections_next_request(
    proxy: Running,
) -> None:
    conn = await connect(proxy.url)
    assert (await ask(conn))[0] == 200
    await asyncio.sleep(2 * TIMEOUT_S)  # idle between requests: not timed by the header timer
    assert (await ask(conn))[0] == 200
    assert timed_out(await trickle(conn))


def codex_post() -> bytes:
    """A whole Codex request, as a client writes it."""
    body = orjson.dumps(codex.request(codex.session(1)))
    headers = "".join(f"{k}: {v}\r\n" for k, v in codex.headers().items())
    return (f"POST /v1/responses HTTP/1.1\r\nHost: localhost\r\n{headers}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def test_a_connection_idle_after_a_post_is_not_timed_and_serves_the_next_one(
    proxy: Running, upstream: FakeUpstream
) -> None:
    # aiohttp tells its parser to go on (an empty data_received) as the handler reads a
    # body: no byte of the client's, so no request's header time begins there.
    conn = await connect(proxy.url)
    for _ in range(3):
        assert (await ask(conn, codex_post()))[0] == 200
        await asyncio.sleep(2 * TIMEOUT_S)  # the client's time between requests
    assert len(upstream.received) == 3
    assert closed(proxy, "header_timeout") is None
    conn[1].close()
    # That a POST's next request is still timed: the test below.


async def test_a_body_coming_at_a_normal_pace_is_not_timed_the_next_requests_headers_are(
    proxy: Running, upstream: FakeUpstream
) -> None:
    sent = codex.request(codex.session(40))
    body = orjson.dumps(sent)
    reader, writer = conn = await connect(proxy.url)
    headers = "".join(f"{k}: {v}\r\n" for k, v in codex.headers().items())
    writer.write(f"POST /v1/responses HTTP/1.1\r\nHost: localhost\r\n{headers}"
                 f"Content-Length: {len(body)}\r\n\r\n".encode())
    step = len(body) // 4 + 1
    pieces = [body[at : at + step] for at in range(0, len(body), step)]
    for piece in pieces[:-1]:  # over twice the header time in all
        writer.write(piece)
        await writer.drain()
        await asyncio.sleep(TIMEOUT_S * 0.8)
    writer.write(pieces[-1])
    answer = await asyncio.wait_for(reader.readuntil(b"\r\n0\r\n\r\n"), GUARD_S)  # chunked
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert upstream.last.json["input"][-1] == sent["input"][-1]  # the prompt, whole
    assert closed(proxy, "header_timeout") is None
    assert timed_out(await trickle(conn))


async def test_an_idle_kept_alive_connection_is_closed_and_frees_its_place(
    start_proxy: ProxyFactory,
) -> None:
    proxy = await start_proxy(keepalive_s=TIMEOUT_S, max_connections=1)
    reader, writer = conn = await connect(proxy.url)
    assert (await ask(conn))[0] == 200
    assert await asyncio.wait_for(reader.read(), GUARD_S) == b""  # closed by the server
    writer.close()
    assert await answered(proxy.url)  # the one place is free again


async def test_connections_over_the_cap_are_closed_and_the_open_ones_kept(
    start_proxy: ProxyFactory,
) -> None:
    proxy = await start_proxy(max_connections=CAP)
    held = [await connect(proxy.url) for _ in range(CAP)]
    for conn in held:
        assert (await ask(conn))[0] == 200
    assert await closed_at_once(proxy.url)
    for conn in held:  # unharmed
        assert (await ask(conn))[0] == 200
    held.pop()[1].close()
    # Its place is free once the server has seen it go.
    deadline = asyncio.get_running_loop().time() + GUARD_S
    while not await answered(proxy.url):
        assert asyncio.get_running_loop().time() < deadline, "no place freed"
        await asyncio.sleep(0.02)
    assert (closed(proxy, "over_limit") or 0) >= 1
    for _, writer in held:
        writer.close()


async def test_ctxproxy_serve_keeps_the_limits_of_its_environment(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with serving(upstream, tmp_path, CTXPROXY_HEADER_TIMEOUT_S=str(TIMEOUT_S),
                       CTXPROXY_MAX_CONNECTIONS="2") as server:
        held = [await connect(server.url) for _ in range(2)]
        for conn in held:
            assert (await ask(conn))[0] == 200
        assert await closed_at_once(server.url)
        assert (await ask(held[0]))[0] == 200
        assert timed_out(await trickle(held[1]))
        held[0][1].close()
