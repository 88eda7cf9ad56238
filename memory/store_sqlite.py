"""The SQLite memory store: one file under ``CTXPROXY_DATA_DIR``, the embedded default.

WAL journal (readers never wait for the writer), an FTS5 index kept in step by triggers,
versioned migrations run in ``open()``. sqlite3 blocks, so every call runs on one worker
thread of its own, off the event loop; that thread also serialises the calls. Every sqlite
error leaves this module as ``StoreError``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import orjson

from memory.model import MEMORY_TYPES, Hit, Memory, MemoryType, Scope, StoreError
from memory.words import terms

__all__ = ["MIGRATIONS", "SqliteStore"]

T = TypeVar("T")

# Versioned schema (PRAGMA user_version). Append new versions; never edit an applied one.
MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        """
        CREATE TABLE memories (
            id          INTEGER PRIMARY KEY,  -- a stable rowid for the external-content index
            memory_id   TEXT NOT NULL UNIQUE,
            type        TEXT NOT NULL CHECK (type IN ('working', 'episodic', 'semantic')),
            service_id  TEXT NOT NULL,
            team_id     TEXT NOT NULL,
            agent_id    TEXT NOT NULL,
            user_ref    TEXT NOT NULL,
            key         TEXT NOT NULL,
            text        TEXT NOT NULL,
            session_id  TEXT,
            turn_index  INTEGER,
            in_window   INTEGER NOT NULL DEFAULT 0,
            sources     TEXT NOT NULL DEFAULT '[]',
            attrs       TEXT NOT NULL DEFAULT '{}',
            created_at  REAL NOT NULL,
            updated_at  REAL NOT NULL,
            expires_at  REAL,
            UNIQUE (service_id, team_id, agent_id, user_ref, type, key)
        );
        CREATE INDEX memories_scope_updated
            ON memories (service_id, team_id, agent_id, user_ref, updated_at DESC);
        CREATE INDEX memories_updated ON memories (updated_at DESC);
        CREATE INDEX memories_session ON memories (session_id) WHERE session_id IS NOT NULL;
        CREATE VIRTUAL TABLE memories_fts USING fts5(
            text, content='memories', content_rowid='id', tokenize='porter unicode61'
        );
        CREATE TRIGGER memories_ai AFTER INSERT ON memories BEGIN
            INSERT INTO memories_fts (rowid, text) VALUES (new.id, new.text);
        END;
        CREATE TRIGGER memories_ad AFTER DELETE ON memories BEGIN
            INSERT INTO memories_fts (memories_fts, rowid, text)
                VALUES ('delete', old.id, old.text);
        END;
        CREATE TRIGGER memories_au AFTER UPDATE OF text ON memories BEGIN
            INSERT INTO memories_fts (memories_fts, rowid, text)
                VALUES ('delete', old.id, old.text);
            INSERT INTO memories_fts (rowid, text) VALUES (new.id, new.text);
        END;
        """,
    ),
)

_COLUMNS = (
    "memory_id, type, service_id, team_id, agent_id, user_ref, key, text, session_id, "
    "turn_index, in_window, sources, attrs, created_at, updated_at, expires_at"
)
_M_COLUMNS = ", ".join("m." + c.strip() for c in _COLUMNS.split(","))
_UPSERT = f"""
INSERT INTO memories ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (service_id, team_id, agent_id, user_ref, type, key) DO UPDATE SET
    text = excluded.text,
    session_id = excluded.session_id,
    turn_index = excluded.turn_index,
    in_window = excluded.in_window,
    sources = excluded.sources,
    attrs = excluded.attrs,
    updated_at = excluded.updated_at,
    expires_at = excluded.expires_at
