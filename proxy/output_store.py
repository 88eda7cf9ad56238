"""Masked outputs in the shared store, so that any replica or worker answers a fetch line, and
after a restart: PostgreSQL under ``CTXPROXY_STORE_URL``, else ``outputs.sqlite3`` in the data
directory.

Each output is stored once, redacted like everything stored, by a bounded writer off the
request path (``Shelf``): what does not fit in its queue is counted and left to the process's
own cache. The store keeps at most ``CTXPROXY_MASK_STORE_MB`` per scope (the oldest go first)
and nothing older than ``CTXPROXY_MASK_STORE_HOURS``. The key the ids are made with lives in
the store too (PostgreSQL), so every replica makes the same id for the same output.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import orjson
import psycopg

from ctxproxy.config.files import secret_key
from ctxproxy.injectors.redact import redact_whole
from ctxproxy.plumbing import sqlite as sqlite_file
from ctxproxy.plumbing.batches import BatchWriter
from ctxproxy.plumbing.pg import Pool, Schema, open_pool

__all__ = [
    "KEY_FILE", "OutputStore", "OutputStoreError", "PostgresOutputs", "Shelf", "SqliteOutputs",
    "Stored", "scope_of",
]

log = logging.getLogger("ctxproxy.outputs")

KEY_FILE = "outputs.key"
STORE_FILE = "outputs.sqlite3"
TABLE = "ctxproxy_outputs"
PRUNE_EVERY_S = 60.0
BATCH = 64
QUEUE_ROWS = 1024
QUEUE_BYTES = 64 * 1024 * 1024


class OutputStoreError(Exception):
    """The outputs' store failed (a driver error, a file that cannot be opened)."""


@dataclass(frozen=True, slots=True)
class Stored:
    """One masked output as stored: whose it is and its text (redacted once stored)."""

    output_id: str
    scope: str  # a digest of (service, team, agent, user): the budget is per scope
    session: str
    text: str
    at: float

    @property
    def size(self) -> int:
        return len(self.text.encode("utf-8", "surrogatepass"))


def scope_of(service: str, team: str | None, agent: str | None, owner: str) -> str:
    """A memory scope (no team or agent: '') as one digest."""
    return hashlib.sha256(orjson.dumps([service, team or "", agent or "", owner])).hexdigest()[
        :32]


class OutputStore(Protocol):
    """Where masked outputs are kept for every replica. Driver errors leave it as
    OutputStoreError."""

    async def open(self) -> bytes:
        """Open it; the key the output ids are made with (the same for all its users)."""
        ...

    async def close(self) -> None: ...

    async def put(self, rows: list[Stored], *, max_scope_bytes: int, before: float | None
                  ) -> None:
        """Store ``rows``, then drop the oldest of their scopes past ``max_scope_bytes`` and,
        with ``before``, every row stored before then."""
        ...

    async def get(self, output_id: str) -> Stored | None: ...


_COLUMNS = "output_id, scope, session_id, body, bytes, at"
_TRIM = (
    f"DELETE FROM {TABLE} WHERE output_id IN (SELECT output_id FROM ("
    f"SELECT output_id, sum(bytes) OVER (ORDER BY at DESC, output_id) AS running "
    f"FROM {TABLE} WHERE scope = {{m}}) AS newest WHERE running > {{m}})"
)
_TABLE_SQL = (
    f"CREATE TABLE {TABLE} (output_id text PRIMARY KEY, scope text NOT NULL, "
    "session_id text NOT NULL, body text NOT NULL, bytes integer NOT NULL, "
    "at {real} NOT NULL)"
)
_INDEXES = (f"CREATE INDEX {TABLE}_scope_at ON {TABLE} (scope, at)",
            f"CREATE INDEX {TABLE}_at ON {TABLE} (at)")


def _row(r: Stored) -> tuple[str, str, str, str, int, float]:
    return (r.output_id, r.scope, r.session, r.text, r.size, r.at)


class PostgresOutputs:
    """Masked outputs in PostgreSQL, with the ids' key in a row of their own."""

    MIGRATIONS = ((1, (
        _TABLE_SQL.format(real="double precision"), *_INDEXES,
        f"CREATE TABLE {TABLE}_key (one integer PRIMARY KEY CHECK (one = 1), key bytea NOT NULL)",
    )),)

    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        self._url = url  # holds the password: never logged
        self._timeout_s = timeout_s
        self._pool: Pool | None = None

    def __repr__(self) -> str:
        return "PostgresOutputs(<url>)"

    async def open(self) -> bytes:
        schema = Schema("ctxproxy.outputs", f"{TABLE}_migrations", self.MIGRATIONS)
        try:
            self._pool = await open_pool(self._url, schema, max_size=2, timeout_s=self._timeout_s,
                                         autocommit=True)
            async with self._pool.connection() as conn:
                # The first replica's key is everyone's.
                await conn.execute(f"INSERT INTO {TABLE}_key VALUES (1, %s) ON CONFLICT DO NOTHING",
                                   (secrets.token_bytes(32),))
                cur = await conn.execute(f"SELECT key FROM {TABLE}_key")
                row = await cur.fetchone()
        except (psycopg.Error, OSError) as exc:
            await self.close()
            raise OutputStoreError(f"postgres: {exc}") from exc
        assert row is not None
        return bytes(row[0])

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def put(self, rows: list[Stored], *, max_scope_bytes: int, before: float | None
                  ) -> None:
        if self._pool is None:
            raise OutputStoreError("postgres: the outputs' store is not open")
        try:
            async with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
                await cur.executemany(
                    f"INSERT INTO {TABLE} ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s) "
                    "ON CONFLICT (output_id) DO UPDATE SET at = excluded.at",
                    [_row(r) for r in sorted(rows, key=lambda r: r.output_id)],
                )
                for scope in sorted({r.scope for r in rows}):
                    await cur.execute(_TRIM.format(m="%s"), (scope, max_scope_bytes))
                if before is not None:
                    await cur.execute(f"DELETE FROM {TABLE} WHERE at < %s", (before,))
        except psycopg.Error as exc:
            raise OutputStoreError(f"postgres: {exc}") from exc

    async def get(self, output_id: str) -> Stored | None:
        if self._pool is None:
            raise OutputStoreError("postgres: the outputs' store is not open")
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(
                    f"SELECT output_id, scope, session_id, body, at FROM {TABLE} "
                    "WHERE output_id = %s", (output_id,))
                row = await cur.fetchone()
        except psycopg.Error as exc:
            raise OutputStoreError(f"postgres: {exc}") from exc
        return None if row is None else Stored(*row)


