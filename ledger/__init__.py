"""The request ledger: one compact row per model request (Responses, Messages or Chat
Completions; never a prompt's text),
what the same request would have cost sent directly, and the reports read from the rows
(``ctxproxy stats``, the ``/ui`` pages)."""

from ctxproxy.ledger.model import Group, Ledger, LedgerError, Record, Totals
from ctxproxy.ledger.prices import Price, Prices, parse_prices

__all__ = [
    "Group", "Ledger", "LedgerError", "Price", "Prices", "Record", "Totals", "parse_prices",
]
