"""``ctxproxy``: serve the proxy, and manage knowledge and memory from the shell."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib.metadata
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from aiohttp import web

from ctxproxy.config import Settings, SettingsError, describe_settings, load_settings, logs
from ctxproxy.config.settings import unknown_settings
from ctxproxy.proxy import workers
from ctxproxy.proxy.bodies import SERVER_OPTIONS
from ctxproxy.proxy.server import Runner

log = logging.getLogger("ctxproxy")


def settings_help() -> str:
    rows = describe_settings()
    width = max(len(name) for name, _, _ in rows)
    lines = ["settings (environment variables):"]
    for name, default, description in rows:
        lines.append(f"  {name:<{width}}  {description} [default: {default}]")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="ctxproxy",
        description="A transparent context proxy for coding agents (OpenAI Responses, Anthropic "
        "Messages, Chat Completions). `ctxproxy serve` runs it; with no command this help is "
        "printed.",
        epilog=settings_help(),
        formatter_class=formatter,
    )
    parser.add_argument("--version", action="version", version=f"ctxproxy {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve", help="run the proxy", epilog=settings_help(), formatter_class=formatter
    )
    serve.set_defaults(func=lambda settings, args: run_server(settings))
    for module in _command_modules():
        module.register(commands)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("ctxproxy")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return "unknown"


def _command_modules() -> list[Any]:
    from ctxproxy.knowledge import cli as knowledge_cli
    from ctxproxy.ledger import cli as ledger_cli
    from ctxproxy.memory import cli as memory_cli
    from ctxproxy.proxy import doctor, explain_cli

    return [knowledge_cli, memory_cli, ledger_cli, explain_cli, doctor]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        # A newcomer's first try: show the commands rather than start a server in silence.
        parser.print_help()
        return 0
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"ctxproxy: invalid setting: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level, settings.log_format)
    for name, closest in unknown_settings():
        hint = f"; did you mean {closest}?" if closest else ""
        log.warning(
            "unknown setting %s is ignored%s", name, hint,
            extra=logs.fields(variable=name, closest=closest),
        )
    try:
        result = args.func(settings, args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`ctxproxy memory export | head`): not an error of ours.
        # Python flushes stdout again at exit: point it at devnull so that fails quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return int(result or 0)


def run_server(settings: Settings) -> int:
    """Serve until SIGTERM or SIGINT: in this process, or in ``WORKERS`` supervised ones."""
    if settings.workers > 1:
        # mkdtemp's mode 0700: no other user reaches the workers' sockets.
        with tempfile.TemporaryDirectory(prefix="ctxproxy-workers-") as directory:
            return workers.supervise(
                settings.workers,
                functools.partial(_worker, settings, Path(directory), settings.workers),
                **_listening(settings),
            )
    return _run(settings)


def _worker(
    settings: Settings, directory: Path, count: int, index: int, ready: Connection
) -> int:
    """One of several workers (in a process of its own, started by ``workers.supervise``)."""
    logs.configure(settings.log_level, settings.log_format)
    workers.tag_logs(index)
    peers = workers.Peers(directory, count, index)
    return _run(settings, peers=peers, ready=workers.ready_signal(ready))


def _run(settings: Settings, *, peers: workers.Peers | None = None,
         ready: workers.Ready | None = None) -> int:
    try:
        asyncio.run(_serve(settings, peers=peers, ready=ready))
    except OSError as exc:
        print(f"ctxproxy: cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr)
        return 1
    return 0


def _listening(settings: Settings) -> dict[str, object]:
    return {"address": f"http://{settings.host}:{settings.port}",
            "upstream": settings.upstream_url, "data_dir": str(settings.data_dir),
            "dashboard": f"http://{settings.host}:{settings.port}/ui"}


async def _serve(settings: Settings, *, peers: workers.Peers | None = None,
                 ready: workers.Ready | None = None) -> None:
    """Serve the app; a worker (``peers``) shares the port with the others (SO_REUSEPORT)
    and listens to them on its socket."""
    from ctxproxy.proxy.app import METRICS, PEERS
    from ctxproxy.proxy.assemble import build_app, limits
    from ctxproxy.proxy.local import sibling_app

    app = build_app(settings)
    if peers is not None:
        app[PEERS] = peers
    runner = Runner(app, limits=limits(app), handler_cancellation=True, access_log=None,
                    shutdown_timeout=30.0, **SERVER_OPTIONS)
    await runner.setup()
    # A worker's siblings ask for its metrics on its socket: an app of that one route, so
    # that the socket is no way around client keys.
    siblings = web.AppRunner(sibling_app(app[METRICS]), access_log=None)
    site = web.TCPSite(
        runner, settings.host, settings.port, backlog=1024, reuse_port=peers is not None
    )
    try:
        await site.start()
        if peers is not None:  # asyncio removes a replaced worker's socket file first
            await siblings.setup()
            await web.UnixSite(siblings, str(peers.socket(peers.index))).start()
    except OSError:
        await siblings.cleanup()
        await runner.cleanup()  # the app's clients and stores are open already
        raise
    log.info(
        "ctxproxy listening" if peers is None else "worker listening",
        extra=logs.fields(**_listening(settings)),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready()
    try:
        await stop.wait()
    finally:
        log.info("shutting down: finishing open streams")
        await runner.cleanup()
        await siblings.cleanup()  # the siblings may scrape it while its streams finish
