"""The PostgreSQL memory store's schema and rows: its versioned migrations, its columns, and
how a record becomes a row and a row a record (``memory.store_pg`` runs the statements)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg.types.json import Jsonb

from ctxproxy.memory.model import Memory, Scope
from ctxproxy.plumbing.pg import Schema

__all__ = [
    "COLUMNS", "FILTERS", "MIGRATIONS", "M_COLUMNS", "clean", "conflict_key", "memory_of",
    "row_params", "schema",
]

# Versioned schema. Append new versions; never edit an applied one.
MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (
        1,
        (
            """
            CREATE TABLE memories (
                memory_id  text PRIMARY KEY,
                type       text NOT NULL CHECK (type IN ('working', 'episodic', 'semantic')),
                service_id text NOT NULL,
                team_id    text NOT NULL,
                agent_id   text NOT NULL,
                user_ref   text NOT NULL,
                key        text NOT NULL,
                text       text NOT NULL,
                session_id text,
                turn_index integer,
                in_window  boolean NOT NULL DEFAULT false,
                sources    text[] NOT NULL DEFAULT '{}',
                attrs      jsonb NOT NULL DEFAULT '{}',
                created_at double precision NOT NULL,
                updated_at double precision NOT NULL,
                expires_at double precision,
                -- Only the head of a huge text is indexed: a tsvector is capped at 1 MB.
                tsv tsvector GENERATED ALWAYS AS
                    (to_tsvector('english'::regconfig, left(text, 100000))) STORED,
                CONSTRAINT memories_scope_type_key
                    UNIQUE (service_id, team_id, agent_id, user_ref, type, key)
            )
            """,
            "CREATE INDEX memories_tsv ON memories USING gin (tsv)",
            """CREATE INDEX memories_scope_updated
                   ON memories (service_id, team_id, agent_id, user_ref, updated_at DESC)""",
            "CREATE INDEX memories_updated ON memories (updated_at DESC)",
            "CREATE INDEX memories_session ON memories (session_id) WHERE session_id IS NOT NULL",
        ),
    ),
    (
        2,
        (
            # The four scope columns go together (an agent belongs to one team): without
            # this the planner multiplies their selectivities, takes a scope holding half
            # the table for a small one and ANDs a bitmap of all of it into every search.
            """CREATE STATISTICS memories_scope (dependencies, ndistinct)
                   ON service_id, team_id, agent_id, user_ref FROM memories""",
            "ANALYZE memories",
        ),
    ),
    (
        3,
        (
            # Forget sticks: a forgotten record leaves a tombstone (its scope, type and key,
            # no text), and a row with that key is never inserted again, by any replica.
            """
            CREATE TABLE forgotten (
                service_id   text NOT NULL,
                team_id      text NOT NULL,
                agent_id     text NOT NULL,
                user_ref     text NOT NULL,
                type         text NOT NULL,
                key          text NOT NULL,
                forgotten_at double precision NOT NULL,
                PRIMARY KEY (service_id, team_id, agent_id, user_ref, type, key)
            )
            """,
            """
            CREATE FUNCTION memories_forgotten() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF EXISTS (SELECT 1 FROM forgotten f WHERE f.service_id = NEW.service_id
                        AND f.team_id = NEW.team_id AND f.agent_id = NEW.agent_id
                        AND f.user_ref = NEW.user_ref AND f.type = NEW.type
                        AND f.key = NEW.key) THEN
                    RETURN NULL;
                END IF;
                RETURN NEW;
            END $$
            """,
            """CREATE TRIGGER memories_forgotten BEFORE INSERT ON memories
                   FOR EACH ROW EXECUTE FUNCTION memories_forgotten()""",
        ),
    ),
    (
        4,
        (
            # Hybrid recall: each chunk's vector (memory.vectors), cached by its digest; gone
            # with its memory, and with its text when that changes. seq only grows (though
            # not in commit order: memory.vectors reads a stretch back again).
            """
            CREATE TABLE memory_vectors (
                seq       bigserial PRIMARY KEY,
                memory_id text NOT NULL REFERENCES memories (memory_id) ON DELETE CASCADE,
                chunk     integer NOT NULL,
                start_at  integer NOT NULL,
                end_at    integer NOT NULL,
                model     text NOT NULL,
                digest    text NOT NULL,
                vector    bytea NOT NULL,
                UNIQUE (memory_id, model, chunk)
            )
            """,
            "CREATE INDEX memory_vectors_digest ON memory_vectors (model, digest)",
            """CREATE FUNCTION ctxproxy_memory_text_changed() RETURNS trigger
               LANGUAGE plpgsql AS $$
               BEGIN
                   DELETE FROM memory_vectors WHERE memory_id = NEW.memory_id;
                   RETURN NEW;
               END $$""",
            """CREATE TRIGGER memories_text_changed AFTER UPDATE OF text ON memories
               FOR EACH ROW WHEN (OLD.text IS DISTINCT FROM NEW.text)
               EXECUTE FUNCTION ctxproxy_memory_text_changed()""",
        ),
    ),
    (
        5,
        (
            # GIN's fast update puts new entries in a pending list, unsorted, that every
            # search reads whole until a vacuum (or enough of it) merges it into the index:
            # with memories written all the time, a probe of a few lexemes slowed by tens of
            # times (bench/RESULTS.md, PostgreSQL search while memories arrive). Written
            # straight into the index, an insert costs a little more (off the request path:
            # episodes are stored in the background).
            "ALTER INDEX memories_tsv SET (fastupdate = off)",
            "SELECT gin_clean_pending_list('memories_tsv'::regclass)",
        ),
    ),
    (
        6,
        (
            # What memory put where in a session's requests (memory/place.py): any replica
            # puts the same bytes in the session's next request.
            """CREATE TABLE memory_placements (
                service_id text NOT NULL, team_id text NOT NULL, agent_id text NOT NULL,
                user_ref text NOT NULL, session_id text NOT NULL, name text NOT NULL,
                value bytea NOT NULL, updated_at double precision NOT NULL,
                PRIMARY KEY (service_id, team_id, agent_id, user_ref, session_id, name))""",
            "CREATE INDEX memory_placements_updated ON memory_placements (updated_at)",
        ),
    ),
)
_LOCK, _VERSIONS = "ctxproxy.memory", "ctxproxy_migrations"  # the advisory lock, the versions table

COLUMNS = (
    "memory_id, type, service_id, team_id, agent_id, user_ref, key, text, session_id, "
    "turn_index, in_window, sources, attrs, created_at, updated_at, expires_at"
)
M_COLUMNS = ", ".join("m." + c.strip() for c in COLUMNS.split(","))
# A search's scope, types and expiry, on the memories aliased ``m``.
FILTERS = """m.service_id = %(service_id)s AND m.team_id = %(team_id)s
      AND m.agent_id = %(agent_id)s AND m.user_ref = %(user_ref)s
      AND m.type = ANY(%(types)s) AND (m.expires_at IS NULL OR m.expires_at > %(now)s)"""


def schema() -> Schema:
    """The versions of ``MIGRATIONS`` as they stand when a store opens (a test may cut them
    short, to open a database as an older release left it)."""
    return Schema(_LOCK, _VERSIONS, MIGRATIONS)


def clean(value: str) -> str:
    """PostgreSQL text cannot hold NUL; it becomes U+FFFD rather than failing the write."""
    return value.replace("\x00", "\ufffd")


def conflict_key(m: Memory) -> tuple[str, ...]:
    s = m.scope
    return (s.service_id, s.team_id, s.agent_id, s.user, m.type, m.key)


def row_params(m: Memory) -> tuple[Any, ...]:
    s = m.scope
    return (
        m.memory_id,
        m.type,
        s.service_id,
        s.team_id,
        s.agent_id,
        s.user,
        clean(m.key),
        clean(m.text),
        clean(m.session_id) if m.session_id is not None else None,
        m.turn_index,
        m.in_window,
        list(m.sources),
        Jsonb(m.attrs),
        m.created_at,
        m.updated_at,
        m.expires_at,
    )


def memory_of(row: Sequence[Any]) -> Memory:
    (memory_id, type_, service_id, team_id, agent_id, user, key, text, session_id,
     turn_index, in_window, sources, attrs, created_at, updated_at, expires_at) = row
    return Memory(
        type=type_,
        scope=Scope(service_id, team_id, agent_id, user),
        key=key,
        text=text,
        memory_id=memory_id,
        session_id=session_id,
        turn_index=turn_index,
        in_window=in_window,
        sources=list(sources),
        attrs=dict(attrs),
        created_at=created_at,
        updated_at=updated_at,
        expires_at=expires_at,
    )
