"""Memory's background work in a child process of the worker (CTXPROXY_MEMORY_PROCESS, the
default of a served proxy): the same records as a thread makes, nothing lost when the child
dies, and the child at the lowest priority, ending with the proxy."""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import operator
import os
import signal
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ctxproxy.injectors import redact as redact_module
from ctxproxy.injectors import tokens
from ctxproxy.memory import cpu, distill
from ctxproxy.memory.cpu import Child, Pool
from ctxproxy.memory.model import Memory
from tests.conftest import ProxyFactory
from tests.fakes.upstream import FakeUpstream
from tests.ledger.test_counting_process import ended
from tests.memory.conftest import Backend
from tests.memory.session import Session, runtime

PROMPTS = ("Where do the migrations live? We always use alembic, never raw SQL.",
           "Our staging database is pg-staging-2; the token is sk-live-abcdefghijklmnop1234.",
           "Thanks, that is all.")


def _child(pool: Pool) -> int:
    child = pool._child
    assert child is not None and child._executor is not None, "no child: nothing ran in one"
    [pid] = child._executor._processes  # type: ignore[attr-defined]
    return int(pid)


async def _episodes(s: Session) -> list[tuple[int | None, str]]:
    """The session's episodes: (turn, text)."""
    await runtime(s.proxy).queue.join()
    stored = await runtime(s.proxy).store.list(None, types=["episodic"], limit=100)
    return sorted((m.turn_index, m.text) for m in stored if m.session_id == s.session_id)


async def _talk(s: Session) -> list[tuple[int | None, str]]:
    for prompt in PROMPTS:
        await s.say(prompt)
    return await _episodes(s)


async def test_the_child_stores_the_same_episodes_as_a_thread(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory, tmp_path: Path,
) -> None:
    in_thread = await _talk(Session(await start_proxy(**backend.settings), upstream,
                                    session_id="in-thread"))
    proxy = await start_proxy(**{**backend.settings, "memory_process": True,
                                 "data_dir": tmp_path / "child"})
    assert await _talk(Session(proxy, upstream, session_id="in-child")) == in_thread
    assert len(in_thread) == 3 and "sk-live-abcdefghijklmnop1234" not in str(in_thread)
    pid = _child(runtime(proxy).pool)
    assert pid != os.getpid()
    assert os.getpriority(os.PRIO_PROCESS, pid) == cpu.NICE


async def test_a_dead_child_loses_no_write_and_the_next_call_starts_another(
    upstream: FakeUpstream, start_proxy: ProxyFactory,
) -> None:
    proxy = await start_proxy(memory_process=True)
    s = Session(proxy, upstream)
    await s.say(PROMPTS[0])
    await runtime(proxy).queue.join()
    dead = _child(runtime(proxy).pool)
    os.kill(dead, signal.SIGKILL)
    # The first write to meet the dead child runs in a thread instead.
    await s.say(PROMPTS[1])
    await s.say(PROMPTS[2])
    assert [e[0] for e in await _episodes(s)] == [0, 1, 2]
    # A call that meets the dead child (here, or at a write above) runs in a thread; the
    # call after it in another child.
    for _ in range(2):
        assert await runtime(proxy).pool.background(operator.add, 2, 3) == 5
    assert _child(runtime(proxy).pool) != dead


async def test_a_child_found_dead_before_a_call_is_replaced_not_given_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool = Pool(process=True)
    try:
        assert await pool.background(operator.add, 1, 1) == 2
        dead = _child(pool)
        os.kill(dead, signal.SIGKILL)
        executor = pool._child._executor if pool._child is not None else None
        for _ in range(200):  # until the pool has seen it die: the next submit is refused
            if getattr(executor, "_broken", False):
                break
            await asyncio.sleep(0.01)
        assert await pool.background(operator.add, 2, 2) == 4  # in the thread
        assert "the child process died" in caplog.text
        assert await pool.background(operator.add, 3, 3) == 6
        assert _child(pool) != dead
    finally:
        await pool.close()


