"""The PostgreSQL memory store: one database that many proxy replicas share.

psycopg 3 async over a connection pool; the schema and rows are in ``memory.pg_schema``, the
search in ``memory.pg_search``; vectors are searched in the database where it has pgvector
(``memory.pg_ann``), else in process (``memory.vectors``). Full-text search is a generated
``tsvector`` column with a GIN index, ranked with ``ts_rank``. Writes are idempotent upserts
on (scope, type, key), so two replicas ingesting the same session converge on one record per
key.
Every driver error leaves this module as ``StoreError``.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import time
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from ctxproxy.memory.model import MEMORY_TYPES, Hit, Memory, MemoryType, Scope, StoreError
from ctxproxy.memory.pg_ann import Ann
from ctxproxy.memory.pg_schema import (
    COLUMNS,
    M_COLUMNS,
    conflict_key,
    memory_of,
    row_params,
    schema,
)
from ctxproxy.memory.pg_search import Search, hits
from ctxproxy.memory.vectors import REREAD, VECTOR_BYTES, VectorIndex, VectorRow
from ctxproxy.plumbing.pg import Pool, open_pool

__all__ = ["PostgresStore"]

log = logging.getLogger("ctxproxy.memory")

_FORGET = """
WITH gone AS (
    DELETE FROM memories WHERE memory_id = ANY(%(ids)s)
    RETURNING service_id, team_id, agent_id, user_ref, type, key
), kept AS (
    INSERT INTO forgotten SELECT gone.*, %(now)s FROM gone ON CONFLICT DO NOTHING
)
SELECT count(*) FROM gone
"""

_UPSERT = f"""
INSERT INTO memories ({COLUMNS})
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT ON CONSTRAINT memories_scope_type_key DO UPDATE SET
    -- A purged record (memory/forget.py) keeps its text: a resent turn must not write the
    -- forgotten lines back.
    text = CASE WHEN memories.attrs ? 'purged' THEN memories.text ELSE EXCLUDED.text END,
    session_id = EXCLUDED.session_id,
    turn_index = EXCLUDED.turn_index,
    in_window = EXCLUDED.in_window,
    sources = EXCLUDED.sources,
    attrs = CASE WHEN memories.attrs ? 'purged' THEN memories.attrs ELSE EXCLUDED.attrs END,
    updated_at = EXCLUDED.updated_at,
    expires_at = EXCLUDED.expires_at
RETURNING {COLUMNS}
"""
_VECTOR_SEQS = """
SELECT v.seq FROM memory_vectors v JOIN memories m ON m.memory_id = v.memory_id
WHERE v.seq > %(since)s AND v.model = %(model)s AND m.service_id = %(service_id)s
  AND m.team_id = %(team_id)s AND m.agent_id = %(agent_id)s AND m.user_ref = %(user_ref)s
"""
_VECTOR_ROWS = """
SELECT seq, memory_id, chunk, start_at, end_at, vector FROM memory_vectors
WHERE seq = ANY(%(seqs)s) ORDER BY seq
"""
# {column}...: the pgvector column, where the store has it (memory.pg_ann).
_PUT_VECTORS = """INSERT INTO memory_vectors (memory_id, chunk, start_at, end_at, model, digest,
    vector{column}) SELECT r.memory_id, r.chunk, r.s, r.e, r.model, r.digest, r.vector{value}
    FROM unnest(%s::text[], %s::int[], %s::int[], %s::int[], %s::text[], %s::text[],
    %s::bytea[]{array}) AS r(memory_id, chunk, s, e, model, digest, vector{alias})
    WHERE EXISTS (SELECT 1 FROM memories m WHERE m.memory_id = r.memory_id)
    ON CONFLICT (memory_id, model, chunk) DO NOTHING"""
_PUT_PLAIN = _PUT_VECTORS.format(column="", value="", array="", alias="")
_SPANS = f"""SELECT {M_COLUMNS}, ARRAY(
    SELECT ARRAY[v.start_at, v.end_at] FROM memory_vectors v
    WHERE v.memory_id = m.memory_id AND v.model = %s ORDER BY v.chunk)
