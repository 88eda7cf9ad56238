"""Memory test fixtures: a fresh PostgreSQL schema per test, and one store per backend.

PostgreSQL tests need ``CTXPROXY_TEST_PG_URL`` (``make test`` starts a server and sets it).
Without it they skip locally and fail in CI, so a missing server is never silent there.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bench.harness.postgres import fresh_schema
from ctxproxy.memory.model import Store
from tests.fakes.server import free_port

# Read at import: the autouse env cleaner removes CTXPROXY_* before any fixture runs.
PG_URL = os.environ.get("CTXPROXY_TEST_PG_URL")
IN_CI = bool(os.environ.get("CI"))


def require_pg_url() -> str:
    if PG_URL:
        return PG_URL
    message = "CTXPROXY_TEST_PG_URL is not set (make test starts PostgreSQL and sets it)"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a fresh schema, dropped after the test."""
    with fresh_schema(require_pg_url()) as url:
        yield url


@dataclass
class Backend:
    """How to reach one backend: a store factory and the settings that select it."""

    name: str
    make: Callable[[], Store]
    broken: Callable[[], Store]  # a store whose open() must fail
    settings: dict[str, Any] = field(default_factory=dict)  # select this store
    broken_settings: dict[str, Any] = field(default_factory=dict)  # select a broken one


def _sqlite_backend(tmp_path: Path) -> Backend:
    from ctxproxy.memory.store_sqlite import SqliteStore

    garbage_dir = tmp_path / "garbage"
    garbage_dir.mkdir()
    garbage = garbage_dir / "memory.sqlite3"
    garbage.write_bytes(b"this is not an SQLite file " * 200)

    def broken() -> Store:
        return SqliteStore(garbage)

    path = tmp_path / "memory.sqlite3"
    return Backend("sqlite", lambda: SqliteStore(path), broken, {"data_dir": tmp_path},
                   {"data_dir": garbage_dir})


def _pg_backend(url: str, tmp_path: Path) -> Backend:
    from ctxproxy.memory.store_pg import PostgresStore

    # Nothing listens on a fresh free port: the connection is refused at once.
    dead_url = f"postgresql://nobody:pw@127.0.0.1:{free_port()}/x"

    def broken() -> Store:
        return PostgresStore(dead_url, timeout_s=1)

    settings = {"store_url": url, "data_dir": tmp_path}
    broken_settings = {"store_url": dead_url, "data_dir": tmp_path}
    return Backend("postgres", lambda: PostgresStore(url), broken, settings, broken_settings)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return _sqlite_backend(tmp_path)
    return _pg_backend(request.getfixturevalue("pg_url"), tmp_path)


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[Store]:
    """An open, empty store of each backend."""
    opened = backend.make()
    await opened.open()
    yield opened
    await opened.close()
