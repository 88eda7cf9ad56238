"""The PostgreSQL store's reads (searches, lists) in processes of their own (a served
proxy's, with CTXPROXY_MEMORY_PROCESS on): the same records as the event loop's connection
reads, no read lost when a process dies or its connection breaks, and no process left once the
store is closed."""

from __future__ import annotations

import os
import signal

import psycopg
import pytest

from memory.model import Memory, StoreError
from memory.store_pg import PostgresStore
from tests.ledger.test_counting_process import alive, ended
from tests.memory.test_search_process import SCOPE, T0, _comm, _queries, _records


async def _hits(store: PostgresStore, query: str) -> list[tuple[str, float]]:
    found = await store.search(SCOPE, query, limit=20, now=T0 + 10_000)
    return [(h.memory.memory_id, round(h.relevance, 9)) for h in found]


def _analyze(url: str) -> None:
    # The searches read the lexeme statistics ANALYZE keeps (autovacuum, in a real server).
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE memories")


async def test_search_processes_find_what_the_event_loop_finds(pg_url: str) -> None:
    here, served = PostgresStore(pg_url), PostgresStore(pg_url, processes=True)
    await here.open()
    await served.open()
    try:
        await here.upsert(_records(1500))
        _analyze(pg_url)
        children = served._served
        assert children is not None and len(children.pids()) == 2
        for query in _queries(60):
            assert await _hits(served, query) == await _hits(here, query), query
        await here.upsert([
            Memory(type="episodic", scope=SCOPE, key=f"s{n}", text=f"turn {n} of a session",
                   session_id=f"s{n % 2}", created_at=T0 + 600 + n, updated_at=T0 + 600 + n)
            for n in range(30)])
        for session in (None, "s0", "s1"):
            for since in (None, T0 + 100):
                listed = await served.list(SCOPE, session_id=session, since=since, limit=50,
                                           now=T0 + 10_000)
                assert listed and listed == await here.list(
                    SCOPE, session_id=session, since=since, limit=50, now=T0 + 10_000)
        pids = children.pids()
        assert len(pids) == 2 and os.getpid() not in pids
        assert {_comm(pid) for pid in pids} == {"search"}
        # Each on a connection of its own, named for what it does.
        with psycopg.connect(pg_url, autocommit=True) as conn:
            named = conn.execute("SELECT count(*) FROM pg_stat_activity"
                                 " WHERE application_name = 'ctxproxy-search'").fetchone()
        assert named is not None and named[0] == 2
    finally:
        await served.close()
        await here.close()


async def test_a_search_process_killed_loses_no_search_and_is_replaced(
    pg_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    store = PostgresStore(pg_url, processes=True)
    await store.open()
    try:
        await store.upsert(_records(300))
        query = "alembic migrations staging"
        expected = await _hits(store, query)
        assert expected
        children = store._served
        assert children is not None
        dead = children.pids()
        for pid in dead:
            os.kill(pid, signal.SIGKILL)
        for pid in dead:
            assert await ended(pid)
        # A search that meets a dead process runs on the event loop instead; the next spawns
        # anew.
        for _ in range(4):
            assert await _hits(store, query) == expected
        assert "memory read ran on the worker's event loop" in caplog.text
        assert children.pids() and not set(children.pids()) & set(dead)
    finally:
        await store.close()


async def test_a_search_on_a_connection_that_broke_is_asked_again(pg_url: str) -> None:
    store = PostgresStore(pg_url, processes=True)
    await store.open()
    try:
        await store.upsert([Memory(type="episodic", scope=SCOPE, key="k",
                                   text="the staging database moved to eu-west")])
        query = "staging database"
        expected = await _hits(store, query)
        assert expected
        assert await _hits(store, query) == expected  # each process has its connection now
        # The server ends the search processes' sessions (a restart, a failover, an idle
        # timeout): each finds out on its next search, and asks again on a new connection.
        with psycopg.connect(pg_url, autocommit=True) as conn:
            ended_ = conn.execute(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'ctxproxy-search') t").fetchone()
        assert ended_ is not None and ended_[0] == 2
        for _ in range(4):
            assert await _hits(store, query) == expected
    finally:
        await store.close()


async def test_a_search_process_that_cannot_reach_the_server_is_a_store_error(
    pg_url: str,
) -> None:
    store = PostgresStore(pg_url, processes=True)
    await store.open()
    try:
        await store.upsert([Memory(type="episodic", scope=SCOPE, key="k",
                                   text="the staging database")])
        children = store._served
        assert children is not None
        # Its searches' connections go where nothing listens (the pool's stay where they
        # were): the search fails as the store's error, saying which store.
        children.close()
        children._args = ("postgresql://nobody@127.0.0.1:1/none", 1.0)
        with pytest.raises(StoreError, match="postgres"):
            await store.search(SCOPE, "staging database", now=T0)
        assert children.pids()  # the process lives on, for the next search
    finally:
        await store.close()


async def test_search_processes_end_with_the_store(pg_url: str) -> None:
    store = PostgresStore(pg_url, processes=True)
    await store.open()
    children = store._served
    assert children is not None
    pids = children.pids()
    assert len(pids) == 2 and all(alive(pid) for pid in pids)
    await store.close()
    for pid in pids:
        assert await ended(pid)
