"""Every /v1/responses request leaves a row, written off the relay; /ui shows the rows and
asks for a key like every route under CLIENT_KEYS."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from lxml import html

from ctxproxy.config import load_settings
from ctxproxy.ledger.cli import stats
from ctxproxy.ledger.counterfactual import PartCounter
from ctxproxy.ledger.measure import InThread, Measurer, Pending
from ctxproxy.ledger.model import Ledger, Record
from ctxproxy.ledger.prices import Price, Prices
from ctxproxy.ledger.recorder import Recorder
from ctxproxy.proxy.ledger_wiring import LEDGER
from ctxproxy.proxy.memory_wiring import MEMORY
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.server import Running, raw_request
from tests.fakes.upstream import FakeUpstream, Received, message_item


async def post(url: str, items: list[dict[str, Any]], session: str = "sess-1",
               **headers: str) -> bytes:
    async with aiohttp.ClientSession() as http, http.post(
        url + "/v1/responses", data=orjson.dumps(codex.request(items, session)),
        headers=codex.headers(session, **headers),
    ) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.read()


async def rows(proxy: Running, session: str = "sess-1") -> list[Record]:
    side = proxy.app[LEDGER]
    assert side.recorder is not None and side.ledger is not None
    await side.recorder.join()
    return await side.ledger.timeline(session)


async def test_each_request_leaves_a_row_with_tokens_usage_and_cuts(
    start_proxy: ProxyFactory,
) -> None:
    # Without the blocks the proxy adds (memory, the cut digest), only the cut shows.
    proxy = await start_proxy(window_policy="fixed", keep_turns=2, trim_slack=0,
                              memory_enabled=False, cut_digest_chars=0)
    history = codex.session(6)
    await post(proxy.url, history)
    [row] = await rows(proxy)
    assert (row.session_id, row.model, row.status) == ("sess-1", "fake-model", 200)
    assert row.turns_in == 6 and row.turns_forwarded == 2 and row.items_cut > 0
    assert row.client_tokens is not None and row.forwarded_tokens is not None
    assert row.forwarded_tokens < row.client_tokens  # the cut turns were not sent
    assert row.input_tokens is not None and row.input_tokens > 0  # the upstream's usage
    assert row.direct_input is not None and row.direct_input > row.input_tokens
    assert row.ttfb_ms is not None


async def test_the_relay_does_not_wait_for_the_ledger(start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy()
    ledger = proxy.app[LEDGER].ledger
    assert ledger is not None
    release = asyncio.Event()
    real_insert = ledger.insert

    async def slow_insert(records: list[Record], nodes: Any = ()) -> None:
        await release.wait()
        await real_insert(records, nodes)

    ledger.insert = slow_insert  # type: ignore[method-assign]
    for n in range(3):  # answered while the ledger is stuck
        await asyncio.wait_for(post(proxy.url, codex.session(n + 1)), 5)
    release.set()
    assert len(await rows(proxy)) == 3


async def test_stats_off_records_nothing_and_ui_says_so(start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy(stats_enabled=False)
    await post(proxy.url, codex.session(2))
    async with aiohttp.ClientSession() as http, http.get(proxy.url + "/ui") as resp:
        assert resp.status == 200
        assert "CTXPROXY_STATS_ENABLED is off" in await resp.text()


async def test_ui_pages_show_the_sessions_and_their_requests(start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy()
    for n in range(1, 4):
        await post(proxy.url, codex.session(n), session="alpha")
    await post(proxy.url, codex.session(1), session="beta/1")
    await rows(proxy, "alpha")
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.url + "/ui?since=all") as resp:
            page = await resp.text()
            assert resp.status == 200 and resp.content_type == "text/html"
            assert 'id="total-requests" data-value="4"' in page
            assert "<script" not in page and "http" not in page.split("<main>")[1]
        async with http.get(proxy.url + "/ui/sessions?since=all") as resp:
            page = await resp.text()
            assert "/ui/sessions/alpha" in page and "/ui/sessions/beta%2F1" in page
        async with http.get(proxy.url + "/ui/sessions/beta%2F1") as resp:
            assert resp.status == 200
            assert 'id="total-requests" data-value="1"' in await resp.text()
        async with http.get(proxy.url + "/ui/sessions/alpha") as resp:
            page = await resp.text()
            assert len(html.fromstring(page).xpath('//table[@id="timeline"]/tbody/tr')) == 3
        async with http.get(proxy.url + "/ui/sessions/nobody") as resp:
            assert resp.status == 404


async def test_memory_browser_shows_and_forgets(start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy(keep_turns=1, window_policy="fixed", trim_slack=0)
    await post(proxy.url, [*codex.session(4), codex.text("user", "what did step 2 do?")])
    runtime = proxy.app[MEMORY]
    await runtime.queue.join()
    stored = await runtime.store.list(None)
    assert stored
    memory_id = stored[0].memory_id
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.url + "/ui/memory") as resp:
            assert memory_id in await resp.text()
        async with http.get(proxy.url + "/ui/memory?q=step") as resp:
            assert resp.status == 200
        async with http.get(proxy.url + f"/ui/memory/{memory_id}") as resp:
            assert resp.status == 200 and "Forget this memory" in await resp.text()
        async with http.post(proxy.url + f"/ui/memory/{memory_id}/forget") as resp:
            assert resp.status == 200
        async with http.get(proxy.url + f"/ui/memory/{memory_id}") as resp:
            assert resp.status == 404
    assert await runtime.store.get(memory_id) is None


async def test_ui_needs_a_client_key_and_a_browser_signs_in_with_a_cookie(
    start_proxy: ProxyFactory,
) -> None:
    proxy = await start_proxy(client_keys="k-one,k-two", upstream_api_key="sk-up")
    async with aiohttp.ClientSession() as http:
        for path in ("/ui", "/ui/sessions", "/ui/memory", "/ui/memory/x"):
            async with http.get(proxy.url + path) as resp:
                assert resp.status == 401, path
        async with http.get(proxy.url + "/ui",
                            headers={"Authorization": "Bearer k-two"}) as resp:
            assert resp.status == 200
        async with http.get(proxy.url + "/ui/login") as resp:
            assert resp.status == 200
    jar = aiohttp.CookieJar(unsafe=True)  # cookies for 127.0.0.1
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        async with http.post(proxy.url + "/ui/login", data={"key": "wrong"},
                             allow_redirects=False) as resp:
            assert resp.status == 303
        async with http.get(proxy.url + "/ui") as resp:
            assert resp.status == 401
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        async with http.post(proxy.url + "/ui/login", data={"key": "k-one"}) as resp:
            assert resp.status == 200 and "Overview" in await resp.text()  # followed
        # The cookie is for the dashboard only: the API still wants the bearer key.
        async with http.post(proxy.url + "/v1/responses", json=codex.request(
                codex.session(1))) as resp:
            assert resp.status == 401




async def raw_post(url: str, session: bytes) -> int:
    """A request whose session-id header holds bytes that are not UTF-8 (aiohttp's client
    would not send them)."""
    body = orjson.dumps(codex.request(codex.session(1), "x"))
    head = (b"POST /v1/responses HTTP/1.1\r\nContent-Type: application/json\r\n"
            b"session-id: " + session)
    return (await raw_request(url, head, body))[0]


async def test_a_session_id_that_is_not_utf8_is_refused_and_the_recorder_goes_on(
    start_proxy: ProxyFactory,
) -> None:
    proxy = await start_proxy()
    # Not UTF-8, and long: refused before anything reads it, so never sent nor recorded.
    assert await raw_post(proxy.url, b"caf\xe9" * 100) == 400
    await post(proxy.url, codex.session(1), session="after")
    side = proxy.app[LEDGER]
    assert side.recorder is not None and side.ledger is not None
    await side.recorder.join()
    assert {t.key for t in await side.ledger.totals("session")} == {"after"}


async def test_a_body_that_cannot_be_counted_leaves_only_its_own_row_without_tokens(
    ledger: Ledger,
) -> None:
    # Parsed fine, but nested deeper than the serialiser goes: the batch's other rows are
    # still counted and written.
    deep = b"[" * 300 + b'"x"' + b"]" * 300
    bodies = {"deep": b'{"input": [{"type": "message", "content": ' + deep + b"}]}",
              "plain": orjson.dumps({"input": [{"type": "message", "role": "user",
                                                "content": "hi"}]})}
    recorder = Recorder(ledger, InThread(Measurer(PartCounter(len))))
    for session, raw in bodies.items():
        assert recorder.put(Pending(
            Record(at=time.time(), session_id=session, model="gpt-5", status=200,
                   input_tokens=10),
            raw, None, parsed=True))
    recorder.start()  # both rows in one batch
    await recorder.join()
    [deep_row] = await ledger.timeline("deep")
    [plain_row] = await ledger.timeline("plain")
    assert deep_row.client_tokens is None
    assert plain_row.client_tokens is not None and plain_row.client_tokens > 0
    await recorder.close()


async def test_a_non_streamed_answer_is_relayed_as_sent_and_its_usage_recorded(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    answer = orjson.dumps({
        "id": "resp_1", "object": "response", "status": "completed",
        "output": [message_item("The migrations live in db/migrate.")],
        "usage": {"input_tokens": 1234, "input_tokens_details": {"cached_tokens": 1024},
                  "output_tokens": 56, "total_tokens": 1290},
    }) + b"\n"  # bytes json.dumps would not write: the client gets the upstream's own

    async def json_answer(request: web.Request, rec: Received) -> web.StreamResponse:
        return web.Response(body=answer, content_type="application/json")

    upstream.then(json_answer)
    proxy = await start_proxy()
    async with aiohttp.ClientSession() as http, http.post(
        proxy.url + "/v1/responses",
        data=orjson.dumps(codex.request(codex.session(1), stream=False)),
        headers=codex.headers("sess-1"),
    ) as resp:
        assert resp.status == 200
        assert await resp.read() == answer

    [row] = await rows(proxy)
    assert (row.input_tokens, row.cached_tokens, row.output_tokens) == (1234, 1024, 56)


WRITES_USAGE = {"input_tokens": 5000, "output_tokens": 40, "total_tokens": 5040,
                "input_tokens_details": {"cached_tokens": 3000, "cache_write_tokens": 1800}}


@pytest.mark.parametrize("store", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
@pytest.mark.parametrize("stream", [True, False])
async def test_cache_writes_the_upstream_reports_reach_the_row_stats_and_dashboard(
    store: str, stream: bool, upstream: FakeUpstream, start_proxy: ProxyFactory,
    request: pytest.FixtureRequest,
) -> None:
    completed = {"id": "resp_1", "object": "response", "status": "completed",
                 "output": [message_item("Done.")], "usage": WRITES_USAGE}
    if stream:
        upstream.then_raw_sse([
            b"event: response.completed\ndata: "
            + orjson.dumps({"type": "response.completed", "response": completed}) + b"\n\n"])
    else:
        async def json_answer(request: web.Request, rec: Received) -> web.StreamResponse:
            return web.json_response(completed)

        upstream.then(json_answer)
    more = {"store_url": request.getfixturevalue("pg_url")} if store == "postgres" else {}
    # A price without a write price: a breakpoint model's writes cost 1.25 of its input.
    proxy = await start_proxy(prices="gpt-6.1-sol=2.0/0.2", **more)
    async with aiohttp.ClientSession() as http, http.post(
        proxy.url + "/v1/responses",
        data=orjson.dumps(codex.request(codex.session(1), model="gpt-6.1-sol", stream=stream)),
        headers=codex.headers("sess-1"),
    ) as resp:
        assert resp.status == 200
        await resp.read()

    [row] = await rows(proxy)
    assert (row.input_tokens, row.cached_tokens, row.cache_write_tokens) == (5000, 3000, 1800)
    side = proxy.app[LEDGER]
    assert side.ledger is not None
    report = stats(await side.ledger.totals("all"), side.prices, by="all", since=None,
                   session=None)["total"]
    assert report["cache_write_tokens"] == 1800 and report["cache_write_share"] == 0.36
    # 200 uncached not written at the input price, 1800 written at 1.25 of it, 3000 read.
    # (The report rounds dollars to six places.)
    assert report["cost_proxy"] == pytest.approx((200 * 2.0 + 1800 * 2.5 + 3000 * 0.2) / 1e6,
                                                 abs=1e-6)
    assert row.direct_input is not None and row.direct_cached is not None
    direct_uncached = row.direct_input - row.direct_cached  # all written, direct
    assert report["cost_direct"] == pytest.approx(
        (direct_uncached * 2.5 + row.direct_cached * 0.2) / 1e6, abs=1e-6)
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.url + "/ui?since=all") as resp:
            assert 'id="total-cache_write_share" data-value="0.36"' in await resp.text()
        async with http.get(proxy.url + "/ui/sessions/sess-1") as resp:
            page = html.fromstring(await resp.text())
    head = [th.text for th in page.xpath('//table[@id="timeline"]/thead/tr/th')]
    [cells] = [[td.text_content() for td in tr] for tr in
               page.xpath('//table[@id="timeline"]/tbody/tr')]
    assert cells[head.index("written")] == "36%" and cells[head.index("cached")] == "60%"


def test_written_tokens_are_priced_at_the_write_price_only_when_reported() -> None:
    price = Price(input=2.0, cached=0.2, write=2.5)
    assert price.cost(5000, 3000) == pytest.approx((2000 * 2.5 + 3000 * 0.2) / 1e6)
    assert price.cost(5000, 3000, 1800) == pytest.approx(
        (200 * 2.0 + 1800 * 2.5 + 3000 * 0.2) / 1e6)
    settings = load_settings(env={}, prices="gpt-6.1-sol=2/0.2,gpt-5.5=2/0.2")
    prices = Prices.from_settings(settings)
    assert prices("gpt-6.1-sol") == Price(2.0, 0.2, 2.5)
    assert prices("gpt-5.5") == Price(2.0, 0.2, 2.0)  # prefix rules: writes at the input price
