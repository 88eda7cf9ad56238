from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from multidict import CIMultiDict

from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream, event, message_item, stream_events


async def post(url: str, body: object, headers: dict[str, str] | None = None,
               raw: bytes | None = None) -> tuple[int, CIMultiDict[str], bytes]:
    async with aiohttp.ClientSession() as s, s.post(
        url + "/v1/responses", data=raw if raw is not None else json.dumps(body),
        headers=headers or codex.headers(),
    ) as r:
        return r.status, CIMultiDict(r.headers), await r.read()


async def test_sse_bytes_reach_the_client_unchanged(upstream: FakeUpstream,
                                                    start_proxy: ProxyFactory) -> None:
    chunks = stream_events([message_item("hello there")], 42)
    upstream.then_raw_sse(chunks)
    proxy = await start_proxy()
    status, headers, body = await post(proxy.url, codex.request(codex.session(2)))
    assert status == 200
    assert headers["Content-Type"] == "text/event-stream"
    assert body == b"".join(chunks)


async def test_window_is_applied_to_what_the_upstream_receives(upstream: FakeUpstream,
                                                               start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy(keep_turns=3)
    await post(proxy.url, codex.request(codex.session(9)))
    sent = upstream.last.json["input"]
    prompts = [i["content"][0]["text"] for i in sent if i.get("role") == "user"][1:]
    assert prompts == [f"turn {n}: please do step {n}" for n in (7, 8, 9)]
    assert upstream.last.path == "/v1/responses"


async def test_short_history_is_forwarded_byte_for_byte(upstream: FakeUpstream,
                                                        start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy()
    raw = json.dumps(codex.request(codex.session(3)), indent=3).encode()
    await post(proxy.url, None, raw=raw)
    assert upstream.last.body == raw


async def test_client_sees_first_event_before_upstream_finishes(upstream: FakeUpstream,
                                                                start_proxy: ProxyFactory) -> None:
    chunks = stream_events([message_item("one two three four")], 10)
    upstream.then_raw_sse(chunks, delay_s=0.3)
    proxy = await start_proxy()
    async with aiohttp.ClientSession() as s, s.post(
        proxy.url + "/v1/responses", json=codex.request(codex.session(1)),
        headers=codex.headers()) as r:
        start = time.monotonic()
        first = await r.content.readuntil(b"\n\n")
        first_at = time.monotonic() - start
        rest = await r.read()
    assert first == chunks[0]
    # The stream takes len(chunks) * 0.3 s; the first event came long before its end.
    assert first_at < 0.3 * (len(chunks) - 2)
    assert first + rest == b"".join(chunks)


async def test_headers_pass_both_ways_but_private_ones_stay(upstream: FakeUpstream,
                                                            start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy()
    hdrs = codex.headers(**{"x-tdai-user-key": "uk-secret", "x-codex-beta-features": "b",
                            "openai-beta": "responses=v1", "Host": "localhost:80"})
    _, headers, _ = await post(proxy.url, codex.request(codex.session(1)), hdrs)
    got = {k.lower(): v for k, v in upstream.last.headers.items()}
    assert got["session-id"] == "sess-1"
    assert got["x-codex-beta-features"] == "b"
    assert got["openai-beta"] == "responses=v1"
    assert got["authorization"] == "Bearer sk-client-test"
    assert "x-tdai-user-key" not in got
    assert got["host"].startswith("127.0.0.1:")
    assert headers["x-request-id"].startswith("req_")
    assert headers["openai-processing-ms"] == "12"


async def test_configured_key_replaces_the_clients(upstream: FakeUpstream,
                                                   start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy(upstream_api_key="sk-upstream-real")
    await post(proxy.url, codex.request(codex.session(1)))
    assert upstream.last.headers["Authorization"] == "Bearer sk-upstream-real"


@pytest.mark.parametrize("status,headers", [
    (400, {}), (401, {}), (429, {"retry-after": "7", "x-ratelimit-remaining-requests": "0"}),
    (500, {}), (503, {}),
])
async def test_upstream_errors_pass_through(upstream: FakeUpstream, start_proxy: ProxyFactory,
                                            status: int, headers: dict[str, str]) -> None:
    err = {"error": {"message": f"upstream says {status}", "type": "x", "code": "y"}}
    upstream.then_error(status, err, headers)
    proxy = await start_proxy()
    got_status, got_headers, body = await post(proxy.url, codex.request(codex.session(1)))
    assert got_status == status
    assert json.loads(body) == err
    for k, v in headers.items():
        assert got_headers[k] == v


async def test_unreachable_upstream_gives_openai_shaped_502(start_proxy: ProxyFactory) -> None:
    from tests.fakes.server import free_port
    proxy = await start_proxy(upstream_url=f"http://127.0.0.1:{free_port()}/v1")
    status, _, body = await post(proxy.url, codex.request(codex.session(1)))
    assert status == 502
    assert json.loads(body)["error"]["code"] == "upstream_unreachable"


async def test_unreachable_upstream_502_names_the_url_without_its_credentials(
        start_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture) -> None:
    from tests.fakes.server import free_port
    port = free_port()
    proxy = await start_proxy(upstream_url=f"http://alice:s3cret@127.0.0.1:{port}/v1?key=k9")
    # No Authorization of the client's: aiohttp sends the URL's user and password instead.
    headers = {k: v for k, v in codex.headers().items() if k.lower() != "authorization"}
    status, _, body = await post(proxy.url, codex.request(codex.session(1)), headers)
    assert status == 502, body
    message = json.loads(body)["error"]["message"]
    assert f"http://127.0.0.1:{port}/v1 " in message
    assert "CTXPROXY_UPSTREAM_URL" in message
    assert not any(secret in message for secret in ("alice", "s3cret", "k9"))
    assert f"http://127.0.0.1:{port}/v1 cannot be reached" in caplog.text
    assert "s3cret" not in caplog.text and "k9" not in caplog.text


async def test_slow_upstream_gives_504(upstream: FakeUpstream, start_proxy: ProxyFactory) -> None:
    upstream.then_delay(3)
    proxy = await start_proxy(upstream_read_timeout_s=0.3)
    status, _, body = await post(proxy.url, codex.request(codex.session(1)))
    assert status == 504
    assert json.loads(body)["error"]["type"] == "upstream_error"


async def test_body_over_limit_gives_413(upstream: FakeUpstream, start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy(max_body_mb=0.01)
    status, _, body = await post(proxy.url, codex.request(codex.session(1), pad="x" * 20000))
    assert status == 413
    assert json.loads(body)["error"]["code"] == "request_too_large"
    assert upstream.received == []


BIG_INT_BODY = json.dumps(codex.request(codex.session(9), seed=2**70)).encode()


@pytest.mark.parametrize("raw", [b"{not json", b"[1,2]", b'{"input": 5}', b"\xff\xfe",
                                 BIG_INT_BODY])
async def test_bodies_the_pipeline_cannot_read_go_through_unchanged(
        upstream: FakeUpstream, start_proxy: ProxyFactory, raw: bytes) -> None:
    upstream.then_error(400, {"error": {"message": "bad"}})
    proxy = await start_proxy()
    status, _, _ = await post(proxy.url, None, raw=raw)
    assert status == 400
    assert upstream.last.body == raw


async def test_client_disconnect_closes_the_upstream_stream(upstream: FakeUpstream,
                                                            start_proxy: ProxyFactory) -> None:
    chunks = [event({"type": "response.created", "response": {"id": "r"}})] * 50
    upstream.then_raw_sse(chunks, delay_s=0.1)
    proxy = await start_proxy()
    async with aiohttp.ClientSession() as s:
        r = await s.post(proxy.url + "/v1/responses", json=codex.request(codex.session(1)),
                         headers=codex.headers())
        await r.content.readuntil(b"\n\n")
        r.close()
    await asyncio.wait_for(upstream.closed_early.wait(), 2)


async def test_broken_upstream_stream_breaks_the_client_stream(upstream: FakeUpstream,
                                                               start_proxy: ProxyFactory) -> None:
    chunks = stream_events([message_item("a b c d e f")], 10)
    upstream.then_raw_sse(chunks, break_after=3)
    proxy = await start_proxy()
    async with aiohttp.ClientSession() as s, s.post(
            proxy.url + "/v1/responses", json=codex.request(codex.session(1)),
            headers=codex.headers()) as r:
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()


async def test_other_paths_are_forwarded_under_the_upstream_url(upstream: FakeUpstream,
                                                                start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy()
    async with aiohttp.ClientSession() as s:
        async with s.get(proxy.url + "/v1/models?limit=2") as r:
            assert r.status == 200
            assert (await r.json())["query"] == "limit=2"
        assert upstream.last.path == "/v1/models"
        async with s.post(proxy.url + "/v1/responses/compact", data=b'{"a":1}',
                          headers={"Content-Type": "application/json"}) as r:
            assert r.status == 200
        assert upstream.last.path == "/v1/responses/compact"
        assert upstream.last.body == b'{"a":1}'


async def test_websocket_upgrade_is_refused_at_once(upstream: FakeUpstream,
                                                    start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy()
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.WSServerHandshakeError) as err:
            await s.ws_connect(proxy.url + "/v1/responses")
    assert err.value.status == 426
    assert upstream.received == []


async def test_health_and_readiness_answer_locally(upstream: FakeUpstream,
                                                   start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy()
    async with aiohttp.ClientSession() as s:
        for path in ("/healthz", "/readyz"):
            async with s.get(proxy.url + path) as r:
                assert r.status == 200
    assert upstream.received == []


async def test_compaction_requests_pass_untouched(upstream: FakeUpstream,
                                                  start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy(keep_turns=1)
    items = codex.session(4)
    await post(proxy.url, codex.request(items), codex.headers(kind="compaction"))
    assert upstream.last.json["input"] == items
    trigger = [*items, {"type": "compaction_trigger"}]
    await post(proxy.url, codex.request(trigger))
    assert upstream.last.json["input"] == trigger
    await post(proxy.url, codex.request(items, previous_response_id="resp_1"))
    assert upstream.last.json["input"] == items
