"""Choosing the memory store from the settings."""

from __future__ import annotations

from config import Settings
from memory.model import Store


def make_store(settings: Settings) -> Store:
    """PostgreSQL when ``CTXPROXY_STORE_URL`` is set (replicas share it), else SQLite."""
    url = settings.store_url
    if url and url.startswith(("postgresql://", "postgres://")):
        from memory.store_pg import PostgresStore

        return PostgresStore(url)
    from memory.store_sqlite import SqliteStore

    return SqliteStore(settings.data_dir / "memory.sqlite3")
