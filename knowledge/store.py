"""The embedded core's SQLite catalogue: wikis, their pages (FTS5 indexed), agent bindings.

Synchronous and short: the server calls it through ``asyncio.to_thread``, the CLI directly.
One connection behind a lock; WAL so that the CLI can write while a server reads, and
several server processes (``CTXPROXY_WORKERS``) share the file, each write waiting up to
the busy timeout for the others'.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from knowledge.wiki import Page

__all__ = ["FILENAME", "Catalogue", "SyncResult"]

FILENAME = "knowledge.sqlite3"
_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"
_BUSY_TIMEOUT_S = 5.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS knowledge (
    knowledge_id TEXT PRIMARY KEY,
    service_id TEXT NOT NULL,
    team_id TEXT NOT NULL,
    type TEXT NOT NULL,
    name TEXT NOT NULL,
    summary TEXT,
    source TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    UNIQUE (service_id, team_id, source)
);
CREATE TABLE IF NOT EXISTS pages (
    id INTEGER PRIMARY KEY,
    knowledge_id TEXT NOT NULL REFERENCES knowledge (knowledge_id) ON DELETE CASCADE,
    page_id TEXT NOT NULL,
    title TEXT NOT NULL,
    body TEXT NOT NULL,
    digest TEXT NOT NULL,
    UNIQUE (knowledge_id, page_id)
);
CREATE VIRTUAL TABLE IF NOT EXISTS pages_fts USING fts5 (
    title, body, content = 'pages', content_rowid = 'id', tokenize = 'porter unicode61'
);
CREATE TRIGGER IF NOT EXISTS pages_ai AFTER INSERT ON pages BEGIN
    INSERT INTO pages_fts (rowid, title, body) VALUES (new.id, new.title, new.body);
END;
CREATE TRIGGER IF NOT EXISTS pages_ad AFTER DELETE ON pages BEGIN
    INSERT INTO pages_fts (pages_fts, rowid, title, body)
    VALUES ('delete', old.id, old.title, old.body);
END;
CREATE TRIGGER IF NOT EXISTS pages_au AFTER UPDATE ON pages BEGIN
    INSERT INTO pages_fts (pages_fts, rowid, title, body)
    VALUES ('delete', old.id, old.title, old.body);
    INSERT INTO pages_fts (rowid, title, body) VALUES (new.id, new.title, new.body);
END;
CREATE TABLE IF NOT EXISTS bindings (
    service_id TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    user_digest TEXT NOT NULL,
    knowledge_id TEXT NOT NULL REFERENCES knowledge (knowledge_id) ON DELETE CASCADE,
    priority INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (service_id, agent_id, user_digest, knowledge_id)
);
"""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _new_id(prefix: str) -> str:
    return prefix + "".join(secrets.choice(_BASE36) for _ in range(8))


def _wal(conn: sqlite3.Connection) -> None:
    """Switch to WAL, retried: the switch ignores the busy timeout, so workers opening a new
    file together would otherwise fail with "database is locked"."""
    deadline = time.monotonic() + _BUSY_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@dataclass(frozen=True, slots=True)
class SyncResult:
    knowledge_id: str
    added: int
    updated: int
    removed: int
    unchanged: int


