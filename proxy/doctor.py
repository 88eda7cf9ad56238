"""``ctxproxy doctor``: the effective settings and where each came from, the data directory,
and a check of each thing the proxy talks to: the upstream, the store, the core."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx
from pydantic import SecretStr

from ctxproxy.config import Settings
from ctxproxy.config.settings import ENV_PREFIX
from ctxproxy.knowledge.client import CoreError, HttpCore
from ctxproxy.knowledge.store import FILENAME, Catalogue
from ctxproxy.ledger import LedgerError
from ctxproxy.ledger.stores import make_ledger
from ctxproxy.memory.model import StoreError
from ctxproxy.memory.stores import make_store
from ctxproxy.proxy.upstream import shown_url

__all__ = ["register", "settings_sources"]

Check = Callable[[Settings], Awaitable[str]]


def register(commands: Any) -> None:
    p: argparse.ArgumentParser = commands.add_parser(
        "doctor", help="print the effective settings and check the upstream, store and core",
    )
    p.set_defaults(func=_run)


def settings_sources(settings: Settings, env: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(variable, value as shown, 'environment' or 'default') for every setting; secrets are
    shown as set or unset, never their value."""
    rows = []
    for name in Settings.model_fields:
        variable = ENV_PREFIX + name.upper()
        value = getattr(settings, name)
        if isinstance(value, SecretStr):
            shown = "(set)"
        elif name == "client_keys" and value:
            shown = "(set)"
        elif name.endswith("_url") and value:
            shown = _no_password(str(value))  # any URL may carry a user's password
        else:
            shown = "unset" if value is None else str(value)
        rows.append((variable, shown, "environment" if variable in env else "default"))
    return rows


def _no_password(url: str) -> str:
    parts = httpx.URL(url)
    return str(parts.copy_with(password="***")) if parts.password else url


def _run(settings: Settings, args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # its request lines are noise here
    print("settings (variable = value  [from]):")
    rows = settings_sources(settings, os.environ)
    width = max(len(v) for v, _, _ in rows)
    for variable, shown, source in rows:
        print(f"  {variable:<{width}} = {shown}  [{source}]")
    data = settings.data_dir
    state = ("exists, writable" if os.access(data, os.W_OK) else "exists, NOT writable") \
        if data.is_dir() else "does not exist yet (made on first start)"
    print(f"\ndata directory: {data} ({state})")
    print("\nchecks:")
    failed = 0
    checks = [("upstream", _upstream), ("store", _store), ("request stats", _ledger),
              ("core", _core)]
    if settings.chat_url:
        checks.insert(1, ("chat upstream", _chat_upstream))
    for name, check in checks:
        started = time.perf_counter()
        try:
            result = asyncio.run(check(settings))
            mark = "ok  "
        except Exception as exc:  # each check reports its own failure and the next runs
            result, mark = f"{type(exc).__name__}: {exc}", "FAIL"
            failed += 1
        print(f"  {mark} {name:<14} {result} ({(time.perf_counter() - started) * 1000:.0f} ms)")
    return 1 if failed else 0


async def _upstream(settings: Settings) -> str:
    return await _models(settings.upstream_url, "CTXPROXY_UPSTREAM_URL", settings)


async def _chat_upstream(settings: Settings) -> str:
    assert settings.chat_url is not None
    return await _models(settings.chat_url, "CTXPROXY_CHAT_URL", settings)


async def _models(url: str, variable: str, settings: Settings) -> str:
    """The base URL is right when its models route answers 2xx, or 401/403: the doctor sends
    no key, and a provider refuses one it lacks only on a route that exists. Anything else
    (a 404 most often) means requests would not reach the API."""
    async with httpx.AsyncClient(timeout=settings.upstream_connect_timeout_s) as http:
        response = await http.get(url + "/models")
    status = response.status_code
    answer = f"{shown_url(url)}/models answered HTTP {status}"
    if 200 <= status < 300 or status in (401, 403):
        return answer
    if status >= 500:
        raise RuntimeError(answer)
    moved = response.headers.get("location")
    raise RuntimeError(
        answer + (f" (moved to {shown_url(moved)})" if moved else "")
        + f"; is {variable} the API's base URL? It usually ends in /v1, as in "
        "https://api.openai.com/v1"
    )


async def _store(settings: Settings) -> str:
    store = make_store(settings)
    try:
        await store.open()
        count = len(await store.list(None, limit=100_000))
    except StoreError as exc:
        raise RuntimeError(str(exc)) from exc
    finally:
        await store.close()
    kind = "PostgreSQL" if settings.store_url else f"SQLite in {settings.data_dir}"
    return f"{kind}: opened, {count:,} memories" + (" (at least)" if count == 100_000 else "")


async def _ledger(settings: Settings) -> str:
    if not settings.stats_enabled:
        return "off (CTXPROXY_STATS_ENABLED)"
    ledger = make_ledger(settings)
    try:
        await ledger.open()
        [*rows] = await ledger.totals("all")
    except LedgerError as exc:
        raise RuntimeError(str(exc)) from exc
    finally:
        await ledger.close()
    return f"opened, {sum(t.requests for t in rows):,} requests recorded"


async def _core(settings: Settings) -> str:
    if settings.core_url is None:
        path = settings.data_dir / FILENAME
        if not path.exists():
            return f"embedded, no catalogue yet ({path}); served on the proxy's port at /v3"
        catalogue = await asyncio.to_thread(Catalogue.open, path)
        try:
            assets = await asyncio.to_thread(catalogue.knowledge, None)
        finally:
            await asyncio.to_thread(catalogue.close)
        return (f"embedded ({path}): {len(assets)} knowledge assets; served on the proxy's "
                "port at /v3")
    token = settings.core_token.get_secret_value() if settings.core_token else None
    core = HttpCore(settings.core_url, service_id=settings.service_id, token=token,
                    timeout_s=settings.core_timeout_ms / 1000)
    try:
        items = await core.list_knowledge(settings.team_id or "")
    except CoreError as exc:
        raise RuntimeError(str(exc)) from exc
    finally:
        await core.aclose()
    return f"{settings.core_url}: listKnowledge answered, {len(items)} assets"