async def test_the_child_ends_with_the_proxy(
    upstream: FakeUpstream, start_proxy: ProxyFactory,
) -> None:
    proxy = await start_proxy(memory_process=True)
    await Session(proxy, upstream).say(PROMPTS[0])
    await runtime(proxy).queue.join()
    pid = _child(runtime(proxy).pool)
    await proxy.close()
    assert await ended(pid)


def _content(decided: tuple[list[Memory], list[str]]) -> tuple[object, ...]:
    writes, deletes = decided
    return tuple((m.key, m.text, m.attrs, tuple(m.sources)) for m in writes), tuple(deletes)


async def test_distillations_work_runs_in_the_child_as_in_a_thread(
    upstream: FakeUpstream, start_proxy: ProxyFactory,
) -> None:
    s = Session(await start_proxy(), upstream)
    await _talk(s)
    episodes = await runtime(s.proxy).store.list(None, types=["episodic"], limit=100)
    parsed = distill._claims_of(episodes)
    mentions = [distill.Mention(c, e.memory_id, e.session_id or "", e.created_at)
                for e, found in zip(episodes, parsed, strict=True) for c in found]
    decide = functools.partial(distill._decide, episodes[0].scope, mentions, [],
                               threshold=0.0, now=episodes[0].created_at)
    child = Child()
    try:
        assert await child.run(functools.partial(distill._claims_of, episodes)) == parsed
        # New records get fresh ids and times: the rest is the same.
        assert _content(await child.run(decide)) == _content(decide())
    finally:
        child.close()
    assert mentions  # "always use alembic, never raw SQL" is a claim
    assert decide()[0]  # and at threshold 0 a semantic memory


def _loaded() -> tuple[int, bool]:
    """In the child: whether the redaction patterns are compiled and the tokenizer loaded."""
    return redact_module._looser.cache_info().currsize, tokens._loaded is not None


async def test_a_started_child_has_loaded_what_its_first_episode_needs_and_no_more() -> None:
    """Spawned on the first turns instead, it stored their episodes 0.5-2.2 s late: after
    bench.recall's sessions had asked for them. The tokenizer, which its work never uses,
    would take about 50 MiB more."""
    pool = Pool(process=True)
    await pool.start()
    try:
        assert await pool.background(_loaded) == (1, False)
    finally:
        await pool.close()


class NoFork(ProcessPoolExecutor):
    """As at a process limit: the child cannot be spawned."""

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        raise OSError(11, "Resource temporarily unavailable")


async def test_where_no_child_can_start_the_work_runs_in_a_thread_and_it_is_not_tried_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(cpu, "ProcessPoolExecutor", NoFork)
    pool = Pool(process=True)
    await pool.start()
    try:
        for n in range(3):
            assert await pool.background(operator.add, n, 1) == n + 1
    finally:
        await pool.close()
    assert pool._child is None
    assert caplog.text.count("memory background work in a thread of the worker") == 1


def _a_worker_that_used_its_child_and_closed() -> None:
    """A proxy worker in small: a spawned process that ran a call in its memory child, closed
    the pool and returns at once, as a worker does once its server has stopped."""

    async def serve() -> None:
        pool = Pool(process=True)
        assert await pool.background(operator.add, 1, 1) == 2
        await pool.close()

    asyncio.run(serve())


def test_a_worker_process_exits_once_its_pool_is_closed() -> None:
    # Closed without waiting for the child, the worker's exit raced the executor's manager
    # thread: its stop message was left in a queue the exit had closed, and the exit waited
    # for the child for ever (39 of 40 such processes hung).
    context = multiprocessing.get_context("spawn")
    for _ in range(3):
        worker = context.Process(target=_a_worker_that_used_its_child_and_closed)
        worker.start()
        worker.join(30)
        hung = worker.is_alive()
        if hung:
            worker.kill()
            worker.join()
        assert not hung and worker.exitcode == 0
