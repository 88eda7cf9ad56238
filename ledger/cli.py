"""``ctxproxy stats``: what the proxy saved and sent, from the request ledger."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from ctxproxy.config import Settings
from ctxproxy.ledger.model import GROUPS, Group, LedgerError, Totals
from ctxproxy.ledger.prices import Prices
from ctxproxy.ledger.report import (
    ESTIMATE_NOTE,
    parse_since,
    percent,
    summarize,
    tokens,
    total,
    usd,
)
from ctxproxy.ledger.stores import make_ledger

__all__ = ["register", "stats"]


def register(commands: Any) -> None:
    p: argparse.ArgumentParser = commands.add_parser(
        "stats", help="requests, tokens and estimated cost, direct vs through the proxy",
        description="What ctxproxy saved and sent, from its request rows. " + ESTIMATE_NOTE,
    )
    p.add_argument("--since", default="24h",
                   help="how far back: 30m, 24h, 7d, 2w, or all (default 24h)")
    p.add_argument("--session", help="only this session id")
    p.add_argument("--by", choices=[g for g in GROUPS if g != "all"], default="day",
                   help="one row per day (UTC, default), hour, session or model")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_run)


def _run(settings: Settings, args: argparse.Namespace) -> int:
    try:
        since = parse_since(args.since)
    except ValueError as exc:
        print(f"ctxproxy stats: --since: {exc}", file=sys.stderr)
        return 2
    try:
        totals = asyncio.run(_totals(settings, args.by, since, args.session))
    except LedgerError as exc:
        print(f"ctxproxy stats: cannot read the request rows: {exc}", file=sys.stderr)
        return 1
    report = stats(totals, Prices.from_settings(settings), by=args.by,
                   since=since, session=args.session)
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        _table(report, args)
    return 0


async def _totals(settings: Settings, by: Group, since: float | None,
                  session: str | None) -> list[Totals]:
    ledger = make_ledger(settings)
    await ledger.open()
    try:
        return await ledger.totals(by, since=since, session=session)
    finally:
        await ledger.close()


def stats(totals: Sequence[Totals], prices: Prices, *, by: str, since: float | None,
          session: str | None) -> dict[str, Any]:
    """The report as ``--json`` prints it (the /ui pages show the same numbers)."""
    return {
        "by": by, "since": since, "session": session,
        "rows": [r.as_json() for r in summarize(totals, prices)],
        "total": total(totals, prices).as_json(),
        "note": ESTIMATE_NOTE,
    }


def _table(report: dict[str, Any], args: argparse.Namespace) -> None:
    # Piped output (no terminal) is not squeezed to 80 columns.
    console = Console(width=None if sys.stdout.isatty() else 160)
    rows = report["rows"]
    if not rows:
        scope = f"session {args.session}" if args.session else "any session"
        console.print(f"No requests recorded since {args.since} for {scope}. The proxy records "
                      "each model request it serves (CTXPROXY_STATS_ENABLED).")
        return
    table = Table(title=f"ctxproxy: requests since {args.since}, by {args.by}",
                  caption="Tokens: sent by the client, forwarded upstream, cached by the "
                  "upstream, written to its cache (where it reports them). Costs: input only, "
                  "USD; direct is an estimate (see --help).")
    table.add_column(args.by)
    for name in ("requests", "sent", "forwarded", "cached", "written", "direct cost",
                 "proxy cost",
                 "saving", "cut", "masked", "recalled", "degraded"):
        table.add_column(name, justify="right")
    for row in [*rows, report["total"]]:
        table.add_row(*cells(row), end_section=row is rows[-1])
    console.print(table)


def cells(row: dict[str, Any]) -> list[str]:
    """One row of the table, from its JSON."""
    forwarded = tokens(row["forwarded_tokens"])
    if row["client_tokens"]:
        forwarded += f" ({row['forwarded_tokens'] / row['client_tokens']:.0%})"
    saving = usd(row["saving"])
    if row["saving_share"] is not None:
        saving += f" ({row['saving_share']:.0%})"
    return [
        str(row["key"]), f"{row['requests']:,}", tokens(row["client_tokens"]), forwarded,
        percent(row["cached_share"]), percent(row["cache_write_share"]),
        usd(row["cost_direct"]), usd(row["cost_proxy"]), saving,
        f"{row['items_cut']:,}", f"{row['outputs_masked']:,}", f"{row['recalled']:,}",
        f"{row['degraded']:,}",
    ]
