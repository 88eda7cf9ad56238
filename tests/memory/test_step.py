"""The memory step on its own: what it writes once a request is answered, and once per turn."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from ctxproxy.config import load_settings
from ctxproxy.injectors import memory_blocks, tokens
from ctxproxy.memory import turns as turns_
from ctxproxy.memory.health import Health
from ctxproxy.memory.ingest import Ingester
from ctxproxy.memory.prepare import Preparing
from ctxproxy.memory.queue import WriteQueue
from ctxproxy.memory.recall import Recaller, Weights
from ctxproxy.memory.step import MemoryStep
from ctxproxy.memory.store_sqlite import SqliteStore
from ctxproxy.memory.working import Working
from ctxproxy.proxy.memory_wiring import _cost
from ctxproxy.request import Exchange
from ctxproxy.window.step import WindowStep
from tests.fakes import codex


@dataclass
class Rig:
    step: MemoryStep
    store: SqliteStore
    queue: WriteQueue
    failures: list[int]
    settings: Any

    async def run(self, items: list[dict[str, Any]], turn_id: str = "t1",
                  status: int | None = 200, **headers: str) -> Exchange:
        """The request through the window and the step, then answered with ``status`` as the
        relay tells it (None: not yet)."""
        raw = orjson.dumps(codex.request(items))
        hdrs = CIMultiDictProxy(CIMultiDict(codex.headers(turn_id=turn_id, **headers)))
        ex = Exchange.parse(raw, hdrs, self.settings)
        await WindowStep(self.settings.keep_turns)(ex)
        await self.step(ex)
        if status is not None:
            await answer(self.step, ex, status)
        return ex


async def answer(step: MemoryStep, ex: Exchange, status: int = 200) -> None:
    """The relay's part: tell the status, and wait as it does before the answer's end."""
    hold = step.answering(ex, status)
    if hold is not None:
        await hold()


@pytest.fixture
async def rig(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    # Busy shared cores: the memory budget is not what these tests are about (see conftest).
    overrides = {"memory_timeout_ms": 10_000, **getattr(request, "param", {})}
    settings = load_settings(env={}, data_dir=tmp_path, keep_turns=2, **overrides)
    store = SqliteStore(tmp_path / "memory.sqlite3")
    await store.open()
    failures: list[int] = []
    health = Health(lambda: failures.append(1))
    queue = WriteQueue(100, health)  # not started: writes wait until a test starts it
    recaller = Recaller(
        store, weights=Weights(), k=5, budget=1200, cost=_cost,
        overhead=lambda kind: tokens.count(memory_blocks.block_overhead(kind)),
    )
    step = MemoryStep(
        settings, working=Working(store, queue, 1800), ingester=Ingester(store),
        recaller=recaller, queue=queue, health=health,
    )
    yield Rig(step, store, queue, failures, settings)
    await step.close()
    queue.start()
    await queue.close()
    await store.close()


def history(*prompts: str) -> list[dict[str, Any]]:
    items = codex.context_items()
    for prompt in prompts[:-1]:
        items += codex.text_turn(prompt)
    return [*items, codex.text("user", prompts[-1])]


async def test_working_memory_is_stored_once_answered_and_before_the_answer_goes_on(
    rig: Rig,
) -> None:
    ex = await rig.run(history("Port the CLI to Rust.", "Never use unsafe code.", "Go on."),
                       status=None)
    assert await rig.store.list(None) == []  # forwarded: nothing kept before its answer
    await answer(rig.step, ex)

    working = await rig.store.list(None, types=["working"])
    assert sorted(m.text for m in working) == ["Go on.", "Never use unsafe code."]
    assert await rig.store.list(None, types=["episodic"]) == []  # still queued

    rig.queue.start()
    await rig.queue.join()
    assert len(await rig.store.list(None, types=["episodic"])) == 2


async def test_a_turn_recalls_once_and_its_tool_loop_reuses_the_bytes(rig: Rig) -> None:
    rig.queue.start()
    prompts = ["Set up the repo.", "Our database is PostgreSQL 15 on port 5433.",
               "step three", "step four"]
    for n in range(1, len(prompts) + 1):
        await rig.run(history(*prompts[:n]), turn_id=f"t{n}")
        await rig.queue.join()
    items = history(*prompts, "Which port is the database on?")
    first = await rig.run(items, turn_id="t5")
    await rig.queue.join()  # the turn's own writes are done: only a recall could fail now
    await rig.store.close()  # a second recall would now fail

    loop = [*items, *codex.tool_turn("x")[1:-1]]
    second = await rig.run(loop, turn_id="t5")

    assert first.notes.memory_cache == "miss" and second.notes.memory_cache == "hit"
    assert "PostgreSQL 15 on port 5433" in orjson.dumps(first.body).decode()
    assert first.body.get("instructions") == second.body.get("instructions")
    recall = [i for i in first.body["input"] if i.get("role") == "developer"][-1]
    assert recall in second.body["input"]
    assert rig.failures == []
    await rig.store.open()


async def test_a_compaction_request_is_left_alone(rig: Rig) -> None:
    items = history("one", "two", "three")
    ex = await rig.run(items, kind="compaction")
    assert not ex.changed
    assert await rig.store.list(None) == []


@pytest.mark.parametrize("rig", [{"memory_placement": "instructions"}], indirect=True)
async def test_instructions_placement_puts_every_block_in_the_system_prompt(rig: Rig) -> None:
    rig.queue.start()
    prompts = ["Set up the repo. Never commit to main.",
               "Our database is PostgreSQL 15 on port 5433.",
               "step three", "step four"]
    for n in range(1, len(prompts) + 1):
        await rig.run(history(*prompts[:n]), turn_id=f"t{n}")
        await rig.queue.join()

    ex = await rig.run(history(*prompts, "Which port is the database on?"), turn_id="t5")

    assert not [i for i in ex.body["input"] if i.get("role") == "developer"
                and "_memory" in str(i)]
    instructions = ex.body["instructions"]
    assert "<working_memory" in instructions and "<episodic_memory" in instructions
    assert "PostgreSQL 15 on port 5433" in instructions


async def test_a_store_failure_is_counted_and_the_request_goes_without_memory(
    rig: Rig,
) -> None:
    await rig.store.close()
    ex = await rig.run(history("one", "two", "three", "four"))
    assert ex.notes.memory_degraded is True
    assert "instructions" not in ex.body
    assert len(rig.failures) == 2  # working memory, then recall
    await rig.store.open()


async def test_a_turns_search_goes_out_before_its_history_is_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search is a turn's longest hop: it needs only the prompt, so it does not wait for
    the split (a worker thread's turn, which under load means a queue)."""
    settings = load_settings(env={}, data_dir=tmp_path, keep_turns=2, memory_timeout_ms=10_000)
    store = SqliteStore(tmp_path / "memory.sqlite3")
    await store.open()
    searched = asyncio.Event()
    search = store.search

    async def seen(*args: Any, **kwargs: Any) -> Any:
        searched.set()
        return await search(*args, **kwargs)

    monkeypatch.setattr(store, "search", seen)
    # A history too long to split in place (a short one is split before anything is awaited).
    monkeypatch.setattr("ctxproxy.memory.prepare.small_history", lambda items, size: False)

    async def offload(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        if fn is turns_.split:  # the split's thread is busy until the search has gone out
            await asyncio.wait_for(searched.wait(), 5)
        return await asyncio.to_thread(fn, *args, **kwargs)

    health = Health(lambda: None)
    queue = WriteQueue(100, health)
    recaller = Recaller(store, weights=Weights(), k=5, budget=1200, cost=_cost,
                        overhead=lambda kind: tokens.count(memory_blocks.block_overhead(kind)))
    step = MemoryStep(settings, working=Working(store, queue, 1800), ingester=Ingester(store),
                      recaller=recaller, queue=queue, health=health, offload=offload)
    rig = Rig(step, store, queue, [], settings)
    ex = await rig.run(history("Set up the repo.", "Which port is the database on?"))
    assert searched.is_set() and not ex.notes.memory_degraded
    await step.close()
    queue.start()
    await queue.close()
    await store.close()


async def test_a_short_turns_work_runs_in_place_and_a_long_ones_in_a_worker(
    tmp_path: Path,
) -> None:
    """The trip to a worker costs more than a short turn's split, working memory, standing
    choice and pick; a long history, a long prompt and a long recall still go to one, so
    that what the loop does per call stays bounded."""
    settings = load_settings(env={}, data_dir=tmp_path, keep_turns=2, memory_timeout_ms=10_000)
    store = SqliteStore(tmp_path / "memory.sqlite3")
    await store.open()
    sent: list[str] = []

    async def offload(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        sent.append(getattr(fn, "__name__", ""))
        return await asyncio.to_thread(fn, *args, **kwargs)

    health = Health(lambda: None)
    queue = WriteQueue(100, health)
    queue.start()
    recaller = Recaller(store, weights=Weights(), k=5, budget=1200, cost=_cost,
                        overhead=lambda kind: tokens.count(memory_blocks.block_overhead(kind)),
                        offload=offload)
    step = MemoryStep(settings, working=Working(store, queue, 1800, offload=offload),
                      ingester=Ingester(store), recaller=recaller, queue=queue, health=health,
                      offload=offload)
    rig = Rig(step, store, queue, [], settings)
    facts = [f"The {n}th service listens on port {5400 + n}." for n in range(8)]
    for n in range(1, len(facts) + 1):
        await rig.run(history(*facts[:n], "Which port?"), turn_id=f"t{n}")
        await queue.join()
    assert sent == []

    # A long history (each round of tool calls is two items), a long prompt: in a worker.
    calls = [item for n in range(300) for item in codex.tool_turn(f"ls {n}")[1:-1]]
    long_prompt = "Keep every service on its own port. " * 1000
    items = [*history(*facts, "Which port?")[:-1], codex.text("user", long_prompt), *calls,
             codex.text("user", "Which port does the 3rd service listen on?")]
    ex = await rig.run(items, turn_id="t-long")
    assert {"split", "derive"} <= set(sent)
    assert "5403" in orjson.dumps(ex.body).decode()

    # A long question: reading it (its words, its questions) and the pick (snippets and
    # token counts over the question and the candidates) in a worker.
    sent.clear()
    question = "Which port does the 3rd service listen on? " + "Be precise, please. " * 2000
    ex = await rig.run(history(*facts, question), turn_id="t-long-question")
    assert {"_read_query", "_pick"} <= set(sent)
    assert "5403" in orjson.dumps(ex.body).decode()
    await step.close()
    await queue.close()
    await store.close()


async def test_a_turns_recall_reaches_its_request_a_few_loop_turns_after_the_search_ends(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load each turn of the event loop takes every other ready callback's time, so
    the levels of futures between the store's answer and the request (tasks, gathers inside
    gathers, a shield inside wait_for) each cost a turn of the busy loop. Counted here on an
    idle loop: from the search's end until the request goes on."""
    await rig.run(history("Set up the repo."), turn_id="t1")
    answer: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()

    listed = asyncio.Event()
    read = rig.store.list

    def search(*args: Any, **kwargs: Any) -> asyncio.Future[list[Any]]:
        return answer  # as the SQLite store's: a future, the read under way

    def list_(*args: Any, **kwargs: Any) -> Any:
        reading = read(*args, **kwargs)
        reading.add_done_callback(lambda _: listed.set())
        return reading

    monkeypatch.setattr(rig.store, "search", search)
    monkeypatch.setattr(rig.store, "list", list_)
    going = asyncio.ensure_future(rig.run(
        history("Set up the repo.", "Which port is the database on?"), turn_id="t2",
        status=None))
    await asyncio.wait_for(listed.wait(), 10)  # the turn's other read (its latest episodes)
    for _ in range(10):
        await asyncio.sleep(0)  # ... has reached the join: only the search waits
    assert not going.done()
    answer.set_result([])
    turns = 0
    while not going.done():
        await asyncio.sleep(0)  # one turn of the loop
        turns += 1
    assert not going.result().notes.memory_degraded
    # The join of the turn's reads, the turn's task, the request (8 with a task a read, a
    # gather inside a gather and wait_for(shield(...)); 6 with a task running the recall's
    # gather; 4 with the request waiting through asyncio.wait).
    assert turns <= 3


async def test_a_turns_reads_go_out_in_the_step_that_finds_the_turn_new(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn's reads are handed to the store before the request's step first lets the loop
    go: no task between the request and its reads."""
    await rig.run(history("Set up the repo."), turn_id="t1")
    asked: list[str] = []
    search, list_ = rig.store.search, rig.store.list

    def searching(*args: Any, **kwargs: Any) -> Any:
        asked.append("search")
        return search(*args, **kwargs)

    def listing(*args: Any, **kwargs: Any) -> Any:
        asked.append(f"list {kwargs['types'][0]}")
        return list_(*args, **kwargs)

    monkeypatch.setattr(rig.store, "search", searching)
    monkeypatch.setattr(rig.store, "list", listing)
    going = asyncio.ensure_future(rig.run(
        history("Set up the repo.", "Which port is the database on?"), turn_id="t2"))
    await asyncio.sleep(0)  # the request's first step, up to its first wait
    assert asked == ["search", "list episodic"]  # the standing block is pinned: no more
    assert not (await going).notes.memory_degraded


async def test_the_answer_goes_on_a_few_loop_turns_after_working_memory_is_written(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer of a turn that states a constraint waits for its working memory write;
    the write's end reaches it in a few turns of the loop (each a busy loop's every ready
    callback)."""
    await rig.run(history("Port the CLI to Rust."), turn_id="t1")
    stored: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
    monkeypatch.setattr(rig.store, "upsert", lambda records: stored)
    ex = await rig.run(history("Port the CLI to Rust.", "Never use unsafe code."), turn_id="t2",
                       status=None)
    answering = asyncio.ensure_future(answer(rig.step, ex))
    for _ in range(10):
        await asyncio.sleep(0)
    assert not answering.done()  # it waits for the write
    stored.set_result([])
    turns = 0
    while not answering.done():
        await asyncio.sleep(0)  # one turn of the loop
        turns += 1
    # The write's task, the answer's wait, the answer (4 through wait_for(shield(...))).
    assert turns <= 3


async def test_a_request_that_stops_waiting_leaves_nothing_behind_in_its_turn() -> None:
    """Requests of a turn whose preparation hangs (a store that does not answer) each wait
    at most their budget; none of them stays referenced by the turn after it has gone."""
    hanging: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def work() -> Any:
        return await hanging

    turn = Preparing(work(), ())
    for _ in range(50):
        await turn.wait(0.001)
    waiter = asyncio.ensure_future(turn.wait(10))
    await asyncio.sleep(0)
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    assert not turn.task.done()
    assert turn._waiting == []
    # One that is still waiting is woken when the work ends.
    waiting = asyncio.ensure_future(turn.wait(10))
    await asyncio.sleep(0)
    hanging.set_result(None)
    await asyncio.wait_for(waiting, 1)
    assert turn._waiting == []
