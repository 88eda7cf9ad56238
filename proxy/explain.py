"""What the pipeline did to a request: ``ctxproxy explain``'s report, the ring of recent
requests it reads with ``--last``, and ``CTXPROXY_CAPTURE_DIR``'s redacted bodies.

The report compares the client's body with the forwarded one, part by part (instructions,
tools, each input item, by digest): items cut, tool outputs masked (same call, other bytes),
items and instruction text added, with their sizes, and both token counts. A Messages or Chat
body is read as the steps saw it (its items), and its system prompt as its instructions.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import re
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from ctxproxy.config.files import private_file
from ctxproxy.injectors import tokens
from ctxproxy.injectors.breakpoints import client_marks, unmarked
from ctxproxy.injectors.redact import redact
from ctxproxy.ledger.counterfactual import PartCounter
from ctxproxy.proxy.app import SETTINGS
from ctxproxy.proxy.auth import ADMIN, PRINCIPAL
from ctxproxy.proxy.errors import error_response
from ctxproxy.request import End, History, Step, message_text, output_text
from ctxproxy.request.chat import first_system
from ctxproxy.request.messages import mark_count
from ctxproxy.request.protocol import CHAT, MESSAGES, PROTOCOLS, RESPONSES

__all__ = ["RECENT", "Recent", "explain", "install", "redact_body", "render", "steps"]

log = logging.getLogger("ctxproxy")
RING = 64  # recent requests kept in memory...
RING_BYTES = 64 * 1024 * 1024  # ...with at most this many bytes of bodies
LOOPBACK = frozenset({"127.0.0.1", "::1"})
_TAG = re.compile(r"<([a-z_]{3,40})[\s>]")


@dataclass(frozen=True, slots=True)
class Seen:
    """One request as the ring keeps it."""

    at: float
    session: str
    raw: bytes
    forwarded: bytes
    status: int
    notes: dict[str, Any]
    principal: str | None = None  # the client key's (None: no client keys)
    protocol: str = "responses"  # the client protocol's name


class Recent:
    """The last ``size`` model requests (of any protocol) of this process, any session, holding at
    most ``max_bytes`` of bodies (the oldest go first; the newest is always kept)."""

    def __init__(self, size: int = RING, max_bytes: int = RING_BYTES) -> None:
        self._ring: collections.deque[Seen] = collections.deque()
        self._size = size
        self._max_bytes = max_bytes
        self.bytes = 0

    def add(self, seen: Seen) -> None:
        self._ring.append(seen)
        self.bytes += _bytes(seen)
        while len(self._ring) > 1 and (len(self._ring) > self._size
                                       or self.bytes > self._max_bytes):
            self.bytes -= _bytes(self._ring.popleft())

    def last(self, session: str | None = None, *, principal: str | None = None) -> Seen | None:
        """The newest request of ``session`` (None: any) sent with ``principal``'s key (None:
        anyone's)."""
        for seen in reversed(self._ring):
            if (session is None or seen.session == session) and (
                    principal is None or seen.principal == principal):
                return seen
        return None


def _bytes(seen: Seen) -> int:
    return len(seen.raw) + (len(seen.forwarded) if seen.forwarded is not seen.raw else 0)


RECENT = web.AppKey("recent", Recent)


def install(app: web.Application) -> None:
    """The ring, the route ``explain --last`` reads, and the capture directory."""
    app[RECENT] = Recent()
    app.router.add_get("/ctxproxy/explain/last", last_route, name="explain")
    if app[SETTINGS].capture_dir is not None:
        app.cleanup_ctx.append(_capture_ctx)


def steps(app: web.Application) -> list[Step]:
    """The pipeline steps that keep each request once it is over: in the ring, and (under
    CTXPROXY_CAPTURE_DIR) on disk. Steps rather than hooks of their own: the pipeline's end
    phase already runs after the access line, isolates a failure and counts it."""
    recent = app.get(RECENT)
    kept: list[Step] = [Keep(recent)] if recent is not None else []
    capture = app.get(CAPTURE)
    if capture is not None:
        kept.append(capture)
    return kept


class Keep:
    """Adds each request that went upstream to the ring ``explain --last`` reads."""

    name = "explain"

    def __init__(self, recent: Recent) -> None:
        self._recent = recent

    def ended(self, end: End) -> None:
        sent, info = end.sent, end.access
        if sent is not None:
            self._recent.add(Seen(sent.at, info.session_id or "", sent.raw, sent.forwarded,
                                  end.status, info.fields(), end.principal, sent.protocol))


