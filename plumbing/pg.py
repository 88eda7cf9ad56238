"""A PostgreSQL connection pool whose schema is brought up to date before it opens.

Each side keeps its own versions table and advisory lock in the one database
(``CTXPROXY_STORE_URL``), so that the memory store and the ledger migrate independently.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

__all__ = ["Connection", "Pool", "Schema", "connect_timeout", "migrate", "open_pool"]

Connection = psycopg.AsyncConnection[TupleRow]
Pool = AsyncConnectionPool[Connection]
Migrations = Sequence[tuple[int, Sequence[str]]]


@dataclass(frozen=True, slots=True)
class Schema:
    """A side's versioned schema: append versions, never edit an applied one."""

    lock: str  # the advisory lock's name ('ctxproxy.memory'); a constant, never user input
    table: str  # the table that records the versions applied
    migrations: Migrations


def connect_timeout(timeout_s: float) -> int:
    """libpq's connect_timeout, whole seconds and at least one."""
    return max(1, round(timeout_s))


async def migrate(url: str, schema: Schema, *, timeout_s: float) -> None:
    """Apply the versions of ``schema`` the database has not had yet, on a connection of its
    own, in one transaction under an advisory lock: replicas starting together apply each
    version once; the others wait, then find nothing left to do. Raises psycopg.Error,
    OSError."""
    conn = await psycopg.AsyncConnection.connect(url, connect_timeout=connect_timeout(timeout_s))
    async with conn, conn.transaction():
        await conn.execute(
            f"SELECT pg_advisory_xact_lock(hashtext('{schema.lock}:' || current_schema()))"
        )
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {schema.table} ("
            " version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        cur = await conn.execute(f"SELECT coalesce(max(version), 0) FROM {schema.table}")
        row = await cur.fetchone()
        current = int(row[0]) if row else 0
        for version, statements in schema.migrations:
            if version <= current:
                continue
            for statement in statements:
                await conn.execute(statement)
            await conn.execute(f"INSERT INTO {schema.table} (version) VALUES (%s)", (version,))


async def open_pool(
    url: str,
    schema: Schema,
    *,
    max_size: int,
    timeout_s: float,
    check: Callable[[Connection], Awaitable[None]] = AsyncConnectionPool.check_connection,
    autocommit: bool = False,
) -> Pool:
    """Run ``schema``'s pending migrations, then open a pool of 1 to ``max_size``
    connections (each checked by ``check`` when handed out; ``autocommit``: a statement on
    its own commits on its own). Raises psycopg.Error, OSError: the caller's to map."""
    kwargs: dict[str, Any] = {"connect_timeout": connect_timeout(timeout_s)}
    if autocommit:
        kwargs["autocommit"] = True
    pool: Pool = AsyncConnectionPool(
        url, min_size=1, max_size=max_size, open=False, timeout=timeout_s, check=check,
        kwargs=kwargs,
    )
    try:
        await migrate(url, schema, timeout_s=timeout_s)
        await pool.open(wait=True, timeout=timeout_s)
    except BaseException:
        await pool.close()
        raise
    return pool
