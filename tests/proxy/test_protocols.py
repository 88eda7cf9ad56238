"""Behaviour the client protocols share, one test per behaviour, parametrised by protocol:
Responses (Codex), Messages (Claude Code) and Chat Completions (opencode and the like). Each
case sends its protocol's own request shape to its own route and reads what its own fake
upstream received."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ctxproxy.proxy.app import METRICS
from tests.conftest import ProxyFactory, ledger_rows
from tests.e2e.test_codex import IDENTITY, bind_wiki
from tests.fakes import chat, codex
from tests.fakes import claude_code as cc
from tests.fakes.anthropic import FakeAnthropic, system_text
from tests.fakes.server import Running, free_port, serve
from tests.fakes.upstream import FakeUpstream, Received


@dataclass
class Case:
    """One protocol under test: its route, a request of N turns, and what its upstream got."""

    name: str
    route: str
    received: list[Received]
    anthropic_url: str = ""

    def body(self, turns: int) -> dict[str, Any]:
        if self.name == "responses":
            items = codex.context_items()
            for n in range(1, turns + 1):
                items += codex.tool_turn(f"[tool] turn {n}") if n % 2 else [
                    codex.text("user", f"turn {n}"), codex.text("assistant", f"answer {n}")]
            return codex.request(items[:-1], "s-proto")
        if self.name == "chat":
            said: list[dict[str, Any]] = []
            for n in range(1, turns + 1):
                said += chat.tool_turn(f"[tool] turn {n}", n) if n % 2 else [
                    {"role": "user", "content": f"turn {n}"},
                    {"role": "assistant", "content": f"answer {n}"}]
            return chat.request(said[:-1])
        messages = cc.first_messages("turn 1")
        messages.append({"role": "assistant", "content": "answer 1"})
        for n in range(2, turns + 1):
            messages += cc.tool_turn(f"[tool] turn {n}", n) if n % 2 else [
                {"role": "user", "content": f"turn {n}"},
                {"role": "assistant", "content": f"answer {n}"}]
        return cc.request(messages[:-1], "s-proto")

    def headers(self) -> dict[str, str]:
        if self.name == "responses":
            return {**codex.headers(session_id="s-proto"), **IDENTITY}
        if self.name == "chat":
            return chat.headers("s-proto", **IDENTITY)
        return cc.headers("s-proto", **IDENTITY)

    def system(self, body: dict[str, Any]) -> str:
        """The text of the body's system prompt, where the proxy's blocks go."""
        if self.name == "responses":
            return str(body.get("instructions", ""))
        if self.name == "chat":
            return chat.system_text(body)
        return system_text(body)

    def error(self, raw: bytes) -> tuple[str, str]:
        """(type, message) of an error body in this protocol's shape; fails on another."""
        body = json.loads(raw)
        if self.name in ("responses", "chat"):
            assert set(body) == {"error"}
        else:
            assert body["type"] == "error" and set(body) == {"type", "error"}
        return body["error"]["type"], body["error"]["message"]

    def pairs_whole(self, body: dict[str, Any]) -> bool:
        """Every tool call forwarded has its output, and the reverse."""
        text = json.dumps(body)
        if self.name == "responses":
            calls = {i["call_id"] for i in body["input"] if i.get("type") == "function_call"}
            outs = {i["call_id"] for i in body["input"]
                    if i.get("type") == "function_call_output"}
            return calls == outs and bool(calls)
        if self.name == "chat":
            asked = {c["id"] for m in body["messages"] for c in m.get("tool_calls") or ()}
            answered = {m["tool_call_id"] for m in body["messages"] if m["role"] == "tool"}
            return asked == answered and bool(asked) and "turn 1" not in text.split(
                "<earlier")[0]
        uses = {b["id"] for m in body["messages"] if isinstance(m["content"], list)
                for b in m["content"] if b.get("type") == "tool_use"}
        results = {b["tool_use_id"] for m in body["messages"] if isinstance(m["content"], list)
                   for b in m["content"] if b.get("type") == "tool_result"}
        return uses == results and bool(uses) and "turn 1" not in text.split("<earlier")[0]


@pytest.fixture(params=["responses", "messages", "chat"])
async def case(
    request: pytest.FixtureRequest, upstream: FakeUpstream
) -> AsyncIterator[Case]:
    if request.param == "responses":
        yield Case("responses", "/v1/responses", upstream.received)
        return
    if request.param == "chat":
        yield Case("chat", "/v1/chat/completions", upstream.received)
        return
    fake = FakeAnthropic()
    running = await serve(fake.app())
    fake.url = running.url
    yield Case("messages", "/v1/messages", fake.received, running.url)
    await running.close()


async def proxy_for(case: Case, start: ProxyFactory, **overrides: Any) -> Running:
    if case.anthropic_url:
        overrides["anthropic_url"] = case.anthropic_url
    return await start(memory_enabled=False, **overrides)


