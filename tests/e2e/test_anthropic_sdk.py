"""The ``anthropic`` SDK's ``messages.stream`` and ``messages.create`` through ctxproxy to the
fake Anthropic upstream: events arrive as the SDK expects them, the final message is whole,
and a proxy error is one the SDK raises as Anthropic's."""

from __future__ import annotations

import anthropic as sdk
import pytest

from tests.conftest import ProxyFactory
from tests.fakes.anthropic import FakeAnthropic


def client(url: str) -> sdk.AsyncAnthropic:
    return sdk.AsyncAnthropic(base_url=url, api_key="sk-ant-sdk", max_retries=0,
                              default_headers={"x-team-id": "team-sdk"})


async def test_messages_stream_yields_the_text_and_the_final_message(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url)
    async with client(proxy.url) as c, c.messages.stream(
        model="claude-fake", max_tokens=100, system="Be brief.",
        messages=[{"role": "user", "content": "hello sdk"}],
    ) as stream:
        pieces = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(pieces).strip() == "FAKE-ANSWER to: hello sdk"
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 10
    assert anthropic.messages[-1].json["messages"] == [{"role": "user", "content": "hello sdk"}]


async def test_messages_stream_carries_a_tool_call_whole(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url)
    async with client(proxy.url) as c, c.messages.stream(
        model="claude-fake", max_tokens=100,
        messages=[{"role": "user", "content": "[tool] go"}],
    ) as stream:
        final = await stream.get_final_message()
    use = final.content[0]
    assert use.type == "tool_use" and use.input == {"command": "echo fake-tool-ran",
                                                    "description": "Print a marker"}


async def test_messages_create_without_a_stream(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url)
    async with client(proxy.url) as c:
        message = await c.messages.create(
            model="claude-fake", max_tokens=100, messages=[{"role": "user", "content": "plain"}])
    assert message.content[0].type == "text"
    assert message.content[0].text == "FAKE-ANSWER to: plain"


async def test_a_proxy_error_reaches_the_sdk_in_anthropics_shape(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url, max_body_mb=0.001)
    async with client(proxy.url) as c:
        with pytest.raises(sdk.APIStatusError) as raised:
            await c.messages.create(
                model="claude-fake", max_tokens=100,
                messages=[{"role": "user", "content": "x" * 5000}])
    assert raised.value.status_code == 413
    assert raised.value.body == {"type": "error", "error": {
        "type": "request_too_large", "message": raised.value.body["error"]["message"]}}


async def test_under_client_keys_the_sdks_key_is_accepted_and_never_forwarded(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url, client_keys="ck-sdk-1 teams=team-sdk",
                              upstream_api_key="sk-openai", anthropic_api_key="sk-ant-upstream")
    keyed = sdk.AsyncAnthropic(base_url=proxy.url, api_key="ck-sdk-1", max_retries=0,
                               default_headers={"x-team-id": "team-sdk"})
    async with keyed as c:
        message = await c.messages.create(
            model="claude-fake", max_tokens=100, messages=[{"role": "user", "content": "keyed"}])
    assert message.content[0].type == "text"
    sent = {k.lower(): v for k, v in anthropic.messages[-1].headers.items()}
    assert sent["x-api-key"] == "sk-ant-upstream" and "ck-sdk-1" not in str(sent)
    async with client(proxy.url) as c:  # its key, sk-ant-sdk, is no client key
        with pytest.raises(sdk.AuthenticationError) as raised:
            await c.messages.create(
                model="claude-fake", max_tokens=100, messages=[{"role": "user", "content": "x"}])
    assert raised.value.body == {"type": "error", "error": {
        "type": "authentication_error", "message": "missing or unknown client key"}}
    assert len(anthropic.messages) == 1
