"""Anthropic Messages under client keys: the client's key is taken from x-api-key (Claude
Code's and the anthropic SDK's way) or Authorization, refused in Anthropic's error shape, and
never forwarded: the Anthropic upstream gets CTXPROXY_ANTHROPIC_API_KEY."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from ctxproxy.config import load_settings
from tests.conftest import ProxyFactory
from tests.fakes import claude_code as cc
from tests.fakes import codex
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.upstream import FakeUpstream

CLIENT_KEY = "ck-alice-5e1f"
ANTHROPIC_KEY = "sk-ant-real-upstream"
KEYED = {"client_keys": f"{CLIENT_KEY} principal=alice teams=team-a",
         "upstream_api_key": "sk-openai-upstream", "anthropic_api_key": ANTHROPIC_KEY,
         "memory_enabled": False}


def headers(**credential: str) -> dict[str, str]:
    """Claude Code's headers, with ``credential`` (header name, underscores for dashes) as
    the only credential."""
    sent = cc.headers("keys")
    sent.pop("x-api-key")
    return {**sent, **{k.replace("_", "-"): v for k, v in credential.items()}}


async def post(url: str, hdrs: dict[str, str], path: str = "/v1/messages",
               ) -> tuple[int, Any]:
    body = cc.request(cc.first_messages("hello"), "keys", stream=False)
    async with aiohttp.ClientSession() as s, s.post(
            url + path, data=json.dumps(body), headers=hdrs) as r:
        return r.status, await r.json(content_type=None)


def sent_headers(anthropic: FakeAnthropic) -> dict[str, str]:
    return {k.lower(): v for k, v in anthropic.received[-1].headers.items()}


def assert_no_client_key(anthropic: FakeAnthropic) -> None:
    for received in anthropic.received:
        assert CLIENT_KEY not in json.dumps(received.headers)
        assert CLIENT_KEY.encode() not in received.body


@pytest.mark.parametrize("credential", [
    {"x_api_key": CLIENT_KEY}, {"authorization": f"Bearer {CLIENT_KEY}"}])
async def test_the_clients_key_is_accepted_and_the_upstream_gets_the_anthropic_key(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic, credential: dict[str, str],
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url, **KEYED)
    status, answer = await post(proxy.url, headers(**credential))
    assert status == 200, answer
    assert answer["content"][0]["text"].startswith("FAKE-ANSWER")
    sent = sent_headers(anthropic)
    assert sent["x-api-key"] == ANTHROPIC_KEY
    assert "authorization" not in sent
    assert_no_client_key(anthropic)


async def test_count_tokens_under_client_keys_carries_the_anthropic_key_alone(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic,
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url, **KEYED)
    status, answer = await post(proxy.url, headers(x_api_key=CLIENT_KEY),
                                "/v1/messages/count_tokens")
    assert status == 200 and answer["input_tokens"] > 0
    assert anthropic.received[-1].path == "/v1/messages/count_tokens"
    assert sent_headers(anthropic)["x-api-key"] == ANTHROPIC_KEY
    assert_no_client_key(anthropic)


@pytest.mark.parametrize("credential", [{}, {"x_api_key": "ck-wrong"},
                                        {"authorization": "Bearer ck-wrong"}])
async def test_an_unknown_key_gets_401_in_anthropics_shape_and_nothing_is_forwarded(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic, credential: dict[str, str],
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url, **KEYED)
    status, answer = await post(proxy.url, headers(**credential))
    assert status == 401
    assert answer["type"] == "error"
    assert answer["error"]["type"] == "authentication_error"
    assert answer["error"]["message"]
    assert anthropic.received == []


async def test_a_team_beyond_the_keys_claims_gets_403_in_anthropics_shape(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic,
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url, **KEYED)
    status, answer = await post(proxy.url, headers(x_api_key=CLIENT_KEY, x_team_id="team-b"))
    assert status == 403
    assert answer == {"type": "error", "error": {
        "type": "permission_error", "message": "this client key may not act for team 'team-b'"}}
    assert anthropic.received == []


async def test_without_an_anthropic_key_client_keys_refuse_rather_than_forward(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic,
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url,
                              **{**KEYED, "anthropic_api_key": None})
    status, answer = await post(proxy.url, headers(x_api_key=CLIENT_KEY))
    assert status == 500
    assert answer["type"] == "error" and answer["error"]["type"] == "api_error"
    assert "CTXPROXY_ANTHROPIC_API_KEY" in answer["error"]["message"]
    status, _ = await post(proxy.url, headers(x_api_key=CLIENT_KEY),
                           "/v1/messages/count_tokens")
    assert status == 500
    assert anthropic.received == []


async def test_without_client_keys_the_anthropic_key_replaces_the_clients(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic,
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url, anthropic_api_key=ANTHROPIC_KEY,
                              memory_enabled=False)
    status, _ = await post(proxy.url, headers(x_api_key="sk-ant-own",
                                              authorization="Bearer oauth-own"))
    assert status == 200
    sent = sent_headers(anthropic)
    assert sent["x-api-key"] == ANTHROPIC_KEY and "authorization" not in sent


async def test_without_any_key_setting_the_clients_own_credential_goes_through(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic,
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url, memory_enabled=False)
    status, _ = await post(proxy.url, headers(x_api_key="sk-ant-own"))
    assert status == 200
    assert sent_headers(anthropic)["x-api-key"] == "sk-ant-own"


async def test_a_responses_request_with_the_key_in_x_api_key_does_not_forward_it(
    start_proxy: ProxyFactory, upstream: FakeUpstream,
) -> None:
    proxy = await start_proxy(**KEYED)
    sent = codex.headers()
    sent.pop("Authorization")
    sent["x-api-key"] = CLIENT_KEY
    async with aiohttp.ClientSession() as s, s.post(
            proxy.url + "/v1/responses", json=codex.request(codex.session(1)),
            headers=sent) as r:
        assert r.status == 200
        await r.read()
    got = {k.lower(): v for k, v in upstream.last.headers.items()}
    assert got["authorization"] == "Bearer sk-openai-upstream"
    assert "x-api-key" not in got


def test_the_anthropic_key_is_a_secret_setting() -> None:
    settings = load_settings(env={"CTXPROXY_ANTHROPIC_API_KEY": ANTHROPIC_KEY})
    assert settings.anthropic_api_key is not None
    assert settings.anthropic_api_key.get_secret_value() == ANTHROPIC_KEY
    assert ANTHROPIC_KEY not in repr(settings)

