"""The last turn of a session is stored from the answer the proxy relayed, once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from memory.turns import answered, last, split
from request import History
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream
from tests.memory.conftest import Backend
from tests.memory.session import Session, runtime


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

    def counting(scope: Any, kind: str, keys: Sequence[str]) -> Any:
        asked.append(list(keys))
        return stored(scope, kind, keys)

    monkeypatch.setattr(store, "stored", counting)
    await s.say("Where do the migrations live?")
    await s.say("And the seeds?")

    assert [e[0] for e in await _episodes(s)] == [0, 1]
    assert asked == []