async def last_route(request: web.Request) -> web.Response:
    """GET /ctxproxy/explain/last[?session=ID][&body=1]: from this machine only."""
    if request.remote not in LOOPBACK:
        return error_response(403, "explain is answered on the proxy's own machine only",
                              "invalid_request_error", "forbidden")
    # A client key sees its own requests only (another's body would carry its capabilities
    # and prompts); an operator's key, or the one-user sidecar without keys, sees them all.
    principal = None if request.get(ADMIN) else request.get(PRINCIPAL)
    seen = request.app[RECENT].last(request.query.get("session"), principal=principal)
    if seen is None:
        return error_response(404, "no request seen yet (for that session) by this process",
                              "invalid_request_error", "not_found")
    with_body = request.query.get("body") in ("1", "true")
    report = await asyncio.to_thread(_report, seen, with_body)
    return web.json_response(report, dumps=lambda v: orjson.dumps(v).decode())


def _report(seen: Seen, with_body: bool) -> dict[str, Any]:
    report = explain(seen.raw, seen.forwarded, seen.protocol)
    report.update(session=seen.session, status=seen.status, at=seen.at, access=seen.notes,
                  protocol=seen.protocol)
    if with_body:
        report["body"] = redact_body(orjson.loads(seen.forwarded))
    return report


# --- the report --------------------------------------------------------------------------


def _digest(item: Any) -> bytes:
    # Without cache breakpoints: an item the proxy marked is still the client's item.
    return hashlib.blake2b(orjson.dumps(unmarked(item), option=orjson.OPT_SORT_KEYS),
                           digest_size=16).digest()


def _describe(item: dict[str, Any]) -> str:
    kind = item.get("type", "?")
    role = item.get("role")
    text = message_text(item) if kind == "message" else output_text(item)
    label = f"{kind}/{role}" if role else str(kind)
    head = " ".join(redact(text).split())[:70]
    return f"{label}: {head}" if head else label


def explain(raw: bytes, forwarded: bytes, protocol: str = "responses") -> dict[str, Any]:
    """What became of the client's body ``raw`` (of ``protocol``) on its way out as
    ``forwarded``.

    Over 60 lines: each of the report's figures is worked out beside the others, from the
    same two lists of items."""
    shape = PROTOCOLS.get(protocol, RESPONSES)
    client, sent = orjson.loads(raw), orjson.loads(forwarded)
    before_text, after_text = shape.system_text(client), shape.system_text(sent)
    # Messages carry their cache marks in their own blocks (the steps' items do not).
    marks = (mark_count(sent) - mark_count(client) if shape is MESSAGES
             and isinstance(client, dict) and isinstance(sent, dict) else None)
    client, sent = shape.seen(client), shape.seen(sent)
    items_in = client.get("input") if isinstance(client.get("input"), list) else []
    items_out = sent.get("input") if isinstance(sent.get("input"), list) else []
    counter = PartCounter(tokens.count)
    extra = after_text[len(before_text):] if after_text.startswith(before_text) else after_text
    # Chat's system message holds what the steps added: compared as the client's own.
    counted_out, items_out = items_out, _system_as_sent(shape, items_in, items_out)
    in_digests = {_digest(i) for i in items_in}
    in_calls = {i.get("call_id"): i for i in items_in
                if isinstance(i, dict) and i.get("type") == "function_call_output"}
    out_digests = {_digest(i) for i in items_out}
    masked, added = [], []
    for item in items_out:
        if _digest(item) in in_digests or not isinstance(item, dict):
            continue
        before = in_calls.get(item.get("call_id")) if item.get("call_id") else None
        if before is not None:
            masked.append({"call_id": item["call_id"], "chars_before": len(output_text(before)),
                           "chars_after": len(output_text(item))})
        else:
            added.append({"item": _describe(item), "chars": len(orjson.dumps(item)),
                          "tokens": counter.measure({"input": [item]}).tokens})
    masked_ids = {m["call_id"] for m in masked}
    cut = sum(1 for i in items_in if _digest(i) not in out_digests
              and not (isinstance(i, dict) and i.get("call_id") in masked_ids
                       and i.get("type") == "function_call_output"))
    return {
        "turns_in": _turns(items_in), "turns_forwarded": _turns(
            [i for i in counted_out if not _added_words(i, in_digests)]),
        "items_in": len(items_in), "items_forwarded": len(counted_out), "items_cut": cut,
        "outputs_masked": masked, "items_added": added,
        "breakpoints": (marks if marks is not None
                        else len(client_marks(items_out)) - len(client_marks(items_in))),
        "instructions_added": {"chars": len(extra), "tokens": tokens.count(extra) if extra else 0,
                               "blocks": list(dict.fromkeys(_TAG.findall(extra)))},
        "client_tokens": counter.measure(client).tokens,
        "forwarded_tokens": counter.measure(sent).tokens,
        "unchanged": raw == forwarded,
    }