class SqliteOutputs:
    """Masked outputs in an SQLite file of the data directory (the workers of one machine);
    the ids' key is the data directory's ``outputs.key``."""

    MIGRATIONS = ((1, (_TABLE_SQL.format(real="REAL"), *_INDEXES)),)

    def __init__(self, data_dir: Path, *, busy_timeout_s: float = 5.0) -> None:
        self._data_dir = data_dir
        self._busy_timeout_s = busy_timeout_s
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()  # one connection, used from worker threads

    async def open(self) -> bytes:
        try:
            self._conn = await asyncio.to_thread(
                sqlite_file.open_file, self._data_dir / STORE_FILE, self._busy_timeout_s,
                pragmas=(sqlite_file.SYNC_NORMAL,),
                setup=lambda conn: sqlite_file.migrate(conn, self.MIGRATIONS))
            return await asyncio.to_thread(secret_key, self._data_dir, KEY_FILE)
        except (OSError, ValueError, sqlite3.Error) as exc:
            raise OutputStoreError(f"sqlite: {exc}") from exc

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.to_thread(conn.close)

    def _put(self, rows: list[Stored], max_scope_bytes: int, before: float | None) -> None:
        if self._conn is None:
            raise OutputStoreError("sqlite: the outputs' store is not open")
        with self._lock, sqlite_file.immediate(self._conn) as conn:
            conn.executemany(
                f"INSERT INTO {TABLE} ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (output_id) DO UPDATE SET at = excluded.at",
                [_row(r) for r in rows])
            for scope in {r.scope for r in rows}:
                conn.execute(_TRIM.format(m="?"), (scope, max_scope_bytes))
            if before is not None:
                conn.execute(f"DELETE FROM {TABLE} WHERE at < ?", (before,))

    async def put(self, rows: list[Stored], *, max_scope_bytes: int, before: float | None
                  ) -> None:
        try:
            await asyncio.to_thread(self._put, rows, max_scope_bytes, before)
        except sqlite3.Error as exc:
            raise OutputStoreError(f"sqlite: {exc}") from exc

    def _get(self, output_id: str) -> Stored | None:
        if self._conn is None:
            raise OutputStoreError("sqlite: the outputs' store is not open")
        with self._lock:
            row = self._conn.execute(
                f"SELECT output_id, scope, session_id, body, at FROM {TABLE} "
                "WHERE output_id = ?", (output_id,)).fetchone()
        return None if row is None else Stored(*row)

    async def get(self, output_id: str) -> Stored | None:
        try:
            return await asyncio.to_thread(self._get, output_id)
        except sqlite3.Error as exc:
            raise OutputStoreError(f"sqlite: {exc}") from exc


class Shelf:
    """The bounded writer in front of a store: ``offer`` (any thread, never waits) queues an
    output; one task (``plumbing.batches``) redacts and stores them in batches. What does
    not fit is counted (``on_drop``) and stays only in the process's own cache. Owned by the
    app: started and drained in its cleanup context."""

    def __init__(
        self, store: OutputStore, *, max_scope_bytes: int, max_age_s: float,
        on_drop: Callable[[str, int], None] = lambda reason, n: None,
        max_rows: int = QUEUE_ROWS, max_bytes: int = QUEUE_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self._max_scope_bytes = max_scope_bytes
        self._max_age_s = max_age_s
        self._on_drop = on_drop
        self._clock = clock
        self._rows = BatchWriter(
            self._write, name="ctxproxy-outputs", size_of=lambda r: r.size,
            max_rows=max_rows, max_bytes=max_bytes, batch_rows=BATCH,
            on_failed=lambda n: on_drop("failed", n))
        self._pruned_at = 0.0
        self.written = 0

    def start(self) -> None:
        self._rows.start()

    def offer(self, row: Stored) -> bool:
        """Queue ``row`` for the store; False when it was dropped (counted)."""
        if self._rows.put(row):
            return True
        self._on_drop("full", 1)
        return False

    async def join(self) -> None:
        """Wait until every queued output is written (tests, shutdown)."""
        await self._rows.join()

    async def close(self, timeout_s: float = 5.0) -> None:
        await self._rows.close(timeout_s)
        await self.store.close()

    async def _write(self, batch: list[Stored]) -> None:
        texts = await asyncio.to_thread(lambda: [redact_whole(r.text) for r in batch])
        rows = [Stored(r.output_id, r.scope, r.session, text, r.at)
                for r, text in zip(batch, texts, strict=True)]
        now = self._clock()
        before = None
        if now - self._pruned_at >= PRUNE_EVERY_S:
            self._pruned_at, before = now, now - self._max_age_s
        try:
            await self.store.put(rows, max_scope_bytes=self._max_scope_bytes, before=before)
            self.written += len(rows)
        except OutputStoreError as exc:
            log.warning("masked outputs not stored: %s", exc)
            self._on_drop("failed", len(rows))
