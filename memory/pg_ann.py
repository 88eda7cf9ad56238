"""Vector search in PostgreSQL itself, where the database has pgvector (the ``vector``
extension): each chunk's vector also in a ``vector`` column, an HNSW index (cosine) per
dimension, and hybrid recall's vector side one query by scope (``ORDER BY distance LIMIT``),
instead of a copy of the scope's vectors in every replica (memory.vectors.VectorIndex, what
the store does without the extension).

The column has no fixed dimension: a model of another size (a model change) gets an index of
its own (a partial index on ``vector_dims``), and a query only reads vectors of its own size
and model. Vectors longer than an HNSW index takes (MAX_DIMS) are left out of the column:
those are searched as without the extension.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import psycopg
from psycopg.rows import TupleRow

from ctxproxy.memory.model import Hit, MemoryType, Scope
from ctxproxy.memory.pg_schema import FILTERS, M_COLUMNS, memory_of
from ctxproxy.memory.vectors import VectorRow, unpack

__all__ = ["MAX_DIMS", "Ann", "literal"]

log = logging.getLogger("ctxproxy.memory")
Conn = psycopg.AsyncConnection[TupleRow]

MAX_DIMS = 2000  # the most dimensions pgvector's HNSW index takes for ``vector``
_EXTENSION = """SELECT n.nspname, e.extversion FROM pg_extension e
JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector'"""
_COLUMN = """SELECT 1 FROM pg_attribute
WHERE attrelid = 'memory_vectors'::regclass AND attname = 'embedding' AND NOT attisdropped"""
_BACKFILL_ROWS = 500  # vectors stored before the column was filled, converted at a time


def literal(vector: np.ndarray | bytes) -> str:
    """A vector as pgvector's text form (float32 values round-trip through their repr)."""
    values = unpack(vector) if isinstance(vector, bytes) else np.asarray(vector, np.float32)
    return "[" + ",".join(repr(float(x)) for x in values.tolist()) + "]"