async def post(proxy: Running, case: Case, body: bytes) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s, s.post(
            proxy.url + case.route, data=body, headers=case.headers()) as r:
        return r.status, await r.read()


async def nine_turns_cut_to_three(case: Case, start: ProxyFactory) -> Running:
    """A proxy that has forwarded a request of nine turns cut to its last three."""
    proxy = await proxy_for(case, start, keep_turns=3, window_policy="fixed", trim_slack=0)
    status, _ = await post(proxy, case, json.dumps(case.body(9)).encode())
    assert status == 200
    return proxy


async def test_an_unchanged_request_goes_upstream_as_the_clients_bytes(
    case: Case, start_proxy: ProxyFactory
) -> None:
    proxy = await proxy_for(case, start_proxy)
    raw = json.dumps(case.body(2), indent=1).encode()  # spaces orjson would not write
    status, _ = await post(proxy, case, raw)
    assert status == 200 and case.received[-1].body == raw


async def test_a_cut_forwards_the_last_turns_with_each_call_and_its_output(
    case: Case, start_proxy: ProxyFactory
) -> None:
    await nine_turns_cut_to_three(case, start_proxy)
    forwarded = case.received[-1].json
    assert case.pairs_whole(forwarded)
    assert len(case.received[-1].body) < len(json.dumps(case.body(9)))


async def test_a_body_too_large_is_refused_in_the_protocols_own_shape(
    case: Case, start_proxy: ProxyFactory
) -> None:
    proxy = await proxy_for(case, start_proxy, max_body_mb=0.001)
    status, raw = await post(proxy, case, json.dumps(case.body(4)).encode())
    assert status == 413
    kind, message = case.error(raw)
    assert kind in ("invalid_request_error", "request_too_large") and "over" in message
    assert case.received == []


async def test_an_unreachable_upstream_is_a_502_in_the_protocols_own_shape(
    case: Case, start_proxy: ProxyFactory
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    overrides = {"anthropic_url": dead} if case.anthropic_url else {"upstream_url": dead}
    case.anthropic_url = ""
    proxy = await start_proxy(memory_enabled=False, **overrides)
    status, raw = await post(proxy, case, json.dumps(case.body(1)).encode())
    assert status == 502
    kind, _ = case.error(raw)
    assert kind in ("upstream_error", "api_error")


async def test_usage_reaches_the_metrics(case: Case, start_proxy: ProxyFactory) -> None:
    proxy = await proxy_for(case, start_proxy)
    status, _ = await post(proxy, case, json.dumps(case.body(1)).encode())
    assert status == 200
    sent = len(case.received[-1].body) // 4  # both fakes count four bytes a token
    assert proxy.app[METRICS].tokens.labels("input")._value.get() == sent


async def test_the_knowledge_block_goes_in_the_system_prompt_once(
    case: Case, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    await bind_wiki(tmp_path, tmp_path / "data")  # the data dir start_proxy serves
    proxy = await proxy_for(case, start_proxy)
    status, _ = await post(proxy, case, json.dumps(case.body(3)).encode())
    assert status == 200
    forwarded = case.received[-1].json
    assert case.system(forwarded).count("<knowledge_tools>") == 1
    assert json.dumps(forwarded).count("<knowledge_tools>") == 1  # nowhere else


async def test_the_ledger_row_names_its_protocol_and_counts_its_tokens(
    case: Case, start_proxy: ProxyFactory
) -> None:
    proxy = await nine_turns_cut_to_three(case, start_proxy)
    [row] = await ledger_rows(proxy.app, "s-proto", 1)
    assert row.protocol == case.name and row.input_tokens == len(case.received[-1].body) // 4
    assert (row.turns_in, row.turns_forwarded) == (9, 3)
    assert row.client_tokens and row.forwarded_tokens and row.forwarded_tokens < row.client_tokens


async def test_explain_reads_the_request_in_its_protocol(
    case: Case, start_proxy: ProxyFactory
) -> None:
    proxy = await nine_turns_cut_to_three(case, start_proxy)
    async with aiohttp.ClientSession() as s, s.get(
            proxy.url + "/ctxproxy/explain/last", params={"session": "s-proto"}) as r:
        report = await r.json()
    assert report["protocol"] == case.name
    assert (report["turns_in"], report["turns_forwarded"]) == (9, 3)
    assert report["items_cut"] > 0 and not report["unchanged"]
    # The digest of the cut turns: at the end of system for Messages (pinned with the
    # standing memory), an item of its own elsewhere.
    if case.name == "messages":
        assert "earlier_turns" in report["instructions_added"]["blocks"]
    else:
        assert any("earlier_turns" in a["item"] for a in report["items_added"])
