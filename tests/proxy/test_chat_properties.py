"""Properties of the Chat Completions parse, write-back and stream reading, over generated
histories and chunkings (hypothesis)."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from ctxproxy.config import load_settings
from ctxproxy.proxy.sse_chat import ChatTap
from ctxproxy.request import Exchange
from ctxproxy.request.protocol import CHAT
from tests.fakes import chat

SETTINGS = load_settings(env={})
# A turn's shape: a plain answer, one or two tool calls (in one assistant message or two),
# a prompt in parts with an image, an old "function" message, a developer message mid-way.
turn_kinds = st.sampled_from(["text", "tool", "two_calls", "parts", "function", "developer"])


def turn(kind: str, n: int, same_ids: bool) -> list[dict[str, Any]]:
    call = "call_1" if same_ids else f"call_{n}"  # some clients number calls per turn
    if kind == "tool":
        return chat.tool_turn(f"turn {n}", n) if not same_ids else [
            {"role": "user", "content": f"turn {n}"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call, "type": "function", "function": {"name": "bash",
                                                              "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call, "content": f"out {n}"},
            {"role": "assistant", "content": f"done {n}"}]
    if kind == "two_calls":
        calls = [{"id": f"{call}_{k}", "type": "function",
                  "function": {"name": "bash", "arguments": json.dumps({"k": k})}}
                 for k in range(2)]
        return [{"role": "user", "content": f"turn {n}"},
                {"role": "assistant", "content": "both", "tool_calls": calls},
                *({"role": "tool", "tool_call_id": c["id"], "content": f"out {n}"}
                  for c in calls)]
    if kind == "parts":
        return [{"role": "user", "content": [
            {"type": "text", "text": f"turn {n}"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
            {"role": "assistant", "content": [{"type": "text", "text": f"answer {n}"}]}]
    if kind == "function":
        return [{"role": "user", "content": f"turn {n}"},
                {"role": "function", "name": "old", "content": "x"}]
    if kind == "developer":
        return [{"role": "user", "content": f"turn {n}"},
                {"role": "developer", "content": f"note {n}"},
                {"role": "assistant", "content": f"answer {n}"}]
    return [{"role": "user", "content": f"turn {n}"}, {"role": "assistant", "content": "ok"}]


def body_of(kinds: list[str], same_ids: bool) -> dict[str, Any]:
    messages = [m for n, kind in enumerate(kinds) for m in turn(kind, n, same_ids)]
    return chat.request([*messages, {"role": "user", "content": "last"}])


def exchange(body: dict[str, Any]) -> Exchange:
    return Exchange.parse(orjson.dumps(body), CIMultiDictProxy(CIMultiDict()), SETTINGS,
                          protocol=CHAT)


@settings(max_examples=150, deadline=None)
@given(st.lists(turn_kinds, max_size=20), st.booleans())
def test_writing_back_an_unchanged_history_gives_the_clients_bytes(
    kinds: list[str], same_ids: bool
) -> None:
    body = body_of(kinds, same_ids)
    ex = exchange(body)
    assert ex.history.turns == len(kinds) + 1
    ex.changed = True
    assert ex.serialise() == orjson.dumps(body)


@settings(max_examples=150, deadline=None)
@given(st.lists(turn_kinds, max_size=20), st.booleans(), st.integers(0, 25))
def test_any_cut_keeps_whole_client_messages_and_every_call_with_its_result(
    kinds: list[str], same_ids: bool, first: int
) -> None:
    body = body_of(kinds, same_ids)
    ex = exchange(body)
    first = min(first, ex.history.turns - 1)
    kept = ex.history.keep_from(first)
    ex.body = {**ex.body, "input": kept.items}
    ex.first_turn, ex.starts, ex.changed = first, kept.starts, True
    written = orjson.loads(ex.serialise())["messages"]
    # Each written message is one of the client's, whole and in order: the context (system,
    # developer) wherever it stood, then every message from the first kept prompt on.
    users = [i for i, m in enumerate(body["messages"]) if m["role"] == "user"]
    assert written == [m for i, m in enumerate(body["messages"])
                       if i >= users[first] or m["role"] in ("system", "developer")]
    open_calls: set[str] = set()
    for message in written:
        if message["role"] == "tool":
            open_calls.remove(message["tool_call_id"])  # answers a call just made
        else:
            assert not open_calls
            open_calls = {c["id"] for c in message.get("tool_calls") or ()}
    assert not open_calls


def stream(content: str, arguments: str) -> bytes:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    message = {"role": "assistant", "content": content, "tool_calls": [{
        "id": "call_9", "type": "function", "function": {"name": "bash",
                                                         "arguments": arguments}}]}
    usage = {"prompt_tokens": 900, "completion_tokens": 12,
             "prompt_tokens_details": {"cached_tokens": 256}}
    return b"".join(chat.stream_chunks(message, base, usage))


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60), st.text(max_size=60), st.lists(st.integers(1, 64), max_size=40))
def test_a_stream_reads_the_same_however_its_bytes_are_chunked(
    content: str, arguments: str, cuts: list[int]
) -> None:
    raw = stream(content, arguments).replace(b"\n", b"\r\n") if len(cuts) % 2 else stream(
        content, arguments)
    tap = ChatTap()
    at = 0
    for size in cuts:
        tap.feed(raw[at:at + size])
        at += size
    tap.feed(raw[at:])
    assert tap.answer_due
    assert tap.usage() == {"input_tokens": 900, "cached_tokens": 256, "output_tokens": 12}
    words = " ".join(w for w in content.split(" ")) + " " if content else ""
    output = tap.output()
    assert output is not None
    texts = [i for i in output if i["type"] == "message"]
    assert [t["content"][0]["text"] for t in texts] == ([words] if words else [])
    call = next(i for i in output if i["type"] == "function_call")
    assert (call["call_id"], call["name"], call["arguments"]) == ("call_9", "bash", arguments)
