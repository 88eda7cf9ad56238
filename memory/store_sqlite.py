"""The SQLite memory store: one file under ``CTXPROXY_DATA_DIR``, the embedded default.

WAL journal (readers never wait for the writer), an FTS5 index kept in step by triggers,
versioned migrations run in ``open()`` (memory.sqlite_schema). sqlite3 blocks, so every call
runs on a worker thread of the store's own, off the event loop (memory.sqlite_conn); the one
writer thread also serialises the writes. Full-text searches: memory.sqlite_search. Every
sqlite error leaves this module as ``StoreError``.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ctxproxy.memory.aio import done
from ctxproxy.memory.cpu import ChildUnavailable, NoChild, Served
from ctxproxy.memory.model import MEMORY_TYPES, Hit, Memory, MemoryType, Scope, StoreError
from ctxproxy.memory.ranking import MatchCounts
from ctxproxy.memory.sqlite_conn import SEARCHERS, Threads
from ctxproxy.memory.sqlite_schema import (
    COLUMNS,
    M_COLUMNS,
    json_rows,
    memory_of,
    params_of,
    scope_params,
)
from ctxproxy.memory.sqlite_search import search_in, searcher
from ctxproxy.memory.vectors import VECTOR_BYTES, Match, VectorIndex, VectorRow
from ctxproxy.memory.words import terms

__all__ = ["SqliteStore"]

log = logging.getLogger("ctxproxy.memory")

_UPSERT = f"""
INSERT INTO memories ({COLUMNS}, scope)
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
RETURNING {COLUMNS}
"""
_SCOPE_WHERE = "m.service_id = ? AND m.team_id = ? AND m.agent_id = ? AND m.user_ref = ?"
_KEYS_PER_QUERY = 500  # under SQLite's bound on a statement's parameters
_VECTORS_SINCE = f"""
SELECT v.seq, v.memory_id, v.chunk, v.start_at, v.end_at, v.vector
FROM memory_vectors v CROSS JOIN memories m ON m.memory_id = v.memory_id
WHERE v.seq > ? AND +v.model = ? AND {_SCOPE_WHERE}  -- by seq (rowid), not the model index
ORDER BY v.seq
"""
_SPANS = f"""SELECT {M_COLUMNS}, (
    SELECT json_group_array(json_array(s.start_at, s.end_at)) FROM (
        SELECT v.start_at, v.end_at FROM memory_vectors v
        WHERE v.memory_id = m.memory_id AND v.model = ? ORDER BY v.chunk) s)
