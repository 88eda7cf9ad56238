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

from config import Settings
from ledger.model import GROUPS, Group, LedgerError, Totals
from ledger.prices import Prices
from ledger.report import ESTIMATE_NOTE, Row, parse_since, summarize, total
from ledger.stores import make_ledger

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
    report = stats(totals, Prices.from_setting(settings.prices), by=args.by,
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
    console = Console()
    rows = report["rows"]
    if not rows:
        scope = f"session {args.session}" if args.session else "any session"
        console.print(f"No requests recorded since {args.since} for {scope}. The proxy records "
                      "each /v1/responses request it serves (CTXPROXY_STATS_ENABLED).")
        return
    table = Table(title=f"ctxproxy: requests since {args.since}, by {args.by}",
                  caption="Costs: input only, USD; direct is an estimate (see --help).")
    for name, justify in (
        (args.by, "left"), ("requests", "right"), ("client tokens", "right"),
        ("forwarded", "right"), ("upstream input", "right"), ("cached", "right"),
        ("direct cost", "right"), ("proxy cost", "right"), ("saving", "right"),
        ("cut", "right"), ("masked", "right"), ("recalled", "right"), ("degraded", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in [*rows, report["total"]]:
        table.add_row(*_cells(row), end_section=row is rows[-1])
    console.print(table)


def _cells(row: dict[str, Any]) -> list[str]:
    return [
        str(row["key"]), f"{row['requests']:,}", f"{row['client_tokens']:,}",
        _share(row["forwarded_tokens"], row["client_tokens"]),
        f"{row['input_tokens']:,}", _percent(row["cached_share"]),
        _usd(row["cost_direct"]), _usd(row["cost_proxy"]),
        _saving(row["saving"], row["saving_share"]),
        f"{row['items_cut']:,}", f"{row['outputs_masked']:,}", f"{row['recalled']:,}",
        f"{row['degraded']:,}",
    ]


def usd(value: float | None) -> str:
    return "-" if value is None else f"${value:,.4f}"


_usd = usd


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _share(part: int, whole: int) -> str:
    return f"{part:,}" + (f" ({part / whole:.0%})" if whole else "")


def _saving(saving: float | None, share: float | None) -> str:
    if saving is None:
        return "-"
    return usd(saving) + (f" ({share:.0%})" if share is not None else "")


def row_cells(row: Row) -> list[str]:
    """A Row as the table shows it (the /ui pages use the same formatting)."""
    return _cells(row.as_json())
