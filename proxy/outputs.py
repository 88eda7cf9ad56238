"""Masked tool outputs kept whole, so the model can fetch one back: ids, the store, the route.

When the window masks an older tool output, the mask's note carries a curl line to
``GET /ctxproxy/outputs/{id}`` with the session in ``x-ctxproxy-session``. The id is an
HMAC over the scope (service, team, agent, user digest), the session and the output (its place
in the client's input, its call id and its text's digest: call ids repeat across turns),
keyed by a secret every replica shares (a row in PostgreSQL under ``CTXPROXY_STORE_URL``, else
a file in the data dir): unguessable, one per output, and the same in every replica and after
a restart, so the forwarded bytes stay the same. The outputs live in a least-recently-used
cache of ``CTXPROXY_MASK_FETCH_MB`` per process and, written off the request path, in the
shared store (``proxy/output_store.py``), so any replica or worker answers, and after a
restart. An id that is unknown, or asked for with another session, gets the same 404 (no
oracle).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import re
import shlex
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import orjson
from aiohttp import web
from cachetools import LRUCache

from ctxproxy.config.files import secret_key
from ctxproxy.proxy.app import METRICS, SETTINGS
from ctxproxy.proxy.auth import OUTPUTS_ROUTE
from ctxproxy.proxy.output_store import (
    KEY_FILE,
    OutputStore,
    OutputStoreError,
    PostgresOutputs,
    Shelf,
    SqliteOutputs,
    Stored,
    scope_of,
)
from ctxproxy.request import Identity
from ctxproxy.window.masking import Output

__all__ = [
    "GONE", "KEY_FILE", "OUTPUTS", "PATH", "SESSION_HEADER", "MaskedOutputs", "OutputIds",
    "archive", "install", "load_key",
]

log = logging.getLogger("ctxproxy.outputs")

PATH = "/ctxproxy/outputs/"
SESSION_HEADER = "x-ctxproxy-session"
GONE = (
    "ctxproxy no longer holds this output (it keeps masked outputs for a while, up to a "
    "budget per scope). Run the command that produced it again.\n"
)
_DOMAIN = b"ctxproxy-masked-output\0"
_HEADER_UNSAFE = re.compile(r"[^\x21-\x7e]")  # a header value the curl line can carry as is


def load_key(data_dir: Path) -> bytes:
    """The secret the ids are keyed by (``data_dir/outputs.key``, see ``secret_key``)."""
    return secret_key(data_dir, KEY_FILE)


class OutputIds:
    """The id of an output in one session and scope (None without a usable session)."""

    def __init__(self, key: bytes, service_id: str) -> None:
        self._key = key
        self.service_id = service_id

    def id(self, identity: Identity, output: Output) -> str | None:
        session = identity.session_id
        if not session or _HEADER_UNSAFE.search(session):
            return None
        scope = [self.service_id, identity.team_id, identity.agent_id, identity.owner]
        which = [output.place, output.call_id, output.digest]
        message = _DOMAIN + orjson.dumps([*scope, session, *which])
        digest = hmac.new(self._key, message, hashlib.sha256).digest()[:16]  # 128 bits
        return base64.b32encode(digest).decode().rstrip("=").lower()


@dataclass(frozen=True, slots=True)
class _Kept:
    session: str
    text: str
    scope: str  # output_store.scope_of the caller's


def _theirs(kept: _Kept | Stored, session: str, scope: str | None) -> bool:
    """Whether an output kept here or in the store is of ``session`` (and ``scope``, when
    given): compared in constant time, as the session stands in for a credential."""
    return hmac.compare_digest(kept.session.encode(), session.encode()) and (
        scope is None or kept.scope == scope)


def _size(kept: _Kept) -> int:
    return sys.getsizeof(kept.text) + sys.getsizeof(kept.session)


# (team, agent, user key, principal, session, output): what an id is made of, besides the
# service.
_PointerKey = tuple[str | None, str | None, str | None, str | None, str | None, Output]
POINTERS_MEMO = 8192


class MaskedOutputs:
    """The window's archive: the fetch line of an output, and the outputs kept whole (here,
    and through ``shelf`` in the store every replica reads).

    Locked: the window masks a large body in a thread while the loop serves fetches.
    """

    def __init__(self, ids: OutputIds, base_url: str, max_bytes: int,
                 shelf: Shelf | None = None) -> None:
        self._ids = ids
        self._base_url = base_url.rstrip("/")
        self._max_bytes = max_bytes
        self._kept: LRUCache[str, _Kept] = LRUCache(maxsize=max_bytes, getsizeof=_size)
        # Every request between two cuts masks the same outputs again: their ids and lines
        # are remembered rather than computed (an HMAC and the quoting: ~12 µs each) again.
        self._pointers: LRUCache[_PointerKey, tuple[str, str]] = LRUCache(POINTERS_MEMO)
        self.shelf = shelf
        self._lock = threading.Lock()

    def _pointer(self, identity: Identity, output: Output) -> tuple[str, str] | None:
        """The output's id and its fetch line."""
        i = identity
        key = (i.team_id, i.agent_id, i.user_key, i.principal, i.session_id, output)
        with self._lock:
            found = self._pointers.get(key)
        if found is None:
            output_id = self._ids.id(identity, output)
            if output_id is None:
                return None
            argv = ["curl", "-sS", "-H", f"{SESSION_HEADER}: {identity.session_id}",
                    f"{self._base_url}{PATH}{output_id}"]
            found = (output_id, " ".join(shlex.quote(a) for a in argv))
            with self._lock:
                self._pointers[key] = found
        return found

    def fetch_command(self, identity: Identity, output: Output) -> str | None:
        pointer = self._pointer(identity, output)
        return pointer[1] if pointer is not None else None

    def keep(self, identity: Identity, output: Output, text: str) -> None:
        pointer = self._pointer(identity, output)
        if pointer is None:
            return  # no line was given
        scope = scope_of(self._ids.service_id, identity.team_id, identity.agent_id,
                         identity.owner)
        kept = _Kept(identity.session_id or "", text, scope)
        with self._lock:
            # Kept already: get marks it recently used (its id covers its text), and it went
            # to the store when it was first kept.
            new = self._kept.get(pointer[0]) is None and _size(kept) <= self._max_bytes
            if new:
                self._kept[pointer[0]] = kept
        if new and self.shelf is not None:
            self.shelf.offer(Stored(pointer[0], scope, kept.session, text, time.time()))

    def get(self, output_id: str, session: str, scope: str | None = None) -> str | None:
        """The output whole, if this process holds it and ``session`` is the one it is of
        (and ``scope``, when given, the scope: ``output_store.scope_of``)."""
        with self._lock:
            kept = self._kept.get(output_id)
        return kept.text if kept is not None and _theirs(kept, session, scope) else None

    async def find(self, output_id: str, session: str, scope: str | None = None) -> str | None:
        """The output whole for ``session`` (and ``scope``, when given): this process's, else
        the store's (redacted); None when neither holds it for them, or the store cannot be
        read (logged)."""
        text = self.get(output_id, session, scope)
        if text is not None or self.shelf is None or not session:
            return text
        try:
            stored = await self.shelf.store.get(output_id)
        except OutputStoreError as exc:
            log.warning("a masked output could not be read from the store: %s", exc)
            return None
        return stored.text if stored is not None and _theirs(stored, session, scope) else None


