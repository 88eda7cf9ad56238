"""`ctxproxy knowledge ...` commands: manage the embedded core's wikis, code graphs and agent
bindings."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from ctxproxy.config import Settings
from ctxproxy.knowledge.announce import announce
from ctxproxy.knowledge.code_index import index_repository
from ctxproxy.knowledge.store import FILENAME, Catalogue, WrongType
from ctxproxy.knowledge.wiki import read_pages
from ctxproxy.request import user_digest

Command = Callable[[Settings, argparse.Namespace], int]


def register(commands: Any) -> None:
    """Add the `knowledge` command group to the top-level parser."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "knowledge",
        help="manage knowledge (wikis, code graphs and agent bindings of the embedded core)",
    )

    def usage(settings: Settings, args: argparse.Namespace) -> int:
        parser.print_help()  # as `ctxproxy memory` does: asking for help is no error
        return 0

    parser.set_defaults(func=usage)
    sub = parser.add_subparsers(dest="knowledge_command", metavar="COMMAND")

    add = sub.add_parser("add-wiki", help="index a folder of *.md files as a wiki (re-run: sync)")
    add.add_argument("--team", required=True, help="the team the wiki belongs to")
    add.add_argument("--name", required=True, help="display name")
    add.add_argument("--summary", default=None, help="one-line description shown to the model")
    add.add_argument("dir", type=Path, help="the folder (searched recursively)")
    add.set_defaults(func=_run(add_wiki))

    code = sub.add_parser(
        "add-code",
        help="index a repository (Python, JS/TS, Go, Rust) as a code graph (re-run: sync)",
    )
    code.add_argument("--team", required=True, help="the team the code graph belongs to")
    code.add_argument("--name", required=True, help="display name")
    code.add_argument("--summary", default=None, help="one-line description")
    code.add_argument("dir", type=Path, help="the repository's root folder")
    code.set_defaults(func=_run(add_code))

    show = sub.add_parser("list", help="list the knowledge and its bindings")
    show.add_argument("--team", default=None, help="only this team's")
    show.set_defaults(func=_run(list_knowledge, changes=False))

    for name, fn, text in (("bind", bind, "bind knowledge to an agent for one user key"),
                           ("unbind", unbind, "remove a binding")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--agent", required=True, help="agent id (x-agent-id)")
        p.add_argument(
            "--user-key", default=None,
            help="the user's key (x-tdai-user-key); default CTXPROXY_USER_KEY; only a digest "
            "is stored",
        )
        if name == "bind":
            p.add_argument("--priority", type=int, default=50, help="higher is listed first")
        p.add_argument("id", help="knowledge id (wiki-... or cg-...)")
        p.set_defaults(func=_run(fn))

    rm = sub.add_parser("remove", help="delete knowledge, its pages or files, its bindings")
    rm.add_argument("id", help="knowledge id (wiki-... or cg-...)")
    rm.set_defaults(func=_run(remove))

    changed = sub.add_parser(
        "changed",
        help="tell every replica on CTXPROXY_STORE_URL to ask the core again now (after "
        "changing a remote core's knowledge or bindings)",
    )
    changed.set_defaults(func=announce_change)


def _run(fn: Callable[[Settings, argparse.Namespace, Catalogue], int], *,
         changes: bool = True) -> Command:
    """``fn`` on the embedded catalogue; when it changed something (``changes`` and exit 0),
    every replica on the store is told."""

    def command(settings: Settings, args: argparse.Namespace) -> int:
        if settings.core_url is not None:
            print(
                "ctxproxy: note: CTXPROXY_CORE_URL is set, so the proxy discovers from that "
                "core; these commands manage the embedded one.",
                file=sys.stderr,
            )
        catalogue = Catalogue.open(settings.data_dir / FILENAME)
        try:
            code = fn(settings, args, catalogue)
        finally:
            catalogue.close()
        if code == 0 and changes and settings.store_url:
            _announce(settings)
        return code

    return command


def _announce(settings: Settings) -> bool:
    assert settings.store_url is not None
    try:
        announce(settings.store_url, settings.service_id)
    except (psycopg.Error, OSError) as exc:
        print(f"ctxproxy: note: the replicas could not be told ({type(exc).__name__}); they "
              f"see the change within CTXPROXY_KNOWLEDGE_TTL_S", file=sys.stderr)
        return False
    return True


def announce_change(settings: Settings, args: argparse.Namespace) -> int:
    if not settings.store_url:
        return _fail("changed needs CTXPROXY_STORE_URL: the replicas hear of changes there")
    if not _announce(settings):
        return 1
    print("told every replica on the store to ask the core again")
    return 0


def _fail(message: str) -> int:
    print(f"ctxproxy: {message}", file=sys.stderr)
    return 1


def add_wiki(settings: Settings, args: argparse.Namespace, catalogue: Catalogue) -> int:
    root: Path = args.dir.resolve()
    if not root.is_dir():
        return _fail(f"{args.dir} is not a folder")
    pages = read_pages(root, sys.stderr)
    if not pages:
        print(f"ctxproxy: warning: no *.md files under {root}: the wiki has no pages"
              " (a wiki already made from this folder loses all of its pages)", file=sys.stderr)
    try:
        result = catalogue.sync_wiki(
            settings.service_id, args.team, args.name, args.summary, str(root), pages
        )
    except WrongType as exc:
        return _fail(str(exc))
    print(result.knowledge_id)
    print(
        f"{len(pages)} pages: {result.added} added, {result.updated} updated, "
        f"{result.removed} removed, {result.unchanged} unchanged",
        file=sys.stderr,
    )
    return 0


def add_code(settings: Settings, args: argparse.Namespace, catalogue: Catalogue) -> int:
    root: Path = args.dir.resolve()
    if not root.is_dir():
        return _fail(f"{args.dir} is not a folder")
    try:
        result, parsed = index_repository(
            catalogue, settings.service_id, args.team, args.name, args.summary, root,
            progress=sys.stderr,
        )
    except WrongType as exc:
        return _fail(str(exc))
    print(result.knowledge_id)
    total = result.added + result.updated + result.unchanged
    print(
        f"{total} files: {result.added} added, {result.updated} updated, "
        f"{result.removed} removed, {result.unchanged} unchanged ({parsed} parsed)",
        file=sys.stderr,
    )
    return 0


def list_knowledge(settings: Settings, args: argparse.Namespace, catalogue: Catalogue) -> int:
    rows = catalogue.knowledge(settings.service_id, args.team, limit=10_000)
    bound: dict[str, list[str]] = {}
    for b in catalogue.bindings(settings.service_id):
        bound.setdefault(b["knowledge_id"], []).append(f"{b['agent_id']}({b['priority']})")
    if not rows:
        print("no knowledge yet: ctxproxy knowledge add-wiki (or add-code) --team T --name N DIR")
    for r in rows:
        size = (f"files={r['file_count']}" if r["type"] == "code-graph"
                else f"pages={r['page_count']}")
        print(f"{r['knowledge_id']}  {r['type']}  team={r['team_id']}  {size}  {r['name']}")
        if r["summary"]:
            print(f"    {r['summary']}")
        print(f"    source: {r['source']}")
        if r["repo_slug"]:
            print(f"    repo: {r['repo_slug']}" + (f" ({r['branch']})" if r["branch"] else ""))
        if r["knowledge_id"] in bound:
            print(f"    bound to: {', '.join(bound[r['knowledge_id']])}")
    if settings.memory_enabled and settings.chat_memory_asset:
        # Not in the catalogue: the proxy serves one per team and agent from its memory.
        print(f"chat_memory-{args.team or '<team>'}-<agent>  chat-memory  served by the proxy")
        print("    each team and agent's own memory (search, read, recent), listed to the "
              "model with the team's assets")
    return 0


def _user_key(settings: Settings, args: argparse.Namespace) -> str | None:
    if args.user_key:
        return str(args.user_key)
    return settings.user_key.get_secret_value() if settings.user_key else None


def bind(settings: Settings, args: argparse.Namespace, catalogue: Catalogue) -> int:
    key = _user_key(settings, args)
    if not key:
        return _fail("bind needs --user-key (or CTXPROXY_USER_KEY)")
    if not catalogue.knowledge(settings.service_id, ids=[args.id]):
        return _fail(f"no knowledge {args.id!r}; see ctxproxy knowledge list")
    catalogue.bind(settings.service_id, args.agent, user_digest(key), args.id, args.priority)
    print(f"bound {args.id} to agent {args.agent} (priority {args.priority})")
    return 0


def unbind(settings: Settings, args: argparse.Namespace, catalogue: Catalogue) -> int:
    key = _user_key(settings, args)
    if not key:
        return _fail("unbind needs --user-key (or CTXPROXY_USER_KEY)")
    if not catalogue.unbind(settings.service_id, args.agent, user_digest(key), args.id):
        return _fail(f"{args.id} is not bound to agent {args.agent} for that user key")
    print(f"unbound {args.id} from agent {args.agent}")
    return 0


def remove(settings: Settings, args: argparse.Namespace, catalogue: Catalogue) -> int:
    if not catalogue.knowledge(settings.service_id, ids=[args.id]) or not catalogue.remove(
        args.id
    ):
        return _fail(f"no knowledge {args.id!r}")
    print(f"removed {args.id}")
    return 0
