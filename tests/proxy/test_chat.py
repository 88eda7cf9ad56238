"""OpenAI Chat Completions (opencode, Aider, Continue, ...) through the proxy: the request
model on Chat bodies, and what the fake upstream receives and the client gets back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from lxml import html
from multidict import CIMultiDict, CIMultiDictProxy

from ctxproxy.config import load_settings
from ctxproxy.config.settings import SettingsError
from ctxproxy.injectors import tokens
from ctxproxy.ledger import Record
from ctxproxy.ledger.counterfactual import PartCounter
from ctxproxy.ledger.measure import Bodies, Measurer, Pending
from ctxproxy.proxy.app import METRICS
from ctxproxy.request import Exchange, NotAResponsesRequest
from ctxproxy.request.chat import parse
from ctxproxy.request.protocol import CHAT
from tests.conftest import ProxyFactory, ledger_rows
from tests.e2e.test_codex import IDENTITY, bind_wiki
from tests.fakes import chat
from tests.fakes.server import serve
from tests.fakes.upstream import FakeUpstream
from tests.memory.session import runtime, settle

FIRST_PROMPT = "hello there, the deploy key lives in vault path ops/deploy"


def exchange(body: dict[str, Any] | bytes, headers: dict[str, str] | None = None) -> Exchange:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    hdrs = CIMultiDictProxy(CIMultiDict(headers or {}))
    return Exchange.parse(raw, hdrs, load_settings(env={}), protocol=CHAT)


def session(turns: int) -> list[dict[str, Any]]:
    """A Chat history of ``turns`` turns, every odd one with a tool call, the last prompt
    unanswered."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": FIRST_PROMPT},
                                      {"role": "assistant", "content": "noted"}]
    for n in range(2, turns + 1):
        messages += chat.tool_turn(f"[tool] turn {n}", n) if n % 2 else [
            {"role": "user", "content": f"turn {n}"},
            {"role": "assistant", "content": f"answer {n}"}]
    return messages[:-1]


def cut(ex: Exchange, first: int) -> dict[str, Any]:
    """The body written back with the turns before ``first`` cut, as the window cuts."""
    kept = ex.history.keep_from(first)
    ex.body = {**ex.body, "input": kept.items}
    ex.first_turn, ex.starts, ex.changed = first, kept.starts, True
    return dict(orjson.loads(ex.serialise()))


def prompts(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user"]


def assert_tool_pairs(body: dict[str, Any]) -> None:
    """Every tool message answers a call of the assistant message before the tool messages,
    and every call is answered (the API refuses anything else)."""
    messages = body["messages"]
    open_calls: set[str] = set()
    for message in messages:
        if message["role"] == "tool":
            assert message["tool_call_id"] in open_calls, message
            open_calls.discard(message["tool_call_id"])
            continue
        assert not open_calls, f"unanswered calls {open_calls} before {message}"
        if message["role"] == "assistant":
            open_calls = {c["id"] for c in message.get("tool_calls") or ()}
    assert not open_calls


# --- the request model -----------------------------------------------------------------------


def test_a_chat_history_reads_as_its_turns_with_the_system_message_as_context() -> None:
    ex = exchange(chat.request(session(5)), {"x-session-id": "s-1"})
    assert [ex.history.prompt_text(n) for n in range(ex.history.turns)] == [
        FIRST_PROMPT, "turn 2", "[tool] turn 3", "turn 4", "[tool] turn 5"]
    assert ex.history.context[0] and not any(ex.history.context[1:])
    assert ex.identity.session_id == "s-1"
    kinds = [i["type"] for i in ex.history.items]
    assert kinds.count("function_call") == kinds.count("function_call_output") == 2


def test_a_tool_result_is_never_a_turn_of_its_own() -> None:
    items, _ = parse({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image_url", "image_url": {"url": "data:x"}}]},
        *chat.tool_turn("[tool] one", 1)[1:]]})
    starts = [i for i, item in enumerate(items)
              if item.get("role") == "user" and item["type"] == "message"]
    assert starts == [0] and items[0]["content"][1] == {"type": "input_image_url"}


