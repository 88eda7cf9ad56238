"""An SQLite file's set-up: created owner-only, in WAL, its pragmas set and its schema
migrated (``PRAGMA user_version``), and write transactions that take the lock at once."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ctxproxy.config.files import private_file

__all__ = ["SYNC_NORMAL", "immediate", "migrate", "open_file", "statements", "wal"]

# In WAL, a commit is durable once the next checkpoint has run: a power cut may lose the
# last writes, never corrupt the file.
SYNC_NORMAL = "PRAGMA synchronous=NORMAL"


def open_file(
    path: Path,
    busy_timeout_s: float,
    *,
    pragmas: Iterable[str] = (),
    setup: Callable[[sqlite3.Connection], None] = lambda conn: None,
) -> sqlite3.Connection:
    """A connection to ``path`` (the file and its folder created owner-only when missing),
    for any thread, in autocommit mode (transactions are asked for: ``immediate``), switched
    to WAL, then ``pragmas`` run and ``setup`` called (the migrations); closed again when
    any of them raises. Raises OSError (the file or its folder), sqlite3.Error."""
    private_file(path)  # owner-only, as every file of the data directory
    conn = sqlite3.connect(
        path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
    )
    try:
        wal(conn, busy_timeout_s)
        for pragma in pragmas:
            conn.execute(pragma)
        setup(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def wal(conn: sqlite3.Connection, wait_s: float) -> None:
    """Switch an SQLite file to WAL. Changing the journal mode does not wait on the busy
    handler: opening a new file while another process migrates it fails at once with
    "database is locked", so that is retried for as long as a busy wait (``wait_s``) would
    last."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A write transaction that takes the file's write lock at its start (``BEGIN
    IMMEDIATE``: two writers never both read, then both try to write): committed when the
    block ends, rolled back when it raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # a failed COMMIT may have rolled back already
            conn.execute("ROLLBACK")
        raise


def migrate(conn: sqlite3.Connection, migrations: Iterable[tuple[int, Sequence[str] | str]]
            ) -> None:
    """Apply the versions of ``migrations`` that ``conn``'s file has not had yet (its
    ``PRAGMA user_version``), in one transaction: two processes opening one new file apply
    each version once. A version is its statements, or one script of them (``statements``)."""
    with immediate(conn):
        current = int(conn.execute("PRAGMA user_version").fetchone()[0])
        for version, script in migrations:
            if version <= current:
                continue
            for statement in statements(script) if isinstance(script, str) else script:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {int(version)}")


def statements(script: str) -> list[str]:
    """Split a script into statements (executescript would commit our transaction)."""
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