FROM memories m WHERE m.type IN ('episodic', 'semantic') AND m.memory_id > %s
ORDER BY m.memory_id LIMIT %s"""
_UNEMBEDDED = """FROM memories m WHERE m.type IN ('episodic', 'semantic') AND NOT EXISTS (
    SELECT 1 FROM memory_vectors v WHERE v.memory_id = m.memory_id AND v.model = %s)"""
# Retried: two replicas writing the same keys can still meet in a deadlock or a
# serialization failure; a second try then succeeds.
_RETRY_SQLSTATES = frozenset({"40P01", "40001"})
# A connection back from a statement a moment ago is alive: checking each one as it leaves the
# pool (a round trip) cost as much as the statement it was taken for. One that sat in the
# pool this long is checked first: the server may have restarted or dropped it meanwhile.
IDLE_CHECK_S = 5.0


class _IdleCheck:
    """The pool's ``check`` callback: a connection is checked when it is taken after
    ``after_s`` idle (or for the first time), else taken as it is. ``done`` marks its last use.

    Not the pool's ``reset`` callback: with one, psycopg_pool hands every returned connection
    to its maintenance workers, tasks of the event loop, and under load connections sat
    there, neither in use nor in the pool, while the turns' reads queued for one (bench/
    RESULTS.md, Load)."""

    def __init__(self, after_s: float) -> None:
        self._after_s = after_s
        self._returned: weakref.WeakKeyDictionary[psycopg.AsyncConnection[TupleRow], float] = (
            weakref.WeakKeyDictionary())

    async def check(self, conn: psycopg.AsyncConnection[TupleRow]) -> None:
        returned = self._returned.pop(conn, None)
        if returned is None or time.monotonic() - returned > self._after_s:
            await AsyncConnectionPool.check_connection(conn)

    def done(self, conn: psycopg.AsyncConnection[TupleRow]) -> None:
        self._returned[conn] = time.monotonic()


_ANN_LOCK = "SELECT pg_advisory_{}(hashtext('ctxproxy.memory.ann:' || current_schema()))"


class PostgresStore:
    """Memory records in PostgreSQL (``CTXPROXY_STORE_URL=postgresql://...``)."""

    def __init__(self, url: str, *, max_connections: int = 10, timeout_s: float = 5.0,
                 idle_check_s: float = IDLE_CHECK_S, vector_bytes: int = VECTOR_BYTES,
                 pgvector: bool = True) -> None:
        self._url = url  # holds the password: never logged
        self._max = max_connections
        self._timeout_s = timeout_s
        self._idle = _IdleCheck(idle_check_s)
        self._pool: Pool | None = None
        self._search = Search()
        self._vectors = VectorIndex(reread=REREAD, max_bytes=vector_bytes)
        self._pgvector = pgvector  # False: never the extension (MEMORY_PGVECTOR)
        self._ann = Ann()

    def __repr__(self) -> str:
        return "PostgresStore(<url>)"

    async def open(self) -> None:
        """Run pending migrations on a connection of its own, then open the pool."""
        try:
            # autocommit: a statement on its own commits on its own: in a transaction it
            # would cost a round trip for BEGIN and one for COMMIT besides its own. What
            # must be one transaction asks for it (``_conn(atomic=True)``).
            self._pool = await open_pool(
                self._url, schema(), max_size=self._max, timeout_s=self._timeout_s,
                check=self._idle.check, autocommit=True,
            )
        except (psycopg.Error, OSError) as exc:
            raise StoreError(f"postgres: cannot open the memory store: {exc}") from exc
        if self._pgvector:
            try:
                async with self._pool.connection() as conn:
                    # One replica at a time: replicas opening together raced on the column
                    # and indexes the set-up adds (a UniqueViolation left one without).
                    await conn.execute(_ANN_LOCK.format("lock"))
                    try:
                        await self._ann.setup(conn)
                    finally:
                        await conn.execute(_ANN_LOCK.format("unlock"))
            except psycopg.Error as exc:  # e.g. a role that may not alter memory_vectors
                log.warning("pgvector: not used (%s): vectors are searched in process",
                            type(exc).__name__)
                self._ann.ready = False

    @property
    def pgvector(self) -> bool:
        """Whether vectors are searched in the database (pgvector), not in process."""
        return self._ann.ready

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    @asynccontextmanager
    async def _conn(
        self, *, atomic: bool = False
    ) -> AsyncIterator[psycopg.AsyncConnection[TupleRow]]:
        """A pooled connection, its statements each committed on its own, or with ``atomic``
        all in one transaction; driver errors become StoreError."""
        if self._pool is None:
            raise StoreError("postgres: the memory store is not open")
        try:
            async with self._pool.connection() as conn:
                try:
                    if atomic:
                        async with conn.transaction():
                            yield conn
                    else:
                        yield conn
                finally:
                    self._idle.done(conn)
        except (psycopg.Error, UnicodeError) as exc:
            raise StoreError(f"postgres: {exc}") from exc

    async def upsert(self, memories: Sequence[Memory]) -> list[Memory]:
        if not memories:
            return []
        # Rows are written in key order so that concurrent writers take their row locks in
        # the same order and cannot deadlock on each other.
        order = sorted(range(len(memories)), key=lambda i: conflict_key(memories[i]))
        params = [row_params(memories[i]) for i in order]
        for attempt in range(3):
            try:
                stored = await self._upsert_rows(params)
                break
            except StoreError as exc:
                if attempt == 2 or _sqlstate(exc) not in _RETRY_SQLSTATES:
                    raise
        # A forgotten key (a tombstone) is not written: it has no row in ``stored``.
        at = {conflict_key(m): n for n, m in enumerate(memories)}
        return sorted(stored, key=lambda m: at.get(conflict_key(m), len(memories)))

    async def _upsert_rows(self, params: list[tuple[Any, ...]]) -> list[Memory]:
        stored: list[Memory] = []
        async with self._conn(atomic=True) as conn, conn.cursor() as cur:
            await cur.executemany(_UPSERT, params, returning=True)
            async for result in cur.results():
                row = await result.fetchone()
                if row is not None:
                    stored.append(memory_of(row))
        return stored

    async def get(self, memory_id: str) -> Memory | None:
        async with self._conn() as conn:
            cur = await conn.execute(
                f"SELECT {COLUMNS} FROM memories WHERE memory_id = %s", (memory_id,)
            )
            row = await cur.fetchone()
        return memory_of(row) if row else None

    async def delete(self, memory_ids: Sequence[str]) -> int:
        if not memory_ids:
            return 0
        async with self._conn() as conn:
            cur = await conn.execute(
                "DELETE FROM memories WHERE memory_id = ANY(%s)", (list(memory_ids),)
            )
            return cur.rowcount

    async def forget(self, memory_ids: Sequence[str], *, now: float | None = None) -> int:
        if not memory_ids:
            return 0
        params = {"ids": list(memory_ids), "now": time.time() if now is None else now}
        async with self._conn() as conn:
            cur = await conn.execute(_FORGET, params)
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def search(
        self,
        scope: Scope,
        query: str,
        *,
        types: Sequence[MemoryType] = MEMORY_TYPES,
        limit: int = 20,
        now: float | None = None,
    ) -> list[Hit]:
        if not query.strip() or not types or limit <= 0:
            return []
        async with self._conn(atomic=True) as conn:  # SET LOCAL ends with the transaction
            rows, chosen = await self._search.run(
                conn, scope, query, types=types, limit=limit, now=now)
        return hits(rows, chosen)

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
        where = ["type = ANY(%(types)s)", "(expires_at IS NULL OR expires_at > %(now)s)"]
        params: dict[str, Any] = {
            "types": list(types),
            "now": time.time() if now is None else now,
            "limit": limit,
        }
        if scope is not None:
            where.append(
                "service_id = %(service_id)s AND team_id = %(team_id)s"
                " AND agent_id = %(agent_id)s AND user_ref = %(user_ref)s"
            )
            params.update(
                service_id=scope.service_id,
                team_id=scope.team_id,
                agent_id=scope.agent_id,
                user_ref=scope.user,
            )
        if session_id is not None:
            where.append("session_id = %(session_id)s")
            params["session_id"] = session_id
        if since is not None:
            where.append("updated_at >= %(since)s")
            params["since"] = since
        sql = (
            f"SELECT {COLUMNS} FROM memories WHERE {' AND '.join(where)}"
            " ORDER BY updated_at DESC, memory_id DESC LIMIT %(limit)s"
        )
        async with self._conn() as conn:
            cur = await conn.execute(sql, params)
            rows = await cur.fetchall()
        return [memory_of(row) for row in rows]

    async def stored(
        self, scope: Scope, kind: MemoryType, keys: Sequence[str]
    ) -> dict[str, bool]:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT key, in_window FROM memories WHERE service_id = %s AND team_id = %s"
                " AND agent_id = %s AND user_ref = %s AND type = %s AND key = ANY(%s)",
                (scope.service_id, scope.team_id, scope.agent_id, scope.user, kind, wanted),
            )
            rows = await cur.fetchall()
        return {str(key): bool(in_window) for key, in_window in rows}

    async def set_in_window(
        self, scope: Scope, kind: MemoryType, flags: Mapping[str, bool]
    ) -> int:
        if not flags:
            return 0
        async with self._conn() as conn:
            cur = await conn.execute(
                "UPDATE memories m SET in_window = f.flag FROM unnest(%s::text[], %s::boolean[])"
                " AS f(key, flag) WHERE m.service_id = %s AND m.team_id = %s"
                " AND m.agent_id = %s AND m.user_ref = %s AND m.type = %s AND m.key = f.key",
                (list(flags), list(flags.values()), scope.service_id, scope.team_id,
                 scope.agent_id, scope.user, kind),
            )
            return cur.rowcount

    # --- vectors -------------------------------------------------------------------------------

    async def placements(
        self, scope: Scope, session: str, names: Sequence[str]
    ) -> dict[str, bytes]:
        if not names:
            return {}
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT name, value FROM memory_placements WHERE service_id = %s AND"
                " team_id = %s AND agent_id = %s AND user_ref = %s AND session_id = %s"
                " AND name = ANY(%s)",
                (scope.service_id, scope.team_id, scope.agent_id, scope.user, session,
                 list(names)),
            )
            rows = await cur.fetchall()
        return {str(name): bytes(value) for name, value in rows}

    async def place(self, scope: Scope, session: str, name: str, value: bytes, *,
                    now: float) -> None:
        async with self._conn() as conn:
            await conn.execute(
                "INSERT INTO memory_placements VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (service_id, team_id, agent_id, user_ref, session_id, name)"
                " DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                (scope.service_id, scope.team_id, scope.agent_id, scope.user, session, name,
                 value, now),
            )

    async def forget_placements(self, before: float) -> int:
        async with self._conn() as conn:
            cur = await conn.execute(
                "DELETE FROM memory_placements WHERE updated_at < %s", (before,))
            return cur.rowcount

    async def put_vectors(self, rows: Sequence[VectorRow]) -> None:
        if not rows:
            return
        pairs = list(dict.fromkeys((r.memory_id, r.model) for r in rows))
        new_dims = self._ann.unindexed(len(r.vector) // 4 for r in rows)
        if new_dims:
            async with self._conn() as conn:
                for dim in new_dims:
                    await self._ann.index(conn, dim)
        async with self._conn(atomic=True) as conn, conn.cursor() as cur:
            await cur.execute(
                "DELETE FROM memory_vectors v USING unnest(%s::text[], %s::text[]) AS d(id, model)"
                " WHERE v.memory_id = d.id AND v.model = d.model",
                ([p[0] for p in pairs], [p[1] for p in pairs]),
            )
            values = ([r.memory_id for r in rows], [r.chunk for r in rows],
                      [r.start for r in rows], [r.end for r in rows], [r.model for r in rows],
                      [r.digest for r in rows], [r.vector for r in rows])
            if not self._ann.ready:
                await cur.execute(_PUT_PLAIN, values)
                return
            await cur.execute(_PUT_VECTORS.format(
                column=", embedding", value=f", r.emb::{self._ann.type}", array=", %s::text[]",
                alias=", emb"),
                (*values, self._ann.embeddings(rows)))

    async def cached_vectors(self, model: str, digests: Sequence[str]) -> dict[str, bytes]:
        wanted = list(dict.fromkeys(digests))
        if not wanted:
            return {}
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT DISTINCT ON (digest) digest, vector FROM memory_vectors"
                " WHERE model = %s AND digest = ANY(%s)", (model, wanted),
            )
            rows = await cur.fetchall()
        return {str(d): bytes(v) for d, v in rows}

    async def unembedded(
        self, model: str, *, after: str = "", limit: int = 100
    ) -> builtins.list[Memory]:
        async with self._conn() as conn:
            cur = await conn.execute(
                f"SELECT {M_COLUMNS} {_UNEMBEDDED} AND m.memory_id > %s"
                " ORDER BY m.memory_id LIMIT %s", (model, after, limit),
            )
            rows = await cur.fetchall()
        return [memory_of(row) for row in rows]

    async def count_unembedded(self, model: str) -> int:
        async with self._conn() as conn:
            cur = await conn.execute(f"SELECT count(*) {_UNEMBEDDED}", (model,))
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def vector_spans(
        self, model: str, *, after: str = "", limit: int = 100
    ) -> builtins.list[tuple[Memory, builtins.list[tuple[int, int]]]]:
        async with self._conn() as conn:
            cur = await conn.execute(_SPANS, (model, after, limit))
            rows = await cur.fetchall()
        return [(memory_of(row[:-1]), [(int(a), int(b)) for a, b in row[-1]]) for row in rows]

    async def count_embeddable(self) -> int:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM memories WHERE type IN ('episodic', 'semantic')")
            row = await cur.fetchone()
        return int(row[0]) if row else 0

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
        if self._ann.searches(vector):
            async with self._conn(atomic=True) as conn:  # SET LOCAL ends with the transaction
                return await self._ann.search(conn, scope, vector, model, types=types,
                                              limit=limit, now=now)
        return await self._search_copy(scope, vector, model, types=types, limit=limit, now=now)

    async def _search_copy(
        self, scope: Scope, vector: np.ndarray, model: str, *,
        types: Sequence[MemoryType], limit: int, now: float | None,
    ) -> builtins.list[Hit]:
        """``vector_search`` without pgvector: on this process's copy of the scope's vectors
        (memory.vectors.VectorIndex), brought up to date first."""
        params: dict[str, Any] = {
            "since": self._vectors.since(scope, model), "model": model,
            "service_id": scope.service_id, "team_id": scope.team_id,
            "agent_id": scope.agent_id, "user_ref": scope.user,
        }
        async with self._conn(atomic=True) as conn:
            # A range of the seq index, whatever the statistics say (before ANALYZE has seen
            # the vectors, the planner read every one of them: bench/RESULTS.md, Hybrid
            # recall).
            await conn.execute("SET LOCAL enable_seqscan = off")
            # The seqs first (a look back, see memory.vectors.REREAD), then only the rows of
            # those not held: the vectors themselves cross the wire once.
            cur = await conn.execute(_VECTOR_SEQS, params)
            seqs = self._vectors.unknown(scope, model, [int(r[0]) for r in await cur.fetchall()])
            fresh: list[Any] = []
            if seqs:
                cur = await conn.execute(_VECTOR_ROWS, {"seqs": seqs})
                fresh = await cur.fetchall()
        rows = [(int(seq), VectorRow(str(mid), int(chunk), int(a), int(b), model, "", bytes(v)))
                for seq, mid, chunk, a, b, v in fresh]

        def top() -> builtins.list[Any]:
            self._vectors.apply(scope, model, rows)
            # Twice the limit: a match of another type, expired or deleted is dropped below.
            return self._vectors.top(scope, model, vector, 2 * limit)

        # The matrix product reads every vector of the scope: in a worker, not on the loop.
        matches = await asyncio.to_thread(top)
        if not matches:
            return []
        at = time.time() if now is None else now
        async with self._conn() as conn:
            # By id alone, filtered here: the planner may not take the scope's index for it.
            cur = await conn.execute(
                f"SELECT {M_COLUMNS} FROM memories m WHERE m.memory_id = ANY(%s)"
                # The copy may hold vectors of a text since changed (not embedded again yet).
                " AND EXISTS (SELECT 1 FROM memory_vectors v WHERE v.memory_id = m.memory_id"
                " AND v.model = %s)", ([m.memory_id for m in matches], model),
            )
            found = {
                m.memory_id: m for m in map(memory_of, await cur.fetchall())
                if m.scope == scope and m.type in types
                and (m.expires_at is None or m.expires_at > at)
            }
        return [
            Hit(found[m.memory_id], max(m.similarity, 1e-9), m.similarity, (m.start, m.end))
            for m in matches if m.memory_id in found
        ][:limit]


def _sqlstate(exc: StoreError) -> str | None:
    cause = exc.__cause__
    return cause.sqlstate if isinstance(cause, psycopg.Error) else None
