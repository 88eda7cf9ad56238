"""Choosing the memory store from the settings."""

from __future__ import annotations

from ctxproxy.config import Settings
from ctxproxy.memory.model import Store


def make_store(settings: Settings, *, serving: bool = False) -> Store:
    """PostgreSQL when ``CTXPROXY_STORE_URL`` is set (replicas share it), else SQLite.

    Settings refuses any other scheme, so a set URL is never silently replaced by SQLite.
    ``serving``: the store of a proxy, which searches SQLite in processes of their own when
    ``CTXPROXY_MEMORY_PROCESS`` is on (a command's store searches in a thread).
    """
    url = settings.store_url
    if url:
        from ctxproxy.memory.store_pg import PostgresStore

        return PostgresStore(url, vector_bytes=int(settings.vector_cache_mb * 2**20),
                             pgvector=settings.memory_pgvector)
    from ctxproxy.memory.store_sqlite import SqliteStore

    return SqliteStore(settings.data_dir / "memory.sqlite3",
                       processes=serving and settings.memory_process,
                       vector_bytes=int(settings.vector_cache_mb * 2**20))
