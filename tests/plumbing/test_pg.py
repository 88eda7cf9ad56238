"""The PostgreSQL pool opens on a migrated schema, and starters racing apply each version once."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from ctxproxy.plumbing.pg import Schema, migrate, open_pool

SCHEMA = Schema("ctxproxy.test", "test_migrations", (
    # Not idempotent, and slow: a second starter applying it too would fail or count twice.
    (1, ("CREATE TABLE applied (version integer NOT NULL)", "SELECT pg_sleep(0.2)",
         "INSERT INTO applied VALUES (1)")),
    (2, ("INSERT INTO applied VALUES (2)",)),
))


async def _rows(url: str, sql: str) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(sql)
        return await cur.fetchall()


async def test_starters_at_once_apply_each_version_once_under_the_advisory_lock(
        pg_url: str) -> None:
    await asyncio.gather(*(migrate(pg_url, SCHEMA, timeout_s=5.0) for _ in range(4)))
    assert await _rows(pg_url, "SELECT version FROM applied ORDER BY version") == [(1,), (2,)]
    assert await _rows(pg_url, "SELECT version FROM test_migrations ORDER BY version") == [
        (1,), (2,)]


async def test_a_version_appended_later_is_applied_alone(pg_url: str) -> None:
    await migrate(pg_url, SCHEMA, timeout_s=5.0)
    later = Schema(SCHEMA.lock, SCHEMA.table,
                   (*SCHEMA.migrations, (3, ("INSERT INTO applied VALUES (3)",))))
    await migrate(pg_url, later, timeout_s=5.0)
    assert await _rows(pg_url, "SELECT version FROM applied ORDER BY version") == [
        (1,), (2,), (3,)]


async def test_the_pool_opens_on_the_migrated_schema(pg_url: str) -> None:
    pool = await open_pool(pg_url, SCHEMA, max_size=2, timeout_s=5.0, autocommit=True)
    try:
        async with pool.connection() as conn:
            assert conn.autocommit
            cur = await conn.execute("SELECT count(*) FROM applied")
            assert await cur.fetchone() == (2,)
    finally:
        await pool.close()


async def test_a_failed_migration_leaves_no_version_and_raises(pg_url: str) -> None:
    broken = Schema("ctxproxy.test", "test_migrations", ((1, ("SELECT no_such_column",)),))
    with pytest.raises(psycopg.Error):
        await open_pool(pg_url, broken, max_size=1, timeout_s=5.0)
    # One transaction: even the versions table it made first is gone with it.
    assert await _rows(pg_url, "SELECT to_regclass('test_migrations')") == [(None,)]
