"""The dashboard at ``/ui``: what the proxy saved and sent (from the request ledger), one
session's timeline, and a memory browser. Server-rendered; under ``CLIENT_KEYS`` it needs a
key like every route (a browser signs in once at ``/ui/login``: the key goes in a cookie).

Under client keys a key sees and acts on its own principal's data only: the ledger's rows it
sent, and the memory scopes those rows name (a scope's user part is a digest of the
principal's: no other key's request names it). An admin key, and the one-user sidecar (no
client keys: its caller is its own operator), see everything."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from html import escape
from typing import Any

from aiohttp import web

from ctxproxy.knowledge.routes import EMBEDDED
from ctxproxy.ledger.model import Group, LedgerError, Record
from ctxproxy.ledger.prices import Prices
from ctxproxy.ledger.report import Row, parse_since, percent, summarize, tokens, total, usd
from ctxproxy.ledger.sql import HOUR
from ctxproxy.memory import forget as forget_
from ctxproxy.memory.model import Memory, Scope, Store, StoreError
from ctxproxy.proxy.auth import ADMIN, PRINCIPAL, UI_COOKIE
from ctxproxy.proxy.ledger_wiring import LEDGER, LedgerSide
from ctxproxy.proxy.memory_wiring import MEMORY
from ctxproxy.proxy.ui_html import (
    cards,
    chart,
    memory_link,
    note,
    page,
    session_link,
    since_links,
    table,
    when,
)

__all__ = ["install"]

SESSIONS_SHOWN = 200
STEPS = 100  # points of the overview's charts
RAW_SERIES = 20_000  # a chart over more requests than this reads the hourly roll-up
MEMORIES_SHOWN = 50
SCOPES_SCANNED = 5000


def install(app: web.Application) -> None:
    app.router.add_get("/ui", overview, name="ui")
    app.router.add_get("/ui/sessions", sessions, name="ui:sessions")
    app.router.add_get("/ui/sessions/{session}", session, name="ui:session")
    app.router.add_get("/ui/memory", memories, name="ui:memory")
    app.router.add_get("/ui/memory/{memory_id}", memory, name="ui:memory-one")
    app.router.add_post("/ui/memory/{memory_id}/forget", forget, name="ui:forget")
    app.router.add_get("/ui/login", login_form, name="ui:login")
    app.router.add_post("/ui/login", login, name="ui:login-post")


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8",
                        headers={"Cache-Control": "no-store"})


def _since(request: web.Request, default: str = "7d") -> tuple[str, float | None]:
    value = request.query.get("since", default)
    try:
        return value, parse_since(value)
    except ValueError:
        return default, parse_since(default)


def _side(request: web.Request) -> LedgerSide:
    side = request.app.get(LEDGER)
    return side if side is not None else LedgerSide(None, None, Prices(), "not installed")


def _whose(request: web.Request) -> str | None:
    """The principal whose data this caller sees; None: everyone's (an admin key, or no
    client keys)."""
    return None if request.get(ADMIN, True) else request[PRINCIPAL]


def _off(side: LedgerSide) -> str:
    return (f"<p>Request stats are off: {escape(side.error or 'the ledger is not open')}.</p>")


# --- the overview and the sessions -----------------------------------------------------------


async def overview(request: web.Request) -> web.Response:
    side = _side(request)
    label, since = _since(request)
    if side.ledger is None:
        return _html(page("Overview", "overview", _off(side)))
    span = (time.time() - since) if since is not None else None
    by: Group = "hour" if span is not None and span <= 3 * 86400 else "day"
    whose = _whose(request)
    totals = await side.ledger.totals(by, since=since, principal=whose)
    rows = summarize(totals, side.prices)
    whole = total(totals, side.prices)
    steps, labels = await _series(side, whole, whose)
    if whole.cost_direct is not None:
        plot = chart(
            [("direct (estimate)", _cumulative(r.cost_direct or 0.0 for r in steps)),
             ("through ctxproxy", _cumulative(r.cost_proxy or 0.0 for r in steps))],
            labels, unit="usd", ident="cost-chart",
        )
        what = "Cumulative input cost, USD"
    else:
        plot = chart(
            [("sent by the client", _cumulative(float(r.client_tokens) for r in steps)),
             ("forwarded", _cumulative(float(r.forwarded_tokens) for r in steps))],
            labels, unit="tokens", ident="cost-chart",
        )
        what = "Cumulative tokens (no price for these models: tokens only)"
    flow = chart(
        [("sent by the client", [float(r.client_tokens) for r in steps]),
         ("forwarded", [float(r.forwarded_tokens) for r in steps]),
         ("cached upstream", [float(r.cached_tokens) for r in steps]),
         ("written to the cache", [float(r.cache_write_tokens) for r in steps])],
        labels, unit="tokens", ident="tokens-chart", bars=True,
    )
    body = (
        since_links("/ui", label) + cards(whole)
        + f"<h2>{what}</h2>{plot}"
        + f"<h2>Tokens over time</h2>{flow}"
        + table([by, "requests", "sent", "forwarded", "cached", "written", "direct", "proxy",
                 "saving", "cut", "recalled", "degraded"],
                [_row_cells(r, escape(r.key)) for r in [*rows, whole]], ident="periods")
        + _unpriced(whole) + note()
    )
    return _html(page("Overview", "overview", body))


async def _series(side: LedgerSide, whole: Row, whose: str | None
                  ) -> tuple[list[Row], list[str]]:
    """The range's rows in ``STEPS`` equal steps of time (empty ones too), with labels."""
    if side.ledger is None or not whole.requests:
        return [], []
    start, step = whole.first_at, max((whole.last_at - whole.first_at) / (STEPS - 1), 1.0)
    if step >= HOUR or whole.requests > RAW_SERIES:
        # From the hourly roll-up: whole hours (a few points for a busy short range).
        start, step = start // HOUR * HOUR, math.ceil(step / HOUR) * HOUR
    series = await side.ledger.series(start, step, principal=whose)
    found = {r.key: r for r in summarize(series, side.prices)}
    count = max((int(key) for key in found), default=0) + 1  # the database's own rounding
    rows = [found.get(str(i)) or Row(str(i)) for i in range(count)]
    return rows, [when(start + i * step)[:16] for i in range(count)]


