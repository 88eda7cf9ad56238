"""Anthropic Messages (Claude Code) through the proxy: the request model on Claude Code's own
requests, and what the fake Anthropic upstream receives and the client gets back."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import orjson
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from ctxproxy.config import load_settings
from ctxproxy.proxy.app import METRICS
from ctxproxy.request import Exchange, History
from ctxproxy.request.messages import MAX_MARKS, parse
from ctxproxy.request.protocol import MESSAGES
from tests.conftest import ProxyFactory
from tests.fakes import claude_code as cc
from tests.fakes.anthropic import FakeAnthropic

SESSION = (cc.FIXTURES / "session.json").read_bytes()
FIRST = (cc.FIXTURES / "first.json").read_bytes()
HEADERS = json.loads((cc.FIXTURES / "headers.json").read_text())


def exchange(raw: bytes, headers: dict[str, str] | None = None) -> Exchange:
    hdrs = CIMultiDictProxy(CIMultiDict(headers or {}))
    return Exchange.parse(raw, hdrs, load_settings(env={}), protocol=MESSAGES)


# --- the request model, on what Claude Code sent -----------------------------------------------


def test_a_real_claude_code_session_reads_as_its_five_turns() -> None:
    ex = exchange(SESSION, HEADERS)
    prompts = [ex.history.prompt_text(n) for n in range(ex.history.turns)]
    assert prompts == ["hello there, remember that the deploy key lives in vault path ops/deploy",
                       "[tool] please run it", "third turn words", "[tool] run it again",
                       "fifth turn: what next?"]
    # The reminder in the first message and the system-role message are context, pinned.
    head = ex.history.items[0]
    assert ex.history.context[0] and "<system-reminder>" in str(head)
    assert [i for i, item in enumerate(ex.history.items)
            if item.get("role") == "system"] == [i for i, c in enumerate(ex.history.context) if c]
    assert ex.identity.session_id == HEADERS["X-Claude-Code-Session-Id"]


def test_the_session_comes_from_metadata_without_the_header() -> None:
    ex = exchange(FIRST)
    user_id = json.loads(json.loads(FIRST)["metadata"]["user_id"])
    assert ex.identity.session_id == user_id["session_id"]


def test_a_body_written_back_unchanged_is_the_clients_own_messages() -> None:
    ex = exchange(SESSION)
    ex.changed = True
    written = orjson.loads(ex.serialise())
    assert written == orjson.loads(SESSION)
    assert list(written) == list(orjson.loads(SESSION))  # the keys in the client's order


def test_a_cut_keeps_each_tool_use_with_its_result_and_the_context() -> None:
    ex = exchange(SESSION)
    cut = ex.history.keep_from(2)
    ex.body = {**ex.body, "input": cut.items}
    ex.first_turn, ex.starts, ex.changed = 2, cut.starts, True
    body = orjson.loads(ex.serialise())
    assert cc.user_words(body) == ["third turn words", "[tool] run it again",
                                   "fifth turn: what next?"]
    assert_tool_pairs(body)
    assert "<system-reminder>" in json.dumps(body["messages"][0])
    assert body["messages"][1]["role"] == "system"
    assert_marks_valid(body)
    # The agent's context end is marked, and the client's newest mark kept.
    assert "cache_control" in body["messages"][1]["content"][-1]
    assert "cache_control" in body["messages"][-1]["content"][-1]


def test_a_user_message_with_results_and_a_new_prompt_splits_between_turns() -> None:
    turn = cc.tool_turn("[tool] one", 1)
    words = {"type": "text", "text": "and now the second thing"}
    messages = [*cc.first_messages("start"), *turn[:2],
                {"role": "user", "content": [*turn[2]["content"], words]},
                {"role": "assistant", "content": "done"}, {"role": "user", "content": "third"}]
    ex = exchange(json.dumps(cc.request(messages, "s")).encode())
    assert ex.history.turns == 4
    cut = ex.history.keep_from(2)  # "start" and "[tool] one" go, with the tool_use's result
    ex.body = {**ex.body, "input": cut.items}
    ex.first_turn, ex.starts, ex.changed = 2, cut.starts, True
    body = orjson.loads(ex.serialise())
    assert cc.user_words(body) == ["and now the second thing", "third"]
    assert "tool_result" not in json.dumps(body) and "tool_use" not in json.dumps(body)


def test_a_masked_output_is_written_back_as_its_tool_result_with_the_new_text() -> None:
    messages = [*cc.first_messages("start"), *cc.tool_turn("[tool] one", 1)]
    ex = exchange(json.dumps(cc.request(messages, "s")).encode())
    out = next(i for i in ex.history.items if i["type"] == "function_call_output")
    ex.body = {**ex.body, "input": [i if i is not out else {**out, "output": "[masked]"}
                                    for i in ex.history.items]}
    ex.changed = True
    body = orjson.loads(ex.serialise())
    result = body["messages"][-2]["content"][0]
    assert result["type"] == "tool_result" and result["content"] == "[masked]"
    assert result["tool_use_id"] == messages[-2]["content"][0]["tool_use_id"]


def test_a_client_sending_too_many_marks_gets_at_most_four_after_a_cut() -> None:
    messages = [*cc.first_messages("one")]
    for n in range(2, 6):
        messages += [{"role": "assistant", "content": f"answer {n - 1}"},
                     {"role": "user", "content": [{"type": "text", "text": f"turn {n}",
                                                   "cache_control": cc.MARK}]}]
    ex = exchange(json.dumps(cc.request(messages, "s")).encode())
    cut = ex.history.keep_from(2)
    ex.body = {**ex.body, "input": cut.items, "instructions": "<knowledge_tools>x"}
    ex.first_turn, ex.starts, ex.changed = 2, cut.starts, True
    body = orjson.loads(ex.serialise())
    assert_marks_valid(body)
    assert len(cc.marks(body)) == MAX_MARKS
    # The stable context ends with the knowledge block: marked; the client's newest mark kept.
    assert body["system"][-1] == {"type": "text", "text": "<knowledge_tools>x",
                                  "cache_control": cc.MARK}
    assert "cache_control" in body["messages"][-1]["content"][-1]


def text_item(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


def cut_with_blocks(raw: bytes, first: int, *pinned: str, recall: str | None = None
                    ) -> Exchange:
    """The exchange as the steps leave it: turns before ``first`` cut, ``pinned`` (the
    digest, the standing memory) before the first kept turn, ``recall`` before the last."""
    ex = exchange(raw)
    cut = ex.history.keep_from(first)
    blocks = tuple(text_item("developer", text) for text in pinned)
    items = list(cut.items)
    at = cut.starts[0]
    items[at:at] = blocks
    starts = [s + len(blocks) for s in cut.starts]
    if recall is not None:
        items.insert(starts[-1], text_item("developer", recall))
        starts[-1] += 1
    ex.body = {**ex.body, "input": items, "instructions": "<knowledge_tools>k"}
    ex.first_turn, ex.starts, ex.stable_blocks, ex.changed = first, starts, blocks, True
    return ex


def test_digest_and_standing_go_in_one_block_at_the_end_of_system_recall_in_messages() -> None:
    ex = cut_with_blocks(SESSION, 2, "<earlier_turns>d</earlier_turns>",
                         "<semantic_memory>s</semantic_memory>", recall="<episodic_memory>r")
    body = orjson.loads(ex.serialise())
    client = orjson.loads(SESSION)
    assert [b["text"] for b in body["system"]] == [
        *(b["text"] for b in client["system"]), "<knowledge_tools>k",
        "<earlier_turns>d</earlier_turns>\n\n<semantic_memory>s</semantic_memory>"]
    text = json.dumps(body["messages"])
    assert "<earlier_turns>" not in text and "<semantic_memory>" not in text
    recall = body["messages"][-2]
    assert recall == {"role": "user", "content": [{"type": "text", "text": "<episodic_memory>r"}]}
    assert_tool_pairs(body)
    # Four marks: the end of the stable context (the knowledge block), the pinned block, the
    # end of the client's context in messages, and the client's newest; its older ones go.
    found = cc.marks(body)
    assert len(found) == MAX_MARKS
    assert "cache_control" in body["system"][-1] and "cache_control" in body["system"][-2]
    assert all("cache_control" not in b for b in body["system"][:-2])
    assert "cache_control" in body["messages"][-1]["content"][-1]
    head = next(n for n, m in enumerate(body["messages"]) if m["role"] == "system")
    assert "cache_control" in body["messages"][head]["content"][-1]


def test_the_pinned_block_is_marked_without_a_cut_and_an_empty_one_is_left_out() -> None:
    ex = cut_with_blocks(FIRST, 0, "<semantic_memory>s</semantic_memory>")
    body = orjson.loads(ex.serialise())
    assert body["system"][-1] == {"type": "text", "text": "<semantic_memory>s</semantic_memory>",
                                  "cache_control": cc.MARK}
    assert_marks_valid(body)
    empty = cut_with_blocks(SESSION, 2, "")
    body = orjson.loads(empty.serialise())
    assert body["system"][-1]["text"] == "<knowledge_tools>k"  # no empty block
    assert_marks_valid(body)


def test_a_string_system_becomes_blocks_with_the_pinned_block_after_it() -> None:
    body = {**orjson.loads(SESSION), "system": "You are terse."}
    ex = cut_with_blocks(orjson.dumps(body), 2, "<earlier_turns>d</earlier_turns>")
    ex.body = {k: v for k, v in ex.body.items() if k != "instructions"}
    sent = orjson.loads(ex.serialise())
    assert sent["system"] == [
        {"type": "text", "text": "You are terse.", "cache_control": cc.MARK},
        {"type": "text", "text": "<earlier_turns>d</earlier_turns>", "cache_control": cc.MARK}]
    assert_marks_valid(sent)


def test_items_parse_from_string_and_block_content_alike() -> None:
    items, _ = parse({"messages": [{"role": "user", "content": "hi"},
                                   {"role": "assistant", "content": "yo"}]})
    assert History(items).turns == 1


# --- through the proxy ---------------------------------------------------------------------


def assert_tool_pairs(body: dict[str, Any]) -> None:
    """Each tool_result answers a tool_use of the message right before it, and every tool_use
    is answered in the message right after it (the API refuses anything else)."""
    messages = body["messages"]
    for n, message in enumerate(messages):
        content = message["content"] if isinstance(message["content"], list) else []
        uses = [b["id"] for b in content if b["type"] == "tool_use"]
        results = [b["tool_use_id"] for b in content if b["type"] == "tool_result"]
        if results:
            before = messages[n - 1]["content"]
            assert set(results) <= {b.get("id") for b in before if isinstance(b, dict)}
        if uses:
            after = messages[n + 1]["content"]
            assert set(uses) == {b.get("tool_use_id") for b in after if isinstance(b, dict)}
    non_system = [m for m in messages if m["role"] != "system"]
    assert non_system[0]["role"] == "user"


def assert_marks_valid(body: dict[str, Any]) -> None:
    found = cc.marks(body)
    assert len(found) <= MAX_MARKS
    for _, block in found:
        assert block["type"] != "text" or block["text"]
        assert block["type"] not in ("thinking", "redacted_thinking")


async def test_an_unchanged_request_goes_upstream_byte_for_byte(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url, memory_enabled=False)
    async with aiohttp.ClientSession() as s, s.post(
            proxy.url + "/v1/messages", data=FIRST, headers=HEADERS) as r:
        assert r.status == 200
        await r.read()
    assert anthropic.messages[-1].body == FIRST
    sent = {k.lower(): v for k, v in anthropic.messages[-1].headers.items()}
    assert sent["x-team-id"] == "team-a" and sent["anthropic-beta"] == HEADERS["anthropic-beta"]
    assert "x-tdai-user-key" not in sent  # the user key never leaves the proxy


async def test_a_long_session_is_cut_with_its_tool_pairs_whole_and_valid_marks(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url, keep_turns=3,
                              window_policy="fixed", trim_slack=0, memory_enabled=False)
    messages = cc.first_messages("turn 1")
    messages.append({"role": "assistant", "content": "ok"})
    for n in range(2, 9):
        messages += cc.tool_turn(f"[tool] turn {n}", n)
    messages.append({"role": "user", "content": "turn 9"})
    status, _ = await cc.post(proxy.url, cc.request(messages, "long"), cc.headers("long"))
    assert status == 200
    body = anthropic.messages[-1].json
    assert cc.user_words(body)[-3:] == ["[tool] turn 7", "[tool] turn 8", "turn 9"]
    assert "turn 1" not in cc.user_words(body)
    # The cut's digest is the last block of system, marked, and the stable context before it.
    assert "<earlier_turns" not in json.dumps(body["messages"])
    assert body["system"][-1]["text"].startswith("<earlier_turns")
    assert "cache_control" in body["system"][-1] and "cache_control" in body["system"][-2]
    assert_tool_pairs(body)
    assert_marks_valid(body)
    assert "cache_control" in body["messages"][-1]["content"][-1]  # the client's newest


@pytest.mark.parametrize("stream", [True, False])
async def test_usage_is_read_from_the_answer_streamed_or_not(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic, stream: bool
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url, memory_enabled=False)
    anthropic.cache_read, anthropic.cache_write = 700, 50
    body = cc.request(cc.first_messages("hello"), "u", stream=stream)
    status, content = await cc.post(proxy.url, body, cc.headers("u"))
    assert status == 200 and content[0]["text"].startswith("FAKE-ANSWER")
    tokens = proxy.app[METRICS].tokens
    total = len(anthropic.messages[-1].body) // 4  # the fake's input, cache included
    assert tokens.labels("input")._value.get() == total
    assert tokens.labels("cached")._value.get() == 700
    assert tokens.labels("cache_write")._value.get() == 50


async def test_the_answer_streams_back_byte_for_byte(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url, memory_enabled=False)
    answer = [{"type": "text", "text": "relayed as it came"}]
    anthropic.script.append(answer)
    async with aiohttp.ClientSession() as s, s.post(
            proxy.url + "/v1/messages", data=FIRST, headers=HEADERS) as r:
        got = await r.read()
    assert got.startswith(b"event: message_start\n")
    assert got.endswith(b'event: message_stop\ndata: {"type": "message_stop"}\n\n')
    assert b'"text": "relayed "' in got


async def test_an_upstream_error_is_relayed_as_anthropic_sent_it(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url, memory_enabled=False)
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    anthropic.script.append((529, error))
    async with aiohttp.ClientSession() as s, s.post(
            proxy.url + "/v1/messages", data=FIRST, headers=HEADERS) as r:
        assert r.status == 529
        assert await r.json() == error


async def test_count_tokens_goes_to_the_anthropic_upstream(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url)
    async with aiohttp.ClientSession() as s, s.post(
            proxy.url + "/v1/messages/count_tokens", data=b'{"messages": []}',
            headers={"x-api-key": "k", "content-type": "application/json"}) as r:
        assert r.status == 200 and "input_tokens" in await r.json()
    assert anthropic.received[-1].path == "/v1/messages/count_tokens"
