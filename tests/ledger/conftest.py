"""Ledger fixtures: one ledger per backend (PostgreSQL in a fresh schema per test)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ctxproxy.ledger.model import Ledger
from ctxproxy.ledger.store_pg import PostgresLedger
from ctxproxy.ledger.store_sqlite import SqliteLedger
from tests.memory.conftest import pg_url  # noqa: F401  (the fixture)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def make_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> object:
    """A factory of ledgers on one backend, all on the same data (a restart opens it anew)."""
    if request.param == "sqlite":
        return lambda: SqliteLedger(tmp_path / "requests.sqlite3")
    url = request.getfixturevalue("pg_url")
    return lambda: PostgresLedger(url)


@pytest.fixture
async def ledger(make_ledger: object) -> AsyncIterator[Ledger]:
    opened: Ledger = make_ledger()  # type: ignore[operator]
    await opened.open()
    yield opened
    await opened.close()