def _cumulative(values: Any) -> list[float]:
    return list(itertools.accumulate(values))


def _row_cells(r: Row, first: str) -> list[str]:
    forwarded = tokens(r.forwarded_tokens) + (
        f" ({r.forwarded_share:.0%})" if r.forwarded_share is not None else "")
    return [first, f"{r.requests:,}", tokens(r.client_tokens), forwarded,
            percent(r.cached_share), percent(r.cache_write_share), usd(r.cost_direct),
            usd(r.cost_proxy), usd(r.saving),
            f"{r.items_cut:,}", f"{r.recalled:,}", f"{r.degraded:,}"]


def _unpriced(row: Row) -> str:
    if not row.unpriced_models:
        return ""
    names = ", ".join(escape(m or "(none)") for m in row.unpriced_models)
    return (f"<p class=note>No price for: {names} (tokens only; set CTXPROXY_PRICES to "
            "price them).</p>")


async def sessions(request: web.Request) -> web.Response:
    side = _side(request)
    label, since = _since(request)
    if side.ledger is None:
        return _html(page("Sessions", "sessions", _off(side)))
    shown = summarize(await side.ledger.totals("session", since=since, limit=SESSIONS_SHOWN,
                                               principal=_whose(request)), side.prices)
    body = (
        since_links("/ui/sessions", label)
        + table(["session", "requests", "sent", "forwarded", "cached", "written", "direct",
                 "proxy", "saving", "cut", "recalled", "degraded", "last request"],
                [[*_row_cells(r, session_link(r.key)), when(r.last_at)] for r in shown],
                ident="sessions")
        + (f"<p class=muted>The {SESSIONS_SHOWN} most recent sessions.</p>"
           if len(shown) == SESSIONS_SHOWN else "")
        + note()
    )
    return _html(page("Sessions", "sessions", body))


async def session(request: web.Request) -> web.Response:
    side = _side(request)
    name = request.match_info["session"]
    if side.ledger is None:
        return _html(page("Session", "sessions", _off(side)))
    whose = _whose(request)
    records = await side.ledger.timeline(name, principal=whose)
    if not records:
        return _html(page("Session", "sessions",
                          f"<p>No requests recorded for session {escape(name)}.</p>"), 404)
    whole = total(await side.ledger.totals("all", session=name, principal=whose), side.prices)
    labels = [f"#{i + 1}" for i in range(len(records))]
    plot = chart(
        [("sent by the client", [float(r.client_tokens or 0) for r in records]),
         ("forwarded", [float(r.forwarded_tokens or 0) for r in records]),
         ("cached upstream", [float(r.cached_tokens or 0) for r in records]),
         ("written to the cache", [float(r.cache_write_tokens or 0) for r in records])],
        labels, unit="tokens", ident="timeline-chart", bars=True,
    )
    body = (
        f"<p>Session <code>{escape(name)}</code>: {len(records)} requests, "
        f"{when(records[0].at)} to {when(records[-1].at)}.</p>"
        + cards(whole) + "<h2>Tokens per request</h2>" + plot
        + table(["#", "time", "model", "protocol", "turns", "sent", "forwarded", "cached",
                 "written", "direct cached", "cut", "masked", "recalled", "knowledge",
                 "degraded", "first byte"],
                [_timeline_cells(i, r) for i, r in enumerate(records, 1)], ident="timeline")
        + note()
    )
    return _html(page(f"Session {name[:40]}", "sessions", body))


