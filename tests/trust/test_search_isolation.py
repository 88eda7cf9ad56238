"""One tenant's volume never hides another's memories: search is bounded within the scope."""

from __future__ import annotations

import pytest

from ctxproxy.memory.model import Memory, Scope, Store

OURS = Scope("svc", "team-a", "agent-1", "u_a")
THEIRS = Scope("svc", "team-b", "agent-1", "u_b")
T0 = 1_700_000_000.0


@pytest.mark.parametrize("ours_first", [True, False])
async def test_another_scopes_volume_does_not_push_a_memory_out_of_search(
    store: Store, ours_first: bool
) -> None:
    ours = Memory(type="episodic", scope=OURS, key="ours",
                  text="the deploy script lives in tools/ship.sh", created_at=T0, updated_at=T0)
    if ours_first:
        await store.upsert([ours])
    # Newer, many, and every one holds the question's words: past every cap a search has.
    noise = [
        Memory(type="episodic", scope=THEIRS, key=f"n{i}",
               text=f"deploy script run {i} for the other team", created_at=T0 + 10 + i,
               updated_at=T0 + 10 + i)
        for i in range(3000)
    ]
    for at in range(0, len(noise), 500):
        await store.upsert(noise[at : at + 500])
    if not ours_first:
        await store.upsert([ours])

    hits = await store.search(OURS, "where is the deploy script", now=T0 + 5000)

    assert [h.memory.key for h in hits] == ["ours"]
    theirs = await store.search(THEIRS, "where is the deploy script", limit=5, now=T0 + 5000)
    assert theirs and all(h.memory.scope == THEIRS for h in theirs)


async def test_a_store_from_before_scoped_search_is_migrated_and_searchable(tmp_path) -> None:
    import sqlite3

    from ctxproxy.memory import sqlite_schema, store_sqlite
    from ctxproxy.plumbing.sqlite import statements

    path = tmp_path / "memory.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    for version, script in sqlite_schema.MIGRATIONS[:2]:
        for statement in statements(script):
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {version}")
    conn.execute(
        "INSERT INTO memories (memory_id, type, service_id, team_id, agent_id, user_ref, key,"
        " text, created_at, updated_at) VALUES ('mem_old', 'episodic', 'svc', 'team-a',"
        " 'agent-1', 'u_a', 'k', 'the deploy script lives in tools/ship.sh', ?, ?)", (T0, T0))
    conn.close()

    store = store_sqlite.SqliteStore(path)
    await store.open()
    try:
        hits = await store.search(OURS, "deploy script", now=T0 + 1)
        assert [h.memory.memory_id for h in hits] == ["mem_old"]
        assert await store.search(THEIRS, "deploy script", now=T0 + 1) == []
    finally:
        await store.close()
