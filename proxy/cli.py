"""``ctxproxy``: serve the proxy, and manage knowledge and memory from the shell."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from config import Settings, SettingsError, describe_settings, load_settings, logs
from config.settings import unknown_settings
from proxy.bodies import SERVER_OPTIONS

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
        description="A transparent context proxy for coding agents (OpenAI Responses API).",
        epilog=settings_help(),
        formatter_class=formatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve", help="run the proxy", epilog=settings_help(), formatter_class=formatter
    )
    serve.set_defaults(func=lambda settings, args: run_server(settings))
    for module in _command_modules():
        module.register(commands)
    return parser


def _command_modules() -> list[Any]:
    from knowledge import cli as knowledge_cli
    from memory import cli as memory_cli

    return [knowledge_cli, memory_cli]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["serve"])
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
    result = args.func(settings, args)
    return int(result or 0)


def run_server(settings: Settings) -> int:
    try:
        asyncio.run(_serve(settings))
    except OSError as exc:
        print(f"ctxproxy: cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr)
        return 1
    return 0


async def _serve(settings: Settings) -> None:
    from proxy.assemble import build_app

    app = build_app(settings)
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=30.0, **SERVER_OPTIONS
    )
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, backlog=1024)
    await site.start()
    log.info(
        "ctxproxy listening",
        extra=logs.fields(
            address=f"http://{settings.host}:{settings.port}", upstream=settings.upstream_url
        ),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("shutting down: finishing open streams")
        await runner.cleanup()
