"""`ctxproxy memory ...` commands: look at, add to, edit and prune the memory store.

The store interface finds records within one whole scope; the CLI also filters by part of
one (say, one team), so those views read the records and filter here. Fine for a shell
command; the request path never does this.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import orjson

from ctxproxy.config import Settings
from ctxproxy.injectors.redact import redact
from ctxproxy.memory import forget as forget_
from ctxproxy.memory.model import (
    MEMORY_TYPES,
    Hit,
    Memory,
    MemoryType,
    Scope,
    Store,
    StoreError,
    user_ref,
)
from ctxproxy.memory.reindex import reindex
from ctxproxy.memory.stores import make_store

__all__ = ["register"]

_SCAN = 10_000_000  # "everything" for list(): the CLI views the whole store
Command = Callable[[Store, argparse.Namespace, Settings], Awaitable[int]]


def register(commands: Any) -> None:
    """Add the `memory` command group to the top-level parser."""
    parser: argparse.ArgumentParser = commands.add_parser("memory", help="manage memory")
    parser.set_defaults(func=lambda settings, args: parser.print_help())
    sub = parser.add_subparsers(dest="memory_command", metavar="ACTION")

    p = sub.add_parser("list", help="list memories, newest first")
    _filters(p)
    p.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    p.set_defaults(func=_runner(_list))

    p = sub.add_parser("search", help="full-text search, best match first")
    p.add_argument("query")
    _filters(p)
    p.add_argument("--limit", type=int, default=20, help="at most this many (default 20)")
    p.set_defaults(func=_runner(_search))

    p = sub.add_parser("show", help="one memory with its source chain")
    p.add_argument("memory_id")
    p.set_defaults(func=_runner(_show))

    p = sub.add_parser("add", help="add a semantic memory (a preference or a project fact)")
    p.add_argument("text")
    _scope_options(p, "scope of the new memory (default: CTXPROXY_SERVICE_ID/TEAM_ID/...)")
    p.add_argument("--key", help="idempotency key (default: derived from the text)")
    p.add_argument("--shared", action="store_true",
                   help="for every user of the team and agent (the scope's user is left "
                        "empty; recall shows it to each of them as added by an operator)")
    p.set_defaults(func=_runner(_add))

    p = sub.add_parser("edit", help="change a memory's text")
    p.add_argument("memory_id")
    p.add_argument("text")
    p.set_defaults(func=_runner(_edit))

    p = sub.add_parser(
        "forget",
        help="forget memories for good (a tombstone keeps them from being written again), "
             "with what was distilled only from them",
    )
    p.add_argument("memory_ids", nargs="*", metavar="MEMORY_ID")
    p.add_argument("--session", help="every memory of this session (narrowed by the scope "
                                     "options)")
    p.add_argument("--search", metavar="TEXT",
                   help="every memory of one scope whose text holds TEXT (case-insensitive)")
    _scope_options(p, "scope (--search: default CTXPROXY_SERVICE_ID/TEAM_ID/...; --session: "
                      "filters)")
    p.add_argument("--purge", action="store_true",
                   help="also replace the lines they quote in other memories of their scope "
                        "with [FORGOTTEN]")
    p.set_defaults(func=_runner(_forget))

    p = sub.add_parser("reindex", help="embed the memories that have no vector yet "
                       "(CTXPROXY_EMBEDDINGS_URL); resumable")
    p.set_defaults(func=_runner(reindex))

    p = sub.add_parser("export", help="write memories as JSON lines")
    _filters(p)
    p.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")
    p.set_defaults(func=_runner(_export))


def _scope_options(p: argparse.ArgumentParser, title: str) -> None:
    group = p.add_argument_group(title)
    group.add_argument("--service", help="service id")
    group.add_argument("--team", help="team id")
    group.add_argument("--agent", help="agent id")
    group.add_argument("--user", help="user ref (u_..., as `show` prints it)")
    group.add_argument("--user-key", help="the user key itself (as sent in x-tdai-user-key); "
                       "only its digest is used or kept")


def _filters(p: argparse.ArgumentParser) -> None:
    _scope_options(p, "filters (each one narrows; none: every scope)")
    p.add_argument("--type", dest="types", action="append", choices=MEMORY_TYPES,
                   help="only this type (repeatable)")
    p.add_argument("--session", help="only this session id")


def _runner(command: Command) -> Callable[[Settings, argparse.Namespace], int]:
    def run(settings: Settings, args: argparse.Namespace) -> int:
        return asyncio.run(_with_store(command, settings, args))

    return run


async def _with_store(command: Command, settings: Settings, args: argparse.Namespace) -> int:
    store = make_store(settings)
    try:
        await store.open()
        try:
            return await command(store, args, settings)
        finally:
            await store.close()
    except StoreError as exc:
        print(f"ctxproxy memory: store error: {exc}", file=sys.stderr)
        return 1


# --- selecting ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Filter:
    service: str | None
    team: str | None
    agent: str | None
    user: str | None
    types: tuple[MemoryType, ...]
    session: str | None

    @classmethod
    def of(cls, args: argparse.Namespace) -> _Filter:
        return cls(args.service, args.team, args.agent, _user(args),
                   tuple(args.types or MEMORY_TYPES), args.session)

    def whole_scope(self) -> Scope | None:
        parts = (self.service, self.team, self.agent, self.user)
        if any(p is None for p in parts):
            return None
        return Scope(*(p or "" for p in parts))

    def any_scope(self) -> bool:
        return all(p is None for p in (self.service, self.team, self.agent, self.user))

    def matches(self, scope: Scope) -> bool:
        wanted = (self.service, self.team, self.agent, self.user)
        have = (scope.service_id, scope.team_id, scope.agent_id, scope.user)
        return all(w is None or w == h for w, h in zip(wanted, have, strict=True))


async def _select(store: Store, f: _Filter, limit: int) -> list[Memory]:
    scope = f.whole_scope()
    if scope is not None or f.any_scope():
        return await store.list(scope, types=f.types, session_id=f.session, limit=limit)
    everything = await store.list(None, types=f.types, session_id=f.session, limit=_SCAN)
    return [m for m in everything if f.matches(m.scope)][:limit]


# --- commands ----------------------------------------------------------------------------


async def _list(store: Store, args: argparse.Namespace, settings: Settings) -> int:
    found = await _select(store, _Filter.of(args), args.limit)
    for m in found:
        print(_line(m))
    if not found:  # said on stderr: stdout stays a clean listing for scripts
        print("no memories (for these filters)", file=sys.stderr)
    return 0


async def _search(store: Store, args: argparse.Namespace, settings: Settings) -> int:
    f = _Filter.of(args)
    scope = f.whole_scope()
    if scope is not None:
        scopes = [scope]
    else:  # search every scope the filter covers; results never mix inside one search
        scopes = list(dict.fromkeys(m.scope for m in await _select(store, f, _SCAN)))
    hits: list[Hit] = []
    for s in scopes:
        hits += await store.search(s, args.query, types=f.types, limit=args.limit)
    hits = [h for h in hits if f.session is None or h.memory.session_id == f.session]
    hits.sort(key=lambda h: h.relevance, reverse=True)
    if not hits:
        print("no memory matches", file=sys.stderr)
    for hit in hits[: args.limit]:
        print(f"{hit.relevance:8.4f}  {_line(hit.memory)}")
    return 0


async def _show(store: Store, args: argparse.Namespace, settings: Settings) -> int:
    m = await store.get(args.memory_id)
    if m is None:
        return _not_found(args.memory_id)
    s = m.scope
    print(f"{m.memory_id}  {m.type}")
    print(f"scope:    service={s.service_id} team={s.team_id} agent={s.agent_id} user={s.user}")
    print(f"key:      {m.key}")
    if m.session_id is not None:
        window = " (inside the window)" if m.in_window else ""
        print(f"session:  {m.session_id} turn {_or_dash(m.turn_index)}{window}")
    print(f"created:  {_time(m.created_at)}")
    print(f"updated:  {_time(m.updated_at)}")
    print(f"expires:  {_time(m.expires_at) if m.expires_at is not None else 'never'}")
    if m.attrs:
        print(f"attrs:    {orjson.dumps(m.attrs, option=orjson.OPT_SORT_KEYS).decode()}")
    print("text:")
    for line in m.text.splitlines() or [""]:
        print(f"  {line}")
    if m.sources:
        print("sources:")
        await _print_sources(store, m.sources, depth=1, seen={m.memory_id})
    return 0


async def _print_sources(store: Store, ids: Sequence[str], depth: int, seen: set[str]) -> None:
    """The memories a record was merged or distilled from, recursively, one per line."""
    indent = "  " * depth
    for memory_id in ids:
        if memory_id in seen:
            print(f"{indent}{memory_id}  (cycle)")
            continue
        source = await store.get(memory_id)
        if source is None:
            print(f"{indent}{memory_id}  (forgotten)")
            continue
        where = ""
        if source.session_id is not None:
            where = f"  session {source.session_id} turn {_or_dash(source.turn_index)}"
        print(f"{indent}{memory_id}  {source.type}{where}  {_preview(source.text, 60)}")
        await _print_sources(store, source.sources, depth + 1, seen | {memory_id})


def _scope_of(args: argparse.Namespace, settings: Settings) -> Scope:
    """The scope the options name, the settings' defaults for those left out."""
    default_user = user_ref(settings.user_key.get_secret_value()) if settings.user_key else ""
    return Scope(
        service_id=args.service if args.service is not None else settings.service_id,
        team_id=args.team if args.team is not None else settings.team_id or "",
        agent_id=args.agent if args.agent is not None else settings.agent_id or "",
        user=user if (user := _user(args)) is not None else default_user,
    )


