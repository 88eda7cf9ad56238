"""The request ledger: one compact row per ``/v1/responses`` request (never a prompt's text),
what the same request would have cost sent directly, and the reports read from the rows
(``ctxproxy stats``, the ``/ui`` pages)."""

from ctxproxy.ledger.model import Group, Ledger, LedgerError, Record, Totals
from ctxproxy.ledger.prices import Price, Prices, parse_prices

__all__ = [
    "Group", "Ledger", "LedgerError", "Price", "Prices", "Record", "Totals", "parse_prices",
]
