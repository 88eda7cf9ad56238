"""The SQLite memory store's schema: its versioned migrations, run in ``migrate``, and how a
``Memory`` maps to a row of ``memories`` and back."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Sequence
from typing import Any

import orjson

from ctxproxy.memory.model import MEMORY_TYPES, Memory, Scope
from ctxproxy.plumbing import sqlite as plumbing_sqlite

__all__ = [
    "COLUMNS", "MIGRATIONS", "M_COLUMNS", "json_rows", "memory_of", "migrate", "params_of",
    "scope_params", "scope_token",
]

# Versioned schema (PRAGMA user_version). Append new versions; never edit an applied one.
MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        """
        CREATE TABLE memories (
            id          INTEGER PRIMARY KEY,  -- a stable rowid for the external-content index
            memory_id   TEXT NOT NULL UNIQUE,
            type        TEXT NOT NULL CHECK (type IN ('working', 'episodic', 'semantic')),
            service_id  TEXT NOT NULL,
            team_id     TEXT NOT NULL,
            agent_id    TEXT NOT NULL,
            user_ref    TEXT NOT NULL,
            key         TEXT NOT NULL,
            text        TEXT NOT NULL,
            session_id  TEXT,
            turn_index  INTEGER,
            in_window   INTEGER NOT NULL DEFAULT 0,
            sources     TEXT NOT NULL DEFAULT '[]',
            attrs       TEXT NOT NULL DEFAULT '{}',
            created_at  REAL NOT NULL,
            updated_at  REAL NOT NULL,
            expires_at  REAL,
            UNIQUE (service_id, team_id, agent_id, user_ref, type, key)
        );
        CREATE INDEX memories_scope_updated
            ON memories (service_id, team_id, agent_id, user_ref, updated_at DESC);
        CREATE INDEX memories_updated ON memories (updated_at DESC);
        CREATE INDEX memories_session ON memories (session_id) WHERE session_id IS NOT NULL;
        CREATE VIRTUAL TABLE memories_fts USING fts5(
            text, content='memories', content_rowid='id', tokenize='porter unicode61'
        );
        CREATE TRIGGER memories_ai AFTER INSERT ON memories BEGIN
            INSERT INTO memories_fts (rowid, text) VALUES (new.id, new.text);
        END;
        CREATE TRIGGER memories_ad AFTER DELETE ON memories BEGIN
            INSERT INTO memories_fts (memories_fts, rowid, text)
                VALUES ('delete', old.id, old.text);
        END;
        CREATE TRIGGER memories_au AFTER UPDATE OF text ON memories BEGIN
            INSERT INTO memories_fts (memories_fts, rowid, text)
                VALUES ('delete', old.id, old.text);
            INSERT INTO memories_fts (rowid, text) VALUES (new.id, new.text);
        END;
        """,
    ),
    (
        2,
        # Recall lists a session's records and a scope's records of one type on every turn;
        # with only (scope, updated_at) to go by, that walked the whole scope. Ingest
        # rewrites a record when only its in_window flag changed: re-indexing the same text
        # churned the FTS index for nothing.
        """
        CREATE INDEX memories_scope_session_type ON memories (service_id, team_id, agent_id,
            user_ref, session_id, type, updated_at DESC, memory_id DESC);
        CREATE INDEX memories_scope_type ON memories (service_id, team_id, agent_id,
            user_ref, type, updated_at DESC, memory_id DESC);
        DROP TRIGGER memories_au;
        CREATE TRIGGER memories_au AFTER UPDATE OF text ON memories
        WHEN old.text IS NOT new.text BEGIN
            INSERT INTO memories_fts (memories_fts, rowid, text)
                VALUES ('delete', old.id, old.text);
            INSERT INTO memories_fts (rowid, text) VALUES (new.id, new.text);
        END;
        """,
    ),
    (
        3,
        # Search bounds its candidates (memory/search.py); bounded across every scope, one
        # scope's volume pushed another's matches out. The scope is now a column of the
        # index, and every full-text query of a search names it, so each bound is taken
        # within the scope. ``scope`` is a token (see scope_token), written by the store.
        """
        DROP TRIGGER memories_ai;
        DROP TRIGGER memories_ad;
        DROP TRIGGER memories_au;
        DROP TABLE memories_fts;
        ALTER TABLE memories ADD COLUMN scope TEXT NOT NULL DEFAULT '';
        UPDATE memories SET scope = ctxproxy_scope_token(service_id, team_id, agent_id,
            user_ref);
        CREATE VIRTUAL TABLE memories_fts USING fts5(
            text, scope, content='memories', content_rowid='id', tokenize='porter unicode61'
        );
        INSERT INTO memories_fts (memories_fts) VALUES ('rebuild');
        CREATE TRIGGER memories_ai AFTER INSERT ON memories BEGIN
            INSERT INTO memories_fts (rowid, text, scope) VALUES (new.id, new.text, new.scope);
        END;
        CREATE TRIGGER memories_ad AFTER DELETE ON memories BEGIN
            INSERT INTO memories_fts (memories_fts, rowid, text, scope)
                VALUES ('delete', old.id, old.text, old.scope);
        END;
        CREATE TRIGGER memories_au AFTER UPDATE OF text ON memories
        WHEN old.text IS NOT new.text BEGIN
            INSERT INTO memories_fts (memories_fts, rowid, text, scope)
                VALUES ('delete', old.id, old.text, old.scope);
            INSERT INTO memories_fts (rowid, text, scope) VALUES (new.id, new.text, new.scope);
        END;
        """,
    ),
    (
        4,
        # Forget sticks: a forgotten record leaves a tombstone (its scope, type and key, no
        # text), and a row with that key is never inserted again, whoever writes it (ingest
        # of a resent turn, distillation, a restart, another process).
        """
        CREATE TABLE forgotten (
            service_id   TEXT NOT NULL,
            team_id      TEXT NOT NULL,
            agent_id     TEXT NOT NULL,
            user_ref     TEXT NOT NULL,
            type         TEXT NOT NULL,
            key          TEXT NOT NULL,
            forgotten_at REAL NOT NULL,
            PRIMARY KEY (service_id, team_id, agent_id, user_ref, type, key)
        ) WITHOUT ROWID;
        CREATE TRIGGER memories_forgotten BEFORE INSERT ON memories
        WHEN EXISTS (SELECT 1 FROM forgotten f WHERE f.service_id = new.service_id
            AND f.team_id = new.team_id AND f.agent_id = new.agent_id
            AND f.user_ref = new.user_ref AND f.type = new.type AND f.key = new.key)
        BEGIN
            SELECT RAISE(IGNORE);
        END;
        """,
    ),
    (
        5,
        # Hybrid recall: each chunk's vector (memory.vectors), cached by its digest. The
        # memory's vectors go with it, and with its text when that changes (the indexer then
        # embeds it again). seq only grows: a search reads the rows written since its last.
        """
        CREATE TABLE memory_vectors (
            seq        INTEGER PRIMARY KEY AUTOINCREMENT,
            memory_id  TEXT NOT NULL,
            chunk      INTEGER NOT NULL,
            start_at   INTEGER NOT NULL,
            end_at     INTEGER NOT NULL,
            model      TEXT NOT NULL,
            digest     TEXT NOT NULL,
            vector     BLOB NOT NULL,
            UNIQUE (memory_id, model, chunk)
        );
        CREATE INDEX memory_vectors_digest ON memory_vectors (model, digest);
        CREATE TRIGGER memories_vectors_ad AFTER DELETE ON memories BEGIN
            DELETE FROM memory_vectors WHERE memory_id = old.memory_id;
        END;
        CREATE TRIGGER memories_vectors_au AFTER UPDATE OF text ON memories
        WHEN old.text IS NOT new.text BEGIN
            DELETE FROM memory_vectors WHERE memory_id = old.memory_id;
        END;
        """,
    ),
    (
        6,
        # Each record's length in characters, kept with its text: a search divides each
        # candidate's score by it, and counting the characters of every candidate's text
        # was half of a search's time.
        """
        ALTER TABLE memories ADD COLUMN chars INTEGER NOT NULL DEFAULT 0;
        UPDATE memories SET chars = length(text);
        CREATE TRIGGER memories_chars_ai AFTER INSERT ON memories BEGIN
            UPDATE memories SET chars = length(new.text) WHERE id = new.id;
        END;
        CREATE TRIGGER memories_chars_au AFTER UPDATE OF text ON memories
        WHEN old.text IS NOT new.text BEGIN
            UPDATE memories SET chars = length(new.text) WHERE id = new.id;
        END;
        """,
    ),
    (
        7,
        # The full-text index keeps which column holds each word, not where in it (detail=
        # column): a search matches single words (memory.sqlite_search's ``_phrase``) and the
        # scope column, never a phrase of several, and the positions were half the index. A
        # search on a load run's store: the same hits, in less time (bench/RESULTS.md,
        # Load). The triggers write to the table by name: the new one takes
        # their writes.
        """
        DROP TABLE memories_fts;
        CREATE VIRTUAL TABLE memories_fts USING fts5(
            text, scope, content='memories', content_rowid='id', tokenize='porter unicode61',
            detail='column'
        );
        INSERT INTO memories_fts (memories_fts) VALUES ('rebuild');
        """,
    ),
    (
        8,
        # What memory put where in a session's requests (memory/place.py): any worker puts
        # the same bytes in the session's next request.
        """
        CREATE TABLE memory_placements (
            service_id TEXT NOT NULL, team_id TEXT NOT NULL, agent_id TEXT NOT NULL,
            user_ref TEXT NOT NULL, session_id TEXT NOT NULL, name TEXT NOT NULL,
            value BLOB NOT NULL, updated_at REAL NOT NULL,
            PRIMARY KEY (service_id, team_id, agent_id, user_ref, session_id, name)
        ) WITHOUT ROWID;
        CREATE INDEX memory_placements_updated ON memory_placements (updated_at);
        """,
    ),
)

def scope_token(service_id: str, team_id: str, agent_id: str, user: str) -> str:
    """A scope as one full-text token (letters and digits): what a search's queries require."""
    joined = "\0".join((service_id, team_id, agent_id, user)).encode()
    return "s" + hashlib.sha256(joined).hexdigest()[:30]


