"""The SQLite memory store's threads and their connections to the file.

sqlite3 blocks, so every call runs off the event loop: writes on one writer thread (which
also serialises them), reads on reader threads with read-only connections of their own
(in WAL they never wait for a write). Every sqlite error leaves a thread as ``StoreError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import orjson

from ctxproxy.config.files import WriteLock
from ctxproxy.memory.lanes import Lane
from ctxproxy.memory.model import StoreError
from ctxproxy.memory.sqlite_schema import migrate, scope_token
from ctxproxy.plumbing.sqlite import SYNC_NORMAL, immediate, open_file

__all__ = ["READERS", "SEARCHERS", "Threads", "guarded", "read_only"]

T = TypeVar("T")

_BUSY_TIMEOUT_S = 5.0
_CACHE_KIB = 32 * 1024
# Each write transaction adds a segment to the full-text index, and a search reads every
# segment for each of its words. FTS5's own merging (automerge) lags behind single-row writes,
# and segments pile up in a load run's store. Merging up to 16 pages at the end of each write
# keeps them few, for a little more CPU a write and a faster search (bench/RESULTS.md, Load).
_FTS_MERGE = "INSERT INTO memories_fts (memories_fts, rank) VALUES ('merge', 16)"
# Reader threads (and connections) per store, in two lanes: full-text searches (a few ms of
# SQLite each, one per turn) and the quick reads (list, get, stored: a turn makes several),
# which would otherwise queue behind other turns' searches.
READERS = 2
SEARCHERS = 2


class Threads:
    """A store's threads, each with its connection to the file at ``path``: the writer (one
    thread, under the processes' write lock) and two lanes of readers (``READERS`` for the
    quick reads, ``SEARCHERS`` for full-text searches)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._executor: Lane | None = None
        # Reads (search, list, get, stored) on connections of their own, one per reader
        # thread: in WAL they never wait for a write, nor a turn's recall for the writes and
        # the other sessions' reads queued on the one writer thread.
        self._readers: Lane | None = None
        self._searchers: Lane | None = None
        self._reader_conns: list[sqlite3.Connection] = []
        self._local = threading.local()  # each thread's connection
        self._lock = WriteLock(self.path)  # one writing process at a time (WORKERS)

    async def open(self) -> None:
        """Start the threads, open the file (creating it and its folder) and run pending
        migrations. On StoreError the caller closes."""
        if self._executor is None:
            # Lanes: each serves the oldest user turn's work first, and episode writes
            # after a turn's own (memory.lanes).
            self._executor = Lane(1, "ctxproxy-sqlite")
            self._readers = Lane(READERS, "ctxproxy-sqlite-read")
            self._searchers = Lane(SEARCHERS, "ctxproxy-sqlite-search")
        self._conn = await self.run(self._connect)

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = open_file(self.path, _BUSY_TIMEOUT_S, pragmas=(
                SYNC_NORMAL,
                # A search touches a few thousand rows and index pages spread over the file;
                # SQLite's default page cache (2 MiB) made each touch a copy from the OS cache.
                f"PRAGMA cache_size=-{_CACHE_KIB}",
            ), setup=migrate)
        except OSError as exc:
            raise StoreError(f"sqlite: cannot create {self.path}: {exc}") from exc
        self._local.conn = conn
        return conn

    def _reader(self) -> sqlite3.Connection:
        """This reader thread's connection, opened on its first read (after the migrations)."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = read_only(self.path)
            self._reader_conns.append(conn)
        return conn

    async def close(self, after_reads: Callable[[], Awaitable[None]] | None = None) -> None:
        """Stop the readers, then the writer once the writes queued are done.
        ``after_reads``: awaited once no read is running, before the writer stops."""
        conn, self._conn = self._conn, None
        executor, self._executor = self._executor, None
        lanes, self._readers, self._searchers = (self._readers, self._searchers), None, None
        for lane in lanes:
            if lane is not None:
                await asyncio.to_thread(lane.shutdown, wait=True)
        for reader in self._reader_conns:
            reader.close()
        self._reader_conns.clear()
        if after_reads is not None:
            await after_reads()
        if executor is None:
            return
        # After the writes still queued (a lane serves by due time, not arrival).
        if conn is not None:
            await asyncio.wrap_future(executor.submit_last(conn.close))
        await asyncio.wrap_future(executor.submit_last(self._lock.close))
        executor.shutdown(wait=False)

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run ``fn(*args)`` on the writer thread; sqlite errors become StoreError."""
        return self._on(self._executor, fn, *args)

    def read(self, fn: Callable[..., T], *args: Any, search: bool = False) -> asyncio.Future[T]:
        """Run the read ``fn(*args)`` on a reader thread (of the search lane when
        ``search``); as ``run`` otherwise."""

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
                return loop.run_in_executor(executor, guarded, fn, *args)
            except RuntimeError as exc:  # the lane is shut down
                failure = StoreError(f"sqlite: the memory store is closing: {exc}")
        failed: asyncio.Future[T] = loop.create_future()
        failed.set_exception(failure)
        return failed

    @contextlib.contextmanager
    def writing(self) -> Iterator[sqlite3.Connection]:
        """A write transaction on the writer's connection, under the processes' write lock:
        committed when the block ends, rolled back when it raises."""
        db = self.db()
        with self._lock, immediate(db):
            yield db
            db.execute(_FTS_MERGE)

    def db(self) -> sqlite3.Connection:
        """The calling thread's connection: the writer's, or a reader's."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if self._conn is None or conn is None:
            raise StoreError("sqlite: the memory store is not open")
        return conn


def guarded(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, its sqlite errors as StoreError (in the thread that runs it)."""
    try:
        return fn(*args)
    except (sqlite3.Error, OSError) as exc:  # OSError: the write lock's file
        raise StoreError(f"sqlite: {exc}") from exc
    except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
        raise StoreError(f"sqlite: a row could not be read: {exc}") from exc


def read_only(path: Path | str) -> sqlite3.Connection:
    """A reader's connection (a thread's, or a search process's)."""
    conn = sqlite3.connect(path, timeout=_BUSY_TIMEOUT_S, isolation_level=None,
                           check_same_thread=False)
    conn.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
    conn.execute("PRAGMA query_only=1")
    conn.create_function("ctxproxy_scope_token", 4, scope_token, deterministic=True)
    return conn
