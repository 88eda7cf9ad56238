"""The PostgreSQL store's pool: a connection is checked only after it sat idle."""

from __future__ import annotations

import asyncio
from urllib.parse import urlencode

import psycopg
import pytest

from ctxproxy.memory.model import Memory, Scope, StoreError
from ctxproxy.memory.store_pg import PostgresStore

pytestmark = pytest.mark.postgres

SCOPE = Scope("svc", "team-a", "agent-1", "u_1")
APP = "ctxproxy-test-pool"


def _named(url: str) -> str:
    return f"{url}&{urlencode({'application_name': APP})}"


def _drop_the_stores_connections(url: str) -> int:
    """What a server restart does to the pool: every connection it holds is cut."""
    with psycopg.connect(url, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s AND pid <> pg_backend_pid()", (APP,),
        ).fetchone()
    return int(row[0]) if row else 0


async def _store(url: str, idle_check_s: float) -> PostgresStore:
    store = PostgresStore(_named(url), max_connections=1, idle_check_s=idle_check_s)
    await store.open()
    await store.upsert([Memory(type="episodic", scope=SCOPE, key="k", text="the port is 5433")])
    return store


async def test_a_connection_cut_while_it_sat_idle_is_replaced_unseen(pg_url: str) -> None:
    store = await _store(pg_url, idle_check_s=0.05)
    try:
        assert _drop_the_stores_connections(pg_url) == 1
        await asyncio.sleep(0.2)
        assert [h.memory.key for h in await store.search(SCOPE, "port")] == ["k"]
    finally:
        await store.close()


async def test_a_connection_cut_right_after_use_fails_one_call_and_is_replaced(
    pg_url: str,
) -> None:
    # Taken back within the idle time, a connection is not checked (that round trip cost as
    # much as a list): a cut one fails the call that takes it (the memory side degrades that
    # request), and the pool replaces it.
    store = await _store(pg_url, idle_check_s=60.0)
    try:
        assert _drop_the_stores_connections(pg_url) == 1
        with pytest.raises(StoreError):
            await store.list(SCOPE)
        assert [m.key for m in await store.list(SCOPE)] == ["k"]
    finally:
        await store.close()


async def test_a_connection_handed_back_is_ready_for_the_next_call_at_once(pg_url: str) -> None:
    # Handed back through the pool's maintenance workers (tasks of the loop), a connection was
    # missing from the pool until they ran, and under load the turns' reads queued for one.
    store = await _store(pg_url, idle_check_s=60.0)
    try:
        pool = store._pool
        assert pool is not None
        before = pool.get_stats().get("requests_queued", 0)
        for _ in range(20):  # one connection, each call right after the last
            assert await store.list(SCOPE, limit=5)
        assert pool.get_stats().get("requests_queued", 0) == before
    finally:
        await store.close()
