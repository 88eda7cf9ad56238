"""The core client over HTTP (respx), and discovery's selection rule, cache and failures."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
import respx

from ctxproxy.knowledge.cache import TtlCache
from ctxproxy.knowledge.client import CoreError, Discovery, HttpCore
from ctxproxy.proxy.metrics import Metrics

CORE = "http://core.test:8420"
LIST = CORE + "/v3/knowledge/list"
AGENT = CORE + "/v3/meta/agent-fixed-asset/list-with-detail"


def wiki(n: int, **extra: Any) -> dict[str, Any]:
    return {"knowledge_id": f"wiki-{n:08d}", "type": "wiki", "name": f"Wiki {n}",
            "service_url": "http://k.test:8421/v3", "summary": f"about {n}", **extra}


def ok(items: list[Any]) -> httpx.Response:
    return httpx.Response(200, json={"code": 0, "message": "ok", "data": {"items": items}})


def bound(asset_id: str, priority: int = 50, **extra: Any) -> dict[str, Any]:
    return {"asset_id": asset_id, "asset_type": "llm_wiki", "name": "x", "status": "active",
            "injection_mode": "tool", "priority": priority, **extra}


@pytest.fixture
async def core() -> AsyncIterator[HttpCore]:
    client = HttpCore(CORE, service_id="svc-1", token="tok-secret", timeout_s=0.5)
    yield client
    await client.aclose()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def discovery(core: HttpCore, clock: Clock | None = None, **kw: Any) -> Discovery:
    values: dict[str, Any] = {"service_id": "svc-1", "timeout_s": 0.5, "ttl_s": 300,
                              "negative_ttl_s": 30}
    values.update(kw)
    return Discovery(core, clock=clock or Clock(), **values)


# --- the three calls on the wire -------------------------------------------------------------


@respx.mock
async def test_list_knowledge_sends_the_documented_request(core: HttpCore) -> None:
    route = respx.post(LIST).mock(return_value=ok([wiki(1)]))
    items = await core.list_knowledge("team-123")
    assert [i.knowledge_id for i in items] == ["wiki-00000001"]
    sent = route.calls.last.request
    assert json.loads(sent.content) == {"team_id": "team-123", "pagination": {"limit": 200}}
    assert sent.headers["authorization"] == "Bearer tok-secret"
    assert sent.headers["x-tdai-service-id"] == "svc-1"
    assert sent.headers["content-type"] == "application/json"
    assert "x-tdai-user-key" not in sent.headers


@respx.mock
async def test_list_by_ids_sends_at_most_200_ids(core: HttpCore) -> None:
    route = respx.post(LIST).mock(return_value=ok([]))
    await core.list_knowledge_by_ids("t", [f"wiki-{n:08d}" for n in range(250)])
    body = json.loads(route.calls.last.request.content)
    assert body["team_id"] == "t" and len(body["knowledge_ids"]) == 200


@respx.mock
async def test_agent_call_sends_the_user_key_header_and_keeps_knowledge_only(
    core: HttpCore,
) -> None:
    route = respx.post(AGENT).mock(return_value=ok([
        bound("wiki-00000001", 80), bound("sk-1", asset_type="skill"),
        bound("cg-00000002", asset_type="code_graph"), bound("wiki-00000003", status="archived"),
    ]))
    found = await core.list_agent_knowledge_ids("coder", "uk-secret")
    assert [(b.knowledge_id, b.priority) for b in found] == [
        ("wiki-00000001", 80), ("cg-00000002", 50)]
    sent = route.calls.last.request
    assert sent.headers["x-tdai-user-key"] == "uk-secret"
    assert json.loads(sent.content) == {
        "agent_id": "coder", "apply_visibility_filter": True, "touch_usage": False}


FAILURES = {
    "refused": httpx.ConnectError("connection refused"),
    "timeout": httpx.ReadTimeout("timed out"),
    "non-2xx": httpx.Response(503, json={"code": 0, "data": {"items": []}}),
    "not JSON": httpx.Response(200, text="<html>oops</html>"),
    "not an envelope": httpx.Response(200, json=[1, 2]),
    "code != 0": httpx.Response(200, json={"code": 40301, "message": "forbidden"}),
    "no items": httpx.Response(200, json={"code": 0, "data": {"things": []}}),
    "malformed item": ok([wiki(1), {"knowledge_id": "wiki-00000002"}]),
}


@pytest.mark.parametrize("answer", FAILURES.values(), ids=FAILURES.keys())
@respx.mock
async def test_every_failure_is_a_core_error_naming_the_call(
    core: HttpCore, answer: httpx.Response | Exception
) -> None:
    respx.post(LIST).mock(side_effect=[answer])
    with pytest.raises(CoreError) as info:
        await core.list_knowledge("t")
    assert info.value.call == "list_knowledge"
    assert "tok-secret" not in str(info.value)


# --- discovery: the selection rule -----------------------------------------------------------


@respx.mock
async def test_team_path_without_a_user_key(core: HttpCore) -> None:
    route = respx.post(LIST).mock(return_value=ok([wiki(2), wiki(1)]))
    agent = respx.post(AGENT)
    assets = await discovery(core).assets("t1", "coder", None)
    assert [a.item.knowledge_id for a in assets] == ["wiki-00000001", "wiki-00000002"]
    assert json.loads(route.calls.last.request.content)["team_id"] == "t1"
    assert not agent.called


@respx.mock
async def test_agent_path_lists_bound_ids_then_fetches_them_by_priority(core: HttpCore) -> None:
    respx.post(AGENT).mock(return_value=ok([bound("wiki-00000002", 90),
                                            bound("wiki-00000001", 10)]))
    by_ids = respx.post(LIST).mock(return_value=ok([wiki(1), wiki(2), wiki(3)]))
    assets = await discovery(core).assets("t1", "coder", "uk-1")
    # Only the bound ones, highest priority first.
    assert [(a.item.knowledge_id, a.priority) for a in assets] == [
        ("wiki-00000002", 90), ("wiki-00000001", 10)]
    assert json.loads(by_ids.calls.last.request.content) == {
        "team_id": "t1", "knowledge_ids": ["wiki-00000002", "wiki-00000001"]}


@respx.mock
async def test_agent_with_no_bindings_skips_the_second_call(core: HttpCore) -> None:
    respx.post(AGENT).mock(return_value=ok([bound("sk-1", asset_type="skill")]))
    lst = respx.post(LIST).mock(return_value=ok([wiki(1)]))
    assert await discovery(core).assets("t1", "coder", "uk-1") == ()
    assert not lst.called


@respx.mock
async def test_no_team_means_no_discovery(core: HttpCore) -> None:
    lst = respx.post(LIST).mock(return_value=ok([wiki(1)]))
    agent = respx.post(AGENT).mock(return_value=ok([]))
    assert await discovery(core).assets(None, "coder", "uk-1") == ()
    assert not lst.called and not agent.called


# --- failures, the cache, single flight ------------------------------------------------------


@respx.mock
async def test_a_failure_is_empty_and_one_warning_without_secrets(
    core: HttpCore, caplog: pytest.LogCaptureFixture
) -> None:
    respx.post(AGENT).mock(return_value=httpx.Response(500))
    metrics = Metrics()
    d = discovery(core, lookups=metrics.knowledge_cache,
                  failures=metrics.degraded.labels("knowledge"))
    with caplog.at_level(logging.WARNING, "ctxproxy.knowledge"):
        assert await d.assets("t1", "coder", "uk-secret") == ()
        assert await d.assets("t1", "coder", "uk-secret") == ()  # negative cache: no new log
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].fields["call"] == "list_agent_knowledge_ids"  # type: ignore[attr-defined]
    assert warnings[0].fields["reason"] == "HTTP 500"  # type: ignore[attr-defined]
    assert "uk-secret" not in caplog.text and "tok-secret" not in caplog.text
    text = metrics.render().decode()
    assert 'ctxproxy_degraded_total{source="knowledge"} 1.0' in text
    assert 'ctxproxy_knowledge_cache_total{result="negative_hit"} 1.0' in text


@respx.mock
async def test_results_are_cached_for_the_ttl_then_fetched_again(core: HttpCore) -> None:
    route = respx.post(LIST).mock(return_value=ok([wiki(1)]))
    clock = Clock()
    d = discovery(core, clock, ttl_s=300)
    for _ in range(3):
        assert len(await d.assets("t1")) == 1
    assert route.call_count == 1
    clock.now += 301
    await d.assets("t1")
    assert route.call_count == 2


async def test_the_cache_keeps_at_most_its_bytes_the_least_recently_used_going_first() -> None:
    cache: TtlCache[str, str] = TtlCache(max_bytes=10, size_of=len)
    loads: list[str] = []

    def load(value: str) -> Callable[[], Awaitable[tuple[str, float]]]:
        async def loaded() -> tuple[str, float]:
            loads.append(value)
            return value, 300.0
        return loaded

    for key in ("a", "b", "a"):  # "a" used last
        await cache.get(key, load(key * 4))
    assert cache.bytes == 8 and loads == ["aaaa", "bbbb"]
    await cache.get("c", load("cccc"))  # 12 bytes: "b" goes
    assert cache.bytes == 8
    await cache.get("a", load("aaaa"))
    await cache.get("b", load("bbbb"))
    assert loads == ["aaaa", "bbbb", "cccc", "bbbb"]
    for _ in range(2):  # over the whole budget: answered, never kept
        assert await cache.get("big", load("x" * 11)) == ("x" * 11, "miss")
    assert loads[-2:] == ["x" * 11] * 2 and cache.bytes <= 10


@respx.mock
async def test_discovery_sizes_its_cache_by_the_assets_text(core: HttpCore) -> None:
    respx.post(LIST).mock(return_value=ok([wiki(n) for n in range(1, 4)]))
    d = discovery(core)
    await d.assets("t1")
    held = d._cache.bytes
    assert held > 3 * len("wiki-00000001")
    respx.post(LIST).mock(return_value=ok([wiki(n) for n in range(1, 7)]))
    await d.assets("t2")
    assert d._cache.bytes - held > held  # twice the assets: about twice the bytes


@respx.mock
async def test_failures_are_remembered_for_the_negative_ttl_only(core: HttpCore) -> None:
    route = respx.post(LIST).mock(side_effect=[httpx.ConnectError("refused"), ok([wiki(1)])])
    clock = Clock()
    d = discovery(core, clock, ttl_s=300, negative_ttl_s=30)
    assert await d.assets("t1") == ()
    clock.now += 29
    assert await d.assets("t1") == ()
    assert route.call_count == 1
    clock.now += 2
    assert len(await d.assets("t1")) == 1
    assert route.call_count == 2


@respx.mock
async def test_cache_keys_separate_teams_agents_and_user_keys(core: HttpCore) -> None:
    agent = respx.post(AGENT).mock(return_value=ok([bound("wiki-00000001")]))
    lst = respx.post(LIST).mock(return_value=ok([wiki(1)]))
    d = discovery(core)
    for who in [("t1", "a", "k1"), ("t1", "a", "k2"), ("t1", "b", "k1"), ("t2", "a", "k1"),
                ("t1", "a", "k1"), ("t1", None, None), ("t1", "a", None)]:
        await d.assets(*who)
    assert agent.call_count == 4
    assert lst.call_count == 5  # four by-ids, then one team-wide shared by the last two


@respx.mock
async def test_concurrent_identical_lookups_share_one_call(core: HttpCore) -> None:
    gate = asyncio.Event()

    async def slow(request: httpx.Request) -> httpx.Response:
        await gate.wait()
        return ok([wiki(1)])

    route = respx.post(LIST).mock(side_effect=slow)
    d = discovery(core)
    waiting = [asyncio.create_task(d.assets("t1")) for _ in range(10)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*waiting)
    assert route.call_count == 1
    assert all(len(r) == 1 for r in results)


@respx.mock
async def test_a_core_slower_than_the_timeout_gives_an_empty_result(core: HttpCore) -> None:
    async def never(request: httpx.Request) -> httpx.Response:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    respx.post(LIST).mock(side_effect=never)
    assert await discovery(core, timeout_s=0.05).assets("t1") == ()


@respx.mock
async def test_a_caller_that_goes_away_does_not_cancel_the_shared_lookup(core: HttpCore) -> None:
    gate = asyncio.Event()

    async def slow(request: httpx.Request) -> httpx.Response:
        await gate.wait()
        return ok([wiki(1)])

    respx.post(LIST).mock(side_effect=slow)
    d = discovery(core)
    first = asyncio.create_task(d.assets("t1"))
    second = asyncio.create_task(d.assets("t1"))
    await asyncio.sleep(0.01)
    first.cancel()
    gate.set()
    assert len(await second) == 1
    with pytest.raises(asyncio.CancelledError):
        await first


@respx.mock
async def test_a_new_generation_drops_every_answer_the_failures_too(core: HttpCore) -> None:
    route = respx.post(LIST).mock(
        side_effect=[httpx.ConnectError("refused"), ok([wiki(1)]), ok([wiki(1), wiki(2)])])
    generation = [7]
    d = discovery(core, ttl_s=300, negative_ttl_s=30, generation=lambda: generation[0])
    assert await d.assets("t1") == ()
    assert await d.assets("t1") == ()  # remembered while nothing changed
    generation[0] += 1
    assert len(await d.assets("t1")) == 1
    assert len(await d.assets("t1")) == 1
    assert route.call_count == 2
    generation[0] += 1
    assert len(await d.assets("t1")) == 2
    assert route.call_count == 3 and len(d._cache._entries) == 1


@respx.mock
async def test_a_lookup_begun_before_a_change_is_not_served_after_it(core: HttpCore) -> None:
    gate = asyncio.Event()
    answers = iter([[wiki(1)], [wiki(1), wiki(2)]])

    async def slow_first(request: httpx.Request) -> httpx.Response:
        items = next(answers)
        if len(items) == 1:
            await gate.wait()
        return ok(items)

    respx.post(LIST).mock(side_effect=slow_first)
    generation = [0]
    d = discovery(core, generation=lambda: generation[0])
    before = asyncio.create_task(d.assets("t1"))
    await asyncio.sleep(0.01)
    generation[0] += 1  # a change lands while the first lookup is still out
    after = asyncio.create_task(d.assets("t1"))  # does not join the first lookup
    await asyncio.sleep(0.01)
    gate.set()
    assert len(await before) == 1
    assert len(await after) == 2
    assert len(await d.assets("t1")) == 2  # the late first answer is never served now
