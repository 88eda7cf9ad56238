"""The PostgreSQL memory store: one database that many proxy replicas share.

psycopg 3 async over a connection pool. Full-text search is a generated ``tsvector`` column
with a GIN index, ranked with ``ts_rank``. Writes are idempotent upserts on
(scope, type, key), so two replicas ingesting the same session converge on one record per key.
Every driver error leaves this module as ``StoreError``.
"""

from __future__ import annotations

import asyncio
import builtins
import time
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psycopg
from psycopg.rows import TupleRow
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from ctxproxy.memory.model import MEMORY_TYPES, Hit, Memory, MemoryType, Scope, StoreError
from ctxproxy.memory.search import BUDGET, MAX_WORDS, RECENT, bound
from ctxproxy.memory.vectors import REREAD, VectorIndex, VectorRow
from ctxproxy.plumbing.pg import Pool, Schema, open_pool

__all__ = ["MIGRATIONS", "PostgresStore"]

# Versioned schema. Append new versions; never edit an applied one.
MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (
        1,
        (
            """
            CREATE TABLE memories (
                memory_id  text PRIMARY KEY,
                type       text NOT NULL CHECK (type IN ('working', 'episodic', 'semantic')),
                service_id text NOT NULL,
                team_id    text NOT NULL,
                agent_id   text NOT NULL,
                user_ref   text NOT NULL,
                key        text NOT NULL,
                text       text NOT NULL,
                session_id text,
                turn_index integer,
                in_window  boolean NOT NULL DEFAULT false,
                sources    text[] NOT NULL DEFAULT '{}',
                attrs      jsonb NOT NULL DEFAULT '{}',
                created_at double precision NOT NULL,
                updated_at double precision NOT NULL,
                expires_at double precision,
                -- Only the head of a huge text is indexed: a tsvector is capped at 1 MB.
                tsv tsvector GENERATED ALWAYS AS
                    (to_tsvector('english'::regconfig, left(text, 100000))) STORED,
                CONSTRAINT memories_scope_type_key
                    UNIQUE (service_id, team_id, agent_id, user_ref, type, key)
            )
            """,
            "CREATE INDEX memories_tsv ON memories USING gin (tsv)",
            """CREATE INDEX memories_scope_updated
                   ON memories (service_id, team_id, agent_id, user_ref, updated_at DESC)""",
            "CREATE INDEX memories_updated ON memories (updated_at DESC)",
            "CREATE INDEX memories_session ON memories (session_id) WHERE session_id IS NOT NULL",
        ),
    ),
    (
        2,
        (
            # The four scope columns go together (an agent belongs to one team): without
            # this the planner multiplies their selectivities, takes a scope holding half
            # the table for a small one and ANDs a bitmap of all of it into every search.
            """CREATE STATISTICS memories_scope (dependencies, ndistinct)
                   ON service_id, team_id, agent_id, user_ref FROM memories""",
            "ANALYZE memories",
        ),
    ),
    (
        3,
        (
            # Forget sticks: a forgotten record leaves a tombstone (its scope, type and key,
            # no text), and a row with that key is never inserted again, by any replica.
            """
            CREATE TABLE forgotten (
                service_id   text NOT NULL,
                team_id      text NOT NULL,
                agent_id     text NOT NULL,
                user_ref     text NOT NULL,
                type         text NOT NULL,
                key          text NOT NULL,
                forgotten_at double precision NOT NULL,
                PRIMARY KEY (service_id, team_id, agent_id, user_ref, type, key)
            )
            """,
            """
            CREATE FUNCTION memories_forgotten() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF EXISTS (SELECT 1 FROM forgotten f WHERE f.service_id = NEW.service_id
                        AND f.team_id = NEW.team_id AND f.agent_id = NEW.agent_id
                        AND f.user_ref = NEW.user_ref AND f.type = NEW.type
                        AND f.key = NEW.key) THEN
                    RETURN NULL;
                END IF;
                RETURN NEW;
            END $$
            """,
            """CREATE TRIGGER memories_forgotten BEFORE INSERT ON memories
                   FOR EACH ROW EXECUTE FUNCTION memories_forgotten()""",
        ),
    ),
    (
        4,
        (
            # Hybrid recall: each chunk's vector (memory.vectors), cached by its digest; gone
            # with its memory, and with its text when that changes. seq only grows (though
            # not in commit order: memory.vectors reads a stretch back again).
            """
            CREATE TABLE memory_vectors (
                seq       bigserial PRIMARY KEY,
                memory_id text NOT NULL REFERENCES memories (memory_id) ON DELETE CASCADE,
                chunk     integer NOT NULL,
                start_at  integer NOT NULL,
                end_at    integer NOT NULL,
                model     text NOT NULL,
                digest    text NOT NULL,
                vector    bytea NOT NULL,
                UNIQUE (memory_id, model, chunk)
            )
            """,
            "CREATE INDEX memory_vectors_digest ON memory_vectors (model, digest)",
            """CREATE FUNCTION ctxproxy_memory_text_changed() RETURNS trigger
               LANGUAGE plpgsql AS $$
               BEGIN
                   DELETE FROM memory_vectors WHERE memory_id = NEW.memory_id;
                   RETURN NEW;
               END $$""",
            """CREATE TRIGGER memories_text_changed AFTER UPDATE OF text ON memories
               FOR EACH ROW WHEN (OLD.text IS DISTINCT FROM NEW.text)
               EXECUTE FUNCTION ctxproxy_memory_text_changed()""",
        ),
    ),
    (
        5,
        (
            # GIN's fast update puts new entries in a pending list, unsorted, that every
            # search reads whole until a vacuum (or 4 MB of it) merges it into the index:
            # with memories written all the time, a probe of a few lexemes took 30-50 ms
            # (bench/RESULTS.md, Load). Written straight into the index, an insert costs a
            # little more (off the request path: episodes are stored in the background).
            "ALTER INDEX memories_tsv SET (fastupdate = off)",
            "SELECT gin_clean_pending_list('memories_tsv'::regclass)",
        ),
    ),
)
_LOCK, _VERSIONS = "ctxproxy.memory", "ctxproxy_migrations"  # the advisory lock, the versions table
_FORGET = """
WITH gone AS (
    DELETE FROM memories WHERE memory_id = ANY(%(ids)s)
    RETURNING service_id, team_id, agent_id, user_ref, type, key
), kept AS (
    INSERT INTO forgotten SELECT gone.*, %(now)s FROM gone ON CONFLICT DO NOTHING
)
SELECT count(*) FROM gone
"""

