"""What the SQLite store adds to the shared contract: WAL, migrations, errors, two writers."""

from __future__ import annotations

import asyncio
import fcntl
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ctxproxy.memory import sqlite_conn
from ctxproxy.memory.model import Memory, Scope, StoreError
from ctxproxy.memory.sqlite_schema import MIGRATIONS
from ctxproxy.memory.store_sqlite import SqliteStore

SCOPE = Scope("svc")


def mem(key: str, text: str = "some text") -> Memory:
    return Memory(type="episodic", scope=SCOPE, key=key, text=text)


async def test_open_makes_the_folder_uses_wal_and_records_the_schema_version(
    tmp_path: Path,
) -> None:
    path = tmp_path / "deep" / "er" / "memory.sqlite3"
    store = SqliteStore(path)
    await store.open()
    await store.close()

    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == MIGRATIONS[-1][0]


async def test_reopening_keeps_the_records_and_migrates_nothing_twice(tmp_path: Path) -> None:
    path = tmp_path / "memory.sqlite3"
    first = SqliteStore(path)
    await first.open()
    (stored,) = await first.upsert([mem("k", "kept across restarts")])
    await first.close()

    again = SqliteStore(path)
    await again.open()
    assert await again.get(stored.memory_id) == stored
    assert [h.memory.key for h in await again.search(SCOPE, "restarts")] == ["k"]
    await again.close()


async def test_two_stores_on_one_file_converge_on_one_record_per_key(tmp_path: Path) -> None:
    path = tmp_path / "memory.sqlite3"
    a, b = SqliteStore(path), SqliteStore(path)
    await asyncio.gather(a.open(), b.open())
    batch = [mem(f"turn-{n}") for n in range(30)]
    await asyncio.gather(a.upsert(batch), b.upsert([mem(m.key) for m in batch]),
                         a.upsert(batch[::-1]))

    listed = await b.list(None, limit=100)
    assert sorted(m.key for m in listed) == sorted(m.key for m in batch)
    await a.close()
    await b.close()


async def test_a_second_store_on_the_file_leaves_the_first_ones_locks(tmp_path: Path) -> None:
    """Closing any descriptor of a file drops this process's POSIX locks on it, SQLite's too,
    so opening the second store must not close one. Else another process's connection takes
    itself for the file's last and deletes the WAL under the first store (seen as "file is
    not a database" in bench.recall once the searches had processes of their own)."""
    path = tmp_path / "memory.sqlite3"
    first = SqliteStore(path)
    await first.open()
    await first.upsert([mem("before")])
    second = SqliteStore(path)
    await second.open()
    await second.close()
    other_process = (f"import sqlite3; db = sqlite3.connect({str(path)!r}); "
                     "db.execute('SELECT count(*) FROM memories'); db.close()")
    subprocess.run([sys.executable, "-c", other_process], check=True)

    assert path.with_name(path.name + "-wal").exists()
    await first.upsert([mem("after")])
    assert sorted(m.key for m in await first.list(SCOPE)) == ["after", "before"]
    await first.close()


async def test_quick_reads_do_not_queue_behind_searches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStore(tmp_path / "memory.sqlite3")
    await store.open()
    (stored,) = await store.upsert([mem("k", "the release train leaves on tuesdays")])
    release = threading.Event()
    search = store._search

    def stuck(*args: object) -> object:
        release.wait(30)
        return search(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "_search", stuck)
    searches = [asyncio.ensure_future(store.search(SCOPE, "release train"))
                for _ in range(sqlite_conn.SEARCHERS + 1)]
    try:
        # Every search thread is busy: lists, gets and "stored" checks are answered anyway.
        listed = await asyncio.wait_for(store.list(SCOPE), 10)
        got = await asyncio.wait_for(store.get(stored.memory_id), 10)
        known = await asyncio.wait_for(store.stored(SCOPE, "episodic", ["k"]), 10)
    finally:
        release.set()
    assert [m.key for m in listed] == ["k"] and got == stored and known == {"k": False}
    assert [[h.memory.key for h in hits] for hits in await asyncio.gather(*searches)] == [
        ["k"]] * len(searches)
    await store.close()


async def test_writers_take_turns_on_a_lock_file_and_readers_never_wait(
    tmp_path: Path,
) -> None:
    """Workers sharing the file write one at a time under an flock on ``<file>.lock``."""
    path = tmp_path / "memory.sqlite3"
    store = SqliteStore(path)
    await store.open()
    await store.upsert([mem("kept", "written before the lock was taken")])
    other = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(other, fcntl.LOCK_EX)  # another worker, mid-write
    try:
        write = asyncio.ensure_future(store.upsert([mem("later", "written after")]))
        done, _ = await asyncio.wait([write], timeout=0.5)
        assert not done  # it waits for the other worker's write to end
        assert [m.key for m in await store.list(SCOPE)] == ["kept"]  # reads do not
    finally:
        fcntl.flock(other, fcntl.LOCK_UN)
        os.close(other)
    assert [m.key for m in await write] == ["later"]
    assert sorted(m.key for m in await store.list(SCOPE)) == ["kept", "later"]
    await store.close()


async def test_a_corrupt_row_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "memory.sqlite3"
    store = SqliteStore(path)
    await store.open()
    (stored,) = await store.upsert([mem("k")])
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE memories SET attrs = '{broken' WHERE key = 'k'")

    with pytest.raises(StoreError):
        await store.get(stored.memory_id)
    await store.close()


async def test_a_path_that_cannot_be_created_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    store = SqliteStore(blocker / "memory.sqlite3")
    with pytest.raises(StoreError):
        await store.open()
    with pytest.raises(StoreError):
        await store.list(None)