def test_an_unchanged_body_written_back_is_the_clients_own_messages_in_order() -> None:
    body = chat.request(session(5))
    ex = exchange(body)
    ex.changed = True
    raw = ex.serialise()
    assert raw == orjson.dumps(body)  # the same bytes as the client's, once written


def test_a_cut_keeps_each_tool_call_with_its_result_and_the_system_message() -> None:
    body = cut(exchange(chat.request(session(9))), 6)
    assert prompts(body) == ["[tool] turn 7", "turn 8", "[tool] turn 9"]
    assert body["messages"][0] == {"role": "system", "content": chat.SYSTEM}
    assert_tool_pairs(body)
    assert list(body) == list(chat.request(session(9)))  # the keys in the client's order


def test_an_assistant_message_with_text_and_two_calls_goes_whole_or_not_at_all() -> None:
    calls = [{"id": f"c{k}", "type": "function", "function": {"name": "bash",
                                                              "arguments": "{}"}}
             for k in (1, 2)]
    messages = [{"role": "user", "content": "one"},
                {"role": "assistant", "content": "two calls", "tool_calls": calls},
                {"role": "tool", "tool_call_id": "c1", "content": "a"},
                {"role": "tool", "tool_call_id": "c2", "content": "b"},
                {"role": "user", "content": "two"}, {"role": "assistant", "content": "x"},
                {"role": "user", "content": "three"}]
    ex = exchange(chat.request(messages))
    assert ex.history.turns == 3
    kept = cut(exchange(chat.request(messages)), 1)
    assert prompts(kept) == ["two", "three"] and "tool_calls" not in json.dumps(kept)
    whole = exchange(chat.request(messages))
    whole.changed = True
    assert orjson.loads(whole.serialise())["messages"][2]["tool_calls"] == calls


def test_a_masked_output_is_written_back_as_its_tool_message_with_the_new_text() -> None:
    messages = [*chat.tool_turn("[tool] one", 1), *chat.tool_turn("[tool] two", 2)]
    # The same call id in both turns (clients that number calls per turn do so).
    messages[5]["tool_calls"][0]["id"] = messages[6]["tool_call_id"] = messages[1][
        "tool_calls"][0]["id"]
    ex = exchange(chat.request(messages))
    outs = [i for i in ex.history.items if i["type"] == "function_call_output"]
    ex.body = {**ex.body, "input": [
        {**i, "output": "[masked]"} if i is outs[1] else i for i in ex.history.items]}
    ex.changed = True
    body = orjson.loads(ex.serialise())
    tools = [m for m in body["messages"] if m["role"] == "tool"]
    assert [t["content"] for t in tools] == [messages[2]["content"], "[masked]"]
    assert tools[1]["tool_call_id"] == messages[6]["tool_call_id"]


