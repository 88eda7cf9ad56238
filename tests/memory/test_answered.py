"""The last turn of a session is stored from the answer the proxy relayed, once."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from typing import Any

import aiohttp
import pytest

from ctxproxy.memory.turns import answered, last, split
from ctxproxy.request import History
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream
from tests.memory.conftest import Backend
from tests.memory.session import Session, exchange, runtime


async def _episodes(s: Session) -> list[tuple[int, str, str]]:
    await runtime(s.proxy).queue.join()
    stored = await runtime(s.proxy).store.list(None, types=["episodic"], limit=100)
    return sorted((m.turn_index or 0, m.key, m.text) for m in stored)


async def test_a_one_turn_sessions_answer_is_stored(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    s = Session(await start_proxy(**backend.settings), upstream)
    await s.say("Where do the migrations live?")

    (episode,) = await _episodes(s)
    assert episode[0] == 0
    assert "User: Where do the migrations live?" in episode[2]
    assert "Assistant: FAKE-ANSWER to: Where do the migrations live?" in episode[2]


async def test_the_next_turn_does_not_store_the_answered_turn_again(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    s = Session(await start_proxy(**backend.settings), upstream)
    await s.say("Where do the migrations live?")
    first = await _episodes(s)
    await s.say("And the seeds?")
    await s.say("Thanks, that is all.")

    episodes = await _episodes(s)
    assert [e[0] for e in episodes] == [0, 1, 2]
    assert episodes[0][1] == first[0][1]  # the same key: the same record


async def test_a_restarted_proxy_does_not_duplicate_the_answered_turn(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    s = Session(await start_proxy(**backend.settings), upstream)
    await s.say("Where do the migrations live?")
    await runtime(s.proxy).queue.join()
    s.proxy = await start_proxy(**backend.settings)  # nothing cached in this one
    await s.say("And the seeds?")

    assert [e[0] for e in await _episodes(s)] == [0, 1]


async def test_a_turn_that_goes_on_after_an_answer_replaces_the_answered_record(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    # The fake answers the tool turn's first request in text; the client goes on with a
    # tool call anyway: the record made from that first answer does not stay beside it.
    s = Session(await start_proxy(), upstream)
    await s.say_with_tool("Run the tests.")
    await s.say("Summarise.")

    episodes = await _episodes(s)
    assert [e[0] for e in episodes] == [0, 1]
    assert "Tool call exec_command" in episodes[0][2]


async def test_a_request_that_ends_unanswered_keeps_nothing_for_its_answer(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    # Refused by the upstream (a context too long, say), broken mid-stream, or answered:
    # none of them leaves the request's turn held for an answer that will not come.
    s = Session(await start_proxy(), upstream)
    upstream.then_error(400).then_raw_sse([b"event: response.created\n\n"], break_after=1)
    s.items = [*s.items, codex.text("user", "Where do the migrations live? " + "x" * 50_000)]
    hdrs = codex.headers(session_id=s.session_id, turn_id="t")
    assert (await exchange(s.proxy.url, codex.request(s.items, s.session_id), hdrs))[0] == 400
    with contextlib.suppress(aiohttp.ClientError):
        await exchange(s.proxy.url, codex.request(s.items, s.session_id), hdrs)
    await s.say("And the seeds?")

    assert runtime(s.proxy).step.awaiting == (0, 0)


async def test_requests_awaiting_their_answer_are_bounded_by_bytes(
    upstream: FakeUpstream, start_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Room for one of these requests, not two: the older goes (its turn is stored when the
    # session resends it), the newer is kept, and both are gone once answered.
    monkeypatch.setattr("ctxproxy.memory.answer.AWAITING_BYTES", 150_000)
    proxy = await start_proxy()
    upstream.then_delay(0.5).then_delay(0.5)

    async def ask(session: str) -> int:
        items = [*codex.context_items(), codex.text("user", "Which port? " + "y" * 100_000)]
        hdrs = codex.headers(session_id=session, turn_id=f"{session}-t")
        return (await exchange(proxy.url, codex.request(items, session), hdrs))[0]

    both = asyncio.gather(ask("a"), ask("b"))
    while len(upstream.received) < 2:
        await asyncio.sleep(0.01)
    held, held_bytes = runtime(proxy).step.awaiting
    assert held == 1 and 100_000 < held_bytes <= 150_000
    assert list(await both) == [200, 200]
    assert runtime(proxy).step.awaiting == (0, 0)


def test_the_answered_turn_gets_the_key_the_next_request_gives_it() -> None:
    items = codex.session(2)
    history = History(items)
    pending = last("s", history)
    assert pending is not None
    output = [{"type": "message", "id": "msg_1", "role": "assistant",
               "content": [{"type": "output_text", "text": "Done."}]}]
    turn = answered("s", pending, output)
    assert turn is not None and turn.complete

    later = split("s", History([*items, *output, codex.text("user", "next")]))
    assert later[turn.index].key == turn.key


def test_an_answer_that_calls_a_tool_does_not_end_the_turn() -> None:
    pending = last("s", History(codex.session(1)))
    assert pending is not None
    call = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "exec_command",
            "arguments": "{}"}
    assert answered("s", pending, [call]) is None
    assert answered("s", pending, []) is None


async def test_an_answered_turn_is_written_without_asking_the_store_first(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its key is made of its content, which no request has sent yet: a read of what the
    # store holds under it would find nothing, and cost a round trip a turn.
    s = Session(await start_proxy(**backend.settings), upstream)
    store = runtime(s.proxy).store
    asked: list[list[str]] = []
    stored = store.stored

    def counting(scope: Any, kind: Any, keys: Sequence[str]) -> Any:
        asked.append(list(keys))
        return stored(scope, kind, keys)

    monkeypatch.setattr(store, "stored", counting)
    await s.say("Where do the migrations live?")
    await s.say("And the seeds?")

    assert [e[0] for e in await _episodes(s)] == [0, 1]
    assert asked == []


async def test_a_non_streamed_answer_is_stored_as_the_turns_answer(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    s = Session(await start_proxy(), upstream)
    s.turns = 1
    s.items = [*s.items, codex.text("user", "Where do the migrations live?")]
    async with aiohttp.ClientSession() as http, http.post(
        s.proxy.url + "/v1/responses",
        data=json.dumps(codex.request(s.items, s.session_id, stream=False)),
        headers=codex.headers(s.session_id, f"{s.session_id}-t1"),
    ) as r:
        assert r.status == 200
        assert (await r.json())["output"][0]["role"] == "assistant"  # one JSON body

    (episode,) = await _episodes(s)
    assert "User: Where do the migrations live?" in episode[2]
    assert "Assistant: FAKE-ANSWER to: Where do the migrations live?" in episode[2]
