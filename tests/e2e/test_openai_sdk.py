"""The OpenAI Python SDK with ``base_url`` at ctxproxy, against the fake upstream."""

from __future__ import annotations

from collections.abc import AsyncIterator

import openai
import pytest

from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.server import free_port
from tests.fakes.upstream import FakeUpstream

API_KEY = "sk-sdk-client"


def sdk(proxy_url: str) -> openai.AsyncOpenAI:
    """The SDK aimed at the proxy. ``max_retries=0``: a failure must show here, not be papered
    over by retries; ``trust_env=False``: no HTTP(S)_PROXY may send it off the loopback."""
    return openai.AsyncOpenAI(
        base_url=proxy_url + "/v1", api_key=API_KEY, max_retries=0, timeout=10,
        http_client=openai.DefaultAsyncHttpxClient(trust_env=False),
    )


@pytest.fixture
async def client(start_proxy: ProxyFactory) -> AsyncIterator[openai.AsyncOpenAI]:
    proxy = await start_proxy(trim_slack=0)  # cut on every turn: the window is asserted on
    async with sdk(proxy.url) as client:
        yield client


async def test_sdk_non_streaming_create_gets_the_answer(client: openai.AsyncOpenAI,
                                                        upstream: FakeUpstream) -> None:
    response = await client.responses.create(model="fake-model", input="say hello")
    assert response.output_text.strip() == "FAKE-ANSWER to: say hello"
    assert response.status == "completed"
    assert response.usage is not None and response.usage.input_tokens > 0
    sent = upstream.last
    assert sent.method == "POST" and sent.path == "/v1/responses"
    assert sent.json == {"model": "fake-model", "input": "say hello"}
    assert sent.headers["Authorization"] == f"Bearer {API_KEY}"


async def test_sdk_streaming_create_gets_every_event(client: openai.AsyncOpenAI,
                                                     upstream: FakeUpstream) -> None:
    stream = await client.responses.create(model="fake-model", input="stream it", stream=True)
    kinds: list[str] = []
    deltas: list[str] = []
    async for ev in stream:
        kinds.append(ev.type)
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
    assert kinds[0] == "response.created"
    assert kinds[-1] == "response.completed"
    assert "response.output_item.done" in kinds
    assert "".join(deltas).strip() == "FAKE-ANSWER to: stream it"
    assert upstream.last.json["stream"] is True


async def test_sdk_stream_helper_accumulates_the_final_response(client: openai.AsyncOpenAI,
                                                                upstream: FakeUpstream) -> None:
    # A long Codex-shaped history: the SDK's request goes through the window like Codex's.
    items = codex.session(8)
    async with client.responses.stream(model="fake-model", input=items) as stream:  # type: ignore[arg-type]
        texts = [ev.delta async for ev in stream if ev.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert "".join(texts).strip() == final.output_text
    assert final.output_text.strip() == "FAKE-ANSWER to: turn 8: please do step 8"
    sent = upstream.last.json["input"]
    prompts = [i["content"][0]["text"] for i in sent if i.get("role") == "user"][1:]
    assert prompts == [f"turn {n}: please do step {n}" for n in range(4, 9)]


async def test_sdk_sees_upstream_errors_as_its_own_exceptions(client: openai.AsyncOpenAI,
                                                              upstream: FakeUpstream) -> None:
    upstream.then_error(429, {"error": {"message": "slow down", "type": "rate_limit",
                                        "code": "rate_limit_exceeded"}},
                        {"retry-after": "3"})
    with pytest.raises(openai.RateLimitError) as err:
        await client.responses.create(model="fake-model", input="too fast")
    assert err.value.status_code == 429
    assert err.value.response.headers["retry-after"] == "3"
    assert err.value.code == "rate_limit_exceeded"


async def test_sdk_sees_an_unreachable_upstream_as_a_502(start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy(upstream_url=f"http://127.0.0.1:{free_port()}/v1")
    async with sdk(proxy.url) as client:
        with pytest.raises(openai.APIStatusError) as err:
            await client.responses.create(model="fake-model", input="anyone there?")
    assert err.value.status_code == 502
    assert err.value.code == "upstream_unreachable"