class Catalogue:
    """The knowledge catalogue in one SQLite file."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: Path) -> Catalogue:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT_S * 1000)}")
        _wal(conn)
        conn.execute("PRAGMA foreign_keys = ON")
        conn.executescript(SCHEMA)
        return cls(conn)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(row) for row in self._conn.execute(sql, params)]

    # --- wikis -------------------------------------------------------------------------------

    def sync_wiki(
        self, service_id: str, team_id: str, name: str, summary: str | None, source: str,
        pages: Sequence[Page],
    ) -> SyncResult:
        """Create or update the wiki of ``source``: changed pages updated, gone ones removed."""
        now = _now()
        with self._lock, self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            row = self._conn.execute(
                "SELECT knowledge_id FROM knowledge"
                " WHERE service_id = ? AND team_id = ? AND source = ?",
                (service_id, team_id, source),
            ).fetchone()
            if row is None:
                knowledge_id = self._insert_wiki(service_id, team_id, name, summary, source, now)
            else:
                knowledge_id = row["knowledge_id"]
                self._conn.execute(
                    "UPDATE knowledge SET name = ?, summary = ?, updated_at = ?"
                    " WHERE knowledge_id = ?",
                    (name, summary, now, knowledge_id),
                )
            return self._sync_pages(knowledge_id, pages)

    def _insert_wiki(
        self, service_id: str, team_id: str, name: str, summary: str | None, source: str,
        now: str,
    ) -> str:
        while True:
            knowledge_id = _new_id("wiki-")
            try:
                self._conn.execute(
                    "INSERT INTO knowledge VALUES (?, ?, ?, 'wiki', ?, ?, ?, ?, ?)",
                    (knowledge_id, service_id, team_id, name, summary, source, now, now),
                )
            except sqlite3.IntegrityError:
                continue  # an id collision (36^8 ids): draw again
            return knowledge_id

    def _sync_pages(self, knowledge_id: str, pages: Sequence[Page]) -> SyncResult:
        old = {
            r["page_id"]: r["digest"]
            for r in self._conn.execute(
                "SELECT page_id, digest FROM pages WHERE knowledge_id = ?", (knowledge_id,)
            )
        }
        added = updated = unchanged = 0
        for page in pages:
            digest = old.pop(page.page_id, None)
            if digest == page.digest:
                unchanged += 1
                continue
            if digest is None:
                added += 1
                self._conn.execute(
                    "INSERT INTO pages (knowledge_id, page_id, title, body, digest)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (knowledge_id, page.page_id, page.title, page.body, page.digest),
                )
            else:
                updated += 1
                self._conn.execute(
                    "UPDATE pages SET title = ?, body = ?, digest = ?"
                    " WHERE knowledge_id = ? AND page_id = ?",
                    (page.title, page.body, page.digest, knowledge_id, page.page_id),
                )
        for page_id in old:  # what is left was deleted from the folder
            self._conn.execute(
                "DELETE FROM pages WHERE knowledge_id = ? AND page_id = ?",
                (knowledge_id, page_id),
            )
        return SyncResult(knowledge_id, added, updated, len(old), unchanged)

    def remove(self, knowledge_id: str) -> bool:
        with self._lock, self._conn:
            cur = self._conn.execute(
                "DELETE FROM knowledge WHERE knowledge_id = ?", (knowledge_id,)
            )
            return cur.rowcount > 0

    # --- reads -------------------------------------------------------------------------------

    def knowledge(
        self, service_id: str | None, team_id: str | None = None,
        ids: Sequence[str] | None = None, limit: int = 200,
    ) -> list[dict[str, Any]]:
        """Catalogue rows with their page counts, oldest first; filters are ANDed."""
        sql = (
            "SELECT k.*, (SELECT count(*) FROM pages p WHERE p.knowledge_id = k.knowledge_id)"
            " AS page_count FROM knowledge k WHERE 1 = 1"
        )
        params: list[Any] = []
        if service_id is not None:
            sql += " AND k.service_id = ?"
            params.append(service_id)
        if team_id is not None:
            sql += " AND k.team_id = ?"
            params.append(team_id)
        if ids is not None:
            sql += f" AND k.knowledge_id IN ({','.join('?' * len(ids))})"
            params.extend(ids)
        sql += " ORDER BY k.created_at, k.knowledge_id LIMIT ?"
        params.append(limit)
        return self._rows(sql, params)

    def search(self, knowledge_id: str, terms: Sequence[str], limit: int) -> list[dict[str, Any]]:
        """Pages matching any of ``terms``, best first (BM25, the title weighs more)."""
        if not terms:
            return []
        match = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
        return self._rows(
            "SELECT p.page_id, p.title,"
            " snippet(pages_fts, 1, '**', '**', '…', 24) AS snippet,"
            " bm25(pages_fts, 4.0, 1.0) AS rank"
            " FROM pages_fts JOIN pages p ON p.id = pages_fts.rowid"
            " WHERE pages_fts MATCH ? AND p.knowledge_id = ?"
            " ORDER BY rank, p.page_id LIMIT ?",
            (match, knowledge_id, limit),
        )

    def pages(self, knowledge_id: str, offset: int, limit: int) -> list[dict[str, Any]]:
        return self._rows(
            "SELECT page_id, title FROM pages WHERE knowledge_id = ?"
            " ORDER BY page_id LIMIT ? OFFSET ?",
            (knowledge_id, limit, offset),
        )

    def page(self, knowledge_id: str, page_id: str) -> dict[str, Any] | None:
        rows = self._rows(
            "SELECT page_id, title, body FROM pages WHERE knowledge_id = ? AND page_id = ?",
            (knowledge_id, page_id),
        )
        return rows[0] if rows else None

    # --- bindings ----------------------------------------------------------------------------

    def bind(
        self, service_id: str, agent_id: str, digest: str, knowledge_id: str, priority: int
    ) -> None:
        with self._lock, self._conn:
            self._conn.execute(
                "INSERT INTO bindings VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (service_id, agent_id, user_digest, knowledge_id)"
                " DO UPDATE SET priority = excluded.priority",
                (service_id, agent_id, digest, knowledge_id, priority, _now()),
            )

    def unbind(self, service_id: str, agent_id: str, digest: str, knowledge_id: str) -> bool:
        with self._lock, self._conn:
            cur = self._conn.execute(
                "DELETE FROM bindings WHERE service_id = ? AND agent_id = ?"
                " AND user_digest = ? AND knowledge_id = ?",
                (service_id, agent_id, digest, knowledge_id),
            )
            return cur.rowcount > 0

    def bindings(
        self, service_id: str, agent_id: str | None = None, digest: str | None = None
    ) -> list[dict[str, Any]]:
        """Bindings with their asset's name and summary: highest priority, then newest, first."""
        sql = (
            "SELECT b.agent_id, b.knowledge_id, b.priority, b.created_at, k.type, k.name,"
            " k.summary FROM bindings b JOIN knowledge k USING (knowledge_id)"
            " WHERE b.service_id = ?"
        )
        params: list[Any] = [service_id]
        if agent_id is not None:
            sql += " AND b.agent_id = ?"
            params.append(agent_id)
        if digest is not None:
            sql += " AND b.user_digest = ?"
            params.append(digest)
        sql += " ORDER BY b.priority DESC, b.created_at DESC, b.rowid DESC"
        return self._rows(sql, params)
