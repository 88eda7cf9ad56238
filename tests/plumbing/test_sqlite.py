"""An SQLite file's set-up: owner-only, WAL, its pragmas, migrations applied once."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest

from ctxproxy.plumbing.sqlite import SYNC_NORMAL, immediate, migrate, open_file, statements

MIGRATIONS: tuple[tuple[int, tuple[str, ...] | str], ...] = (
    (1, ("CREATE TABLE t (n INTEGER)", "INSERT INTO t VALUES (1)")),
    (2, "INSERT INTO t VALUES (2);\nINSERT INTO t VALUES (';');\n"),  # a script, split
)


def test_a_new_file_is_private_in_wal_with_its_pragmas_and_migrated(tmp_path: Path) -> None:
    path = tmp_path / "new" / "f.sqlite3"
    conn = open_file(path, 5.0, pragmas=(SYNC_NORMAL,), setup=lambda c: migrate(c, MIGRATIONS))
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
        assert [r[0] for r in conn.execute("SELECT n FROM t")] == [1, 2, ";"]
    finally:
        conn.close()


def test_reopening_applies_no_version_twice(tmp_path: Path) -> None:
    path = tmp_path / "f.sqlite3"
    for _ in range(2):
        open_file(path, 5.0, setup=lambda c: migrate(c, MIGRATIONS)).close()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 3
    conn.close()


def test_a_failed_setup_closes_the_connection_and_raises(tmp_path: Path) -> None:
    def broken(conn: sqlite3.Connection) -> None:
        migrate(conn, ((1, ("CREATE TABLE t (n)", "SELECT no_such_column")),))

    with pytest.raises(sqlite3.OperationalError):
        open_file(tmp_path / "f.sqlite3", 5.0, setup=broken)
    conn = sqlite3.connect(tmp_path / "f.sqlite3")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 0  # rolled back, table too
    assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
    conn.close()


def test_immediate_commits_at_the_end_and_rolls_back_on_a_raise(tmp_path: Path) -> None:
    conn = open_file(tmp_path / "f.sqlite3", 5.0, setup=lambda c: migrate(c, MIGRATIONS[:1]))
    with immediate(conn):
        conn.execute("INSERT INTO t VALUES (7)")
    with pytest.raises(RuntimeError), immediate(conn):
        conn.execute("INSERT INTO t VALUES (8)")
        raise RuntimeError("undone")
    assert not conn.in_transaction
    assert [r[0] for r in conn.execute("SELECT n FROM t ORDER BY n")] == [1, 7]
    conn.close()


def test_a_script_splits_into_whole_statements() -> None:
    assert statements("CREATE TABLE a (s TEXT DEFAULT ';');\nSELECT 1;\n") == [
        "CREATE TABLE a (s TEXT DEFAULT ';');", "SELECT 1;"]