def _timeline_cells(i: int, r: Record) -> list[str]:
    turns = "-" if r.turns_in is None else f"{r.turns_forwarded}/{r.turns_in}"
    cached = percent((r.cached_tokens or 0) / r.input_tokens) if r.input_tokens else "-"
    written = "-" if r.cache_write_tokens is None or not r.input_tokens else percent(
        r.cache_write_tokens / r.input_tokens)
    direct = percent((r.direct_cached or 0) / r.direct_input) if r.direct_input else "-"
    recalled = " ".join(memory_link(m, short=True) for m in r.memory_ids) or "-"
    return [
        str(i), when(r.at)[11:19], escape(r.model), escape(r.protocol) or "-", turns,
        _opt(r.client_tokens),
        _opt(r.forwarded_tokens), cached, written, direct, str(r.items_cut), str(r.outputs_masked),
        recalled, "yes" if r.knowledge else "-", escape(", ".join(r.degraded)) or "-",
        f"{r.ttfb_ms:.0f} ms" if r.ttfb_ms is not None else "-",
    ]


def _opt(n: int | None) -> str:
    return "-" if n is None else tokens(n)


# --- the memory browser ----------------------------------------------------------------------


async def memories(request: web.Request) -> web.Response:
    runtime = request.app.get(MEMORY)
    query = request.query.get("q", "").strip()
    form = (f'<form method=get action="/ui/memory"><input name=q size=50 '
            f'value="{escape(query)}" placeholder="search memories"> '
            "<button>Search</button></form>")
    if runtime is None:
        return _html(page("Memory", "memory", form + "<p>Memory is off "
                          "(CTXPROXY_MEMORY_ENABLED).</p>" + await _knowledge(request)))
    try:
        found = await _found(runtime.store, await _scopes(request), query)
    except (StoreError, LedgerError) as exc:
        return _failed(exc, form)
    heading = f"Matches for “{escape(query)}”" if query else "Newest memories"
    body = (form + f"<h2>{heading}</h2>"
            + table(["memory", "type", "session", "updated", "text"],
                    [_memory_cells(m) for m in found], ident="memories")
            + await _knowledge(request))
    return _html(page("Memory", "memory", body))


async def _scopes(request: web.Request) -> list[Scope] | None:
    """The memory scopes this caller may see (None: every scope): those its principal's
    requests named, as the ledger recorded them."""
    whose = _whose(request)
    if whose is None:
        return None
    ledger = _side(request).ledger
    if ledger is None:
        return []
    return [Scope(*key) for key in await ledger.scopes(whose, limit=SCOPES_SCANNED)]


async def _found(store: Store, scopes: list[Scope] | None, query: str) -> list[Memory]:
    """The newest memories, or the best matches for ``query``, of ``scopes`` (None: all)."""
    if scopes is None and not query:
        return await store.list(None, limit=MEMORIES_SHOWN)
    if scopes is None:
        newest = await store.list(None, limit=SCOPES_SCANNED)
        scopes = list(dict.fromkeys(m.scope for m in newest))
    if not query:
        mine = [m for scope in scopes for m in await store.list(scope, limit=MEMORIES_SHOWN)]
        mine.sort(key=lambda m: m.updated_at, reverse=True)
        return mine[:MEMORIES_SHOWN]
    hits = [h for scope in scopes for h in await store.search(scope, query,
                                                                limit=MEMORIES_SHOWN)]
    hits.sort(key=lambda h: h.relevance, reverse=True)
    return [h.memory for h in hits[:MEMORIES_SHOWN]]


def _failed(exc: Exception, before: str = "") -> web.Response:
    return _html(page("Memory", "memory", before + f"<p>The memory store failed: "
                      f"{escape(str(exc))}</p>"), 503)