FROM memories m WHERE m.type IN ('episodic', 'semantic') AND m.memory_id > ?
ORDER BY m.memory_id LIMIT ?"""
_UNEMBEDDED = """FROM memories m WHERE m.type IN ('episodic', 'semantic') AND NOT EXISTS (
    SELECT 1 FROM memory_vectors v WHERE v.memory_id = m.memory_id AND v.model = ?)"""


class SqliteStore:
    """Memory records in one SQLite file (``CTXPROXY_DATA_DIR/memory.sqlite3``)."""

    def __init__(self, path: Path | str, *, processes: bool = False,
                 vector_bytes: int = VECTOR_BYTES) -> None:
        self.path = Path(path)
        # Searches in processes of their own (``processes``): in the search threads, their
        # Python (the rerank, the rows read) held the worker's GIL against its event loop.
        self._served: Served[builtins.list[Hit]] | None = (
            Served(SEARCHERS, searcher, str(self.path), name="ctxproxy-search")
            if processes else None)
        self._threads = Threads(self.path)
        self._vectors = VectorIndex(max_bytes=vector_bytes)
        self._matches = MatchCounts()

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    # --- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        """Open the file (creating it and its folder) and run pending migrations."""
        try:
            await self._threads.open()
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

    async def close(self) -> None:
        await self._threads.close(after_reads=self._close_search_processes)

    async def _close_search_processes(self) -> None:
        if self._served is not None:
            await asyncio.to_thread(self._served.close)

    # --- the Store protocol ------------------------------------------------------------------

    async def upsert(self, memories: Sequence[Memory]) -> list[Memory]:
        if not memories:
            return []
        rows = [params_of(m) for m in memories]
        return await self._threads.run(self._upsert, rows)

    def _upsert(self, rows: list[tuple[Any, ...]]) -> list[Memory]:
        stored: list[Memory] = []
        with self._threads.writing() as db:
            for row in rows:
                found = db.execute(_UPSERT, row).fetchone()
                if found is not None:  # None: the key was forgotten (a tombstone)
                    stored.append(memory_of(found))
        return stored

    def get(self, memory_id: str) -> asyncio.Future[Memory | None]:
        def get() -> Memory | None:
            row = self._threads.db().execute(
                f"SELECT {COLUMNS} FROM memories WHERE memory_id = ?", (memory_id,)
            ).fetchone()
            return memory_of(row) if row else None

        return self._threads.read(get)

    async def delete(self, memory_ids: Sequence[str]) -> int:
        if not memory_ids:
            return 0
        ids = list(memory_ids)

        def delete() -> int:
            marks = ", ".join("?" * len(ids))
            with self._threads.writing() as db:
                cur = db.execute(f"DELETE FROM memories WHERE memory_id IN ({marks})", ids)
            return cur.rowcount

        return await self._threads.run(delete)

    async def forget(self, memory_ids: Sequence[str], *, now: float | None = None) -> int:
        if not memory_ids:
            return 0
        ids = list(memory_ids)
        at = time.time() if now is None else now

        def forget() -> int:
            marks = ", ".join("?" * len(ids))
            with self._threads.writing() as db:
                db.execute(
                    "INSERT OR IGNORE INTO forgotten SELECT service_id, team_id, agent_id,"
                    f" user_ref, type, key, ? FROM memories WHERE memory_id IN ({marks})",
                    [at, *ids],
                )
                gone = db.execute(f"DELETE FROM memories WHERE memory_id IN ({marks})", ids)
            return gone.rowcount

        return await self._threads.run(forget)

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
        return self._threads.read(self._search, scope, words, list(types), limit, at, search=True)

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
        return search_in(self._threads.db(), self._matches, scope, words, types, limit, now)

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
            params += scope_params(scope)
        if session_id is not None:
            where.append("m.session_id = ?")
            params.append(session_id)
        if since is not None:
            where.append("m.updated_at >= ?")
            params.append(since)
        sql = (
            f"SELECT {M_COLUMNS} FROM memories m WHERE {' AND '.join(where)}"
            " ORDER BY m.updated_at DESC, m.memory_id DESC LIMIT ?"
        )
        params.append(limit)

        def list_() -> list[Memory]:
            found = [memory_of(row) for row in json_rows(self._threads.db(), sql, params, COLUMNS)]
            return sorted(found, key=lambda m: (m.updated_at, m.memory_id), reverse=True)

        return self._threads.read(list_)

    async def stored(
        self, scope: Scope, kind: MemoryType, keys: Sequence[str]
    ) -> dict[str, bool]:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}

        def stored_() -> dict[str, bool]:
            out: dict[str, bool] = {}
            db = self._threads.db()
            for at in range(0, len(wanted), _KEYS_PER_QUERY):
                chunk = wanted[at : at + _KEYS_PER_QUERY]
                rows = db.execute(
                    "SELECT key, in_window FROM memories WHERE service_id = ? AND team_id = ?"
                    " AND agent_id = ? AND user_ref = ? AND type = ?"
                    f" AND key IN ({', '.join('?' * len(chunk))})",
                    [*scope_params(scope), kind, *chunk],
                ).fetchall()
                out.update((str(key), bool(in_window)) for key, in_window in rows)
            return out

        return await self._threads.read(stored_)

    async def set_in_window(
        self, scope: Scope, kind: MemoryType, flags: Mapping[str, bool]
    ) -> int:
        if not flags:
            return 0

        def set_() -> int:
            with self._threads.writing() as db:
                changed = db.executemany(
                    "UPDATE memories SET in_window = ? WHERE service_id = ? AND team_id = ?"
                    " AND agent_id = ? AND user_ref = ? AND type = ? AND key = ?",
                    [(int(flag), *scope_params(scope), kind, key) for key, flag in flags.items()],
                )
                return changed.rowcount

        return await self._threads.run(set_)

    async def placements(
        self, scope: Scope, session: str, names: Sequence[str]
    ) -> dict[str, bytes]:
        wanted = list(dict.fromkeys(names))[:_KEYS_PER_QUERY]  # a session's few names
        if not wanted:
            return {}

        def placements_() -> dict[str, bytes]:
            rows = self._threads.db().execute(
                "SELECT name, value FROM memory_placements WHERE service_id = ? AND team_id = ?"
                " AND agent_id = ? AND user_ref = ? AND session_id = ?"
                f" AND name IN ({', '.join('?' * len(wanted))})",
                [*scope_params(scope), session, *wanted],
            )
            return {str(name): bytes(value) for name, value in rows}

        return await self._threads.read(placements_)

    async def place(self, scope: Scope, session: str, name: str, value: bytes, *,
                    now: float) -> None:
        def place_() -> None:
            with self._threads.writing() as db:
                db.execute(
                    "INSERT INTO memory_placements VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (service_id, team_id, agent_id, user_ref, session_id, name)"
                    " DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                    [*scope_params(scope), session, name, value, now],
                )

        await self._threads.run(place_)

    async def forget_placements(self, before: float) -> int:
        def forget_() -> int:
            with self._threads.writing() as db:
                return db.execute(
                    "DELETE FROM memory_placements WHERE updated_at < ?", (before,)).rowcount

        return await self._threads.run(forget_)

    # --- vectors -------------------------------------------------------------------------------

    async def put_vectors(self, rows: Sequence[VectorRow]) -> None:
        if not rows:
            return

        def put() -> None:
            with self._threads.writing() as db:
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

        await self._threads.run(put)

    async def cached_vectors(self, model: str, digests: Sequence[str]) -> dict[str, bytes]:
        wanted = list(dict.fromkeys(digests))
        if not wanted:
            return {}

        def cached() -> dict[str, bytes]:
            out: dict[str, bytes] = {}
            for at in range(0, len(wanted), _KEYS_PER_QUERY):
                part = wanted[at : at + _KEYS_PER_QUERY]
                rows = self._threads.db().execute(
                    "SELECT digest, vector FROM memory_vectors WHERE model = ?"
                    f" AND digest IN ({', '.join('?' * len(part))})", [model, *part],
                ).fetchall()
                out.update((str(d), bytes(v)) for d, v in rows)
            return out

        return await self._threads.run(cached)

    async def unembedded(
        self, model: str, *, after: str = "", limit: int = 100
    ) -> builtins.list[Memory]:
        sql = (f"SELECT {M_COLUMNS} {_UNEMBEDDED} AND m.memory_id > ?"
               " ORDER BY m.memory_id LIMIT ?")

        def unembedded_() -> builtins.list[Memory]:
            rows = self._threads.db().execute(sql, (model, after, limit)).fetchall()
            return [memory_of(row) for row in rows]

        return await self._threads.run(unembedded_)

    async def count_unembedded(self, model: str) -> int:
        def count() -> int:
            row = self._threads.db().execute(f"SELECT count(*) {_UNEMBEDDED}", (model,)).fetchone()
            return int(row[0])

        return await self._threads.run(count)

    async def vector_spans(
        self, model: str, *, after: str = "", limit: int = 100
    ) -> builtins.list[tuple[Memory, builtins.list[tuple[int, int]]]]:
        def spans() -> builtins.list[tuple[Memory, builtins.list[tuple[int, int]]]]:
            rows = self._threads.db().execute(_SPANS, (model, after, limit)).fetchall()
            return [(memory_of(row[:-1]), [(int(a), int(b)) for a, b in orjson.loads(row[-1])])
                    for row in rows]

        return await self._threads.run(spans)

    async def count_embeddable(self) -> int:
        def count() -> int:
            row = self._threads.db().execute(
                "SELECT count(*) FROM memories WHERE type IN ('episodic', 'semantic')"
            ).fetchone()
            return int(row[0])

        return await self._threads.run(count)

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
            rows = self._threads.db().execute(_VECTORS_SINCE, (since, model, *scope_params(scope)))
            return [(int(seq), VectorRow(str(mid), int(chunk), int(a), int(b), model, "",
                                         bytes(vec)))
                    for seq, mid, chunk, a, b, vec in rows.fetchall()]

        def top(rows: builtins.list[tuple[int, VectorRow]]) -> builtins.list[Match]:
            self._vectors.apply(scope, model, rows)
            # Twice the limit: a match of another type, expired or deleted is dropped later.
            return self._vectors.top(scope, model, vector, 2 * limit)

        # The matrix product in a worker of its own: the store's thread meanwhile serves the
        # full-text search recall runs beside it.
        matches = await asyncio.to_thread(top, await self._threads.run(fresh))
        if not matches:
            return []
        return await self._threads.run(self._found, scope, matches, model, list(types), limit, at)

    def _found(
        self, scope: Scope, matches: builtins.list[Match], model: str,
        types: builtins.list[str], limit: int, now: float,
    ) -> builtins.list[Hit]:
        db = self._threads.db()
        marks = ", ".join("?" * len(matches))
        # Looked up by id alone and filtered here: with the scope in the statement, SQLite
        # would walk the scope's index (tens of thousands of rows) instead.
        rows = db.execute(
            f"SELECT {M_COLUMNS} FROM memories m WHERE m.memory_id IN ({marks})"
            # The copy may hold vectors of a text since changed (and not embedded again yet).
            " AND EXISTS (SELECT 1 FROM memory_vectors v WHERE v.memory_id = m.memory_id"
            " AND v.model = ?)",
            [*(m.memory_id for m in matches), model],
        ).fetchall()
        found = {
            m.memory_id: m for m in map(memory_of, rows)
            if m.scope == scope and m.type in types
            and (m.expires_at is None or m.expires_at > now)
        }
        return [
            Hit(found[m.memory_id], max(m.similarity, 1e-9), m.similarity, (m.start, m.end))
            for m in matches if m.memory_id in found
        ][:limit]
