"""The SQLite memory store: one file under ``CTXPROXY_DATA_DIR``, the embedded default.

WAL journal (readers never wait for the writer), an FTS5 index kept in step by triggers,
versioned migrations run in ``open()``. sqlite3 blocks, so every call runs on one worker
thread of its own, off the event loop; that thread also serialises the calls. Every sqlite
error leaves this module as ``StoreError``.
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import contextlib
import functools
import hashlib
import logging
import math
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import orjson
from cachetools import LRUCache

from ctxproxy.config.files import WriteLock, private_file, wal
from ctxproxy.memory.aio import done
from ctxproxy.memory.cpu import ChildUnavailable, NoChild, Served
from ctxproxy.memory.lanes import Lane
from ctxproxy.memory.model import MEMORY_TYPES, Hit, Memory, MemoryType, Scope, StoreError
from ctxproxy.memory.search import BUDGET, MAX_WORDS, RECENT, Bounds, bound
from ctxproxy.memory.vectors import Match, VectorIndex, VectorRow
from ctxproxy.memory.words import terms

__all__ = ["MIGRATIONS", "SqliteStore"]

log = logging.getLogger("ctxproxy.memory")

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
    (
        2,
        # Recall lists a session's records and a scope's records of one type on every turn;
        # with only (scope, updated_at) to go by, that walked the whole scope (120 ms at
        # 50k records). Ingest rewrites a record when only its in_window flag changed:
        # re-indexing the same text churned the FTS index for nothing.
        """
        CREATE INDEX memories_scope_session_type ON memories (service_id, team_id, agent_id,
            user_ref, session_id, type, updated_at DESC, memory_id DESC);
        CREATE INDEX memories_scope_type ON memories (service_id, team_id, agent_id,
            user_ref, type, updated_at DESC, memory_id DESC);
        DROP TRIGGER memories_au;
        CREATE TRIGGER memories_au AFTER UPDATE OF text ON memories
        WHEN old.text IS NOT new.text BEGIN
            INSERT INTO memories_fts (memories_fts, rowid, text)
                VALUES ('delete', old.id, old.text);
            INSERT INTO memories_fts (rowid, text) VALUES (new.id, new.text);
        END;
        """,
    ),
    (
        3,
        # Search bounds its candidates (memory/search.py); bounded across every scope, one
        # scope's volume pushed another's matches out. The scope is now a column of the
        # index, and every full-text query of a search names it, so each bound is taken
        # within the scope. ``scope`` is a token (see scope_token), written by the store.
        """
        DROP TRIGGER memories_ai;
        DROP TRIGGER memories_ad;
        DROP TRIGGER memories_au;
        DROP TABLE memories_fts;
        ALTER TABLE memories ADD COLUMN scope TEXT NOT NULL DEFAULT '';
        UPDATE memories SET scope = ctxproxy_scope_token(service_id, team_id, agent_id,
            user_ref);
        CREATE VIRTUAL TABLE memories_fts USING fts5(
            text, scope, content='memories', content_rowid='id', tokenize='porter unicode61'
        );
        INSERT INTO memories_fts (memories_fts) VALUES ('rebuild');
        CREATE TRIGGER memories_ai AFTER INSERT ON memories BEGIN
            INSERT INTO memories_fts (rowid, text, scope) VALUES (new.id, new.text, new.scope);
        END;
        CREATE TRIGGER memories_ad AFTER DELETE ON memories BEGIN
            INSERT INTO memories_fts (memories_fts, rowid, text, scope)
                VALUES ('delete', old.id, old.text, old.scope);
        END;
        CREATE TRIGGER memories_au AFTER UPDATE OF text ON memories
        WHEN old.text IS NOT new.text BEGIN
            INSERT INTO memories_fts (memories_fts, rowid, text, scope)
                VALUES ('delete', old.id, old.text, old.scope);
            INSERT INTO memories_fts (rowid, text, scope) VALUES (new.id, new.text, new.scope);
        END;
        """,
    ),
    (
        4,
        # Forget sticks: a forgotten record leaves a tombstone (its scope, type and key, no
        # text), and a row with that key is never inserted again, whoever writes it (ingest
        # of a resent turn, distillation, a restart, another process).
        """
        CREATE TABLE forgotten (
            service_id   TEXT NOT NULL,
            team_id      TEXT NOT NULL,
            agent_id     TEXT NOT NULL,
            user_ref     TEXT NOT NULL,
            type         TEXT NOT NULL,
            key          TEXT NOT NULL,
            forgotten_at REAL NOT NULL,
            PRIMARY KEY (service_id, team_id, agent_id, user_ref, type, key)
        ) WITHOUT ROWID;
        CREATE TRIGGER memories_forgotten BEFORE INSERT ON memories
        WHEN EXISTS (SELECT 1 FROM forgotten f WHERE f.service_id = new.service_id
            AND f.team_id = new.team_id AND f.agent_id = new.agent_id
            AND f.user_ref = new.user_ref AND f.type = new.type AND f.key = new.key)
        BEGIN
            SELECT RAISE(IGNORE);
        END;
        """,
    ),
    (
        5,
        # Hybrid recall: each chunk's vector (memory.vectors), cached by its digest. The
        # memory's vectors go with it, and with its text when that changes (the indexer then
        # embeds it again). seq only grows: a search reads the rows written since its last.
        """
        CREATE TABLE memory_vectors (
            seq        INTEGER PRIMARY KEY AUTOINCREMENT,
            memory_id  TEXT NOT NULL,
            chunk      INTEGER NOT NULL,
            start_at   INTEGER NOT NULL,
            end_at     INTEGER NOT NULL,
            model      TEXT NOT NULL,
            digest     TEXT NOT NULL,
            vector     BLOB NOT NULL,
            UNIQUE (memory_id, model, chunk)
        );
        CREATE INDEX memory_vectors_digest ON memory_vectors (model, digest);
        CREATE TRIGGER memories_vectors_ad AFTER DELETE ON memories BEGIN
            DELETE FROM memory_vectors WHERE memory_id = old.memory_id;
        END;
        CREATE TRIGGER memories_vectors_au AFTER UPDATE OF text ON memories
        WHEN old.text IS NOT new.text BEGIN
            DELETE FROM memory_vectors WHERE memory_id = old.memory_id;
        END;
        """,
    ),
    (
        6,
        # Each record's length in characters, kept with its text: a search divides each
        # candidate's score by it, and counting the characters of every candidate's text
        # was half of a search's time.
        """
        ALTER TABLE memories ADD COLUMN chars INTEGER NOT NULL DEFAULT 0;
        UPDATE memories SET chars = length(text);
        CREATE TRIGGER memories_chars_ai AFTER INSERT ON memories BEGIN
            UPDATE memories SET chars = length(new.text) WHERE id = new.id;
        END;
        CREATE TRIGGER memories_chars_au AFTER UPDATE OF text ON memories
        WHEN old.text IS NOT new.text BEGIN
            UPDATE memories SET chars = length(new.text) WHERE id = new.id;
        END;
        """,
    ),
    (
        7,
        # The full-text index keeps which column holds each word, not where in it (detail=
        # column): a search matches single words (``_phrase``) and the scope column, never a
        # phrase of several, and the positions were half the index. A search on a load run's
        # store: the same hits, about a quarter less time (bench/RESULTS.md, Load). The
        # triggers write to the table by name: the new one takes their writes.
        """
        DROP TABLE memories_fts;
        CREATE VIRTUAL TABLE memories_fts USING fts5(
            text, scope, content='memories', content_rowid='id', tokenize='porter unicode61',
            detail='column'
        );
        INSERT INTO memories_fts (memories_fts) VALUES ('rebuild');
        """,
    ),
)


def scope_token(service_id: str, team_id: str, agent_id: str, user: str) -> str:
    """A scope as one full-text token (letters and digits): what a search's queries require."""
    joined = "\0".join((service_id, team_id, agent_id, user)).encode()
    return "s" + hashlib.sha256(joined).hexdigest()[:30]


