"""The write queue's byte budget, and the persistent "already stored" check of ingest."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from ctxproxy.memory.health import Health
from ctxproxy.memory.ingest import Ingester
from ctxproxy.memory.model import Scope, Store, StoreError
from ctxproxy.memory.queue import DropReason, WriteQueue
from ctxproxy.memory.turns import split
from ctxproxy.request import History
from tests.fakes import codex

T = TypeVar("T")


async def _nothing() -> None:
    return None


def _queue(**kwargs: Any) -> tuple[WriteQueue, list[DropReason], list[int]]:
    dropped: list[DropReason] = []
    sizes: list[int] = []
    q = WriteQueue(100, Health(), on_drop=dropped.append, on_bytes=sizes.append, **kwargs)
    return q, dropped, sizes


async def test_a_write_over_the_byte_budget_is_refused_and_counted() -> None:
    q, dropped, sizes = _queue(max_bytes=1000)
    assert q.put(_nothing, 600)
    assert not q.put(_nothing, 600)
    assert q.put(_nothing, 400)
    assert dropped == ["bytes"] and q.dropped == 1
    assert q.bytes == 1000 and sizes[-1] == 1000
    q.start()
    await q.join()
    assert q.bytes == 0 and sizes[-1] == 0
    await q.close()


async def test_one_write_larger_than_the_budget_goes_into_an_empty_queue_only() -> None:
    q, dropped, _ = _queue(max_bytes=1000)
    assert q.put(_nothing, 5000)
    assert not q.put(_nothing, 1)
    assert dropped == ["bytes"]


async def test_a_write_that_fails_twice_is_dropped_and_counted_once_retried() -> None:
    q, dropped, _ = _queue(retry_s=0)
    calls: list[int] = []

    async def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise StoreError("locked")

    async def broken() -> None:
        raise StoreError("down")

    q.put(flaky)
    q.put(broken)
    q.start()
    await q.join()
    assert calls == [1, 1]  # the retry stored it
    assert dropped == ["failed"]
    await q.close()


class Recording:
    """An offload that runs inline and records what it ran."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    async def __call__(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        self.ran.append(getattr(fn, "__name__", repr(fn)))
        return fn(*args, **kwargs)


async def test_stored_turns_are_not_rendered_again_after_a_restart(store: Store) -> None:
    scope = Scope("svc", "team", "agent", "user")
    turns = split("sess", History(codex.session(6)))
    assert sum(t.complete for t in turns) >= 5
    first = Recording()
    assert await Ingester(store, offload=first).write(scope, "sess", turns, now=time.time()) >= 5
    assert first.ran == ["episodes"]

    again = Recording()  # a new process: nothing known in memory
    assert await Ingester(store, offload=again).write(scope, "sess", turns, now=time.time()) == 0
    assert again.ran == []


async def test_stored_answers_each_key_with_its_window_flag(store: Store) -> None:
    scope = Scope("svc", "team", "agent", "user")
    turns = split("sess", History(codex.session(4)), first_turn=2)
    await Ingester(store).write(scope, "sess", turns, now=time.time())
    keys = [t.key for t in turns if t.complete]
    found = await store.stored(scope, "episodic", [*keys, "turn:unknown"])
    assert found == {t.key: t.in_window for t in turns if t.complete}
    assert await store.stored(Scope("svc", "other"), "episodic", keys) == {}
    assert await store.stored(scope, "working", keys) == {}


async def test_a_turn_that_leaves_the_window_is_not_rendered_again(store: Store) -> None:
    """Its key holds its content: only its window flag is written, by the process that
    stored it and by another one (a restart, another worker) alike."""
    scope = Scope("svc", "team", "agent", "user")
    history = History(codex.session(6))
    inside = split("sess", history)  # every turn forwarded
    here = Recording()
    writer = Ingester(store, offload=here)
    await writer.write(scope, "sess", inside, now=time.time())
    texts = {m.key: m.text for m in await store.list(scope, types=["episodic"], limit=100)}
    cut = split("sess", history, first_turn=2)  # the window has cut the first two turns
    out = {t.key for t in cut if t.complete and not t.in_window}
    assert len(out) == 2

    assert await writer.write(scope, "sess", cut, now=time.time()) == 2
    assert here.ran == ["episodes"]  # the first write's, none since
    assert {k for k, inside in (await store.stored(scope, "episodic", list(texts))).items()
            if not inside} == out

    again = split("sess", history, first_turn=3)  # one more cut, seen by another process
    elsewhere = Recording()
    assert await Ingester(store, offload=elsewhere).write(scope, "sess", again,
                                                          now=time.time()) == 1
    assert elsewhere.ran == []
    flags = await store.stored(scope, "episodic", list(texts))
    assert flags == {t.key: t.in_window for t in again if t.complete}
    assert {m.key: m.text for m in await store.list(scope, types=["episodic"], limit=100)} == texts


async def test_the_turn_keys_known_as_stored_are_bounded_the_oldest_session_asked_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ctxproxy.memory.ingest._KEYS", 8)  # room for one session's turns, not two
    asked: list[str] = []
    stored = store.stored

    def counting(scope: Scope, kind: Any, keys: Any) -> Any:
        asked.append(scope.agent_id)
        return stored(scope, kind, keys)

    monkeypatch.setattr(store, "stored", counting)
    writer = Ingester(store)
    turns = split("sess", History(codex.session(6)))
    a, b = Scope("svc", "team", "a", "user"), Scope("svc", "team", "b", "user")
    await writer.write(a, "sess", turns, now=time.time())
    await writer.write(b, "sess", turns, now=time.time())
    assert asked == ["a", "b"]

    assert await writer.write(b, "sess", turns, now=time.time()) == 0  # still known
    assert asked == ["a", "b"]
    assert await writer.write(a, "sess", turns, now=time.time()) == 0  # forgotten: asked
    assert asked == ["a", "b", "a"]