def _memory_cells(m: Memory) -> list[str]:
    text = m.text.replace("\n", " ")
    return [memory_link(m.memory_id), m.type, escape(m.session_id or "-"), when(m.updated_at),
            f'<span style="white-space:normal">{escape(text[:160])}</span>']


async def _knowledge(request: web.Request) -> str:
    core = request.app.get(EMBEDDED)
    if core is None:
        return "<h2>Knowledge</h2><p class=muted>Knowledge comes from the core at CORE_URL.</p>"
    if _whose(request) is not None:
        # The catalogue lists every team's assets; a key's teams are not on the request.
        return "<h2>Knowledge</h2><p class=muted>Knowledge assets are listed for admin keys.</p>"
    rows = await asyncio.to_thread(core.catalogue.knowledge, None)
    return "<h2>Knowledge assets</h2>" + table(
        ["id", "type", "name", "team", "pages / files", "summary"],
        [[escape(str(r.get("knowledge_id"))), escape(str(r.get("type", ""))),
          escape(str(r.get("name", ""))), escape(str(r.get("team_id") or "-")),
          str(r.get("page_count") or r.get("file_count") or 0),
          f'<span style="white-space:normal">{escape(str(r.get("summary") or "")[:160])}'
          "</span>"] for r in rows],
        ident="knowledge",
    )


async def _visible(request: web.Request, memory_id: str) -> Memory | None:
    """The memory ``memory_id`` if this caller may see it: another principal's is as unknown
    as none (a 403 would tell it exists)."""
    runtime = request.app.get(MEMORY)
    m = await runtime.store.get(memory_id) if runtime is not None else None
    if m is None:
        return None
    scopes = await _scopes(request)
    return m if scopes is None or m.scope in scopes else None


def _unknown(memory_id: str) -> web.Response:
    return _html(page("Memory", "memory", f"<p>No memory {escape(memory_id)} (forgotten, or "
                      "never stored).</p>" + '<p><a href="/ui/memory">Back</a></p>'), 404)


async def memory(request: web.Request) -> web.Response:
    memory_id = request.match_info["memory_id"]
    try:
        m = await _visible(request, memory_id)
    except (StoreError, LedgerError) as exc:
        return _failed(exc)
    if m is None:
        return _unknown(memory_id)
    s = m.scope
    facts = [
        ("type", escape(m.type)),
        ("scope", escape(f"service={s.service_id} team={s.team_id} agent={s.agent_id} "
                         f"user={s.user}")),
        ("session", escape(f"{m.session_id or '-'} turn {m.turn_index}")),
        ("updated", when(m.updated_at)),
        ("sources", " ".join(memory_link(x) for x in m.sources) or "-"),
    ]
    body = (
        table(["field", "value"], [[k, v] for k, v in facts], ident="memory")
        + f"<pre>{escape(m.text)}</pre>"
        + f'<form class=inline method=post action="/ui/memory/{escape(memory_id)}/forget">'
        "<button>Forget this memory</button></form>"
    )
    return _html(page(f"Memory {memory_id}", "memory", body))


async def forget(request: web.Request) -> web.Response:
    """Forget for good, as ``ctxproxy memory forget`` does: a tombstone keeps the session's
    next request from storing it again."""
    runtime = request.app.get(MEMORY)
    memory_id = request.match_info["memory_id"]
    try:
        m = await _visible(request, memory_id)
        if runtime is None or m is None:
            return _unknown(memory_id)
        done = await forget_.forget(runtime.store, [memory_id], scope=m.scope)
    except (StoreError, LedgerError) as exc:
        return _failed(exc)
    text = "".join(f"<p>Forgot {escape(i)}.</p>" for i in done.ids)
    return _html(page("Memory", "memory", text + '<p><a href="/ui/memory">Back</a></p>'))


# --- signing in (CLIENT_KEYS) ----------------------------------------------------------------


async def login_form(request: web.Request) -> web.Response:
    body = ('<form method=post action="/ui/login"><p>This proxy needs a client key '
            "(CTXPROXY_CLIENT_KEYS).</p><input type=password name=key size=40> "
            "<button>Sign in</button></form>")
    return _html(page("Sign in", "", body))


async def login(request: web.Request) -> web.Response:
    form = await request.post()
    key = form.get("key")
    response = web.Response(status=303, headers={"Location": "/ui"})
    if isinstance(key, str) and key:
        # The auth middleware checks the cookie like a bearer key, on /ui pages only.
        response.set_cookie(UI_COOKIE, key, httponly=True, samesite="Strict", path="/ui")
    return response
