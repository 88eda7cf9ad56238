"""Vector search in PostgreSQL with pgvector (memory/pg_ann.py): what it finds, against the
exact search of a store that keeps a copy in process. Each test skips when the database has
no ``vector`` extension (CI installs PostgreSQL from Debian's packages: no pgvector)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import numpy as np
import pytest

from ctxproxy.config import Settings
from ctxproxy.memory.model import Hit, Memory, MemoryType, Scope
from ctxproxy.memory.store_pg import PostgresStore
from ctxproxy.memory.stores import make_store
from ctxproxy.memory.vectors import VectorRow, pack

pytestmark = pytest.mark.postgres

SCOPE = Scope("svc", "team-a", "agent-1", "u_1")
OTHER = replace(SCOPE, user="u_2")
T0 = 1_700_000_000.0
MODEL = "test-embedder"


@pytest.fixture
async def stores(pg_url: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    """A store searching with pgvector, and one on the same tables searching in process."""
    ann, exact = PostgresStore(pg_url), PostgresStore(pg_url, pgvector=False)
    await ann.open()
    await exact.open()
    try:
        if not ann.pgvector:
            pytest.skip("pgvector: the database has no `vector` extension and this role may"
                        " not create it (CREATE EXTENSION vector, as a superuser)")
        assert not exact.pgvector
        yield ann, exact
    finally:
        await ann.close()
        await exact.close()


def _unit(rng: np.random.Generator, dim: int) -> np.ndarray:
    vector = rng.standard_normal(dim).astype(np.float32)
    return vector / np.linalg.norm(vector)


async def _store(store: PostgresStore, rng: np.random.Generator, n: int, *, scope: Scope = SCOPE,
                 dim: int = 8, model: str = MODEL, prefix: str = "m") -> list[Memory]:
    """``n`` memories of 1 to 3 chunks each, random vectors; every fifth one expired, every
    seventh one semantic."""
    memories = [
        Memory(type="semantic" if i % 7 == 3 else "episodic", scope=scope,
               key=f"{prefix}{i}", text="x" * 40, created_at=T0, updated_at=T0,
               expires_at=T0 - 1 if i % 5 == 4 else None)
        for i in range(n)
    ]
    stored = await store.upsert(memories)
    rows = [VectorRow(m.memory_id, c, 10 * c, 10 * c + 10, model, f"{m.key}-{c}-{model}",
                      pack(_unit(rng, dim)))
            for i, m in enumerate(stored) for c in range(1 + i % 3)]
    await store.put_vectors(rows)
    return stored


def _seen(hits: list[Hit]) -> list[tuple[str, tuple[int, int] | None]]:
    return [(h.memory.memory_id, h.span) for h in hits]


async def test_pgvector_finds_what_the_exact_search_finds_without_a_copy_in_process(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    ann, exact = stores
    rng = np.random.default_rng(7)
    await _store(ann, rng, 60)
    await _store(ann, rng, 60, scope=OTHER, prefix="o")
    types: list[tuple[MemoryType, ...]] = [("episodic", "semantic"), ("episodic",)]
    for n in range(12):
        query, kinds = _unit(rng, 8), types[n % 2]
        found = await ann.vector_search(SCOPE, query, MODEL, types=kinds, limit=5, now=T0)
        # All of the scope ranked (the copy's top 2 * limit is filtered after).
        expected = (await exact.vector_search(SCOPE, query, MODEL, types=kinds, limit=60,
                                              now=T0))[:5]
        assert len(found) == 5
        assert _seen(found) == _seen(expected)
        assert [h.similarity for h in found] == pytest.approx(
            [h.similarity for h in expected], abs=1e-5)
        assert all(h.memory.scope == SCOPE and h.memory.type in kinds for h in found)
        assert all(h.memory.expires_at is None for h in found)
    assert ann._vectors.nbytes == 0  # nothing of the scope's vectors held by this process
    assert exact._vectors.nbytes > 0


async def test_another_scopes_nearer_vectors_are_never_returned(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    ann, _ = stores
    rng = np.random.default_rng(11)
    query = _unit(rng, 8)
    # Many vectors of another scope nearer the question than any of this scope's: a filter
    # applied after an index scan that stops early would find nothing of this scope.
    others = await ann.upsert([
        Memory(type="episodic", scope=OTHER, key=f"o{i}", text="y" * 20, created_at=T0,
               updated_at=T0) for i in range(300)])
    near = [query + 0.01 * _unit(rng, 8) for _ in others]
    await ann.put_vectors([VectorRow(m.memory_id, 0, 0, 20, MODEL, f"o{i}",
                                     pack(v / np.linalg.norm(v)))
                           for i, (m, v) in enumerate(zip(others, near, strict=True))])
    mine = await _store(ann, rng, 6)

    found = await ann.vector_search(SCOPE, query, MODEL, limit=3, now=T0)

    live = {m.memory_id for m in mine if m.expires_at is None}
    assert len(found) == 3
    assert {h.memory.memory_id for h in found} <= live
    assert all(h.memory.scope == SCOPE for h in found)


async def test_vectors_of_another_model_and_size_are_searched_apart(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    ann, exact = stores
    rng = np.random.default_rng(5)
    await _store(ann, rng, 20, dim=8)
    # A model change: vectors of another size beside the old ones.
    await _store(ann, rng, 20, dim=4, model="new-model", prefix="n")
    query = _unit(rng, 4)

    found = await ann.vector_search(SCOPE, query, "new-model", limit=4, now=T0)
    expected = (await exact.vector_search(SCOPE, query, "new-model", limit=20, now=T0))[:4]

    assert len(found) == 4
    assert _seen(found) == _seen(expected)
    assert all(h.memory.key.startswith("n") for h in found)
    assert await ann.vector_search(SCOPE, _unit(rng, 8), MODEL, limit=2, now=T0)


async def test_vectors_stored_before_pgvector_are_searched_once_it_is_on(
    pg_url: str, stores: tuple[PostgresStore, PostgresStore],
) -> None:
    ann, exact = stores
    rng = np.random.default_rng(3)
    await _store(exact, rng, 20)  # written without the column (as by an older release)
    query = _unit(rng, 8)
    assert await ann.vector_search(SCOPE, query, MODEL, limit=3, now=T0) == []

    reopened = PostgresStore(pg_url)
    await reopened.open()  # fills the column of the vectors stored without it
    try:
        found = await reopened.vector_search(SCOPE, query, MODEL, limit=3, now=T0)
    finally:
        await reopened.close()
    expected = (await exact.vector_search(SCOPE, query, MODEL, limit=20, now=T0))[:3]
    assert len(found) == 3
    assert _seen(found) == _seen(expected)


async def test_replicas_opening_together_all_search_with_pgvector(
    pg_url: str, stores: tuple[PostgresStore, PostgresStore],
) -> None:
    _, exact = stores
    await _store(exact, np.random.default_rng(9), 10)  # vectors the replicas fill at open
    replicas = [PostgresStore(pg_url) for _ in range(3)]
    await asyncio.gather(*(r.open() for r in replicas))
    try:
        assert all(r.pgvector for r in replicas)
        query = _unit(np.random.default_rng(10), 8)
        found = [_seen(await r.vector_search(SCOPE, query, MODEL, limit=3, now=T0))
                 for r in replicas]
    finally:
        await asyncio.gather(*(r.close() for r in replicas))
    assert found[0] and found[0] == found[1] == found[2]


async def test_the_setting_off_keeps_the_search_in_process_where_the_extension_is(
    stores: tuple[PostgresStore, PostgresStore], pg_url: str,
) -> None:
    """``CTXPROXY_MEMORY_PGVECTOR=false`` reaches the store ``make_store`` builds: on a
    database with the extension (the fixture skips otherwise) it searches in process."""
    ann, _ = stores
    assert ann.pgvector
    for on in (False, True):
        store = make_store(Settings(store_url=pg_url, memory_pgvector=on))
        assert isinstance(store, PostgresStore)
        await store.open()
        try:
            assert store.pgvector is on
        finally:
            await store.close()
