"""Choosing the ledger's store from the settings: where the memory store is."""

from __future__ import annotations

from ctxproxy.config import Settings
from ctxproxy.ledger.model import Ledger

LEDGER_FILE = "requests.sqlite3"


def make_ledger(settings: Settings) -> Ledger:
    """PostgreSQL when ``CTXPROXY_STORE_URL`` is set, else SQLite in the data directory."""
    if settings.store_url:
        from ctxproxy.ledger.store_pg import PostgresLedger

        return PostgresLedger(settings.store_url)
    from ctxproxy.ledger.store_sqlite import SqliteLedger

    return SqliteLedger(settings.data_dir / LEDGER_FILE)