def migrate(conn: sqlite3.Connection) -> None:
    """Apply the versions of ``MIGRATIONS`` that ``conn``'s file has not had yet."""
    conn.create_function("ctxproxy_scope_token", 4, scope_token, deterministic=True)
    plumbing_sqlite.migrate(conn, MIGRATIONS)


# --- rows ----------------------------------------------------------------------------------------

COLUMNS = (
    "memory_id, type, service_id, team_id, agent_id, user_ref, key, text, session_id, "
    "turn_index, in_window, sources, attrs, created_at, updated_at, expires_at"
)
M_COLUMNS = ", ".join("m." + c.strip() for c in COLUMNS.split(","))
_REALS = frozenset({"created_at", "updated_at", "expires_at"})


def scope_params(scope: Scope) -> list[str]:
    """A scope's four columns, in the order of ``COLUMNS``."""
    return [scope.service_id, scope.team_id, scope.agent_id, scope.user]


def params_of(m: Memory) -> tuple[Any, ...]:
    """The values of ``COLUMNS`` and ``scope`` for a memory: an upsert's parameters."""
    s = m.scope
    return (
        m.memory_id, m.type, s.service_id, s.team_id, s.agent_id, s.user, m.key, m.text,
        m.session_id, m.turn_index, int(m.in_window), orjson.dumps(list(m.sources)).decode(),
        orjson.dumps(m.attrs).decode(), m.created_at, m.updated_at, m.expires_at,
        scope_token(s.service_id, s.team_id, s.agent_id, s.user),
    )