async def test_search_is_ranked_by_words_matched_then_bm25(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "memory.sqlite3")
    await store.open()
    await store.upsert([
        mem("both", "the database port is 5433"),
        mem("port", "port " * 5),
        mem("neither", "nothing to see"),
    ])
    hits = await store.search(SCOPE, "database port")
    assert [h.memory.key for h in hits] == ["both", "port"]
    assert 1 > hits[0].relevance > hits[1].relevance > 0
    await store.close()


async def test_each_record_keeps_its_length_in_characters_through_writes(tmp_path: Path) -> None:
    # A search weighs candidates by their length: the stored count follows the text.
    path = tmp_path / "memory.sqlite3"
    old = SqliteStore(path)
    with pytest.MonkeyPatch.context() as m:  # a store from before the column (version 6)
        m.setattr("ctxproxy.memory.sqlite_schema.MIGRATIONS", [v for v in MIGRATIONS if v[0] < 6])
        await old.open()
        await old.upsert([mem("before", "written before the column: ünïcode")])
        await old.close()
    store = SqliteStore(path)
    await store.open()
    try:
        await store.upsert([mem("a", "short"), mem("b", "€ twelve chars")])
        await store.upsert([mem("a", "a longer text than before")])
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT key, chars, length(text) FROM memories").fetchall()
    assert len(rows) == 3 and all(chars == length for _, chars, length in rows), rows


async def test_among_more_matches_alike_than_it_reranks_a_search_keeps_the_shorter(
    tmp_path: Path,
) -> None:
    # 60 records say "zebra" once; the 30 long ones are newer, so that a ranking which lost
    # sight of length would hand the newest (long) ones to the rerank and return them.
    store = SqliteStore(tmp_path / "memory.sqlite3")
    await store.open()
    try:
        short = [Memory(type="episodic", scope=SCOPE, key=f"s{i}", text=f"zebra note {i}",
                        created_at=1000.0 + i, updated_at=1000.0 + i) for i in range(30)]
        long = [Memory(type="episodic", scope=SCOPE, key=f"l{i}",
                       text=f"zebra {i} " + "filler words of a long tool output " * 100,
                       created_at=2000.0 + i, updated_at=2000.0 + i) for i in range(30)]
        await store.upsert([*short, *long])
        hits = await store.search(SCOPE, "zebra", limit=20, now=3000.0)
    finally:
        await store.close()
    assert len(hits) == 20 and all(h.memory.key.startswith("s") for h in hits), [
        h.memory.key for h in hits]


async def test_the_full_text_index_stays_in_few_segments_under_single_writes(
    tmp_path: Path,
) -> None:
    # Every write transaction adds a segment, and a search reads each segment for each of its
    # words: the store merges as it writes (FTS5's automerge alone reached 16 here).
    path = tmp_path / "memory.sqlite3"
    store = SqliteStore(path)
    await store.open()
    segments = []
    try:
        with sqlite3.connect(path) as conn:
            for n in range(800):
                await store.upsert([mem(f"turn-{n}", f"turn {n} touched ledger/posting_{n}.py")])
                if n % 25 == 24:
                    segments.append(conn.execute(
                        "SELECT count(DISTINCT segid) FROM memories_fts_idx").fetchone()[0])
        await store.upsert([mem("turn-7", "rewritten: working memory changes its text")])
        assert (await store.search(SCOPE, "posting_123"))[0].memory.key == "turn-123"
        assert [h.memory.key for h in await store.search(SCOPE, "rewritten")] == ["turn-7"]
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO memories_fts (memories_fts) VALUES ('integrity-check')")
    assert max(segments) <= 8, segments


async def test_a_store_from_before_the_index_without_positions_finds_the_same(
    tmp_path: Path,
) -> None:
    # Version 7 rebuilds the full-text index without positions: what a search found before
    # it finds after, and the records written since are found too.
    path = tmp_path / "memory.sqlite3"
    old = SqliteStore(path)
    with pytest.MonkeyPatch.context() as m:
        m.setattr("ctxproxy.memory.sqlite_schema.MIGRATIONS", [v for v in MIGRATIONS if v[0] < 7])
        await old.open()
        await old.upsert([mem("port", "the database port is 5433"),
                          mem("other", "the cache is warm")])
        before = [h.memory.key for h in await old.search(SCOPE, "database port")]
        await old.close()
    store = SqliteStore(path)
    await store.open()
    try:
        assert [h.memory.key for h in await store.search(SCOPE, "database port")] == before
        await store.upsert([mem("new", "the database moved to port 6000")])
        assert {h.memory.key for h in await store.search(SCOPE, "database port")} == {
            "port", "new"}
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'memories_fts'").fetchone()
    assert "detail='column'" in sql[0]


async def test_words_the_index_splits_or_drops_are_searched_as_it_indexed_them(
    tmp_path: Path,
) -> None:
    # U+19B0 is a letter to Python and a separator to SQLite's Unicode 6.1 tables: the index
    # holds "ab" and "cd", and without positions it cannot match them as a phrase.
    store = SqliteStore(tmp_path / "memory.sqlite3")
    await store.open()
    try:
        await store.upsert([mem("split", "deploy ab\u19b0cd today"), mem("plain", "deploy later")])
        assert [h.memory.key for h in await store.search(SCOPE, "ab\u19b0cd")] == ["split"]
        assert await store.search(SCOPE, "\u19b0\u19b1") == []  # no token of the index's
        assert {h.memory.key for h in await store.search(SCOPE, "deploy \u19b0")} == {
            "split", "plain"}
    finally:
        await store.close()