RETURNING {_COLUMNS}
"""
_SCOPE_WHERE = "m.service_id = ? AND m.team_id = ? AND m.agent_id = ? AND m.user_ref = ?"
# bm25 alone ranks a long record that matches every word of a question below a short one that
# matches one word (its length penalty, and idf collapses in a small store); so records are
# ranked by how many of the question's words they match first, bm25 second, among a pool of
# the best bm25 matches.
_POOL = 200
_BUSY_TIMEOUT_S = 5.0


class SqliteStore:
    """Memory records in one SQLite file (``CTXPROXY_DATA_DIR/memory.sqlite3``)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._conn: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    # --- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        """Open the file (creating it and its folder) and run pending migrations."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="ctxproxy-sqlite")
        try:
            self._conn = await self._run(self._connect)
        except StoreError:
            await self.close()
            raise

    def _connect(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"sqlite: cannot create {self.path.parent}: {exc}") from exc
        conn = sqlite3.connect(
            self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            _migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        executor, self._executor = self._executor, None
        if executor is None:
            return
        if conn is not None:
            await asyncio.get_running_loop().run_in_executor(executor, conn.close)
        executor.shutdown(wait=False)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the store's thread; sqlite errors become StoreError."""
        if self._executor is None:
            raise StoreError("sqlite: the memory store is not open")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite: {exc}") from exc
        except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
            raise StoreError(f"sqlite: a row could not be read: {exc}") from exc

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError("sqlite: the memory store is not open")
        return self._conn

    # --- the Store protocol ------------------------------------------------------------------

    async def upsert(self, memories: Sequence[Memory]) -> list[Memory]:
        if not memories:
            return []
        rows = [_params(m) for m in memories]
        return await self._run(self._upsert, rows)

    def _upsert(self, rows: list[tuple[Any, ...]]) -> list[Memory]:
        db = self._db()
        stored: list[Memory] = []
        db.execute("BEGIN IMMEDIATE")
        try:
            for row in rows:
                stored.append(_memory(db.execute(_UPSERT, row).fetchone()))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return stored

    async def get(self, memory_id: str) -> Memory | None:
        def get() -> Memory | None:
            row = self._db().execute(
                f"SELECT {_COLUMNS} FROM memories WHERE memory_id = ?", (memory_id,)
            ).fetchone()
            return _memory(row) if row else None

        return await self._run(get)

    async def delete(self, memory_ids: Sequence[str]) -> int:
        if not memory_ids:
            return 0
        ids = list(memory_ids)

        def delete() -> int:
            marks = ", ".join("?" * len(ids))
            cur = self._db().execute(f"DELETE FROM memories WHERE memory_id IN ({marks})", ids)
            return cur.rowcount

        return await self._run(delete)

    async def search(
        self,
        scope: Scope,
        query: str,
        *,
        types: Sequence[MemoryType] = MEMORY_TYPES,
        limit: int = 20,
        now: float | None = None,
    ) -> list[Hit]:
        words = terms(query)
        if not words or not types or limit <= 0:
            return []
        at = time.time() if now is None else now
        return await self._run(self._search, scope, words, list(types), limit, at)

    def _search(
        self, scope: Scope, words: list[str], types: list[str], limit: int, now: float
    ) -> list[Hit]:
        phrases = [_phrase(w) for w in words]
        type_marks = ", ".join("?" * len(types))
        coverage = " + ".join(
            "(SELECT count(*) FROM memories_fts f WHERE f.memories_fts MATCH ? AND f.rowid = h.id)"
            for _ in phrases
        )
        sql = f"""
            WITH h AS (
                SELECT m.id AS id, -bm25(memories_fts) AS score
                FROM memories_fts JOIN memories m ON m.id = memories_fts.rowid
                WHERE memories_fts MATCH ? AND {_SCOPE_WHERE}
                  AND m.type IN ({type_marks}) AND (m.expires_at IS NULL OR m.expires_at > ?)
                ORDER BY score DESC LIMIT ?
            )
            SELECT {_M_COLUMNS}, h.score, {coverage} AS coverage
            FROM h JOIN memories m ON m.id = h.id
            ORDER BY coverage DESC, h.score DESC, m.updated_at DESC, m.memory_id DESC
            LIMIT ?
        """
        params: list[Any] = [" OR ".join(phrases), *_scope(scope), *types, now, _POOL]
        params += [*phrases, limit]
        hits = []
        for row in self._db().execute(sql, params).fetchall():
            score, matched = max(float(row[-2]), 0.0), int(row[-1])
            # In (0, 1): the share of the question's words matched, bm25 breaking ties.
            relevance = (matched + score / (1.0 + score)) / (len(words) + 1)
            hits.append(Hit(_memory(row[:-2]), max(relevance, 1e-9)))
        return hits

    async def list(
        self,
        scope: Scope | None = None,
        *,
        types: Sequence[MemoryType] = MEMORY_TYPES,
        session_id: str | None = None,
        since: float | None = None,
        limit: int = 100,
        now: float | None = None,
    ) -> list[Memory]:
        if not types or limit <= 0:
            return []
        where = [f"m.type IN ({', '.join('?' * len(types))})"]
        where.append("(m.expires_at IS NULL OR m.expires_at > ?)")
        params: list[Any] = [*types, time.time() if now is None else now]
        if scope is not None:
            where.append(_SCOPE_WHERE)
            params += _scope(scope)
        if session_id is not None:
            where.append("m.session_id = ?")
            params.append(session_id)
        if since is not None:
            where.append("m.updated_at >= ?")
            params.append(since)
        sql = (
            f"SELECT {_M_COLUMNS} FROM memories m WHERE {' AND '.join(where)}"
            " ORDER BY m.updated_at DESC, m.memory_id DESC LIMIT ?"
        )
        params.append(limit)

        def list_() -> list[Memory]:
            return [_memory(row) for row in self._db().execute(sql, params).fetchall()]

        return await self._run(list_)


# --- helpers -----------------------------------------------------------------------------------


def _migrate(conn: sqlite3.Connection) -> None:
    # IMMEDIATE: two processes opening one new file apply each version once.
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = int(conn.execute("PRAGMA user_version").fetchone()[0])
        for version, script in MIGRATIONS:
            if version <= current:
                continue
            for statement in _statements(script):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {int(version)}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _statements(script: str) -> list[str]:
    """Split a migration into statements (executescript would commit our transaction)."""
    out: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            out.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        out.append(buffer.strip())
    return out


def _phrase(word: str) -> str:
    """One FTS5 string token: quoted, so no word is ever read as query syntax."""
    return '"' + word.replace('"', '""') + '"'


def _scope(scope: Scope) -> list[str]:
    return [scope.service_id, scope.team_id, scope.agent_id, scope.user]


def _params(m: Memory) -> tuple[Any, ...]:
    s = m.scope
    return (
        m.memory_id, m.type, s.service_id, s.team_id, s.agent_id, s.user, m.key, m.text,
        m.session_id, m.turn_index, int(m.in_window), orjson.dumps(list(m.sources)).decode(),
        orjson.dumps(m.attrs).decode(), m.created_at, m.updated_at, m.expires_at,
    )


def _memory(row: Sequence[Any]) -> Memory:
    (memory_id, type_, service_id, team_id, agent_id, user, key, text, session_id,
     turn_index, in_window, sources, attrs, created_at, updated_at, expires_at) = row
    if type_ not in MEMORY_TYPES:
        raise ValueError(f"unknown memory type {type_!r}")
    return Memory(
        type=type_,
        scope=Scope(service_id, team_id, agent_id, user),
        key=key,
        text=text,
        memory_id=memory_id,
        session_id=session_id,
        turn_index=turn_index,
        in_window=bool(in_window),
        sources=list(orjson.loads(sources)),
        attrs=dict(orjson.loads(attrs)),
        created_at=float(created_at),
        updated_at=float(updated_at),
        expires_at=None if expires_at is None else float(expires_at),
    )
