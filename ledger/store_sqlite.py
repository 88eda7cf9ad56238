"""The ledger in SQLite: its own file beside the memory store (``requests.sqlite3``), so that
neither's writes wait on the other's. One thread of its own runs every call, off the loop."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

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
    direct_select_sql,
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
from ctxproxy.plumbing.sqlite import SYNC_NORMAL, immediate, migrate, open_file

__all__ = ["MIGRATIONS", "SqliteLedger"]

T = TypeVar("T")
_SESSIONS_PER_SELECT = 500  # under SQLite's limit on a statement's parameters
_BUSY_TIMEOUT_S = 5.0

# Versioned schema (PRAGMA user_version of this file). Append; never edit an applied one.
MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (
        1,
        (
            f"""CREATE TABLE {TABLE} (
                request_id       INTEGER PRIMARY KEY,
                at               REAL NOT NULL,
                session_id       TEXT NOT NULL,
                model            TEXT NOT NULL,
                status           INTEGER NOT NULL,
                service_id       TEXT NOT NULL,
                team_id          TEXT NOT NULL,
                agent_id         TEXT NOT NULL,
                user_ref         TEXT NOT NULL,
                client_tokens    INTEGER,
                forwarded_tokens INTEGER,
                input_tokens     INTEGER,
                cached_tokens    INTEGER,
                output_tokens    INTEGER,
                direct_input     INTEGER,
                direct_cached    INTEGER,
                turns_in         INTEGER,
                turns_forwarded  INTEGER,
                items_cut        INTEGER NOT NULL,
                outputs_masked   INTEGER NOT NULL,
                memory_ids       TEXT NOT NULL,
                knowledge        INTEGER NOT NULL,
                degraded         TEXT NOT NULL,
                ttfb_ms          REAL,
                recalled         INTEGER NOT NULL
            )""",
            f"CREATE INDEX {TABLE}_at ON {TABLE} (at)",
            f"CREATE INDEX {TABLE}_session_at ON {TABLE} (session_id, at)",
        ),
    ),
    (
        2,  # the hourly roll-up the reports read (ledger/sql.py), filled from the rows so far
        (
            ROLLUP_TABLE_V2.format(int="INTEGER", real="REAL"),
            f"CREATE INDEX {ROLLUP}_session ON {ROLLUP} (session_id, hour)",
            backfill_sql(0, version=2),
        ),
    ),
    (3, principal_migration(0)),  # each row says whose it is
    (4, cache_write_migration(0)),  # the cache writes the upstream reported
    (5, protocol_migration()),  # the client protocol of each row
    (6, direct_migration(0)),  # the direct-cost estimate's state, per session
)
_DIRECT_UPSERT = direct_upsert_sql(0, "?")
_UPSERT = upsert_sql(0, "?")

_INSERT = (
    f"INSERT INTO {TABLE} ({INSERT_COLUMNS}) VALUES "
    f"({', '.join('?' * len(INSERT_COLUMNS.split(',')))})"
)


class SqliteLedger:
    """Request rows in ``path`` (default ``CTXPROXY_DATA_DIR/requests.sqlite3``)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._conn: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None

    def __repr__(self) -> str:
        return f"SqliteLedger({str(self.path)!r})"

    async def open(self) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="ctxproxy-ledger")
        try:
            self._conn = await self._run(self._connect)
        except LedgerError:
            await self.close()
            raise

    def _connect(self) -> sqlite3.Connection:
        try:
            return open_file(self.path, _BUSY_TIMEOUT_S, pragmas=(SYNC_NORMAL,),
                             setup=lambda conn: migrate(conn, MIGRATIONS))
        except OSError as exc:
            raise LedgerError(f"sqlite: cannot create {self.path}: {exc}") from exc

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        executor, self._executor = self._executor, None
        if executor is None:
            return
        if conn is not None:
            await asyncio.get_running_loop().run_in_executor(executor, conn.close)
        executor.shutdown(wait=False)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            raise LedgerError("sqlite: the ledger is not open")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        except (sqlite3.Error, UnicodeError) as exc:
            raise LedgerError(f"sqlite: {exc}") from exc

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise LedgerError("sqlite: the ledger is not open")
        return self._conn

    async def insert(self, records: list[Record],
                     nodes: Sequence[tuple[str, bytes, float]] = ()) -> None:
        if not records and not nodes:
            return
        rows = [to_row(r) for r in records]
        rolled = rollup_rows(records)

        def insert() -> None:
            with immediate(self._db()) as db:
                db.executemany(_INSERT, rows)
                db.executemany(_UPSERT, rolled)
                db.executemany(_DIRECT_UPSERT, nodes)

        await self._run(insert)

    async def direct_nodes(self, sessions: Sequence[str], since: float
                           ) -> dict[str, dict[bytes, float]]:
        def select() -> dict[str, dict[bytes, float]]:
            found: dict[str, dict[bytes, float]] = {s: {} for s in sessions}
            for start in range(0, len(sessions), _SESSIONS_PER_SELECT):
                some = list(sessions[start : start + _SESSIONS_PER_SELECT])
                sql = direct_select_sql("?", len(some))
                for session, link, used in self._db().execute(sql, (*some, since)):
                    found[session][bytes(link)] = used
            return found

        return await self._run(select)

    async def prune_direct(self, before: float) -> int:
        def prune() -> int:
            with immediate(self._db()) as db:
                return db.execute(f"DELETE FROM {DIRECT} WHERE used_at < ?", (before,)).rowcount

        return await self._run(prune)

    async def prune(self, before: float) -> int:
        hour = int(before // HOUR)

        def prune() -> int:
            with immediate(self._db()) as db:
                gone = db.execute(f"DELETE FROM {TABLE} WHERE at < ?", (before,)).rowcount
                # The hour the cut falls in is rolled up again from the rows it kept.
                db.execute(f"DELETE FROM {ROLLUP} WHERE hour <= ?", (hour,))
                db.execute(backfill_sql(0, where="WHERE at >= ? AND at < ?"),
                           (hour * HOUR, (hour + 1) * HOUR))
            return gone

        return await self._run(prune)

    async def totals(
        self, by: Group, *, since: float | None = None, session: str | None = None,
        limit: int | None = None, principal: str | None = None,
    ) -> list[Totals]:
        sql, params = totals_query(by, since=since, session=session, principal=principal,
                                   limit=limit, mark="?")

        def totals() -> list[Totals]:
            return [totals_from(by, row) for row in self._db().execute(sql, params)]

        return await self._run(totals)

    async def series(self, start: float, step: float, *, principal: str | None = None
                     ) -> list[Totals]:
        hourly = step >= HOUR
        sql = series_sql(0, hourly=hourly, mark="?", principal=principal is not None)
        params = with_principal(series_params(start, step, hourly), principal)

        def series() -> list[Totals]:
            return [totals_from("model", row) for row in self._db().execute(sql, params)]

        return await self._run(series)

    async def timeline(self, session: str, *, limit: int = 1000,
                       principal: str | None = None) -> list[Record]:
        sql = timeline_sql("?", principal=principal is not None)
        params = (*with_principal((session,), principal), limit)

        def timeline() -> list[Record]:
            return [from_row(row) for row in self._db().execute(sql, params)]

        return await self._run(timeline)

    async def scopes(self, principal: str, *, limit: int) -> list[ScopeKey]:
        def scopes() -> list[ScopeKey]:
            rows = self._db().execute(scopes_sql("?"), (principal, limit))
            return [(a, b, c, d) for a, b, c, d in rows]

        return await self._run(scopes)