_COLUMNS = (
    "memory_id, type, service_id, team_id, agent_id, user_ref, key, text, session_id, "
    "turn_index, in_window, sources, attrs, created_at, updated_at, expires_at"
)
_M_COLUMNS = ", ".join("m." + c.strip() for c in _COLUMNS.split(","))
_REALS = frozenset({"created_at", "updated_at", "expires_at"})
_UPSERT = f"""
INSERT INTO memories ({_COLUMNS}, scope)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (service_id, team_id, agent_id, user_ref, type, key) DO UPDATE SET
    -- A purged record (memory/forget.py) keeps its text: a resent turn must not write the
    -- forgotten lines back.
    text = iif(json_extract(memories.attrs, '$.purged'), memories.text, excluded.text),
    session_id = excluded.session_id,
    turn_index = excluded.turn_index,
    in_window = excluded.in_window,
    sources = excluded.sources,
    attrs = iif(json_extract(memories.attrs, '$.purged'), memories.attrs, excluded.attrs),
    updated_at = excluded.updated_at,
    expires_at = excluded.expires_at
RETURNING {_COLUMNS}
"""
_SCOPE_WHERE = "m.service_id = ? AND m.team_id = ? AND m.agent_id = ? AND m.user_ref = ?"
_MATCH = "SELECT rowid FROM memories_fts WHERE memories_fts MATCH"
_FILTERS = """m.service_id = :service AND m.team_id = :team AND m.agent_id = :agent
    AND m.user_ref = :user AND (m.expires_at IS NULL OR m.expires_at > :now)
    AND m.type IN (:types)"""
