"""A PostgreSQL connection pool whose schema is brought up to date before it opens, and the
``LISTEN``/``NOTIFY`` pair replicas announce changes to each other with.

Each side keeps its own versions table and advisory lock in the one database
(``CTXPROXY_STORE_URL``), so that the memory store and the ledger migrate independently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

__all__ = ["Connection", "Listener", "Pool", "Schema", "connect_timeout", "migrate", "notify",
           "open_pool"]

log = logging.getLogger("ctxproxy.pg")
_CHANNEL = re.compile(r"[a-z_][a-z0-9_]{0,62}")  # a channel is an identifier: never quoted

Connection = psycopg.AsyncConnection[TupleRow]
Pool = AsyncConnectionPool[Connection]
Migrations = Sequence[tuple[int, Sequence[str]]]


@dataclass(frozen=True, slots=True)
class Schema:
    """A side's versioned schema: append versions, never edit an applied one."""

    lock: str  # the advisory lock's name ('ctxproxy.memory'); a constant, never user input
    table: str  # the table that records the versions applied
    migrations: Migrations


def connect_timeout(timeout_s: float) -> int:
    """libpq's connect_timeout, whole seconds and at least one."""
    return max(1, round(timeout_s))


async def migrate(url: str, schema: Schema, *, timeout_s: float) -> None:
    """Apply the versions of ``schema`` the database has not had yet, on a connection of its
    own, in one transaction under an advisory lock: replicas starting together apply each
    version once; the others wait, then find nothing left to do. Raises psycopg.Error,
    OSError."""
    conn = await psycopg.AsyncConnection.connect(url, connect_timeout=connect_timeout(timeout_s))
    async with conn, conn.transaction():
        await conn.execute(
            f"SELECT pg_advisory_xact_lock(hashtext('{schema.lock}:' || current_schema()))"
        )
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {schema.table} ("
            " version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        cur = await conn.execute(f"SELECT coalesce(max(version), 0) FROM {schema.table}")
        row = await cur.fetchone()
        current = int(row[0]) if row else 0
        for version, statements in schema.migrations:
            if version <= current:
                continue
            for statement in statements:
                await conn.execute(statement)
            await conn.execute(f"INSERT INTO {schema.table} (version) VALUES (%s)", (version,))


async def open_pool(
    url: str,
    schema: Schema,
    *,
    max_size: int,
    timeout_s: float,
    check: Callable[[Connection], Awaitable[None]] = AsyncConnectionPool.check_connection,
    autocommit: bool = False,
) -> Pool:
    """Run ``schema``'s pending migrations, then open a pool of 1 to ``max_size``
    connections (each checked by ``check`` when handed out; ``autocommit``: a statement on
    its own commits on its own). Raises psycopg.Error, OSError: the caller's to map."""
    kwargs: dict[str, Any] = {"connect_timeout": connect_timeout(timeout_s)}
    if autocommit:
        kwargs["autocommit"] = True
    pool: Pool = AsyncConnectionPool(
        url, min_size=1, max_size=max_size, open=False, timeout=timeout_s, check=check,
        kwargs=kwargs,
    )
    try:
        await migrate(url, schema, timeout_s=timeout_s)
        await pool.open(wait=True, timeout=timeout_s)
    except BaseException:
        await pool.close()
        raise
    return pool


def notify(url: str, channel: str, payload: str, *, timeout_s: float = 5.0) -> None:
    """Send ``payload`` to every connection listening on ``channel`` (the command line's side:
    a connection of its own, closed at once). Raises psycopg.Error, OSError."""
    with psycopg.connect(url, autocommit=True, connect_timeout=connect_timeout(timeout_s)) as c:
        c.execute("SELECT pg_notify(%s, %s)", (channel, payload))


class Listener:
    """``LISTEN`` on ``channel`` on a connection of its own, calling ``heard(payload)`` for each
    notification, on the loop. The connection is made again after a failure (every
    ``retry_s``); ``heard(None)`` then says that notifications may have been missed, and is
    also called once the first connection listens (anything before it was missed too).
    Owned by the app: ``start`` in its cleanup context, ``close`` at its end."""

    def __init__(self, url: str, channel: str, heard: Callable[[str | None], None], *,
                 timeout_s: float = 5.0, retry_s: float = 1.0) -> None:
        if not _CHANNEL.fullmatch(channel):
            raise ValueError(f"not a channel name: {channel!r}")
        self._url = url  # holds the password: never logged
        self._channel = channel
        self._heard = heard
        self._timeout_s = timeout_s
        self._retry_s = retry_s
        self._task: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()  # set while a connection listens (tests wait on it)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"ctxproxy-listen-{self._channel}")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        failing = False
        while True:
            try:
                await self._listen()
            except (psycopg.Error, OSError) as exc:
                if self.listening.is_set() or not failing:  # once until it listens again
                    log.warning("not listening on %s, retrying: %s", self._channel,
                                type(exc).__name__)
                failing = True
            self.listening.clear()
            await asyncio.sleep(self._retry_s)

    async def _listen(self) -> None:
        # Keepalives: an idle connection whose server went away is noticed within a minute.
        conn = await psycopg.AsyncConnection.connect(
            self._url, autocommit=True, connect_timeout=connect_timeout(self._timeout_s),
            keepalives=1, keepalives_idle=30, keepalives_interval=10, keepalives_count=3)
        async with conn:
            await conn.execute(f"LISTEN {self._channel}")
            self.listening.set()
            self._heard(None)
            async for note in conn.notifies():
                self._heard(note.payload)
