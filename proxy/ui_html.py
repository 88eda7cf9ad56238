"""The dashboard's HTML: pure functions from numbers to a page. Server-rendered, the charts
inline SVG, no script, no stylesheet or font from elsewhere: it works offline."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape
from urllib.parse import quote

from ctxproxy.ledger.report import ESTIMATE_NOTE, Row, percent, tokens, usd

__all__ = ["cards", "chart", "page", "table", "when"]

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:10px 24px;display:flex;gap:24px;align-items:center}
header a{color:#cfd8ea;text-decoration:none}header a.on{color:#fff;font-weight:600}
header b{margin-right:12px}main{padding:16px 24px;max-width:1200px}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:12px 0}
.card{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:10px 14px;min-width:140px}
.card .v{font-size:20px;font-weight:600}.card .k{color:#5b6475;font-size:12px}
table{border-collapse:collapse;background:#fff;width:100%;margin:12px 0}
th,td{border-bottom:1px solid #e3e6ec;padding:5px 8px;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}th{background:#eef1f5;font-weight:600}
.note{color:#5b6475;font-size:12px;max-width:900px}svg{background:#fff;border:1px solid #dde1e8}
.muted{color:#8a93a3}pre{background:#fff;border:1px solid #dde1e8;padding:10px;white-space:pre-wrap}
form.inline{display:inline}nav.since a{margin-right:10px}
#memories td:last-child,#knowledge td:last-child,#memory td{text-align:left}
"""
_NAV = (("overview", "/ui", "Overview"), ("sessions", "/ui/sessions", "Sessions"),
        ("memory", "/ui/memory", "Memory"))


def page(title: str, section: str, body: str) -> str:
    nav = "".join(
        f'<a href="{href}"{" class=on" if name == section else ""}>{label}</a>'
        for name, href, label in _NAV
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8><link rel=icon href=\"data:,\">"
        f"<title>{escape(title)} · ctxproxy</title><style>{_CSS}</style></head>"
        f"<body><header><b>ctxproxy</b>{nav}</header><main><h1>{escape(title)}</h1>"
        f"{body}</main></body></html>"
    )


def when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if ts else "-"


def cards(row: Row) -> str:
    """The headline numbers of a Row; each carries its exact value in ``data-value``."""
    items = [
        ("requests", f"{row.requests:,}", row.requests),
        ("client_tokens", tokens(row.client_tokens), row.client_tokens),
        ("forwarded_tokens", tokens(row.forwarded_tokens), row.forwarded_tokens),
        ("cached_share", percent(row.cached_share), row.cached_share),
        ("cache_write_share", percent(row.cache_write_share), row.cache_write_share),
        ("cost_direct", usd(row.cost_direct), row.cost_direct),
        ("cost_proxy", usd(row.cost_proxy), row.cost_proxy),
        ("saving", usd(row.saving), row.saving),
        ("recalled", f"{row.recalled:,}", row.recalled),
    ]
    labels = {
        "requests": "requests", "client_tokens": "tokens sent by the client",
        "forwarded_tokens": "tokens forwarded", "cached_share": "cached (upstream)",
        "cache_write_share": "written to the cache (upstream)",
        "cost_direct": "cost direct (estimate)", "cost_proxy": "cost through the proxy",
        "saving": "saving", "recalled": "memories shown",
    }
    return '<div class=cards>' + "".join(
        f'<div class=card><div class=v id="total-{name}" data-value="{_raw(value)}">'
        f"{escape(text)}</div><div class=k>{labels[name]}</div></div>"
        for name, text, value in items
    ) + "</div>"


def _raw(value: float | int | None) -> str:
    return "" if value is None else repr(round(value, 6) if isinstance(value, float) else value)


def table(head: Sequence[str], rows: Sequence[Sequence[str]], *, ident: str = "") -> str:
    """Cells are HTML already (escape text before)."""
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    attr = f' id="{ident}"' if ident else ""
    return f"<table{attr}><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def note() -> str:
    return f"<p class=note>{escape(ESTIMATE_NOTE)}</p>"


