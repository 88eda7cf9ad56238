"""The embedded core's SQLite catalogue: wikis, their pages (FTS5 indexed), agent bindings.

Synchronous and short: the server calls it through ``asyncio.to_thread``, the CLI directly.
One connection behind a lock; WAL so that the CLI can write while a server reads, and
several server processes (``CTXPROXY_WORKERS``) share the file, each write waiting up to
the busy timeout for the others'.
"""

from __future__ import annotations

import logging
import secrets
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ctxproxy.knowledge.wiki import Page
from ctxproxy.plumbing.sqlite import immediate, open_file

__all__ = ["FILENAME", "Catalogue", "Generation", "SyncResult", "WrongType"]

log = logging.getLogger("ctxproxy.knowledge")

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

# Code graphs (issue 15). Names are resolved at query time, by name within the graph, so
# a file's rows depend on that file alone: re-indexing replaces only changed files.
CODE_SCHEMA = """
CREATE TABLE IF NOT EXISTS code_graphs (
    knowledge_id TEXT PRIMARY KEY REFERENCES knowledge (knowledge_id) ON DELETE CASCADE,
    repo_url TEXT,
    repo_slug TEXT,
    branch TEXT
);
CREATE TABLE IF NOT EXISTS code_files (
    id INTEGER PRIMARY KEY,
    knowledge_id TEXT NOT NULL REFERENCES knowledge (knowledge_id) ON DELETE CASCADE,
    path TEXT NOT NULL,
    language TEXT NOT NULL,
    digest TEXT NOT NULL,
    lines INTEGER NOT NULL,
    content TEXT NOT NULL,
    UNIQUE (knowledge_id, path)
);
CREATE TABLE IF NOT EXISTS code_symbols (
    id INTEGER PRIMARY KEY,
    file_id INTEGER NOT NULL REFERENCES code_files (id) ON DELETE CASCADE,
    knowledge_id TEXT NOT NULL,
    name TEXT NOT NULL,
    qualname TEXT NOT NULL,
    kind TEXT NOT NULL,
    start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL,
    signature TEXT NOT NULL,
    doc TEXT NOT NULL,
    words TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS code_symbols_file ON code_symbols (file_id);
CREATE INDEX IF NOT EXISTS code_symbols_name ON code_symbols (knowledge_id, name);
CREATE INDEX IF NOT EXISTS code_symbols_qualname ON code_symbols (knowledge_id, qualname);
CREATE VIRTUAL TABLE IF NOT EXISTS code_symbols_fts USING fts5 (
    words, doc, content = 'code_symbols', content_rowid = 'id', tokenize = 'porter unicode61'
);
CREATE TRIGGER IF NOT EXISTS code_symbols_ai AFTER INSERT ON code_symbols BEGIN
    INSERT INTO code_symbols_fts (rowid, words, doc) VALUES (new.id, new.words, new.doc);
END;
CREATE TRIGGER IF NOT EXISTS code_symbols_ad AFTER DELETE ON code_symbols BEGIN
    INSERT INTO code_symbols_fts (code_symbols_fts, rowid, words, doc)
    VALUES ('delete', old.id, old.words, old.doc);
END;
CREATE TABLE IF NOT EXISTS code_refs (
    file_id INTEGER NOT NULL REFERENCES code_files (id) ON DELETE CASCADE,
    knowledge_id TEXT NOT NULL,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    line INTEGER NOT NULL,
    scope_id INTEGER REFERENCES code_symbols (id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS code_refs_file ON code_refs (file_id);
CREATE INDEX IF NOT EXISTS code_refs_name ON code_refs (knowledge_id, name, kind);
CREATE INDEX IF NOT EXISTS code_refs_scope ON code_refs (scope_id);
CREATE TABLE IF NOT EXISTS code_imports (
    file_id INTEGER NOT NULL REFERENCES code_files (id) ON DELETE CASCADE,
    statement TEXT NOT NULL,
    line INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS code_imports_file ON code_imports (file_id);
"""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _new_id(prefix: str) -> str:
    return prefix + "".join(secrets.choice(_BASE36) for _ in range(8))



class WrongType(ValueError):
    """A folder is already indexed as another type of asset (a wiki, a code graph)."""


@dataclass(frozen=True, slots=True)
class SyncResult:
    knowledge_id: str
    added: int
    updated: int
    removed: int
    unchanged: int


def _create(conn: sqlite3.Connection) -> None:
    conn.executescript(SCHEMA)
    conn.executescript(CODE_SCHEMA)