class Ann:
    """The store's use of pgvector: ``ready`` once ``setup`` found (or created) the
    extension and the column; each method runs on a connection the store hands it."""

    def __init__(self) -> None:
        self.ready = False
        self._type = ""  # the qualified type, e.g. "public".vector
        self._ops = ""  # the qualified schema of its operators and functions
        self._iterative = False  # pgvector 0.8+: filtered HNSW scans go on until LIMIT rows
        self._indexed: set[int] = set()  # the dimensions whose index this process ensured

    @property
    def type(self) -> str:
        return self._type

    async def setup(self, conn: Conn) -> bool:
        """Use the extension if the database has it, else try to create it; without it
        (not installed, or CREATE EXTENSION not allowed) log once and stay off."""
        found = await (await conn.execute(_EXTENSION)).fetchone()
        if found is None:
            refused: psycopg.Error | None = None
            try:
                await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            except psycopg.Error as exc:
                refused = exc  # or another replica created it at the same moment
            found = await (await conn.execute(_EXTENSION)).fetchone()
            if found is None:
                log.info("pgvector: not available (%s): vectors are searched in process",
                         type(refused).__name__)
                return False
        schema, version = str(found[0]), str(found[1])
        quoted = '"' + schema.replace('"', '""') + '"'
        self._type, self._ops = f"{quoted}.vector", quoted
        self._iterative = tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) >= (0, 8)
        if await (await conn.execute(_COLUMN)).fetchone() is None:
            await conn.execute(
                f"ALTER TABLE memory_vectors ADD COLUMN IF NOT EXISTS embedding {self._type}")
            # What the column lacks, found at each open without reading every vector.
            await conn.execute("CREATE INDEX IF NOT EXISTS memory_vectors_unfilled"
                               " ON memory_vectors (seq) WHERE embedding IS NULL")
        await self._backfill(conn)
        self.ready = True
        log.info("pgvector %s: vectors are searched in the database", version)
        return True

    async def _backfill(self, conn: Conn) -> None:
        """Fill the column of the vectors stored before it was (by a release without it, or
        while the extension was missing), and index their dimensions."""
        after = -1
        while True:
            cur = await conn.execute(
                "SELECT seq, vector FROM memory_vectors WHERE embedding IS NULL AND seq > %s"
                " ORDER BY seq LIMIT %s", (after, _BACKFILL_ROWS))
            rows = await cur.fetchall()
            if not rows:
                return
            after = int(rows[-1][0])
            fit = [(int(s), bytes(v)) for s, v in rows if 0 < len(v) // 4 <= MAX_DIMS]
            for dim in {len(v) // 4 for _, v in fit}:
                await self.index(conn, dim)
            await conn.execute(
                f"UPDATE memory_vectors v SET embedding = r.e::{self._type}"
                " FROM unnest(%s::bigint[], %s::text[]) AS r(seq, e) WHERE v.seq = r.seq",
                ([s for s, _ in fit], [literal(v) for _, v in fit]))

    async def index(self, conn: Conn, dim: int) -> None:
        """The HNSW index of the vectors of ``dim`` dimensions (once per process)."""
        if dim in self._indexed or not 0 < dim <= MAX_DIMS:
            return
        try:
            await conn.execute(
                f"CREATE INDEX IF NOT EXISTS memory_vectors_hnsw_{int(dim)} ON memory_vectors"
                f" USING hnsw ((embedding::{self._type}({int(dim)}))"
                f" {self._ops}.vector_cosine_ops)"
                f" WHERE {self._ops}.vector_dims(embedding) = {int(dim)}")
        except psycopg.errors.UniqueViolation:
            pass  # another replica created it at the same moment
        self._indexed.add(dim)

    def unindexed(self, dims: Iterable[int]) -> set[int]:
        """Which of ``dims`` need ``index`` first (none while the extension is off)."""
        if not self.ready:
            return set()
        return {d for d in dims if d not in self._indexed and 0 < d <= MAX_DIMS}

    def embeddings(self, rows: Sequence[VectorRow]) -> list[str | None]:
        """Each row's column value (None: too long for an index, searched as without)."""
        return [literal(r.vector) if 0 < len(r.vector) // 4 <= MAX_DIMS else None
                for r in rows]

    def searches(self, vector: np.ndarray) -> bool:
        return self.ready and 0 < len(vector) <= MAX_DIMS

    async def search(
        self, conn: Conn, scope: Scope, vector: np.ndarray, model: str, *,
        types: Sequence[MemoryType], limit: int, now: float | None,
    ) -> list[Hit]:
        """The ``limit`` memories of ``scope`` whose best chunk is nearest ``vector``,
        nearest first; in a transaction of ``conn`` (its SET LOCAL ends with it)."""
        dim = len(vector)
        # A memory has several chunks: enough chunks to fill ``limit`` memories (as
        # memory.vectors.VectorIndex.top takes).
        wanted = 4 * limit + 16
        # The scope, types and expiry filter what the index finds: without iterative scans
        # (pgvector 0.8) a scan stops at ef_search candidates, most of another scope's.
        await conn.execute(f"SET LOCAL hnsw.ef_search = {min(1000, max(40, wanted))}")
        if self._iterative:
            await conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        distance = (f"v.embedding::{self._type}({dim}) OPERATOR({self._ops}.<=>)"
                    f" %(q)s::{self._type}({dim})")
        params: dict[str, Any] = {
            "q": literal(vector), "model": model, "wanted": wanted,
            "service_id": scope.service_id, "team_id": scope.team_id,
            "agent_id": scope.agent_id, "user_ref": scope.user, "types": list(types),
            "now": time.time() if now is None else now,
        }
        cur = await conn.execute(
            f"SELECT {M_COLUMNS}, v.start_at, v.end_at, {distance} AS distance"
            " FROM memory_vectors v JOIN memories m ON m.memory_id = v.memory_id"
            f" WHERE v.model = %(model)s AND {self._ops}.vector_dims(v.embedding) = {dim}"
            f" AND {FILTERS} ORDER BY distance LIMIT %(wanted)s", params)
        rows = await cur.fetchall()
        # relaxed_order: nearly in order; sorted here (ties by memory id, as stable).
        rows.sort(key=lambda r: (float(r[-1]), str(r[0])))
        out: dict[str, Hit] = {}
        for row in rows:
            memory = memory_of(row[:-3])
            if memory.memory_id in out:
                continue
            similarity = 1.0 - float(row[-1])
            out[memory.memory_id] = Hit(memory, max(similarity, 1e-9), similarity,
                                        (int(row[-3]), int(row[-2])))
            if len(out) == limit:
                break
        return list(out.values())