# Search at scale: see memory/search.py for the bounding policy. The work stays inside
# SQLite (three statements, a few dozen rows back): each row that crosses into Python costs a
# turn of the GIL, and under load the event loop holds it.
_RECENT_SCAN = 2000
# BM25: matches of rare words count for more, long records for less. Term frequencies are
# read from the text of the best _RERANK candidates only.
_K1, _B = 1.2, 0.75
_RERANK = 20  # 40 before 2026-12-03: see memory.search.BUDGET
_TF_CHARS = 2000
_SUFFIXES = ("ing", "ed", "es", "s", "e")
_BUSY_TIMEOUT_S = 5.0
_CACHE_KIB = 32 * 1024
# Each write transaction adds a segment to the full-text index, and a search reads every
# segment for each of its words. FTS5's own merging (automerge) lags behind single-row writes:
# up to 16 segments at 800 memories, 21 in a load run's store at 3,000. Merging up to 16 pages
# at the end of each write keeps them at 6 or fewer, for about a fifth more CPU a write; the
# search statement on 6 segments takes about a fifth less than on 21 (bench/RESULTS.md, Load).
_FTS_MERGE = "INSERT INTO memories_fts (memories_fts, rank) VALUES ('merge', 16)"
# Reader threads (and connections) per store, in two lanes: full-text searches (a few ms of
# SQLite each, one per turn) and the quick reads (list, get, stored: a turn makes several),
# which would otherwise queue behind other turns' searches.
READERS = 2
SEARCHERS = 2
_KEYS_PER_QUERY = 500  # under SQLite's bound on a statement's parameters
# A word's match count in a scope (up to a cap) ranks the question's words and weighs them
# (IDF): a count some seconds old does as well, and saves a full-text probe per word. A
# word that matched nothing is counted again each time: a memory stored since may hold it.
MATCH_COUNTS_TTL_S = 30.0
MATCH_COUNTS_CACHED = 16384
_VECTORS_SINCE = f"""
SELECT v.seq, v.memory_id, v.chunk, v.start_at, v.end_at, v.vector
FROM memory_vectors v CROSS JOIN memories m ON m.memory_id = v.memory_id
WHERE v.seq > ? AND +v.model = ? AND {_SCOPE_WHERE}  -- by seq (rowid), not the model index
ORDER BY v.seq
"""
_SPANS = f"""SELECT {_M_COLUMNS}, (
    SELECT json_group_array(json_array(s.start_at, s.end_at)) FROM (
        SELECT v.start_at, v.end_at FROM memory_vectors v
        WHERE v.memory_id = m.memory_id AND v.model = ? ORDER BY v.chunk) s)
FROM memories m WHERE m.type IN ('episodic', 'semantic') AND m.memory_id > ?
ORDER BY m.memory_id LIMIT ?"""
_UNEMBEDDED = """FROM memories m WHERE m.type IN ('episodic', 'semantic') AND NOT EXISTS (
    SELECT 1 FROM memory_vectors v WHERE v.memory_id = m.memory_id AND v.model = ?)"""