async def _add(store: Store, args: argparse.Namespace, settings: Settings) -> int:
    text = redact(args.text.strip())  # a secret typed here is not kept either
    if not text:
        print("ctxproxy memory add: the text is empty", file=sys.stderr)
        return 2
    scope = _scope_of(args, settings)
    attrs: dict[str, object] = {"origin": "cli"}
    if args.shared:
        scope = replace(scope, user="")
        attrs["shared"] = True
    key = args.key or "cli:" + hashlib.sha256(text.encode()).hexdigest()[:24]
    memory = Memory(type="semantic", scope=scope, key=key, text=text, attrs=attrs)
    stored = await store.upsert([memory])
    if not stored:
        print("ctxproxy memory add: this memory was forgotten (a tombstone keeps it out)",
              file=sys.stderr)
        return 1
    print(stored[0].memory_id)
    print(_scope_note(scope, shared=args.shared, client_keys=bool(settings.client_keys)),
          file=sys.stderr)
    return 0


def _user(args: argparse.Namespace) -> str | None:
    """The user ref from --user (a digest) or --user-key (digested here; never kept)."""
    if getattr(args, "user_key", None):
        if args.user is not None:
            raise SystemExit("ctxproxy memory: give --user or --user-key, not both")
        return user_ref(args.user_key)
    return args.user  # type: ignore[no-any-return]