_COLUMNS = (
    "memory_id, type, service_id, team_id, agent_id, user_ref, key, text, session_id, "
    "turn_index, in_window, sources, attrs, created_at, updated_at, expires_at"
)
_UPSERT = f"""
INSERT INTO memories ({_COLUMNS})
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
RETURNING {_COLUMNS}
"""
_M_COLUMNS = ", ".join("m." + c.strip() for c in _COLUMNS.split(","))
_FILTERS = """m.service_id = %(service_id)s AND m.team_id = %(team_id)s
      AND m.agent_id = %(agent_id)s AND m.user_ref = %(user_ref)s
      AND m.type = ANY(%(types)s) AND (m.expires_at IS NULL OR m.expires_at > %(now)s)"""
# The question is parsed by the same configuration as the documents; its first 64 lexemes
# are OR-ed, since a question shares only some words with the memory that answers it.
# Which of these lexemes (tsquery operands) any memory holds: one GIN probe each.
_PRESENT = """
SELECT p.part FROM unnest(%(parts)s::text[]) AS p(part)
WHERE EXISTS (SELECT 1 FROM memories m WHERE m.tsv @@ p.part::tsquery)
"""
_PRESENCE_FACTOR = 4  # lexemes looked up at a time: this many times MAX_WORDS, rarest first
_LEXEMES = """
SELECT lexeme FROM unnest(to_tsvector('english'::regconfig, %s)) ORDER BY positions[1] LIMIT 64
"""
# How common each lexeme is, from the statistics ANALYZE (autovacuum) keeps for the planner.
_STATS = """
SELECT c.reltuples, s.most_common_elems::text::text[], s.most_common_elem_freqs
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stats s ON s.schemaname = n.nspname AND s.tablename = c.relname
    AND s.attname = 'tsv'
WHERE c.oid = 'memories'::regclass
"""
# Bounded as in the SQLite store (see memory.store_sqlite.bound): every match of the rarer
# lexemes (found through the GIN index alone: the scope index would add a bitmap of the
# whole scope), the newest matches of the commoner ones (a walk down the scope index), then
# ranked exactly: first how many of the question's lexemes a record holds, then ts_rank.
# The scope is part of each candidate query, before its cap: another scope's volume never
# fills the cap (one tenant hiding another's memories).
_RARE = f"""rare AS MATERIALIZED (
    SELECT m.memory_id FROM memories m WHERE m.tsv @@ %(rare)s::tsquery AND {_FILTERS}
    LIMIT %(cap)s
)"""
_RECENT = f"""recent AS MATERIALIZED (
    SELECT m.memory_id FROM memories m WHERE {_FILTERS} AND m.tsv @@ %(common)s::tsquery
    ORDER BY m.updated_at DESC LIMIT %(recent)s
)"""
_RANKED = f"""
SELECT {_M_COLUMNS}, ts_rank(d.v, %(all)s::tsquery, 1) AS score,
       (SELECT count(*) FROM unnest(%(parts)s::tsquery[]) AS p(part) WHERE d.v @@ p.part)
           AS coverage
FROM memories m
-- A row's tsvector decompressed once, not at each of its nine uses (a third of the ranking's
-- time for a thousand candidates of a few KB each).
CROSS JOIN LATERAL (SELECT m.tsv || ''::tsvector AS v OFFSET 0) AS d
-- An array, not a join: joined, the planner would rather read the whole scope than look up
-- the few candidates by key.
WHERE m.memory_id = ANY(ARRAY(SELECT memory_id FROM pool)) AND {_FILTERS}
ORDER BY coverage DESC, score DESC, m.updated_at DESC, m.memory_id DESC
LIMIT %(limit)s
"""
_STATS_TTL_S = 300.0
_VECTOR_SEQS = """
SELECT v.seq FROM memory_vectors v JOIN memories m ON m.memory_id = v.memory_id
WHERE v.seq > %(since)s AND v.model = %(model)s AND m.service_id = %(service_id)s
  AND m.team_id = %(team_id)s AND m.agent_id = %(agent_id)s AND m.user_ref = %(user_ref)s
"""
_VECTOR_ROWS = """
SELECT seq, memory_id, chunk, start_at, end_at, vector FROM memory_vectors
WHERE seq = ANY(%(seqs)s) ORDER BY seq
"""
_SPANS = f"""SELECT {_M_COLUMNS}, ARRAY(
    SELECT ARRAY[v.start_at, v.end_at] FROM memory_vectors v
    WHERE v.memory_id = m.memory_id AND v.model = %s ORDER BY v.chunk)
FROM memories m WHERE m.type IN ('episodic', 'semantic') AND m.memory_id > %s
ORDER BY m.memory_id LIMIT %s"""
_UNEMBEDDED = """FROM memories m WHERE m.type IN ('episodic', 'semantic') AND NOT EXISTS (
    SELECT 1 FROM memory_vectors v WHERE v.memory_id = m.memory_id AND v.model = %s)"""
