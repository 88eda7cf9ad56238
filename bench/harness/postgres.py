"""A fresh PostgreSQL schema for a bench run, dropped after (as the tests make theirs:
``tests/memory/conftest.py``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg


def with_search_path(url: str, schema: str) -> str:
    """``url`` with its connections confined to ``schema``."""
    parts = urlsplit(url)
    query = [*parse_qsl(parts.query), ("options", f"-csearch_path={schema}")]
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


@contextmanager
def fresh_schema(base: str, prefix: str = "t") -> Iterator[str]:
    """``base`` with its connections confined to a new schema, dropped after."""
    schema = f"{prefix}_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield with_search_path(base, schema)
    finally:
        drop_schema(base, schema)


# Holders of the schema's locks. A proxy of a failed test may still be running (fixtures are
# torn down in reverse order, this one before the proxy's) with a write in flight on the test's
# event loop, which this blocking teardown stops: its lock would hold the DROP forever.
LOCKERS = """
SELECT DISTINCT l.pid FROM pg_locks l
JOIN pg_class c ON c.oid = l.relation JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND l.pid <> pg_backend_pid()
"""


def drop_schema(base: str, schema: str) -> None:
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '2s'")
        for _ in range(5):
            for (pid,) in conn.execute(LOCKERS, (schema,)).fetchall():
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            try:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                return
            except psycopg.errors.LockNotAvailable:
                continue
        raise AssertionError(f"schema {schema} is still locked")
