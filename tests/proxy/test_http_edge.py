"""The HTTP edge as HTTP says: compressed bodies, request targets, clients that hang up."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from ctxproxy.config import load_settings
from ctxproxy.proxy.assemble import build_app
from ctxproxy.proxy.bodies import SERVER_OPTIONS
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.server import Running, free_port, raw_request
from tests.fakes.upstream import FakeUpstream, Received, event, message_item, stream_events

Encode = Callable[[bytes], bytes]


def raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


ENCODINGS: dict[str, Encode] = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,  # zlib-wrapped, as RFC 9110 says
    "deflate-raw": raw_deflate,  # what some clients send as "deflate"
}


JSON = {"Content-Type": "application/json"}  # the only body /v1 takes


def header_of(name: str) -> str:
    return name.removesuffix("-raw")


async def send(url: str, path: str, body: bytes, headers: dict[str, str]
               ) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s, s.post(url + path, data=body,
                                                    headers=headers) as r:
        return r.status, await r.read()


def assert_openai_error(body: bytes, code: str) -> None:
    error = json.loads(body)["error"]
    assert error["code"] == code
    assert error["type"] == "invalid_request_error"
    assert error["message"]


def lower(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


# --- compressed request bodies --------------------------------------------------------------


@pytest.mark.parametrize("encoding", list(ENCODINGS))
async def test_compressed_responses_body_goes_upstream_decoded_and_unlabelled(
        upstream: FakeUpstream, start_proxy: ProxyFactory, encoding: str) -> None:
    proxy = await start_proxy(keep_turns=3, trim_slack=0)
    plain = json.dumps(codex.request(codex.session(9))).encode()
    status, _ = await send(proxy.url, "/v1/responses", ENCODINGS[encoding](plain),
                           {**codex.headers(), "Content-Encoding": header_of(encoding)})
    assert status == 200
    got = lower(upstream.last.headers)
    assert "content-encoding" not in got
    assert int(got["content-length"]) == len(upstream.last.body)
    # The pipeline read it: the window cut the history.
    prompts = [i for i in upstream.last.json["input"] if i.get("role") == "user"][1:]
    assert len(prompts) == 3


@pytest.mark.parametrize("encoding", list(ENCODINGS))
async def test_compressed_passthrough_body_goes_upstream_decoded_and_unlabelled(
        upstream: FakeUpstream, start_proxy: ProxyFactory, encoding: str) -> None:
    proxy = await start_proxy()
    plain = b'{"input": "compact me", "model": "m"}' * 50
    status, _ = await send(proxy.url, "/v1/responses/compact", ENCODINGS[encoding](plain),
                           {"Content-Encoding": header_of(encoding).upper(), **JSON})
    assert status == 200
    assert upstream.last.path == "/v1/responses/compact"
    assert upstream.last.body == plain
    got = lower(upstream.last.headers)
    assert "content-encoding" not in got
    assert int(got["content-length"]) == len(plain)


async def test_identity_and_stacked_codings_are_undone_in_order(
        upstream: FakeUpstream, start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy()
    plain = b'{"a": 1}'
    twice = zlib.compress(gzip.compress(plain))  # gzip applied first, then deflate
    status, _ = await send(proxy.url, "/v1/files", twice,
                           {"Content-Encoding": "identity, gzip, deflate", **JSON})
    assert status == 200
    assert upstream.last.body == plain
    assert "content-encoding" not in lower(upstream.last.headers)


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/files"])
@pytest.mark.parametrize("encoding", ["br", "zstd", "compress", "x-made-up", "gzip, br"])
async def test_an_encoding_the_proxy_cannot_decode_gets_an_openai_shaped_415(
        upstream: FakeUpstream, start_proxy: ProxyFactory, path: str, encoding: str) -> None:
    proxy = await start_proxy()
    status, body = await send(proxy.url, path, b"\x0b\x02\x80{}\x03",
                              {**codex.headers(), "Content-Encoding": encoding})
    assert status == 415
    assert_openai_error(body, "unsupported_content_encoding")
    assert upstream.received == []


@pytest.mark.parametrize("garbage", [b"not gzip at all", gzip.compress(b'{"a": 1}' * 100)[:-4]])
async def test_a_body_that_is_not_what_its_encoding_says_gets_a_400(
        upstream: FakeUpstream, start_proxy: ProxyFactory, garbage: bytes) -> None:
    proxy = await start_proxy()
    status, body = await send(proxy.url, "/v1/responses", garbage,
                              {**codex.headers(), "Content-Encoding": "gzip"})
    assert status == 400
    assert_openai_error(body, "invalid_request")
    assert upstream.received == []


async def test_a_small_body_that_decodes_past_the_limit_gets_a_413(
        upstream: FakeUpstream, start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy(max_body_mb=1)
    bomb = gzip.compress(b"0" * (64 * 1024 * 1024))  # 64 KiB that decode to 64 MiB
    assert len(bomb) < 1024 * 1024
    status, body = await send(proxy.url, "/v1/responses", bomb,
                              {**codex.headers(), "Content-Encoding": "gzip"})
    assert status == 413
    assert_openai_error(body, "request_too_large")
    assert upstream.received == []


# --- compressed answers: relayed as sent, read for usage -------------------------------------


def gzip_sse(chunks: list[bytes]) -> list[bytes]:
    """Each event flushed as it is compressed, the way a streaming server gzips SSE."""
    c = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    out = [c.compress(chunk) + c.flush(zlib.Z_SYNC_FLUSH) for chunk in chunks]
    out[-1] += c.flush()
    return out


async def test_gzipped_sse_reaches_the_client_untouched_and_its_usage_is_read(
        upstream: FakeUpstream, start_proxy: ProxyFactory,
        caplog: pytest.LogCaptureFixture) -> None:
    wire = gzip_sse(stream_events([message_item("compressed hello")], 4321))

    async def gzipped(request: web.Request, rec: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Content-Encoding": "gzip"})
        await resp.prepare(request)
        for piece in wire:
            await resp.write(piece)
        await resp.write_eof()
        return resp

    upstream.then(gzipped)
    proxy = await start_proxy()
    with caplog.at_level(logging.INFO):
        async with aiohttp.ClientSession(auto_decompress=False) as s:
            async with s.post(proxy.url + "/v1/responses",
                              json=codex.request(codex.session(1)),
                              headers=codex.headers()) as r:
                got = await r.read()
                assert r.headers["Content-Encoding"] == "gzip"
            async with s.get(proxy.url + "/metrics") as r:
                metrics = await r.text()
    assert got == b"".join(wire)
    line = next(r for r in caplog.records if r.name == "ctxproxy.access")
    assert line.fields["input_tokens"] == 4321  # type: ignore[attr-defined]
    assert 'ctxproxy_upstream_tokens_total{kind="input"} 4321.0' in metrics


# --- request targets -------------------------------------------------------------------------


@pytest.mark.parametrize("target", [
    "/v1/../admin", "/v1/%2e%2e/admin", "/v1/%2E%2e/%2e%2E/admin", "/v1/./models",
    "/v1/files/%2e", "/v1/files/..%2fadmin", "/v1/files/..%5cadmin", "/v1/files/..;x/admin",
    "/..", "/v1/models/..?limit=1",
])
async def test_a_path_with_dot_segments_is_refused_before_it_reaches_the_upstream(
        upstream: FakeUpstream, start_proxy: ProxyFactory, target: str) -> None:
    proxy = await start_proxy()
    for method in ("GET", "DELETE"):
        status, body = await raw_request(proxy.url, f"{method} {target} HTTP/1.1")
        assert status == 400
        assert_openai_error(body, "invalid_request")
    assert upstream.received == []


@pytest.mark.parametrize("target", ["/v1/files/a..b", "/v1/files/.hidden", "/v1/models/..."])
async def test_dots_inside_a_segment_are_not_dot_segments(
        upstream: FakeUpstream, start_proxy: ProxyFactory, target: str) -> None:
    proxy = await start_proxy()
    status, _ = await raw_request(proxy.url, f"GET {target} HTTP/1.1")
    assert status == 200
    assert upstream.last.path == target


async def test_the_upstream_base_path_is_kept_under_a_deeper_base(
        upstream: FakeUpstream, start_proxy: ProxyFactory) -> None:
    base = upstream.url + "/team/openai/v1"  # type: ignore[attr-defined]
    proxy = await start_proxy(upstream_url=base)
    status, _ = await raw_request(proxy.url, "GET /v1/models?limit=2 HTTP/1.1")
    assert status == 200
    assert (upstream.last.path, upstream.last.query) == ("/team/openai/v1/models", "limit=2")
    status, _ = await raw_request(proxy.url, "GET /v1/../../../models HTTP/1.1")
    assert status == 400
    assert len(upstream.received) == 1


@pytest.mark.parametrize("head,body", [
    ("GET http://evil.example/v1/models HTTP/1.1", b""),
    ("GET http://127.0.0.1/v1/models?limit=2 HTTP/1.1", b""),
    ("POST http://evil.example/v1/responses HTTP/1.1\r\nContent-Type: application/json",
     json.dumps(codex.request(codex.session(1))).encode()),
])
async def test_a_target_that_is_not_a_path_gets_a_400(
        upstream: FakeUpstream, start_proxy: ProxyFactory, head: str, body: bytes) -> None:
    proxy = await start_proxy()
    status, answer = await raw_request(proxy.url, head, body)
    assert status == 400
    assert_openai_error(answer, "invalid_request")
    assert upstream.received == []


# --- a client hanging up ---------------------------------------------------------------------


@pytest.fixture
async def proxy_without_cancellation(upstream: FakeUpstream, tmp_path: Path
                                     ) -> AsyncIterator[Running]:
    """The proxy under a server that lets the handler run on after its client is gone, so
    the hang-up shows as a failed write (ClientConnectionResetError), not a cancellation."""
    settings = load_settings(env={}, upstream_url=upstream.url + "/v1",  # type: ignore[attr-defined]
                             data_dir=tmp_path / "data", port=free_port())
    app = build_app(settings)
    runner = web.AppRunner(app, handler_cancellation=False, access_log=None,
                           shutdown_timeout=2, **SERVER_OPTIONS)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", settings.port).start()
    yield Running(app, runner, f"http://127.0.0.1:{settings.port}")
    await runner.cleanup()


@pytest.mark.parametrize("cancellation", [True, False])
async def test_a_client_hanging_up_is_client_closed_not_an_upstream_error(
        upstream: FakeUpstream, start_proxy: ProxyFactory,
        proxy_without_cancellation: Running, caplog: pytest.LogCaptureFixture,
        cancellation: bool) -> None:
    proxy = await start_proxy() if cancellation else proxy_without_cancellation
    upstream.then_raw_sse([event({"type": "response.created", "response": {"id": "r"}})] * 200,
                          delay_s=0.02)
    with caplog.at_level(logging.DEBUG):
        async with aiohttp.ClientSession() as s:
            r = await s.post(proxy.url + "/v1/responses", json=codex.request(codex.session(1)),
                             headers=codex.headers())
            await r.content.readuntil(b"\n\n")
            r.close()
        for _ in range(100):
            if any(rec.name == "ctxproxy.access" for rec in caplog.records):
                break
            await asyncio.sleep(0.05)
        async with aiohttp.ClientSession() as s, s.get(proxy.url + "/metrics") as r:
            metrics = await r.text()
    [line] = [rec for rec in caplog.records if rec.name == "ctxproxy.access"]
    fields = line.fields  # type: ignore[attr-defined]
    assert fields["status"] == 499
    assert fields["error"] == "client_closed"
    assert "upstream_error" not in fields
    assert [rec for rec in caplog.records if rec.exc_info] == []
    assert [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.WARNING] == []
    assert 'ctxproxy_requests_total{route="responses",status="499"} 1.0' in metrics
    assert 'status="500"' not in metrics
    await asyncio.wait_for(upstream.closed_early.wait(), 2)