# Retried: two replicas writing the same keys can still meet in a deadlock or a
# serialization failure; a second try then succeeds.
_RETRY_SQLSTATES = frozenset({"40P01", "40001"})
_MAX_QUERY_CHARS = 8000
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


class PostgresStore:
    """Memory records in PostgreSQL (``CTXPROXY_STORE_URL=postgresql://...``)."""

    def __init__(self, url: str, *, max_connections: int = 10, timeout_s: float = 5.0,
                 idle_check_s: float = IDLE_CHECK_S) -> None:
        self._url = url  # holds the password: never logged
        self._max = max_connections
        self._timeout_s = timeout_s
        self._idle = _IdleCheck(idle_check_s)
        self._pool: Pool | None = None
        self._stats: _Stats | None = None
        self._vectors = VectorIndex(reread=REREAD)

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
        order = sorted(range(len(memories)), key=lambda i: _conflict_key(memories[i]))
        params = [_params(memories[i]) for i in order]
        for attempt in range(3):
            try:
                stored = await self._upsert_rows(params)
                break
            except StoreError as exc:
                if attempt == 2 or _sqlstate(exc) not in _RETRY_SQLSTATES:
                    raise
        # A forgotten key (a tombstone) is not written: it has no row in ``stored``.
        at = {_conflict_key(m): n for n, m in enumerate(memories)}
        return sorted(stored, key=lambda m: at.get(_conflict_key(m), len(memories)))

    async def _upsert_rows(self, params: list[tuple[Any, ...]]) -> list[Memory]:
        stored: list[Memory] = []
        async with self._conn(atomic=True) as conn, conn.cursor() as cur:
            await cur.executemany(_UPSERT, params, returning=True)
            async for result in cur.results():
                row = await result.fetchone()
                if row is not None:
                    stored.append(_memory(row))
        return stored

    async def get(self, memory_id: str) -> Memory | None:
        async with self._conn() as conn:
            cur = await conn.execute(
                f"SELECT {_COLUMNS} FROM memories WHERE memory_id = %s", (memory_id,)
            )
            row = await cur.fetchone()
        return _memory(row) if row else None

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
            cur = await conn.execute(_LEXEMES, (_clean(query[:_MAX_QUERY_CHARS]),))
            lexemes = [str(row[0]) for row in await cur.fetchall()]
            if not lexemes:
                return []
            stats = await self._statistics(conn)
            rarest = sorted(range(len(lexemes)), key=lambda i: stats.rows(lexemes[i]))
            # The planner costs a tsvector match as next to free and would rather read the
            # whole table than the GIN index; every set read here is small by construction.
            await conn.execute("SET LOCAL enable_seqscan = off")
            # A lexeme no memory holds looks rarest of all to the statistics, and finds
            # nothing: a long prompt's new names and typos would leave the search empty.
            held: list[int] = []
            step = MAX_WORDS * _PRESENCE_FACTOR
            for at in range(0, len(rarest), step):  # the rarest first, until enough are held
                looked = rarest[at : at + step]
                # A lexeme the statistics list is held (as of the last ANALYZE): only the
                # rest are probed. GIN scans are bitmap scans, so a probe of a common lexeme
                # would read its whole posting list; a rare one's is short.
                unlisted = [_quote(lexemes[i]) for i in looked if lexemes[i] not in stats.freq]
                present: set[str] = set()
                if unlisted:
                    cur = await conn.execute(_PRESENT, {"parts": unlisted})
                    present = {str(row[0]) for row in await cur.fetchall()}
                held += [i for i in looked
                         if lexemes[i] in stats.freq or _quote(lexemes[i]) in present]
                if len(held) >= MAX_WORDS:
                    break
            if not held:
                return []
            chosen = [lexemes[i] for i in sorted(held[:MAX_WORDS])]
            plan = bound([round(stats.rows(lex)) for lex in chosen], BUDGET)
            params: dict[str, Any] = {
                "service_id": scope.service_id,
                "team_id": scope.team_id,
                "agent_id": scope.agent_id,
                "user_ref": scope.user,
                "types": list(types),
                "now": time.time() if now is None else now,
                "limit": limit,
                "all": " | ".join(_quote(lex) for lex in chosen),
                "parts": [_quote(lex) for lex in chosen],
                "rare": " | ".join(_quote(chosen[i]) for i in plan.rare),
                "common": " | ".join(_quote(chosen[i]) for i in plan.common),
                "cap": 2 * BUDGET,
                "recent": RECENT,
            }
            named = {"rare": _RARE} if plan.rare else {}
            if plan.common:
                named["recent"] = _RECENT
            union = " UNION ".join(f"SELECT memory_id FROM {name}" for name in named)
            ctes = [*named.values(), f"pool AS ({union})"]
            # Planned with the actual lexemes (no generic plan), so that the planner knows a
            # rare lexeme from a common one.
            cur = await conn.execute(
                f"WITH {', '.join(ctes)} {_RANKED}", params, prepare=False
            )
            rows = await cur.fetchall()
        hits = []
        for row in rows:
            score, matched = max(float(row[-2]), 0.0), int(row[-1])
            # In (0, 1) as in the SQLite store: the share of the question's words matched,
            # ts_rank breaking ties.
            relevance = (matched + score / (1.0 + score)) / (len(chosen) + 1)
            hits.append(Hit(_memory(row[:-2]), max(relevance, 1e-9)))
        return hits

    async def _statistics(self, conn: psycopg.AsyncConnection[TupleRow]) -> _Stats:
        """The lexeme statistics, read again every few minutes."""
        stats = self._stats
        # A table not analyzed yet is looked at again soon: it may be filling up.
        ttl = _STATS_TTL_S if stats is not None and stats.total else _STATS_TTL_S / 10
        if stats is None or time.monotonic() - stats.read_at > ttl:
            cur = await conn.execute(_STATS)
            row = await cur.fetchone()
            stats = _Stats.of(row)
            self._stats = stats
        return stats

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
            f"SELECT {_COLUMNS} FROM memories WHERE {' AND '.join(where)}"
            " ORDER BY updated_at DESC, memory_id DESC LIMIT %(limit)s"
        )
        async with self._conn() as conn:
            cur = await conn.execute(sql, params)
            rows = await cur.fetchall()
        return [_memory(row) for row in rows]

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

    async def put_vectors(self, rows: Sequence[VectorRow]) -> None:
        if not rows:
            return
        pairs = list(dict.fromkeys((r.memory_id, r.model) for r in rows))
        async with self._conn(atomic=True) as conn, conn.cursor() as cur:
            await cur.execute(
                "DELETE FROM memory_vectors v USING unnest(%s::text[], %s::text[]) AS d(id, model)"
                " WHERE v.memory_id = d.id AND v.model = d.model",
                ([p[0] for p in pairs], [p[1] for p in pairs]),
            )
            await cur.execute(
                "INSERT INTO memory_vectors (memory_id, chunk, start_at, end_at, model, digest,"
                " vector) SELECT r.* FROM unnest(%s::text[], %s::int[], %s::int[], %s::int[],"
                " %s::text[], %s::text[], %s::bytea[]) AS r(memory_id, chunk, s, e, model,"
                " digest, vector) WHERE EXISTS"
                " (SELECT 1 FROM memories m WHERE m.memory_id = r.memory_id)"
                " ON CONFLICT (memory_id, model, chunk) DO NOTHING",
                ([r.memory_id for r in rows], [r.chunk for r in rows],
                 [r.start for r in rows], [r.end for r in rows], [r.model for r in rows],
                 [r.digest for r in rows], [r.vector for r in rows]),
            )

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
                f"SELECT {_M_COLUMNS} {_UNEMBEDDED} AND m.memory_id > %s"
                " ORDER BY m.memory_id LIMIT %s", (model, after, limit),
            )
            rows = await cur.fetchall()
        return [_memory(row) for row in rows]

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
        return [(_memory(row[:-1]), [(int(a), int(b)) for a, b in row[-1]]) for row in rows]

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
        params: dict[str, Any] = {
            "since": self._vectors.since(scope, model), "model": model,
            "service_id": scope.service_id, "team_id": scope.team_id,
            "agent_id": scope.agent_id, "user_ref": scope.user,
        }
        async with self._conn(atomic=True) as conn:
            # A range of the seq index, whatever the statistics say (before ANALYZE has seen
            # the vectors, the planner read every one of them, 150 MB at 100k).
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
                f"SELECT {_M_COLUMNS} FROM memories m WHERE m.memory_id = ANY(%s)"
                # The copy may hold vectors of a text since changed (not embedded again yet).
                " AND EXISTS (SELECT 1 FROM memory_vectors v WHERE v.memory_id = m.memory_id"
                " AND v.model = %s)", ([m.memory_id for m in matches], model),
            )
            found = {
                m.memory_id: m for m in map(_memory, await cur.fetchall())
                if m.scope == scope and m.type in types
                and (m.expires_at is None or m.expires_at > at)
            }
        return [
            Hit(found[m.memory_id], max(m.similarity, 1e-9), m.similarity, (m.start, m.end))
            for m in matches if m.memory_id in found
        ][:limit]