def since_links(base: str, current: str) -> str:
    links = " ".join(
        f'<a href="{base}?since={s}">{"<b>" + s + "</b>" if s == current else s}</a>'
        for s in ("24h", "7d", "30d", "all")
    )
    return f"<nav class=since>since: {links}</nav>"


def session_link(session: str) -> str:
    label = escape(session) if session else "<i>(no session id)</i>"
    return f'<a href="/ui/sessions/{quote(session, safe="")}">{label}</a>'


def memory_link(memory_id: str, *, short: bool = False) -> str:
    label = "…" + memory_id[-6:] if short and len(memory_id) > 8 else memory_id
    return (f'<a href="/ui/memory/{quote(memory_id, safe="")}" title="{escape(memory_id)}">'
            f"{escape(label)}</a>")


# --- charts ----------------------------------------------------------------------------------

_W, _H, _L, _B, _T = 860, 260, 70, 30, 14  # size, left and bottom margins, top
_COLOURS = ("#c0392b", "#2471a3", "#7d8a99")


def chart(
    series: Sequence[tuple[str, Sequence[float]]], labels: Sequence[str], *, unit: str,
    ident: str, bars: bool = False,
) -> str:
    """Lines (or grouped bars) of one or more series over the same points, with the first
    and last label under the axis and the top value on it."""
    points = max((len(values) for _, values in series), default=0)
    if points == 0:
        return "<p class=muted>Nothing recorded in this range yet.</p>"
    top = max((max(values, default=0.0) for _, values in series), default=0.0) or 1.0
    width, height = _W - _L - 10, _H - _B - _T

    def x(i: int) -> float:
        return _L + (width * (i + 0.5) / points if bars else
                     (width * i / (points - 1) if points > 1 else width / 2))

    def y(v: float) -> float:
        return _T + height * (1 - v / top)

    parts = [
        f'<svg id="{ident}" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" '
        f'role="img" aria-label="{escape(", ".join(name for name, _ in series))}">',
        f'<line x1="{_L}" y1="{_T + height}" x2="{_W - 10}" y2="{_T + height}" stroke="#999"/>',
        f'<line x1="{_L}" y1="{_T}" x2="{_L}" y2="{_T + height}" stroke="#999"/>',
        f'<text x="{_L - 6}" y="{_T + 4}" text-anchor="end" font-size="11">'
        f"{escape(_axis(top, unit))}</text>",
        f'<text x="{_L - 6}" y="{_T + height}" text-anchor="end" font-size="11">0</text>',
        f'<text x="{_L}" y="{_H - 8}" font-size="11">{escape(labels[0])}</text>',
        f'<text x="{_W - 10}" y="{_H - 8}" text-anchor="end" font-size="11">'
        f"{escape(labels[-1])}</text>",
    ]
    slot = width / points / (len(series) + 1)
    for n, (name, values) in enumerate(series):
        colour = _COLOURS[n % len(_COLOURS)]
        if bars:
            for i, v in enumerate(values):
                left = x(i) - slot * len(series) / 2 + slot * n
                parts.append(
                    f'<rect x="{left:.1f}" y="{y(v):.1f}" width="{max(slot, 1):.1f}" '
                    f'height="{_T + height - y(v):.1f}" fill="{colour}"/>'
                )
        else:
            path = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" '
                         f'points="{path}"/>')
        parts.append(f'<rect x="{_L + 10 + 190 * n}" y="2" width="10" height="10" '
                     f'fill="{colour}"/><text x="{_L + 24 + 190 * n}" y="11" font-size="11">'
                     f"{escape(name)}</text>")
    parts.append("</svg>")
    return "".join(parts)


def _axis(value: float, unit: str) -> str:
    return usd(value) if unit == "usd" else tokens(round(value))
