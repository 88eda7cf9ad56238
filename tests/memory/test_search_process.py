"""The SQLite store's searches in processes of their own (a served proxy's, with
CTXPROXY_MEMORY_PROCESS on): the same hits as a thread finds, no search lost when a process
dies, errors that still say what failed, and no process left once the store is closed."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
from pathlib import Path

import pytest

from ctxproxy.memory.cpu import ChildUnavailable, Served
from ctxproxy.memory.model import Memory, Scope, StoreError
from ctxproxy.memory.store_sqlite import SqliteStore
from tests.ledger.test_counting_process import alive, ended

SCOPE = Scope("svc", "team", "agent", "u_1")
OTHER = Scope("svc", "team", "agent", "u_2")
T0 = 1_700_000_000.0
# Few words, some in most records: searches that take the rare path, the common one and both.
WORDS = [f"w{n}" for n in range(60)] + ["migrations", "alembic", "staging", "deploy"]


def _records(count: int, seed: int = 7) -> list[Memory]:
    rng = random.Random(seed)
    weights = [1 / (1 + n) for n in range(len(WORDS))]  # Zipf-like: a few words everywhere
    return [
        Memory(type=rng.choice(["episodic", "semantic"]), scope=rng.choice([SCOPE, OTHER]),
               key=f"k{n}", text=" ".join(rng.choices(WORDS, weights, k=rng.randint(3, 40))),
               created_at=T0 + n, updated_at=T0 + n)
        for n in range(count)
    ]


def _queries(count: int, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.sample(WORDS, rng.randint(1, 12))) for _ in range(count)]


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


async def _hits(store: SqliteStore, query: str) -> list[tuple[str, float]]:
    found = await store.search(SCOPE, query, limit=20, now=T0 + 10_000)
    return [(h.memory.memory_id, h.relevance) for h in found]


async def test_search_processes_find_what_a_thread_finds(tmp_path: Path) -> None:
    path = tmp_path / "memory.sqlite3"
    threads, processes = SqliteStore(path), SqliteStore(path, processes=True)
    await threads.open()
    await processes.open()
    try:
        await threads.upsert(_records(1500))
        served = processes._served
        assert served is not None and len(served.pids()) == 2
        for query in _queries(60):
            assert await _hits(processes, query) == await _hits(threads, query), query
        # The searches ran there: processes named for what they do, beside this one.
        pids = served.pids()
        assert len(pids) == 2 and os.getpid() not in pids
        assert {_comm(pid) for pid in pids} == {"search"}
    finally:
        await processes.close()
        await threads.close()


async def test_a_search_process_killed_loses_no_search_and_is_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    store = SqliteStore(tmp_path / "memory.sqlite3", processes=True)
    await store.open()
    try:
        await store.upsert(_records(300))
        query = "alembic migrations staging"
        expected = await _hits(store, query)
        assert expected
        served = store._served
        assert served is not None
        dead = served.pids()
        for pid in dead:
            os.kill(pid, signal.SIGKILL)
        for pid in dead:
            assert await ended(pid)
        # A search that meets a dead process runs in a thread instead; the next spawns anew.
        for _ in range(4):
            assert await _hits(store, query) == expected
        assert "memory search ran in a thread of the worker" in caplog.text
        assert served.pids() and not set(served.pids()) & set(dead)
    finally:
        await store.close()


async def test_a_corrupt_row_found_by_a_search_process_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "memory.sqlite3"
    store = SqliteStore(path, processes=True)
    await store.open()
    try:
        await store.upsert([Memory(type="episodic", scope=SCOPE, key="k",
                                   text="the staging database")])
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE memories SET attrs = '{broken' WHERE key = 'k'")
        with pytest.raises(StoreError, match="could not be read"):
            await store.search(SCOPE, "staging database", now=T0)
    finally:
        await store.close()


async def test_search_processes_end_with_the_store(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "memory.sqlite3", processes=True)
    await store.open()
    served = store._served
    assert served is not None
    pids = served.pids()
    assert len(pids) == 2 and all(alive(pid) for pid in pids)
    await store.close()
    for pid in pids:
        assert await ended(pid)


def _raise(kind: str) -> object:
    if kind == "value":
        raise ValueError("bad value")
    return lambda: None  # a reply that cannot be pickled


def _serving(_: str) -> object:
    return _raise


def test_a_served_call_raises_its_exception_here_and_an_unpicklable_reply_says_so() -> None:
    served: Served[object] = Served(1, _serving, "x", name="ctxproxy-test")  # type: ignore[arg-type]
    try:
        with pytest.raises(ValueError, match="bad value"):
            served.call("value")
        with pytest.raises(RuntimeError, match="unpicklable reply"):
            served.call("lambda")
        with pytest.raises(ValueError, match="bad value"):  # the process still serves
            served.call("value")
    finally:
        served.close()


def _broken(_: str) -> object:
    raise OSError("no such database")


def test_a_process_that_cannot_start_says_so_and_each_call_tries_again() -> None:
    served: Served[object] = Served(1, _broken, "x", name="ctxproxy-test")  # type: ignore[arg-type]
    try:
        with pytest.raises(ChildUnavailable, match="did not start"):
            served.start()
        with pytest.raises(ChildUnavailable, match="did not start"):
            served.call("value")
        assert served.pids() == []
    finally:
        served.close()