@dataclass(frozen=True, slots=True)
class _Stats:
    """How many records hold a lexeme, as the table statistics estimate it."""

    total: float = 0.0  # 0: never analyzed, every lexeme counts as rare
    freq: dict[str, float] = field(default_factory=dict)  # the most common lexemes
    floor: float = 0.0  # the frequency under which a lexeme is not in ``freq``
    read_at: float = field(default_factory=time.monotonic)

    @classmethod
    def of(cls, row: Sequence[Any] | None) -> _Stats:
        if row is None or row[0] is None or float(row[0]) <= 0 or not row[1] or not row[2]:
            return cls()
        elems, freqs = list(row[1]), [float(f) for f in row[2]]
        # After one frequency per element: their minimum and maximum.
        floor = freqs[len(elems)] if len(freqs) > len(elems) else min(freqs, default=0.0)
        return cls(float(row[0]), dict(zip(elems, freqs, strict=False)), floor)

    def rows(self, lexeme: str) -> float:
        # A lexeme not in the list is rarer than its rarest: the planner guesses half that.
        return self.total * self.freq.get(lexeme, self.floor / 2)


def _quote(lexeme: str) -> str:
    """A lexeme as a tsquery operand, taken literally."""
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


def _clean(value: str) -> str:
    """PostgreSQL text cannot hold NUL; it becomes U+FFFD rather than failing the write."""
    return value.replace("\x00", "\ufffd")