@pytest.mark.parametrize("system", [
    {"role": "system", "content": "be brief"},
    {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
    None,
])
def test_blocks_steps_add_to_instructions_go_in_the_system_message(
    system: dict[str, Any] | None
) -> None:
    messages = [*([system] if system else []), {"role": "user", "content": "hi"}]
    ex = exchange({"model": "m", "messages": messages})
    ex.body = {**ex.body, "instructions": "<knowledge_tools>x</knowledge_tools>"}
    ex.changed = True
    body = orjson.loads(ex.serialise())
    assert "instructions" not in body and body["messages"][-1] == messages[-1]
    head = body["messages"][0]
    assert head["role"] == (system["role"] if system else "system")
    text = head["content"] if isinstance(head["content"], str) else json.dumps(head["content"])
    assert text.endswith(("<knowledge_tools>x</knowledge_tools>",
                          '"<knowledge_tools>x</knowledge_tools>"}]'))
    assert "be brief" in text or system is None


def test_a_message_a_step_adds_is_a_user_message_of_its_text() -> None:
    ex = exchange(chat.request(session(3)))
    note = {"type": "message", "role": "developer",
            "content": [{"type": "input_text", "text": "<memory>a note</memory>"}]}
    items = ex.history.items
    ex.body = {**ex.body, "input": [*items[:-1], note, items[-1]]}
    ex.changed = True
    body = orjson.loads(ex.serialise())
    assert body["messages"][-2] == {"role": "user", "content": "<memory>a note</memory>"}


@pytest.mark.parametrize("body", [
    b'{"model": "m", "messages": "not a list"}',
    b'{"model": "m", "messages": [1]}',
    b'{"model": "m", "messages": [], "instructions": "x"}',
])
def test_a_body_the_pipeline_cannot_read_is_refused_by_the_parse(body: bytes) -> None:
    with pytest.raises(NotAResponsesRequest):
        exchange(body)


# --- through the proxy -------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/chat/completions"])
async def test_an_unchanged_request_goes_upstream_byte_for_byte(
    start_proxy: ProxyFactory, upstream: FakeUpstream, route: str
) -> None:
    proxy = await start_proxy(memory_enabled=False)
    raw = json.dumps(chat.request(session(3)), indent=1).encode()
    async with aiohttp.ClientSession() as s, s.post(
            proxy.url + route, data=raw, headers=chat.headers("s-raw",
                                                               **{"x-tdai-user-key": "uk"})) as r:
        assert r.status == 200
        answer = await r.read()
    assert upstream.last.body == raw and upstream.last.path == "/v1/chat/completions"
    sent = {k.lower(): v for k, v in upstream.last.headers.items()}
    assert sent["authorization"] == "Bearer sk-client" and "x-tdai-user-key" not in sent
    assert answer.endswith(b"data: [DONE]\n\n")


async def test_a_long_session_is_cut_with_its_tool_calls_whole(
    start_proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    proxy = await start_proxy(keep_turns=3, window_policy="fixed", trim_slack=0,
                              memory_enabled=False)
    status, message = await chat.post(proxy.url, chat.request(session(9)),
                                      chat.headers("s-long"))
    # The history ends with turn 9's tool result: the fake closes the turn.
    assert status == 200 and message["content"].startswith("FAKE-DONE")
    body = upstream.last.json
    assert prompts(body)[-3:] == ["[tool] turn 7", "turn 8", "[tool] turn 9"]
    assert FIRST_PROMPT not in prompts(body)
    assert "<earlier_turns" in json.dumps(body["messages"])  # the cut's digest, as a message
    assert body["messages"][0]["role"] == "system" and chat.SYSTEM in body["messages"][0][
        "content"]
    assert_tool_pairs(body)


@pytest.mark.parametrize("stream", [True, False])
async def test_usage_is_read_from_the_answer_streamed_or_not(
    start_proxy: ProxyFactory, upstream: FakeUpstream, stream: bool
) -> None:
    proxy = await start_proxy(memory_enabled=False)
    upstream.chat_cached = 128
    status, message = await chat.post(
        proxy.url, chat.request([{"role": "user", "content": "hello"}], stream=stream),
        chat.headers("u"))
    assert status == 200 and message["content"].strip() == "FAKE-ANSWER to: hello"
    tokens = proxy.app[METRICS].tokens
    assert tokens.labels("input")._value.get() == len(upstream.last.body) // 4
    assert tokens.labels("cached")._value.get() == 128


async def test_a_stream_without_usage_is_relayed_and_counts_nothing(
    start_proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    proxy = await start_proxy(memory_enabled=False)
    status, message = await chat.post(
        proxy.url, chat.request([{"role": "user", "content": "[tool] go"}], usage=False),
        chat.headers("u"))
    assert status == 200
    assert json.loads(message["calls"][0]["arguments"]) == {"command": "echo fake-tool-ran"}
    assert proxy.app[METRICS].tokens.labels("input")._value.get() == 0


async def test_a_body_that_is_not_json_goes_upstream_as_sent(
    start_proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    proxy = await start_proxy(memory_enabled=False)
    async with aiohttp.ClientSession() as s, s.post(
            proxy.url + "/v1/chat/completions", data=b"{not json",
            headers=chat.headers("u")) as r:
        assert r.status == 400
        assert (await r.json())["error"]["type"] == "invalid_request_error"
    assert upstream.last.body == b"{not json"


async def test_an_upstream_error_is_relayed_as_sent(
    start_proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    proxy = await start_proxy(memory_enabled=False)
    error = {"error": {"message": "Rate limit reached", "type": "requests",
                       "code": "rate_limit_exceeded", "param": None}}
    upstream.then_error(429, error)
    status, body = await chat.post(proxy.url, chat.request(session(1)), chat.headers("u"))
    assert status == 429 and body == error


async def test_a_proxy_error_is_in_openais_shape(start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy(memory_enabled=False, max_body_mb=0.001)
    status, body = await chat.post(proxy.url, chat.request(session(5)), chat.headers("u"),
                                   route="/chat/completions")
    assert status == 413 and set(body) == {"error"}
    assert body["error"]["code"] == "request_too_large"


async def test_chat_url_sends_chat_requests_elsewhere_with_its_own_key(
    start_proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    other = FakeUpstream()
    running = await serve(other.app())
    try:
        proxy = await start_proxy(memory_enabled=False, chat_url=running.url + "/api",
                                  chat_api_key="sk-chat", upstream_api_key="sk-openai")
        status, _ = await chat.post(proxy.url, chat.request(session(1)), chat.headers("u"))
        assert status == 200 and upstream.received == []
        assert other.last.path == "/api/chat/completions"
        sent = {k.lower(): v for k, v in other.last.headers.items()}
        assert sent["authorization"] == "Bearer sk-chat"
    finally:
        await running.close()


def test_client_keys_with_a_chat_url_need_a_chat_key() -> None:
    env = {"CTXPROXY_CLIENT_KEYS": "k1", "CTXPROXY_UPSTREAM_API_KEY": "sk",
           "CTXPROXY_CHAT_URL": "http://127.0.0.1:9/v1"}
    with pytest.raises(SettingsError, match="CTXPROXY_CHAT_API_KEY"):
        load_settings(env=env)
    assert load_settings(env={**env, "CTXPROXY_CHAT_API_KEY": "sk-c"}).chat_api_key


def test_a_huge_integer_in_a_message_sends_the_clients_bytes_rather_than_rounding_it() -> None:
    messages = session(5)
    raw = orjson.dumps(chat.request(messages)).replace(
        b'"content":"noted"', b'"content":"noted","seed":123456789012345678901234567890')
    ex = exchange(raw)
    with pytest.raises(NotAResponsesRequest, match="64 bits"):
        cut(ex, 0)  # written back whole: the message holding it is the client's own


# --- stats ---------------------------------------------------------------------------------


async def test_a_chat_request_leaves_a_ledger_row_of_its_protocol_with_its_counts(
    start_proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    proxy = await start_proxy(keep_turns=3, window_policy="fixed", trim_slack=0,
                              memory_enabled=False)
    status, _ = await chat.post(proxy.url, chat.request(session(9)), chat.headers("s-row"))
    assert status == 200
    [row] = await ledger_rows(proxy.app, "s-row", 1)
    assert row.protocol == "chat" and row.model == "gpt-5"
    assert (row.turns_in, row.turns_forwarded) == (9, 3) and row.items_cut
    assert row.input_tokens == len(upstream.last.body) // 4
    assert row.client_tokens and row.forwarded_tokens and row.forwarded_tokens < row.client_tokens


def test_a_chat_row_counted_from_its_bytes_counts_what_the_steps_saw() -> None:
    """A row counted in the counting process gets the bytes, in the client's protocol: they
    count as the proxy's parsed (Responses-shaped) bodies do."""
    raw = orjson.dumps(chat.request(session(9)))
    ex = exchange(raw)
    client = dict(ex.body)
    sent = orjson.dumps(cut(ex, 6))
    record = Record(at=0.0, session_id="s", model="gpt-5", status=200, protocol="chat")
    from_bytes = Measurer(PartCounter(tokens.count)).measure(
        Pending(record, raw, sent, parsed=True))
    from_bodies = Measurer(PartCounter(tokens.count)).measure(Pending(
        record, b"", None, parsed=True, bodies=Bodies(client, ex.body, len(raw))))
    assert from_bytes.client_tokens == from_bodies.client_tokens
    assert from_bytes.forwarded_tokens == from_bodies.forwarded_tokens
    assert from_bytes.forwarded_tokens is not None and from_bytes.client_tokens is not None
    assert from_bytes.forwarded_tokens < from_bytes.client_tokens


async def test_explain_reads_a_chat_request_as_the_steps_saw_it(
    start_proxy: ProxyFactory, upstream: FakeUpstream, tmp_path: Path
) -> None:
    await bind_wiki(tmp_path, tmp_path / "data")
    proxy = await start_proxy(keep_turns=3, window_policy="fixed", trim_slack=0,
                              memory_enabled=False)
    status, _ = await chat.post(proxy.url, chat.request(session(9)),
                                chat.headers("s-explain", **IDENTITY))
    assert status == 200
    async with aiohttp.ClientSession() as s, s.get(
            proxy.url + "/ctxproxy/explain/last", params={"session": "s-explain"}) as r:
        report = await r.json()
    assert report["protocol"] == "chat"
    assert (report["turns_in"], report["turns_forwarded"]) == (9, 3)
    assert report["items_cut"] > 0 and report["items_in"] > report["items_forwarded"]
    added = [a["item"] for a in report["items_added"]]
    assert len(added) == 1 and "earlier_turns" in added[0]  # the system message is not one
    assert "knowledge_tools" in report["instructions_added"]["blocks"]
    assert report["forwarded_tokens"] > 0 and report["client_tokens"] > 0


async def test_under_client_keys_the_upstream_gets_its_own_key_never_the_clients(
    start_proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    proxy = await start_proxy(memory_enabled=False, client_keys="ck-alice principal=alice",
                              upstream_api_key="sk-upstream")
    hdrs = {**chat.headers("s-keys"), "Authorization": "Bearer ck-alice"}
    status, _ = await chat.post(proxy.url, chat.request(session(1)), hdrs)
    assert status == 200
    assert upstream.last.headers["Authorization"] == "Bearer sk-upstream"
    status, body = await chat.post(proxy.url, chat.request(session(1)), chat.headers("s-keys"))
    assert status == 401 and set(body) == {"error"} and len(upstream.received) == 1


@pytest.mark.parametrize("stream", [True, False])
async def test_the_relayed_answer_streamed_or_not_is_what_memory_keeps_of_the_turn(
    start_proxy: ProxyFactory, upstream: FakeUpstream, stream: bool
) -> None:
    proxy = await start_proxy(keep_turns=1, window_policy="fixed", trim_slack=0)
    messages: list[dict[str, Any]] = []
    for n in range(4):  # the client's own answers, then the newest prompt unanswered
        messages += [{"role": "user", "content": f"step {n} of the zebra chore"},
                     {"role": "assistant", "content": f"recorded {n}"}]
    status, _ = await chat.post(proxy.url, chat.request(messages[:-1], stream=stream),
                                chat.headers("s-kept"))
    assert status == 200
    await settle(proxy)
    texts = [m.text for m in await runtime(proxy).store.list(None, limit=100)]
    assert "User: step 3 of the zebra chore\nAssistant: FAKE-ANSWER to: step 3 of the zebra " \
           "chore" in texts, texts
    assert "User: step 1 of the zebra chore\nAssistant: recorded 1" in texts


async def test_the_dashboards_timeline_shows_each_requests_protocol(
    start_proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    proxy = await start_proxy(memory_enabled=False)
    await chat.post(proxy.url, chat.request(session(1)), chat.headers("s-ui"))
    await ledger_rows(proxy.app, "s-ui", 1)
    async with aiohttp.ClientSession() as s, s.get(proxy.url + "/ui/sessions/s-ui") as r:
        page = html.fromstring(await r.text())
    head = [th.text for th in page.xpath('//table[@id="timeline"]/thead/tr/th')]
    [cells] = [[td.text_content() for td in tr]
               for tr in page.xpath('//table[@id="timeline"]/tbody/tr')]
    assert cells[head.index("protocol")] == "chat"