class SqliteStore:
    """Memory records in one SQLite file (``CTXPROXY_DATA_DIR/memory.sqlite3``)."""

    def __init__(self, path: Path | str, *, processes: bool = False) -> None:
        self.path = Path(path)
        # Searches in processes of their own (``processes``): in the search threads, their
        # Python (the rerank, the rows read) held the worker's GIL against its event loop.
        self._served: Served[builtins.list[Hit]] | None = (
            Served(SEARCHERS, _searcher, str(self.path), name="ctxproxy-search")
            if processes else None)
        self._conn: sqlite3.Connection | None = None
        self._executor: Lane | None = None
        # Reads (search, list, get, stored) on connections of their own, one per reader
        # thread: in WAL they never wait for a write, nor a turn's recall for the writes and
        # the other sessions' reads queued on the one writer thread.
        self._readers: Lane | None = None
        self._searchers: Lane | None = None
        self._reader_conns: builtins.list[sqlite3.Connection] = []
        self._local = threading.local()  # each thread's connection
        self._lock = WriteLock(self.path)  # one writing process at a time (WORKERS)
        self._vectors = VectorIndex()
        self._matches = MatchCounts()

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    # --- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        """Open the file (creating it and its folder) and run pending migrations."""
        if self._executor is None:
            # Lanes: each serves the oldest user turn's work first, and episode writes
            # after a turn's own (memory.lanes).
            self._executor = Lane(1, "ctxproxy-sqlite")
            self._readers = Lane(READERS, "ctxproxy-sqlite-read")
            self._searchers = Lane(SEARCHERS, "ctxproxy-sqlite-search")
        try:
            self._conn = await self._run(self._connect)
        except StoreError:
            await self.close()
            raise
        if self._served is not None:
            try:
                await asyncio.to_thread(self._served.start)
            except NoChild as exc:
                self._served = None
                log.warning("memory searches in threads of the worker: %s", exc)
            except ChildUnavailable as exc:  # searches try again, and meanwhile run here
                log.warning("memory search process: %s", exc)

    def _connect(self) -> sqlite3.Connection:
        try:
            private_file(self.path)
        except OSError as exc:
            raise StoreError(f"sqlite: cannot create {self.path}: {exc}") from exc
        conn = sqlite3.connect(
            self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        try:
            wal(conn, _BUSY_TIMEOUT_S)
            conn.execute("PRAGMA synchronous=NORMAL")
            # A search touches a few thousand rows and index pages spread over the file;
            # SQLite's default 2 MB page cache made each touch a copy from the OS cache.
            conn.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
            _migrate(conn)
        except BaseException:
            conn.close()
            raise
        self._local.conn = conn
        return conn

    def _reader(self) -> sqlite3.Connection:
        """This reader thread's connection, opened on its first read (after the migrations)."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = _read_only(self.path)
            self._reader_conns.append(conn)
        return conn

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        executor, self._executor = self._executor, None
        lanes, self._readers, self._searchers = (self._readers, self._searchers), None, None
        for lane in lanes:
            if lane is not None:
                await asyncio.to_thread(lane.shutdown, wait=True)
        for reader in self._reader_conns:
            reader.close()
        self._reader_conns.clear()
        if self._served is not None:
            await asyncio.to_thread(self._served.close)
        if executor is None:
            return
        # After the writes still queued (a lane serves by due time, not arrival).
        if conn is not None:
            await asyncio.wrap_future(executor.submit_last(conn.close))
        await asyncio.wrap_future(executor.submit_last(self._lock.close))
        executor.shutdown(wait=False)

    def _run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run ``fn(*args)`` on the writer thread; sqlite errors become StoreError."""
        return self._on(self._executor, fn, *args)

    def _read(self, fn: Callable[..., T], *args: Any, search: bool = False) -> asyncio.Future[T]:
        """Run the read ``fn(*args)`` on a reader thread (of the search lane when
        ``search``); as ``_run`` otherwise."""

        def read() -> T:
            self._reader()
            return fn(*args)

        lane = self._searchers if search else self._readers
        return self._on(lane if self._conn is not None else None, read)

    def _on(self, executor: Lane | None, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``fn(*args)`` handed to ``executor`` now, as a future: a turn's reads go out in
        the step of the loop that asks for them, and their end reaches it with no task
        between (each is a turn of a busy loop)."""
        loop = asyncio.get_running_loop()
        if executor is None:
            failure = StoreError("sqlite: the memory store is not open")
        else:
            try:
                return loop.run_in_executor(executor, _guarded, fn, *args)
            except RuntimeError as exc:  # the lane is shut down
                failure = StoreError(f"sqlite: the memory store is closing: {exc}")
        failed: asyncio.Future[T] = loop.create_future()
        failed.set_exception(failure)
        return failed

    @contextlib.contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """A write transaction on the writer's connection, under the processes' write lock:
        committed when the block ends, rolled back when it raises."""
        db = self._db()
        with self._lock:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute(_FTS_MERGE)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:  # a failed COMMIT may have rolled back already
                    db.execute("ROLLBACK")
                raise

    def _db(self) -> sqlite3.Connection:
        """The calling thread's connection: the writer's, or a reader's."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if self._conn is None or conn is None:
            raise StoreError("sqlite: the memory store is not open")
        return conn

    # --- the Store protocol ------------------------------------------------------------------

    async def upsert(self, memories: Sequence[Memory]) -> list[Memory]:
        if not memories:
            return []
        rows = [_params(m) for m in memories]
        return await self._run(self._upsert, rows)

    def _upsert(self, rows: list[tuple[Any, ...]]) -> list[Memory]:
        stored: list[Memory] = []
        with self._writing() as db:
            for row in rows:
                found = db.execute(_UPSERT, row).fetchone()
                if found is not None:  # None: the key was forgotten (a tombstone)
                    stored.append(_memory(found))
        return stored

    def get(self, memory_id: str) -> asyncio.Future[Memory | None]:
        def get() -> Memory | None:
            row = self._db().execute(
                f"SELECT {_COLUMNS} FROM memories WHERE memory_id = ?", (memory_id,)
            ).fetchone()
            return _memory(row) if row else None

        return self._read(get)

    async def delete(self, memory_ids: Sequence[str]) -> int:
        if not memory_ids:
            return 0
        ids = list(memory_ids)

        def delete() -> int:
            marks = ", ".join("?" * len(ids))
            with self._writing() as db:
                cur = db.execute(f"DELETE FROM memories WHERE memory_id IN ({marks})", ids)
            return cur.rowcount

        return await self._run(delete)

    async def forget(self, memory_ids: Sequence[str], *, now: float | None = None) -> int:
        if not memory_ids:
            return 0
        ids = list(memory_ids)
        at = time.time() if now is None else now

        def forget() -> int:
            marks = ", ".join("?" * len(ids))
            with self._writing() as db:
                db.execute(
                    "INSERT OR IGNORE INTO forgotten SELECT service_id, team_id, agent_id,"
                    f" user_ref, type, key, ? FROM memories WHERE memory_id IN ({marks})",
                    [at, *ids],
                )
                gone = db.execute(f"DELETE FROM memories WHERE memory_id IN ({marks})", ids)
            return gone.rowcount

        return await self._run(forget)

    def search(
        self,
        scope: Scope,
        query: str,
        *,
        types: Sequence[MemoryType] = MEMORY_TYPES,
        limit: int = 20,
        now: float | None = None,
    ) -> asyncio.Future[list[Hit]]:
        words = terms(query)
        if not words or not types or limit <= 0:
            return done([])
        at = time.time() if now is None else now
        return self._read(self._search, scope, words, list(types), limit, at, search=True)

    def _search(
        self, scope: Scope, words: list[str], types: list[str], limit: int, now: float
    ) -> list[Hit]:
        served = self._served
        if served is not None:
            try:
                return served.call(scope, words, types, limit, now)
            except NoChild as exc:  # this machine cannot start one: do not try every search
                self._served = None
                log.warning("memory searches in threads of the worker: %s", exc)
            except ChildUnavailable as exc:  # it died: this search here, the next in another
                log.warning("a memory search ran in a thread of the worker: %s", exc)
        return _search_in(self._db(), self._matches, scope, words, types, limit, now)

    def list(
        self,
        scope: Scope | None = None,
        *,
        types: Sequence[MemoryType] = MEMORY_TYPES,
        session_id: str | None = None,
        since: float | None = None,
        limit: int = 100,
        now: float | None = None,
    ) -> asyncio.Future[builtins.list[Memory]]:
        if not types or limit <= 0:
            return done([])
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
            found = [_memory(row) for row in _json_rows(self._db(), sql, params, _COLUMNS)]
            return sorted(found, key=lambda m: (m.updated_at, m.memory_id), reverse=True)

        return self._read(list_)

    async def stored(
        self, scope: Scope, kind: MemoryType, keys: Sequence[str]
    ) -> dict[str, bool]:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}

        def stored_() -> dict[str, bool]:
            out: dict[str, bool] = {}
            db = self._db()
            for at in range(0, len(wanted), _KEYS_PER_QUERY):
                chunk = wanted[at : at + _KEYS_PER_QUERY]
                rows = db.execute(
                    "SELECT key, in_window FROM memories WHERE service_id = ? AND team_id = ?"
                    " AND agent_id = ? AND user_ref = ? AND type = ?"
                    f" AND key IN ({', '.join('?' * len(chunk))})",
                    [*_scope(scope), kind, *chunk],
                ).fetchall()
                out.update((str(key), bool(in_window)) for key, in_window in rows)
            return out

        return await self._read(stored_)

    async def set_in_window(
        self, scope: Scope, kind: MemoryType, flags: Mapping[str, bool]
    ) -> int:
        if not flags:
            return 0

        def set_() -> int:
            with self._writing() as db:
                changed = db.executemany(
                    "UPDATE memories SET in_window = ? WHERE service_id = ? AND team_id = ?"
                    " AND agent_id = ? AND user_ref = ? AND type = ? AND key = ?",
                    [(int(flag), *_scope(scope), kind, key) for key, flag in flags.items()],
                )
                return changed.rowcount

        return await self._run(set_)

    # --- vectors -------------------------------------------------------------------------------

    async def put_vectors(self, rows: Sequence[VectorRow]) -> None:
        if not rows:
            return

        def put() -> None:
            with self._writing() as db:
                for memory_id, model in dict.fromkeys((r.memory_id, r.model) for r in rows):
                    db.execute("DELETE FROM memory_vectors WHERE memory_id = ? AND model = ?",
                               (memory_id, model))
                db.executemany(
                    "INSERT INTO memory_vectors (memory_id, chunk, start_at, end_at, model,"
                    " digest, vector) SELECT ?, ?, ?, ?, ?, ?, ?"
                    " WHERE EXISTS (SELECT 1 FROM memories WHERE memory_id = ?)",
                    [(r.memory_id, r.chunk, r.start, r.end, r.model, r.digest, r.vector,
                      r.memory_id) for r in rows],
                )

        await self._run(put)

    async def cached_vectors(self, model: str, digests: Sequence[str]) -> dict[str, bytes]:
        wanted = list(dict.fromkeys(digests))
        if not wanted:
            return {}

        def cached() -> dict[str, bytes]:
            out: dict[str, bytes] = {}
            for at in range(0, len(wanted), _KEYS_PER_QUERY):
                part = wanted[at : at + _KEYS_PER_QUERY]
                rows = self._db().execute(
                    "SELECT digest, vector FROM memory_vectors WHERE model = ?"
                    f" AND digest IN ({', '.join('?' * len(part))})", [model, *part],
                ).fetchall()
                out.update((str(d), bytes(v)) for d, v in rows)
            return out

        return await self._run(cached)

    async def unembedded(
        self, model: str, *, after: str = "", limit: int = 100
    ) -> builtins.list[Memory]:
        sql = (f"SELECT {_M_COLUMNS} {_UNEMBEDDED} AND m.memory_id > ?"
               " ORDER BY m.memory_id LIMIT ?")

        def unembedded_() -> builtins.list[Memory]:
            rows = self._db().execute(sql, (model, after, limit)).fetchall()
            return [_memory(row) for row in rows]

        return await self._run(unembedded_)

    async def count_unembedded(self, model: str) -> int:
        def count() -> int:
            row = self._db().execute(f"SELECT count(*) {_UNEMBEDDED}", (model,)).fetchone()
            return int(row[0])

        return await self._run(count)

    async def vector_spans(
        self, model: str, *, after: str = "", limit: int = 100
    ) -> builtins.list[tuple[Memory, builtins.list[tuple[int, int]]]]:
        def spans() -> builtins.list[tuple[Memory, builtins.list[tuple[int, int]]]]:
            rows = self._db().execute(_SPANS, (model, after, limit)).fetchall()
            return [(_memory(row[:-1]), [(int(a), int(b)) for a, b in orjson.loads(row[-1])])
                    for row in rows]

        return await self._run(spans)

    async def count_embeddable(self) -> int:
        def count() -> int:
            row = self._db().execute(
                "SELECT count(*) FROM memories WHERE type IN ('episodic', 'semantic')"
            ).fetchone()
            return int(row[0])

        return await self._run(count)

    async def vector_search(
        self,
        scope: Scope,
        vector: np.ndarray,
        model: str,
        *,
        types: Sequence[MemoryType] = MEMORY_TYPES,
        limit: int = 20,
        now: float | None = None,
    ) -> builtins.list[Hit]:
        if not types or limit <= 0:
            return []
        at = time.time() if now is None else now

        def fresh() -> builtins.list[tuple[int, VectorRow]]:
            since = self._vectors.since(scope, model)
            rows = self._db().execute(_VECTORS_SINCE, (since, model, *_scope(scope)))
            return [(int(seq), VectorRow(str(mid), int(chunk), int(a), int(b), model, "",
                                         bytes(vec)))
                    for seq, mid, chunk, a, b, vec in rows.fetchall()]

        def top(rows: builtins.list[tuple[int, VectorRow]]) -> builtins.list[Match]:
            self._vectors.apply(scope, model, rows)
            # Twice the limit: a match of another type, expired or deleted is dropped later.
            return self._vectors.top(scope, model, vector, 2 * limit)

        # The matrix product in a worker of its own: the store's thread meanwhile serves the
        # full-text search recall runs beside it.
        matches = await asyncio.to_thread(top, await self._run(fresh))
        if not matches:
            return []
        return await self._run(self._found, scope, matches, model, list(types), limit, at)

    def _found(
        self, scope: Scope, matches: builtins.list[Match], model: str,
        types: builtins.list[str], limit: int, now: float,
    ) -> builtins.list[Hit]:
        db = self._db()
        marks = ", ".join("?" * len(matches))
        # Looked up by id alone and filtered here: with the scope in the statement, SQLite
        # would walk the scope's index (tens of thousands of rows) instead.
        rows = db.execute(
            f"SELECT {_M_COLUMNS} FROM memories m WHERE m.memory_id IN ({marks})"
            # The copy may hold vectors of a text since changed (and not embedded again yet).
            " AND EXISTS (SELECT 1 FROM memory_vectors v WHERE v.memory_id = m.memory_id"
            " AND v.model = ?)",
            [*(m.memory_id for m in matches), model],
        ).fetchall()
        found = {
            m.memory_id: m for m in map(_memory, rows)
            if m.scope == scope and m.type in types
            and (m.expires_at is None or m.expires_at > now)
        }
        return [
            Hit(found[m.memory_id], max(m.similarity, 1e-9), m.similarity, (m.start, m.end))
            for m in matches if m.memory_id in found
        ][:limit]


# --- helpers -----------------------------------------------------------------------------------


def _json_rows(
    db: sqlite3.Connection, sql: str, params: Sequence[Any] | dict[str, Any], columns: str
) -> list[builtins.list[Any]]:
    """The rows of ``sql`` (its ``columns``), in one JSON array: each row crossing into
    Python is a turn of the GIL, and under load the event loop holds it for long."""
    names = ", ".join(
        # JSON keeps 15 digits of a REAL, quote() all: a timestamp comes back as it went in.
        f"iif({c} IS NULL, NULL, quote({c}))" if c in _REALS else c
        for c in (c.strip() for c in columns.split(","))
    )
    row = db.execute(f"SELECT json_group_array(json_array({names})) FROM ({sql})", params)
    return list(orjson.loads(row.fetchone()[0]))



def _migrate(conn: sqlite3.Connection) -> None:
    conn.create_function("ctxproxy_scope_token", 4, scope_token, deterministic=True)
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
        if conn.in_transaction:
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


def _guarded(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, its sqlite errors as StoreError (in the thread that runs it)."""
    try:
        return fn(*args)
    except (sqlite3.Error, OSError) as exc:  # OSError: the write lock's file
        raise StoreError(f"sqlite: {exc}") from exc
    except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
        raise StoreError(f"sqlite: a row could not be read: {exc}") from exc


def _read_only(path: Path | str) -> sqlite3.Connection:
    """A reader's connection (a thread's, or a search process's)."""
    conn = sqlite3.connect(path, timeout=_BUSY_TIMEOUT_S, isolation_level=None,
                           check_same_thread=False)
    conn.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
    conn.execute("PRAGMA query_only=1")
    conn.create_function("ctxproxy_scope_token", 4, scope_token, deterministic=True)
    return conn


def _searcher(path: str) -> Callable[..., builtins.list[Hit]]:
    """What a search process runs (``Served``): searches on a connection of its own."""
    return functools.partial(_search_in, _read_only(path), MatchCounts())


def _search_in(
    db: sqlite3.Connection, matches: MatchCounts, scope: Scope, words: Sequence[str],
    types: Sequence[str], limit: int, now: float,
) -> builtins.list[Hit]:
    """``SqliteStore.search`` on the connection ``db`` (``matches``: its counts' cache)."""
    words = [w for w in words if _TOKENS(w)]  # a word with no token of the index's matches nothing
    token = scope_token(scope.service_id, scope.team_id, scope.agent_id, scope.user)
    within = _within(token)
    total = int(db.execute("SELECT max(id) FROM memories").fetchone()[0] or 0)

    def count(some: Sequence[str], cap: int) -> builtins.list[int]:
        return matches.counts(
            token, some, cap, lambda missing: _counts(db, missing, cap, within), now)

    counted = _rarest(count, words)
    if not counted:
        return []  # no word of the query is in any memory of the scope
    df = [n for n, _ in counted]
    idf = [math.log(1.0 + (total - n + 0.5) / (n + 0.5)) for n in df]
    sql, params = _candidates_sql(
        [_phrase(w) for _, w in counted], idf, bound(df, BUDGET), within
    )
    params.update(service=scope.service_id, team=scope.team_id, agent=scope.agent_id,
                  user=scope.user, now=now, limit=max(limit, _RERANK),
                  **{f"type{i}": t for i, t in enumerate(types)})
    sql = sql.replace(":types", ", ".join(f":type{i}" for i in range(len(types))))
    ranked = sorted(_json_rows(db, sql, params, "matched, score, updated, memory_id, id, "
                                                "words"), reverse=True)
    if not ranked:
        return []
    marks = ", ".join("?" * len(ranked))
    rows = {
        row[0]: _memory(row[1:])
        for row in _json_rows(
            db, f"SELECT m.id, {_M_COLUMNS} FROM memories m WHERE m.id IN ({marks})",
            [r[4] for r in ranked], "id, " + _COLUMNS,
        )
    }
    found = [(rows[r[4]], {int(w) for w in str(r[5]).split(",")})
             for r in ranked if r[4] in rows]
    return _rerank(found, [w for _, w in counted], idf)[:limit]


def _rarest(
    count: Callable[[Sequence[str], int], builtins.list[int]], words: Sequence[str]
) -> builtins.list[tuple[int, str]]:
    """The ``MAX_WORDS`` rarest words that match at all, with their match counts (``count``:
    each word's, up to a cap; up to ``BUDGET + 1``), rarest first. Counted with a low cap
    first, since a long prompt's rare words are usually enough."""
    low = BUDGET // MAX_WORDS + 1
    first = count(words, low)
    # A word no memory holds finds nothing: a long prompt's new names and typos would
    # otherwise be its "rarest" words and leave the search empty.
    counted = [c for c in zip(first, words, strict=True) if c[0] > 0]
    rare = [c for c in counted if c[0] < low]
    common = [w for n, w in counted if n >= low]
    if len(rare) < MAX_WORDS and common:
        again = count(common, BUDGET + 1)
        rare += zip(again, common, strict=True)
    # The commonest words of a long prompt say least about which memory is meant.
    return sorted(rare, key=lambda c: c[0])[:MAX_WORDS]


def _counts(
    db: sqlite3.Connection, words: Sequence[str], cap: int, within: Callable[[str], str]
) -> builtins.list[int]:
    """Each word's matches in the scope, up to ``cap``."""
    each = ", ".join(
        f"(SELECT count(*) FROM ({_MATCH} :w{i} LIMIT :cap))" for i in range(len(words))
    )
    params: dict[str, object] = {f"w{i}": within(_phrase(w)) for i, w in enumerate(words)}
    row = db.execute(f"SELECT {each}", {**params, "cap": cap})
    return [int(n or 0) for n in row.fetchone()]


class MatchCounts:
    """Words' match counts per (scope, cap), each kept for ``ttl_s`` (see MATCH_COUNTS_TTL_S)
    of the searches' own clock (their ``now``: a replay's simulated time gives the same
    results on a fast machine and a slow one); a count of 0 is never kept. Shared by the
    search threads."""

    def __init__(self, ttl_s: float = MATCH_COUNTS_TTL_S,
                 size: int = MATCH_COUNTS_CACHED) -> None:
        self._ttl_s = ttl_s
        self._kept: LRUCache[tuple[str, int, str], tuple[int, float]] = LRUCache(size)
        self._lock = threading.Lock()

    def counts(self, scope: str, words: Sequence[str], cap: int,
               count: Callable[[Sequence[str]], builtins.list[int]],
               now: float) -> builtins.list[int]:
        """Each of ``words``' count in ``scope`` up to ``cap`` at ``now``: kept, or by
        ``count`` (which is asked only the words not kept)."""
        found: dict[str, int] = {}
        with self._lock:
            for word in words:
                kept = self._kept.get((scope, cap, word))
                if kept is not None and 0 <= now - kept[1] < self._ttl_s:
                    found[word] = kept[0]
        missing = [w for w in dict.fromkeys(words) if w not in found]
        if missing:
            fresh = count(missing)
            found.update(zip(missing, fresh, strict=True))
            with self._lock:
                for word, n in zip(missing, fresh, strict=True):
                    if n:
                        self._kept[(scope, cap, word)] = (n, now)
        return [found[w] for w in words]


def _candidates_sql(
    phrases: Sequence[str], idf: Sequence[float], plan: Bounds, within: Callable[[str], str]
) -> tuple[str, dict[str, object]]:
    """One statement: the bounded candidates of the words in scope, alive and of the asked
    types (``:types``), the best first: words matched, BM25 with term frequency 1,
    updated_at, memory_id (the ranking), rowid, and the indices of the words each holds."""
    params: dict[str, object] = {f"p{i}": within(p) for i, p in enumerate(phrases)}
    params.update({f"idf{i}": v for i, v in enumerate(idf)})
    rare = " OR ".join(phrases[i] for i in plan.rare)
    hits = [f"SELECT rowid AS id, {i} AS w, :idf{i} AS idf, 1 AS rare FROM memories_fts "
            f"WHERE memories_fts MATCH :p{i}" for i in plan.rare]
    ctes = []
    pool = "c.rare = 1"
    if plan.common:
        # Which of the rare words' matches and of the newest matches hold a common word.
        params["common"] = within(" OR ".join(phrases[i] for i in plan.common))
        params.update(scan=_RECENT_SCAN, recent=RECENT)
        ctes.append(f"""recent(id) AS MATERIALIZED (
            SELECT m.id FROM ({_MATCH} :common ORDER BY rowid DESC LIMIT :scan) AS f
            CROSS JOIN memories m ON m.id = f.rowid
            WHERE {_FILTERS} LIMIT :recent)""")
        pool += " OR c.id IN (SELECT id FROM recent)"
        for i in plan.common:
            # Rare-word matches and newest matches overlap: each row is found once.
            common = f"SELECT rowid AS id, {i} AS w, :idf{i} AS idf, 0 AS rare FROM memories_fts"
            params[f"n{i}"] = within(f"{phrases[i]} NOT ({rare})" if rare else phrases[i])
            hits.append(f"{common} WHERE memories_fts MATCH :n{i}"
                        " AND rowid >= (SELECT min(id) FROM recent)")
            if rare:
                params[f"q{i}"] = within(f"{phrases[i]} AND ({rare})")
                hits.append(f"{common} WHERE memories_fts MATCH :q{i}")
    ctes += [
        "hits AS (" + " UNION ALL ".join(hits) + ")",
        """cand AS (
            SELECT id, count(*) AS matched, sum(idf) AS idf, group_concat(w) AS words,
                   max(rare) AS rare
            FROM hits GROUP BY id)""",
    ]
    sql = f"""WITH {", ".join(ctes)}
        SELECT c.matched, c.idf / (1.0 + {_K1} * (1.0 - {_B} + {_B} * m.chars
                / avg(m.chars) OVER ())) AS score,
            m.updated_at AS updated, m.memory_id, c.id, c.words
        FROM cand AS c CROSS JOIN memories m ON m.id = c.id
        WHERE ({pool}) AND {_FILTERS}
        ORDER BY 1 DESC, 2 DESC, 3 DESC, 4 DESC
        LIMIT :limit"""
    return sql, params


def _rerank(
    candidates: Sequence[tuple[Memory, set[int]]], words: Sequence[str], idf: Sequence[float]
) -> builtins.list[Hit]:
    """The best candidates again, by BM25 with the term frequencies read from their text
    (a record that says a word twice is likelier about it)."""
    folded = [_fold(w) for w in words]
    # Only the tokens that start like a question word, found by one scan of the text. No
    # leading \b: without it ``re`` skips ahead to a question word's first letters; a match
    # inside a word is dropped below (it consumes only that word's letters).
    forms = re.compile(r"(?:" + "|".join(map(re.escape, set(folded))) + r")[^\W_]*")
    average = max(1.0, sum(len(m.text) for m, _ in candidates) / max(len(candidates), 1))
    scored = []
    for memory, matched in candidates:
        # Counted in the head of the text: a long tool output would cost more than it tells.
        head = memory.text[:_TF_CHARS].lower()
        counts = collections.Counter(_fold(t) for t in _words_like(forms, head))
        size = len(memory.text) / average
        # The index says the word is there even when folding missed its form: at least 1.
        score = sum(_bm25(idf[i], max(1, counts[folded[i]]), size) for i in matched)
        scored.append((len(matched), score, memory.updated_at, memory.memory_id, memory))
    scored.sort(key=lambda s: s[:4], reverse=True)
    # In (0, 1): the share of the question's words matched, BM25 breaking ties.
    return [
        Hit(memory, max((matched + score / (1.0 + score)) / (len(words) + 1), 1e-9))
        for matched, score, _, _, memory in scored
    ]


def _bm25(idf: float, tf: int, size: float) -> float:
    """One word's BM25 term; ``size``: the record's length over the average."""
    return idf * tf * (_K1 + 1.0) / (tf + _K1 * (1.0 - _B + _B * size))


def _words_like(forms: re.Pattern[str], text: str) -> builtins.list[str]:
    """What ``forms`` matches in ``text`` where a word starts (as if it began with ``\b``)."""
    return [m.group() for m in forms.finditer(text)
            if not m.start() or not (text[m.start() - 1].isalnum() or text[m.start() - 1] == "_")]


@functools.lru_cache(maxsize=1 << 16)  # called per token of every candidate a search reranks
def _fold(token: str) -> str:
    """A rough stem (rates, rated -> rat; rate -> rat): enough to count a word's forms."""
    for suffix in _SUFFIXES:
        if token.endswith(suffix) and len(token) - len(suffix) >= 3:
            return token[: -len(suffix)]
    return token


def _within(token: str) -> Callable[[str], str]:
    """A full-text query confined to the records of the scope whose ``scope_token`` this is."""
    return lambda query: f'scope : "{token}" AND ({query})'


def _phrase(word: str) -> str:
    """``word`` for a full-text query: each of the index's tokens of it quoted, so that none
    is read as query syntax, and all of them required (not as a phrase: the index keeps no
    positions). Most words are one token."""
    quoted = ['"' + t.replace('"', '""') + '"' for t in _TOKENS(word)]
    return quoted[0] if len(quoted) == 1 else "(" + " AND ".join(quoted) + ")"


class _Tokens:
    """A word as the index's tokenizer splits it (unicode61; its stemmer runs on the query).
    Letters and digits of ASCII are one token. Another word may be several, or none: SQLite's
    tables are Unicode 6.1 and Python's newer, so a letter added since is a separator in the
    index and part of a word here. Asked of SQLite itself, on a table of its own, and kept."""

    def __init__(self, size: int = 16384) -> None:
        self._kept: LRUCache[str, tuple[str, ...]] = LRUCache(size)
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def __call__(self, word: str) -> tuple[str, ...]:
        if word.isascii():
            return (word,)
        with self._lock:
            tokens = self._kept.get(word)
            if tokens is None:
                tokens = self._kept[word] = self._split(word)
            return tokens

    def _split(self, word: str) -> tuple[str, ...]:
        if self._db is None:
            self._db = sqlite3.connect(":memory:", isolation_level=None,
                                       check_same_thread=False)
            self._db.executescript(
                "CREATE VIRTUAL TABLE t USING fts5(x, tokenize='unicode61');"
                "CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance');")
        self._db.execute("INSERT INTO t (rowid, x) VALUES (1, ?)", (word,))
        try:
            return tuple(row[0] for row in self._db.execute("SELECT term FROM v ORDER BY offset"))
        finally:
            self._db.execute("DELETE FROM t")


_TOKENS = _Tokens()


def _scope(scope: Scope) -> list[str]:
    return [scope.service_id, scope.team_id, scope.agent_id, scope.user]


def _params(m: Memory) -> tuple[Any, ...]:
    s = m.scope
    return (
        m.memory_id, m.type, s.service_id, s.team_id, s.agent_id, s.user, m.key, m.text,
        m.session_id, m.turn_index, int(m.in_window), orjson.dumps(list(m.sources)).decode(),
        orjson.dumps(m.attrs).decode(), m.created_at, m.updated_at, m.expires_at,
        scope_token(s.service_id, s.team_id, s.agent_id, s.user),
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
