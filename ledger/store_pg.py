"""The ledger in PostgreSQL: a table of its own beside the memory store's, in the same
database (``CTXPROXY_STORE_URL``), with its own migrations."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import psycopg

from ctxproxy.ledger.model import Group, LedgerError, Record, ScopeKey, Totals
from ctxproxy.ledger.sql import (
    DIRECT,
    HOUR,
    INSERT_COLUMNS,
    ROLLUP,
    ROLLUP_TABLE_V2,
    TABLE,
    backfill_sql,
    cache_write_migration,
    direct_migration,
    direct_upsert_sql,
    from_row,
    principal_migration,
    protocol_migration,
    rollup_rows,
    scopes_sql,
    series_params,
    series_sql,
    timeline_sql,
    to_row,
    totals_from,
    totals_query,
    upsert_sql,
    with_principal,
)
from ctxproxy.plumbing.pg import Connection, Pool, Schema, open_pool

__all__ = ["MIGRATIONS", "PostgresLedger"]

# Versioned schema. Append new versions; never edit an applied one.
MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (
        1,
        (
            f"""CREATE TABLE {TABLE} (
                request_id       bigserial PRIMARY KEY,
                at               double precision NOT NULL,
                session_id       text NOT NULL,
                model            text NOT NULL,
                status           integer NOT NULL,
                service_id       text NOT NULL,
                team_id          text NOT NULL,
                agent_id         text NOT NULL,
                user_ref         text NOT NULL,
                client_tokens    bigint,
                forwarded_tokens bigint,
                input_tokens     bigint,
                cached_tokens    bigint,
                output_tokens    bigint,
                direct_input     bigint,
                direct_cached    bigint,
                turns_in         integer,
                turns_forwarded  integer,
                items_cut        integer NOT NULL,
                outputs_masked   integer NOT NULL,
                memory_ids       text NOT NULL,
                knowledge        integer NOT NULL,
                degraded         text NOT NULL,
                ttfb_ms          double precision,
                recalled         integer NOT NULL
            )""",
            f"CREATE INDEX {TABLE}_at ON {TABLE} (at)",
            f"CREATE INDEX {TABLE}_session_at ON {TABLE} (session_id, at)",
        ),
    ),
    (
        2,  # the hourly roll-up the reports read (ledger/sql.py), filled from the rows so far
        (
            ROLLUP_TABLE_V2.format(int="bigint", real="double precision"),
            f"CREATE INDEX {ROLLUP}_session ON {ROLLUP} (session_id, hour)",
            backfill_sql(1, version=2),
        ),
    ),
    (3, principal_migration(1)),  # each row says whose it is
    (4, cache_write_migration(1)),  # the cache writes the upstream reported
    (5, protocol_migration()),  # the client protocol of each row
    (6, direct_migration(1)),  # the direct-cost estimate's state, per session
)
_DIRECT_UPSERT = direct_upsert_sql(1, "%s")
_UPSERT = upsert_sql(1, "%s")
_LOCK, _VERSIONS = "ctxproxy.ledger", f"{TABLE}_migrations"  # the advisory lock, the versions table
_INSERT = (
    f"INSERT INTO {TABLE} ({INSERT_COLUMNS}) VALUES "
    f"({', '.join(['%s'] * len(INSERT_COLUMNS.split(',')))})"
)


class PostgresLedger:
    """Request rows in PostgreSQL (``CTXPROXY_STORE_URL``); replicas share them."""

    def __init__(self, url: str, *, max_connections: int = 2, timeout_s: float = 5.0) -> None:
        self._url = url  # holds the password: never logged
        self._max = max_connections
        self._timeout_s = timeout_s
        self._pool: Pool | None = None

    def __repr__(self) -> str:
        return "PostgresLedger(<url>)"

    async def open(self) -> None:
        try:
            self._pool = await open_pool(self._url, schema(), max_size=self._max,
                                         timeout_s=self._timeout_s)
        except (psycopg.Error, OSError) as exc:
            raise LedgerError(f"postgres: cannot open the ledger: {exc}") from exc

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[Connection]:
        if self._pool is None:
            raise LedgerError("postgres: the ledger is not open")
        try:
            async with self._pool.connection() as conn:
                yield conn
        except (psycopg.Error, UnicodeError) as exc:
            raise LedgerError(f"postgres: {exc}") from exc

    async def insert(self, records: list[Record],
                     nodes: Sequence[tuple[str, bytes, float]] = ()) -> None:
        if not records and not nodes:
            return
        rolled = rollup_rows(records)
        async with self._conn() as conn, conn.transaction(), conn.cursor() as cur:
            if records:
                await cur.executemany(_INSERT, [to_row(r) for r in records])
                # Sorted: concurrent replicas take the roll-up's row locks in one order.
                await cur.executemany(_UPSERT, sorted(rolled))
            if nodes:
                await cur.executemany(_DIRECT_UPSERT, sorted(nodes))

    async def direct_nodes(self, sessions: Sequence[str], since: float
                           ) -> dict[str, dict[bytes, float]]:
        found: dict[str, dict[bytes, float]] = {s: {} for s in sessions}
        if not sessions:
            return found
        async with self._conn() as conn:
            cur = await conn.execute(
                f"SELECT session_id, link, used_at FROM {DIRECT} "
                "WHERE session_id = ANY(%s) AND used_at >= %s", (list(sessions), since))
            for session, link, used in await cur.fetchall():
                found[session][bytes(link)] = used
        return found

    async def prune_direct(self, before: float) -> int:
        async with self._conn() as conn, conn.transaction():
            cur = await conn.execute(f"DELETE FROM {DIRECT} WHERE used_at < %s", (before,))
            return cur.rowcount

    async def prune(self, before: float) -> int:
        hour = int(before // HOUR)
        async with self._conn() as conn, conn.transaction():
            cur = await conn.execute(f"DELETE FROM {TABLE} WHERE at < %s", (before,))
            gone = cur.rowcount
            # The hour the cut falls in is rolled up again from the rows it kept.
            await conn.execute(f"DELETE FROM {ROLLUP} WHERE hour <= %s", (hour,))
            await conn.execute(backfill_sql(1, where="WHERE at >= %s AND at < %s"),
                               (hour * HOUR, (hour + 1) * HOUR))
            return gone

    async def totals(
        self, by: Group, *, since: float | None = None, session: str | None = None,
        limit: int | None = None, principal: str | None = None,
    ) -> list[Totals]:
        sql, params = totals_query(by, since=since, session=session, principal=principal,
                                   limit=limit, mark="%s")
        async with self._conn() as conn:
            cur = await conn.execute(sql, params)
            return [totals_from(by, row) for row in await cur.fetchall()]

    async def series(self, start: float, step: float, *, principal: str | None = None
                     ) -> list[Totals]:
        hourly = step >= HOUR
        sql = series_sql(1, hourly=hourly, mark="%s", principal=principal is not None)
        params = with_principal(series_params(start, step, hourly), principal)
        async with self._conn() as conn:
            cur = await conn.execute(sql, params)
            return [totals_from("model", row) for row in await cur.fetchall()]

    async def timeline(self, session: str, *, limit: int = 1000,
                       principal: str | None = None) -> list[Record]:
        sql = timeline_sql("%s", principal=principal is not None)
        async with self._conn() as conn:
            cur = await conn.execute(sql, (*with_principal((session,), principal), limit))
            return [from_row(row) for row in await cur.fetchall()]

    async def scopes(self, principal: str, *, limit: int) -> list[ScopeKey]:
        async with self._conn() as conn:
            cur = await conn.execute(scopes_sql("%s"), (principal, limit))
            return [(a, b, c, d) for a, b, c, d in await cur.fetchall()]


def schema() -> Schema:
    """The versions of ``MIGRATIONS`` as they stand when a store opens (a test may cut them
    short, to open a file as an older release left it)."""
    return Schema(_LOCK, _VERSIONS, MIGRATIONS)