def memory_of(row: Sequence[Any]) -> Memory:
    """The memory a row of ``COLUMNS`` holds; ValueError for a type the store never writes."""
    (memory_id, type_, service_id, team_id, agent_id, user, key, text, session_id,
     turn_index, in_window, sources, attrs, created_at, updated_at, expires_at) = row
    if type_ not in MEMORY_TYPES:
        raise ValueError(f"unknown memory type {type_!r}")
    return Memory(
        type=type_,
        scope=Scope(service_id, team_id, agent_id, user),
        key=key,
        text=text,
        memory_id=memory_id,
        session_id=session_id,
        turn_index=turn_index,
        in_window=bool(in_window),
        sources=list(orjson.loads(sources)),
        attrs=dict(orjson.loads(attrs)),
        created_at=float(created_at),
        updated_at=float(updated_at),
        expires_at=None if expires_at is None else float(expires_at),
    )


def json_rows(
    db: sqlite3.Connection, sql: str, params: Sequence[Any] | dict[str, Any], columns: str
) -> list[list[Any]]:
    """The rows of ``sql`` (its ``columns``), in one JSON array: each row crossing into
    Python is a turn of the GIL, and under load the event loop holds it for long."""
    names = ", ".join(
        # JSON keeps 15 digits of a REAL, quote() all: a timestamp comes back as it went in.
        f"iif({c} IS NULL, NULL, quote({c}))" if c in _REALS else c
        for c in (c.strip() for c in columns.split(","))
    )
    row = db.execute(f"SELECT json_group_array(json_array({names})) FROM ({sql})", params)
    return list(orjson.loads(row.fetchone()[0]))
