"""GET /v1/models from an Anthropic client (Claude Code, the anthropic SDK: its
anthropic-version and x-api-key headers say so) goes to the Anthropic API, with its key rules;
from an OpenAI client it goes to the OpenAI upstream as before. Anthropic's /api/ paths (Claude
Code's connection probe) go to the Anthropic API."""

from __future__ import annotations

import aiohttp
import anthropic as sdk
import pytest

from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.anthropic import MODEL, FakeAnthropic
from tests.fakes.upstream import FakeUpstream

KEYED = {"client_keys": "ck-models-1", "upstream_api_key": "sk-openai-up",
         "anthropic_api_key": "sk-ant-up"}


def client(url: str, key: str = "sk-ant-own") -> sdk.AsyncAnthropic:
    return sdk.AsyncAnthropic(base_url=url, api_key=key, max_retries=0)


async def test_the_sdks_model_list_comes_from_the_anthropic_upstream(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic, upstream: FakeUpstream,
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url)
    async with client(proxy.url) as c:
        listed = [m.id async for m in c.models.list()]
        one = await c.models.retrieve(MODEL)
    assert listed == [MODEL] and one.id == MODEL
    assert [(r.method, r.path) for r in anthropic.received] == [
        ("GET", "/v1/models"), ("GET", f"/v1/models/{MODEL}")]
    assert "sk-ant-own" in str(anthropic.received[0].headers)  # the client's own key
    assert upstream.received == []


async def test_an_openai_clients_model_list_still_goes_to_the_openai_upstream(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic, upstream: FakeUpstream,
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url)
    async with aiohttp.ClientSession() as s, s.get(
            proxy.url + "/v1/models", headers={"Authorization": "Bearer sk-openai"}) as r:
        await r.read()
    assert [(r.method, r.path) for r in upstream.received] == [("GET", "/v1/models")]
    assert anthropic.received == []


async def test_claude_codes_connection_probe_goes_to_the_anthropic_api(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic, upstream: FakeUpstream,
) -> None:
    # Claude Code sends HEAD {ANTHROPIC_BASE_URL}/api/hello with no headers of its own.
    proxy = await start_proxy(anthropic_url=anthropic.url)
    async with aiohttp.ClientSession() as s, s.head(proxy.url + "/api/hello") as r:
        await r.read()
    assert [(r.method, r.path) for r in anthropic.received] == [("HEAD", "/api/hello")]
    assert upstream.received == []


async def test_under_client_keys_the_model_list_carries_the_anthropic_key(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic, upstream: FakeUpstream,
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url, **KEYED)
    async with client(proxy.url, "ck-models-1") as c:
        assert [m.id async for m in c.models.list()] == [MODEL]
    sent = {k.lower(): v for k, v in anthropic.received[-1].headers.items()}
    assert sent["x-api-key"] == "sk-ant-up" and "ck-models-1" not in str(sent)
    assert upstream.received == []
    async with client(proxy.url, "ck-unknown") as c:
        with pytest.raises(sdk.AuthenticationError) as raised:
            await c.models.retrieve(MODEL)
    assert raised.value.body == {"type": "error", "error": {
        "type": "authentication_error", "message": "missing or unknown client key"}}
    assert len(anthropic.received) == 1


async def test_under_client_keys_without_an_anthropic_key_the_list_is_refused(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic, upstream: FakeUpstream,
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url,
                              **{**KEYED, "anthropic_api_key": None})
    async with client(proxy.url, "ck-models-1") as c:
        with pytest.raises(sdk.InternalServerError) as raised:
            await c.models.retrieve(MODEL)
    assert "CTXPROXY_ANTHROPIC_API_KEY" in raised.value.body["error"]["message"]
    assert anthropic.received == [] and upstream.received == []
    # A Codex request's list still goes to the OpenAI upstream with its key.
    async with aiohttp.ClientSession() as s, s.get(
            proxy.url + "/v1/models", headers=codex.headers() | {
                "Authorization": "Bearer ck-models-1"}) as r:
        assert r.status == 200
    assert upstream.received[-1].headers["Authorization"] == "Bearer sk-openai-up"