def _conflict_key(m: Memory) -> tuple[str, ...]:
    s = m.scope
    return (s.service_id, s.team_id, s.agent_id, s.user, m.type, m.key)


def _params(m: Memory) -> tuple[Any, ...]:
    s = m.scope
    return (
        m.memory_id,
        m.type,
        s.service_id,
        s.team_id,
        s.agent_id,
        s.user,
        _clean(m.key),
        _clean(m.text),
        _clean(m.session_id) if m.session_id is not None else None,
        m.turn_index,
        m.in_window,
        list(m.sources),
        Jsonb(m.attrs),
        m.created_at,
        m.updated_at,
        m.expires_at,
    )


def _memory(row: Sequence[Any]) -> Memory:
    (memory_id, type_, service_id, team_id, agent_id, user, key, text, session_id,
     turn_index, in_window, sources, attrs, created_at, updated_at, expires_at) = row
    return Memory(
        type=type_,
        scope=Scope(service_id, team_id, agent_id, user),
        key=key,
        text=text,
        memory_id=memory_id,
        session_id=session_id,
        turn_index=turn_index,
        in_window=in_window,
        sources=list(sources),
        attrs=dict(attrs),
        created_at=created_at,
        updated_at=updated_at,
        expires_at=expires_at,
    )


def _sqlstate(exc: StoreError) -> str | None:
    cause = exc.__cause__
    return cause.sqlstate if isinstance(cause, psycopg.Error) else None


def schema() -> Schema:
    """The versions of ``MIGRATIONS`` as they stand when a store opens (a test may cut them
    short, to open a file as an older release left it)."""
    return Schema(_LOCK, _VERSIONS, MIGRATIONS)