class Catalogue:
    """The knowledge catalogue in one SQLite file."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: Path) -> Catalogue:
        conn = open_file(path, _BUSY_TIMEOUT_S, pragmas=("PRAGMA foreign_keys = ON",),
                         setup=_create)
        conn.row_factory = sqlite3.Row
        return cls(conn)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(row) for row in self._conn.execute(sql, params)]

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Rows of one query, as dicts (for the asset modules: ``knowledge.code_store``)."""
        return self._rows(sql, params)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """The connection inside one write transaction, committed when the block ends."""
        with self._lock, immediate(self._conn) as conn:
            yield conn

    def find_source(
        self, conn: sqlite3.Connection, service_id: str, team_id: str, source: str
    ) -> sqlite3.Row | None:
        """The catalogue row already made from ``source`` for this team (in a transaction)."""
        row: sqlite3.Row | None = conn.execute(
            "SELECT knowledge_id, type FROM knowledge"
            " WHERE service_id = ? AND team_id = ? AND source = ?",
            (service_id, team_id, source),
        ).fetchone()
        return row

    def insert_knowledge(
        self, conn: sqlite3.Connection, kind: str, prefix: str, service_id: str, team_id: str,
        name: str, summary: str | None, source: str,
    ) -> str:
        """A new catalogue row with a fresh ``prefix`` + 8 base36 id (in a transaction)."""
        now = _now()
        while True:
            knowledge_id = _new_id(prefix)
            try:
                conn.execute(
                    "INSERT INTO knowledge VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (knowledge_id, service_id, team_id, kind, name, summary, source, now, now),
                )
            except sqlite3.IntegrityError:
                continue  # an id collision (36^8 ids): draw again
            return knowledge_id

    # --- wikis -------------------------------------------------------------------------------

    def sync_wiki(
        self, service_id: str, team_id: str, name: str, summary: str | None, source: str,
        pages: Sequence[Page],
    ) -> SyncResult:
        """Create or update the wiki of ``source``: changed pages updated, gone ones removed.

        ``WrongType`` when ``source`` is already indexed as another type of asset."""
        with self.transaction() as conn:
            knowledge_id = self.upsert_knowledge(
                conn, "wiki", "wiki-", service_id, team_id, name, summary, source
            )
            return self._sync_pages(knowledge_id, pages)

    def upsert_knowledge(
        self, conn: sqlite3.Connection, kind: str, prefix: str, service_id: str, team_id: str,
        name: str, summary: str | None, source: str,
    ) -> str:
        """The id of the ``kind`` asset made from ``source``, created or renamed (in a
        transaction)."""
        row = self.find_source(conn, service_id, team_id, source)
        if row is None:
            return self.insert_knowledge(
                conn, kind, prefix, service_id, team_id, name, summary, source
            )
        if row["type"] != kind:
            raise WrongType(f"{source} is already indexed as {row['knowledge_id']}")
        # A re-run without a summary (a sync) keeps the one the model is shown.
        conn.execute(
            "UPDATE knowledge SET name = ?, summary = coalesce(?, summary), updated_at = ?"
            " WHERE knowledge_id = ?",
            (name, summary, _now(), row["knowledge_id"]),
        )
        return str(row["knowledge_id"])

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
        """Catalogue rows with their page or file counts and, for code graphs, the
        repository; oldest first; filters are ANDed."""
        sql = (
            "SELECT k.*, (SELECT count(*) FROM pages p WHERE p.knowledge_id = k.knowledge_id)"
            " AS page_count,"
            " (SELECT count(*) FROM code_files f WHERE f.knowledge_id = k.knowledge_id)"
            " AS file_count, c.repo_url, c.repo_slug, c.branch"
            " FROM knowledge k LEFT JOIN code_graphs c USING (knowledge_id) WHERE 1 = 1"
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


class Generation:
    """Whether the catalogue has changed: a count that moves whenever any other connection
    (a ``ctxproxy knowledge`` command in another process, another worker) commits to it.

    SQLite's ``PRAGMA data_version`` on a connection of this object's own, which never
    writes: a few microseconds (the WAL index's header and the first page, already cached
    unless the file changed), and it never waits (busy timeout 0), so the event loop may ask
    it on every request. A commit that changed nothing discovery shows (a page's text, a
    checkpoint) moves it too; that costs one reload. Not thread-safe: one caller, the loop.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._last = 0
        self._failing = False

    @classmethod
    def open(cls, path: Path) -> Generation:
        """For the catalogue at ``path``, which ``Catalogue.open`` has made."""
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA busy_timeout = 0")
        conn.execute("PRAGMA query_only = ON")
        generation = cls(conn)
        generation.current()
        return generation

    def current(self) -> int:
        """The count now; the last one seen if SQLite cannot tell at once (a warning then,
        once until it can: answers are kept for their TTL meanwhile)."""
        try:
            row = self._conn.execute("PRAGMA data_version").fetchone()
        except sqlite3.Error as exc:
            if not self._failing:
                self._failing = True
                log.warning("cannot tell whether the knowledge catalogue changed: %s", exc)
            return self._last
        self._failing = False
        self._last = int(row[0])
        return self._last

    def close(self) -> None:
        self._conn.close()
