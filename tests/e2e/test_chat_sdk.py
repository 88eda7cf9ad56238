"""The ``openai`` SDK's ``chat.completions`` (streamed and not) through ctxproxy to the fake
upstream: chunks arrive as the SDK expects them, tool calls whole, a multi-turn agent loop is
cut with its calls paired, usage reaches the stats, and a proxy error is one the SDK raises
as OpenAI's."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from ctxproxy.proxy.app import METRICS
from tests.conftest import ProxyFactory, ledger_rows
from tests.e2e.test_openai_sdk import API_KEY, sdk
from tests.fakes.chat import SYSTEM
from tests.fakes.upstream import FakeUpstream

WHO = {"x-team-id": "team-sdk", "x-agent-id": "coder", "x-tdai-user-key": "uk-sdk",
       "x-session-id": "sdk-chat"}


def client(url: str) -> openai.AsyncOpenAI:
    c = sdk(url)
    return c.with_options(default_headers=WHO)


async def test_a_streamed_completion_yields_the_text_and_the_usage(
    start_proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    proxy = await start_proxy(memory_enabled=False)
    upstream.chat_cached = 64
    async with client(proxy.url) as c:
        stream = await c.chat.completions.create(
            model="gpt-fake", messages=[{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "hello sdk"}],
            stream=True, stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() == "FAKE-ANSWER to: hello sdk"
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 64
    assert upstream.last.path == "/v1/chat/completions"
    assert upstream.last.headers["Authorization"] == f"Bearer {API_KEY}"
    tokens = proxy.app[METRICS].tokens
    assert tokens.labels("input")._value.get() == usage.prompt_tokens
    assert tokens.labels("cached")._value.get() == 64


async def test_a_streamed_tool_call_arrives_whole(
    start_proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    proxy = await start_proxy(memory_enabled=False)
    async with client(proxy.url) as c, c.chat.completions.stream(
        model="gpt-fake", messages=[{"role": "user", "content": "[tool] go"}],
    ) as stream:
        final = await stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert calls is not None and len(calls) == 1
    assert json.loads(calls[0].function.arguments) == {"command": "echo fake-tool-ran"}


async def test_a_completion_without_a_stream(
    start_proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    proxy = await start_proxy(memory_enabled=False)
    async with client(proxy.url) as c:
        completion = await c.chat.completions.create(
            model="gpt-fake", messages=[{"role": "user", "content": "plain"}])
    assert completion.choices[0].message.content == "FAKE-ANSWER to: plain"
    assert completion.usage is not None
    assert proxy.app[METRICS].tokens.labels("input")._value.get() == (
        completion.usage.prompt_tokens)


async def test_an_agent_loop_is_cut_with_its_calls_paired_and_counted_in_the_stats(
    start_proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    """An agent's loop: each prompt, the tool call asked for, its result sent back, the
    whole history resent each time, as opencode does."""
    proxy = await start_proxy(memory_enabled=False, keep_turns=2, window_policy="fixed",
                              trim_slack=0)
    messages: list[Any] = [{"role": "system", "content": SYSTEM}]
    async with client(proxy.url) as c:
        for n in range(5):
            messages.append({"role": "user", "content": f"[tool] step {n}"})
            while True:
                done = await c.chat.completions.create(model="gpt-fake", messages=messages)
                message = done.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    break
                messages.extend({"role": "tool", "tool_call_id": call.id,
                                 "content": "fake-tool-ran"} for call in message.tool_calls)
    assert message.content is not None and message.content.startswith("FAKE-DONE")
    sent = upstream.last.json["messages"]
    assert [m["content"] for m in sent if m["role"] == "user" and not m["content"].startswith(
        "<")] == ["[tool] step 3", "[tool] step 4"]
    called = {c["id"] for m in sent for c in m.get("tool_calls") or ()}
    assert called == {m["tool_call_id"] for m in sent if m["role"] == "tool"} and called
    rows = await ledger_rows(proxy.app, "sdk-chat", 10)
    assert all(r.input_tokens for r in rows) and all(r.model == "gpt-fake" for r in rows)
    assert (rows[-1].turns_in, rows[-1].turns_forwarded) == (5, 2)  # oldest first
    assert rows[-1].forwarded_tokens is not None and rows[-1].client_tokens is not None
    assert rows[-1].forwarded_tokens < rows[-1].client_tokens


async def test_a_proxy_error_reaches_the_sdk_in_openais_shape(
    start_proxy: ProxyFactory,
) -> None:
    proxy = await start_proxy(memory_enabled=False, max_body_mb=0.001)
    async with client(proxy.url) as c:
        with pytest.raises(openai.APIStatusError) as raised:
            await c.chat.completions.create(
                model="gpt-fake", messages=[{"role": "user", "content": "x" * 5000}])
    assert raised.value.status_code == 413
    assert isinstance(raised.value.body, dict)
    assert raised.value.body["code"] == "request_too_large"