OUTPUTS = web.AppKey("masked_outputs", MaskedOutputs)


def install(app: web.Application) -> None:
    """Mount the fetch route (always: a fetch line must never be forwarded upstream) and,
    when ``MASK_FETCH_MB`` is set, the store behind it."""
    app.router.add_get(PATH + "{output_id}", fetch, name=OUTPUTS_ROUTE)
    settings = app[SETTINGS]
    if settings.mask_tool_outputs and settings.mask_fetch_mb > 0:
        app.cleanup_ctx.append(_outputs_ctx)


def archive(app: web.Application) -> MaskedOutputs | None:
    """The window step's archive (called at start-up, after every context is open)."""
    return app.get(OUTPUTS)


async def _outputs_ctx(app: web.Application) -> AsyncIterator[None]:
    settings, metrics = app[SETTINGS], app[METRICS]
    shelf = None
    if settings.mask_store_mb > 0:
        store: OutputStore = (PostgresOutputs(settings.store_url) if settings.store_url
                              else SqliteOutputs(settings.data_dir))
        try:
            key = await store.open()
            shelf = Shelf(
                store, max_scope_bytes=int(settings.mask_store_mb * 1024 * 1024),
                max_age_s=settings.mask_store_hours * 3600,
                on_drop=lambda reason, n: metrics.outputs_unstored.labels(reason).inc(n),
            )
            shelf.start()
        except OutputStoreError as exc:
            # Fetch lines still work from the process that forwarded the request.
            log.warning("masked outputs are kept in this process only: %s", exc)
    if shelf is None:
        key = await asyncio.to_thread(load_key, settings.data_dir)
    app[OUTPUTS] = MaskedOutputs(
        OutputIds(key, settings.service_id),
        settings.reachable_url,
        int(settings.mask_fetch_mb * 1024 * 1024),
        shelf,
    )
    try:
        yield
    finally:
        if shelf is not None:
            await shelf.close()


async def fetch(request: web.Request) -> web.Response:
    """GET /ctxproxy/outputs/{id}: a masked output whole, for the session that has it."""
    outputs = request.app.get(OUTPUTS)
    session = request.headers.get(SESSION_HEADER, "")
    text = await outputs.find(request.match_info["output_id"], session) if outputs else None
    if text is None:
        return web.Response(status=404, text=GONE, content_type="text/plain", charset="utf-8")
    return web.Response(text=text, content_type="text/plain", charset="utf-8")
