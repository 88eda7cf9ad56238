"""``ctxproxy explain``: what the pipeline does to a request body, and ``ctxproxy doctor``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from ctxproxy.config import Settings
from ctxproxy.proxy.auth import load_client_keys
from ctxproxy.proxy.explain import explain, redact_body, render
from ctxproxy.request import Exchange, NotAResponsesRequest
from ctxproxy.request.messages import is_messages_body
from ctxproxy.request.protocol import CHAT, MESSAGES, PROTOCOLS, RESPONSES, Protocol
from ctxproxy.window.step import WindowStep

__all__ = ["register"]

OFFLINE_NOTE = (
    "offline: the window as configured ran on this body; knowledge and memory blocks need the "
    "running proxy (send the request through it, then: ctxproxy explain --last)"
)


def register(commands: Any) -> None:
    p: argparse.ArgumentParser = commands.add_parser(
        "explain", help="show what the pipeline does to a request body",
        description="Turns in and kept, items cut, outputs masked, blocks added with their "
        "sizes, the tokens sent and forwarded. FILE ('-': stdin) is run through the window "
        "here; --last asks the running proxy about the last request it served.",
    )
    p.add_argument("file", nargs="?",
                   help="a /v1/responses, /v1/messages or /v1/chat/completions request body "
                   "(JSON)")
    p.add_argument("--protocol", choices=sorted(PROTOCOLS),
                   help="FILE's protocol (default: told from the body: input is Responses; "
                   "messages with a top-level system, or none, Messages; with developer or tool "
                   "messages or tool_calls, Chat Completions)")
    p.add_argument("--last", action="store_true",
                   help="the last request the running proxy served (kept in memory); under "
                   "client keys, asked with the first admin key, else the first key (which "
                   "sees only its own principal's requests)")
    p.add_argument("--session", help="with --last: that session's last request")
    p.add_argument("--url", help="the running proxy (default: http://HOST:PORT)")
    p.add_argument("--body", action="store_true",
                   help="also print the forwarded body, secrets redacted")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_run)


def _run(settings: Settings, args: argparse.Namespace) -> int:
    if args.last == bool(args.file):
        print("ctxproxy explain: give a FILE or --last", file=sys.stderr)
        return 2
    try:
        report = _last(settings, args) if args.last else _offline(settings, args)
    except (OSError, httpx.HTTPError, ValueError) as exc:
        print(f"ctxproxy explain: {exc}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
        return 0
    print(render(report))
    if args.body and "body" in report:
        print("forwarded body (secrets redacted):")
        sys.stdout.buffer.write(orjson.dumps(report["body"], option=orjson.OPT_INDENT_2) + b"\n")
    return 0


def _offline(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    raw = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    headers = CIMultiDict[str]()
    if args.session:
        headers["session-id"] = headers["x-claude-code-session-id"] = args.session
    try:
        protocol = PROTOCOLS[args.protocol] if args.protocol else _protocol_of(orjson.loads(raw))
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"the body is not JSON: {exc}") from exc
    try:
        ex = Exchange.parse(raw, CIMultiDictProxy(headers), settings, protocol=protocol)
    except NotAResponsesRequest as exc:
        raise ValueError(f"not a request the pipeline reads, it would go out as sent: "
                         f"{exc}") from exc
    asyncio.run(WindowStep.from_settings(settings)(ex))
    forwarded = ex.serialise()
    report = explain(raw, forwarded, protocol.name)
    report["note"] = OFFLINE_NOTE
    if args.body:
        report["body"] = redact_body(orjson.loads(forwarded))
    return report


def _protocol_of(body: Any) -> Protocol:
    """A body's protocol as far as its keys tell: Chat's own roles and tool_calls, else
    Messages' messages, else Responses."""
    if not is_messages_body(body):
        return RESPONSES
    chat = any(isinstance(m, dict) and (m.get("role") in ("developer", "tool") or "tool_calls" in m)
               for m in body["messages"])
    return CHAT if chat and "system" not in body else MESSAGES


def _last(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    url = (args.url or f"http://{_host(settings.host)}:{settings.port}").rstrip("/")
    params = {"body": "1"} if args.body else {}
    if args.session:
        params["session"] = args.session
    headers = {}
    keys = load_client_keys(settings.client_keys)
    if keys:
        # An operator's key sees every principal's requests; any other only its own.
        key = next((k for k in keys if k.admin), keys[0])
        headers["Authorization"] = "Bearer " + key.key.decode()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # its request line is noise here
    response = httpx.get(url + "/ctxproxy/explain/last", params=params, headers=headers,
                         timeout=30)
    if response.status_code != 200:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:200]
        raise ValueError(f"{url} answered {response.status_code}: {message}")
    report: dict[str, Any] = response.json()
    return report


def _host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