def _scope_note(scope: Scope, *, shared: bool = False, client_keys: bool = False) -> str:
    """Which requests will see a memory of ``scope`` (they must match all four parts)."""
    parts = [f"service {scope.service_id!r}",
             f"x-team-id {scope.team_id!r}" if scope.team_id else "no x-team-id",
             f"x-agent-id {scope.agent_id!r}" if scope.agent_id else "no x-agent-id"]
    if shared:
        return "scope: requests with " + ", ".join(parts) + ", any user, see this memory"
    parts.append(f"the user {scope.user}" if scope.user else "no x-tdai-user-key")
    note = "scope: requests with " + ", ".join(parts) + " see this memory"
    if not scope.user:
        note += " (requests that send a user key do not: add --user-key, or --shared)"
    elif client_keys and scope.user.startswith("u_"):
        note += (" (under CTXPROXY_CLIENT_KEYS a scope also names the client key: give "
                 "--user p_... as `memory list` shows it)")
    return note


async def _edit(store: Store, args: argparse.Namespace, settings: Settings) -> int:
    m = await store.get(args.memory_id)
    if m is None:
        return _not_found(args.memory_id)
    text = redact(args.text.strip())
    if not text:
        print("ctxproxy memory edit: the text is empty", file=sys.stderr)
        return 2
    attrs = {**m.attrs, "edited": True}
    await store.upsert([replace(m, text=text, attrs=attrs, updated_at=time.time())])
    print(m.memory_id)
    return 0


async def _forget(store: Store, args: argparse.Namespace, settings: Settings) -> int:
    if not (args.memory_ids or args.session or args.search):
        print("ctxproxy memory forget: name memory ids, --session or --search", file=sys.stderr)
        return 2
    chosen: list[str] = []
    for memory_id in args.memory_ids:
        if await store.get(memory_id) is None:
            return _not_found(memory_id)
        chosen.append(memory_id)
    if args.session:
        f = _Filter.of(argparse.Namespace(**vars(args), types=None))
        chosen += [m.memory_id for m in await _select(store, f, _SCAN)]
    if args.search:
        scope = _scope_of(args, settings)
        wanted = args.search.casefold()
        hits = await store.search(scope, args.search, limit=1000)
        chosen += [h.memory.memory_id for h in hits if wanted in h.memory.text.casefold()]
    done = await forget_.forget(store, list(dict.fromkeys(chosen)), purge=args.purge)
    for memory_id in done.ids:
        print(f"forgot {memory_id}")
    for memory_id in done.rewritten:
        print(f"purged {memory_id}")
    return 0


async def _export(store: Store, args: argparse.Namespace, settings: Settings) -> int:
    records = await _select(store, _Filter.of(args), _SCAN)
    if args.output is None:
        _write_jsonl(records, sys.stdout)
    else:
        with args.output.open("w", encoding="utf-8") as out:
            _write_jsonl(records, out)
        print(f"exported {len(records)} memories to {args.output}", file=sys.stderr)
    return 0


def _write_jsonl(records: Sequence[Memory], out: TextIO) -> None:
    for m in records:
        out.write(orjson.dumps(asdict(m)).decode() + "\n")


# --- formatting --------------------------------------------------------------------------


def _line(m: Memory) -> str:
    s = m.scope
    where = "/".join(p or "-" for p in (s.service_id, s.team_id, s.agent_id, s.user))
    return f"{m.memory_id}  {m.type:<8}  {where}  {_time(m.updated_at)}  {_preview(m.text, 80)}"


def _preview(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _time(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def _not_found(memory_id: str) -> int:
    print(f"ctxproxy memory: no memory {memory_id}", file=sys.stderr)
    return 1