def _added_words(item: Any, client: set[bytes]) -> bool:
    """A user message of the steps' own (Messages and Chat write their blocks as user
    text): not a prompt of the client's, so no turn."""
    return isinstance(item, dict) and item.get("role") == "user" and _digest(item) not in client


def _system_as_sent(shape: object, items_in: list[Any], items_out: list[Any]) -> list[Any]:
    """``items_out`` with Chat's first system message the client's, when the steps only
    appended to it, or without it when they added it (what they wrote there is counted as
    instructions)."""
    before, after = first_system(items_in), first_system(items_out)
    if shape is not CHAT or after is None or before is after:
        return items_out
    if before is None:  # a system message of the steps' own, first
        return [item for item in items_out if item is not after]
    if not message_text(after).startswith(message_text(before)):
        return items_out
    return [before if item is after else item for item in items_out]


def _turns(items: list[Any]) -> int:
    try:
        return History(items).turns
    except TypeError:
        return 0


def redact_body(value: Any) -> Any:
    """A JSON value with ``injectors.redact`` applied to every string in it (long strings are
    cut to their head and tail as redaction does)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [redact_body(v) for v in value]
    if isinstance(value, dict):
        return {k: redact_body(v) for k, v in value.items()}
    return value


def render(report: dict[str, Any]) -> str:
    """The report as ``ctxproxy explain`` prints it."""
    lines = []
    if report.get("session") is not None:
        lines.append(f"session {report['session'] or '(none)'}, status {report.get('status')}")
    if report.get("note"):
        lines.append(report["note"])
    lines += [
        f"turns: {report['turns_in']} in, {report['turns_forwarded']} forwarded",
        f"items: {report['items_in']} in, {report['items_forwarded']} forwarded, "
        f"{report['items_cut']} cut",
        f"tokens: {report['client_tokens']:,} sent by the client, "
        f"{report['forwarded_tokens']:,} forwarded",
    ]
    if report["unchanged"]:
        lines.append("forwarded as sent (no step changed it)")
    masked = report["outputs_masked"]
    lines.append(f"tool outputs masked: {len(masked)}")
    lines += [f"  {m['call_id']}: {m['chars_before']:,} -> {m['chars_after']:,} chars"
              for m in masked]
    added = report["items_added"]
    lines.append(f"items added: {len(added)}")
    lines += [f"  {a['item']} ({a['chars']:,} chars, {a['tokens']:,} tokens)" for a in added]
    if report.get("breakpoints"):
        lines.append(f"cache breakpoints marked: {report['breakpoints']}")
    extra = report["instructions_added"]
    blocks = ", ".join(f"<{b}>" for b in extra["blocks"]) or "text"
    lines.append(f"instructions added: {extra['chars']:,} chars, {extra['tokens']:,} tokens"
                 + (f" ({blocks})" if extra["chars"] else ""))
    return "\n".join(lines)


# --- CTXPROXY_CAPTURE_DIR ----------------------------------------------------------------

PENDING = 32  # captures waiting at most; more are dropped (a debugging aid, never a brake)


class Capture:
    """Writes each parsed request's forwarded body, redacted, into CTXPROXY_CAPTURE_DIR: in a
    thread of its own, at most PENDING waiting (more are dropped)."""

    name = "capture"

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ctxproxy-capture")
        self._pending = 0
        self._count = 0

    def ended(self, end: End) -> None:
        sent = end.sent
        if sent is None or self._pending >= PENDING or sent.exchange is None:
            return
        self._pending += 1
        self._count += 1
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(sent.at))
        session = re.sub(r"[^A-Za-z0-9_-]", "_", end.access.session_id or "none")[:64]
        future = asyncio.get_running_loop().run_in_executor(
            self._pool, self._write, f"{stamp}-{session}-{self._count:06d}.json", sent.forwarded)
        future.add_done_callback(self._done)

    def _write(self, name: str, forwarded: bytes) -> None:
        body = redact_body(orjson.loads(forwarded))
        path = self._folder / name
        private_file(path)  # prompts, even redacted: owner-only like the data directory
        path.write_bytes(orjson.dumps(body, option=orjson.OPT_INDENT_2))

    def _done(self, future: asyncio.Future[None]) -> None:
        self._pending -= 1
        if not future.cancelled() and future.exception() is not None:
            log.warning("capturing a body failed: %s", future.exception())

    def close(self) -> None:
        self._pool.shutdown(wait=True)


CAPTURE = web.AppKey("capture", Capture)


async def _capture_ctx(app: web.Application) -> AsyncIterator[None]:
    folder: Path = app[SETTINGS].capture_dir  # type: ignore[assignment]
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    app[CAPTURE] = capture = Capture(folder)
    try:
        yield
    finally:
        capture.close()
