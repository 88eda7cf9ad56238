"""`ctxproxy explain`: what the pipeline did to a request, for the last one the proxy served
(kept in memory) and for a body on disk; CTXPROXY_CAPTURE_DIR's redacted bodies."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from ctxproxy.proxy.cli import main
from tests.conftest import ProxyFactory
from tests.fakes import chat, codex
from tests.fakes import claude_code as cc
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.upstream import FakeUpstream

SECRET = "sk-proj-Abcdefghijklmnop1234567890"
WINDOW = {"window_policy": "fixed", "keep_turns": 2, "trim_slack": 0}


def body(turns: int = 6) -> dict[str, Any]:
    items = codex.session(turns)
    items[-1] = codex.text("user", f"deploy with key {SECRET} please")
    return codex.request(items, "sess-x")


async def send(url: str, payload: dict[str, Any]) -> None:
    async with aiohttp.ClientSession() as http, http.post(
        url + "/v1/responses", data=orjson.dumps(payload), headers=codex.headers("sess-x"),
    ) as resp:
        assert resp.status == 200
        await resp.read()


async def test_last_explains_the_request_the_proxy_served(
    start_proxy: ProxyFactory, upstream: FakeUpstream,
) -> None:
    proxy = await start_proxy(**WINDOW)
    await send(proxy.url, body())
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.url + "/ctxproxy/explain/last",
                            params={"session": "sess-x", "body": "1"}) as resp:
            assert resp.status == 200
            report = await resp.json()
        async with http.get(proxy.url + "/ctxproxy/explain/last",
                            params={"session": "other"}) as resp:
            assert resp.status == 404
    forwarded = upstream.received[-1].json  # type: ignore[attr-defined]
    assert report["turns_in"] == 6 and report["turns_forwarded"] == 2
    assert report["items_forwarded"] == len(forwarded["input"])
    assert report["items_cut"] > 0
    added = [a["item"] for a in report["items_added"]]
    assert any("earlier_turns" in a for a in added)  # the digest of the cut turns
    assert report["forwarded_tokens"] > 0 and report["client_tokens"] > 0
    # The body shown is the forwarded one, with the secret redacted (the upstream got it).
    assert SECRET in upstream.received[-1].body.decode()  # type: ignore[attr-defined]
    shown = orjson.dumps(report["body"]).decode()
    assert SECRET not in shown and "[REDACTED]" in shown
    assert len(report["body"]["input"]) == len(forwarded["input"])


async def offline(payload: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                  capsys: pytest.CaptureFixture[str]) -> tuple[Path, dict[str, Any]]:
    """``ctxproxy explain FILE --json --body`` on ``payload`` with the window of WINDOW."""
    path = tmp_path / "body.json"
    path.write_bytes(orjson.dumps(payload))
    for name, value in WINDOW.items():
        monkeypatch.setenv(f"CTXPROXY_{name.upper()}", str(value))
    monkeypatch.setenv("CTXPROXY_DATA_DIR", str(tmp_path))
    assert await asyncio.to_thread(main, ["explain", str(path), "--json", "--body"]) == 0
    return path, orjson.loads(capsys.readouterr().out)


async def test_explain_a_file_runs_the_window_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    path, report = await offline(body(), tmp_path, monkeypatch, capsys)
    assert (report["turns_in"], report["turns_forwarded"]) == (6, 2)
    assert "offline" in report["note"]
    assert SECRET not in orjson.dumps(report["body"]).decode()
    assert await asyncio.to_thread(main, ["explain", str(path)]) == 0
    text = capsys.readouterr().out
    assert "turns: 6 in, 2 forwarded" in text and "items added: 1" in text
    assert await asyncio.to_thread(main, ["explain"]) == 2  # neither a file nor --last


async def test_capture_dir_writes_each_forwarded_body_redacted(
    start_proxy: ProxyFactory, upstream: FakeUpstream, tmp_path: Path,
) -> None:
    proxy = await start_proxy(capture_dir=tmp_path / "captured", **WINDOW)
    await send(proxy.url, body())
    await send(proxy.url, body(8))
    await proxy.close()  # the captures are flushed at shutdown
    files = sorted((tmp_path / "captured").iterdir())
    assert len(files) == 2 and all("sess-x" in f.name for f in files)
    assert all(f.stat().st_mode & 0o077 == 0 for f in files)  # owner-only
    captured = orjson.loads(files[-1].read_bytes())
    assert SECRET not in files[-1].read_text()
    forwarded = upstream.received[-1].json  # type: ignore[attr-defined]
    assert len(captured["input"]) == len(forwarded["input"])


def test_the_ring_is_bounded_by_count_and_bytes() -> None:
    from ctxproxy.proxy.explain import Recent, Seen

    ring = Recent(size=3, max_bytes=1000)
    for n in range(5):
        ring.add(Seen(float(n), f"s{n}", b"x" * 100, b"y" * 100, 200, {}))
    assert ring.last("s1") is None and ring.last("s4") is not None
    assert ring.bytes == 3 * 200
    ring.add(Seen(5.0, "big", b"x" * 5000, b"x" * 5000, 200, {}))  # the newest always stays
    assert ring.last() is not None and ring.last().session == "big"  # type: ignore[union-attr]
    assert ring.last("s4") is None


# --- Anthropic Messages (Claude Code) ----------------------------------------------------


def claude_body(turns: int = 6) -> dict[str, Any]:
    messages = [*cc.first_messages("turn 1"), {"role": "assistant", "content": "ok"}]
    for n in range(2, turns):
        messages += cc.tool_turn(f"[tool] turn {n}", n)
    messages.append({"role": "user", "content": f"deploy with key {SECRET} please"})
    return cc.request(messages, "sess-c")


async def test_last_explains_a_claude_code_request(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic,
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url, memory_enabled=False, **WINDOW)
    client = claude_body()
    status, _ = await cc.post(proxy.url, client, cc.headers("sess-c"))
    assert status == 200
    async with aiohttp.ClientSession() as http, http.get(
            proxy.url + "/ctxproxy/explain/last",
            params={"session": "sess-c", "body": "1"}) as resp:
        assert resp.status == 200
        report = await resp.json()
    forwarded = anthropic.messages[-1].json
    assert report["turns_in"] == 6 and report["turns_forwarded"] == 2
    assert report["items_cut"] > 0 and report["items_in"] > report["items_forwarded"] > 0
    # The digest of the cut turns went to the end of system: added instructions, no item.
    assert "earlier_turns" in report["instructions_added"]["blocks"]
    assert report["instructions_added"]["tokens"] > 0
    assert report["items_added"] == []
    assert report["breakpoints"] == len(cc.marks(forwarded)) - len(cc.marks(client))
    assert report["client_tokens"] > report["forwarded_tokens"] > 0
    shown = orjson.dumps(report["body"]).decode()
    assert SECRET not in shown and len(report["body"]["messages"]) == len(forwarded["messages"])
    assert report["access"]["turns_forwarded"] == 2


async def test_explain_a_claude_code_file_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    _, report = await offline(claude_body(), tmp_path, monkeypatch, capsys)
    assert (report["turns_in"], report["turns_forwarded"]) == (6, 2)
    assert report["client_tokens"] > report["forwarded_tokens"]
    assert "messages" in report["body"] and "input" not in report["body"]


async def test_explain_a_chat_completions_file_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    messages: list[dict[str, Any]] = []
    for n in range(1, 7):
        messages += chat.tool_turn(f"turn {n}", n)
    _, report = await offline(chat.request(messages[:-1]), tmp_path, monkeypatch, capsys)
    assert (report["turns_in"], report["turns_forwarded"]) == (6, 2)
    assert report["client_tokens"] > report["forwarded_tokens"]
    forwarded = report["body"]["messages"]
    assert forwarded[0]["role"] == "system"  # the agent's context stays
    assert all("tool_call_id" in m for m in forwarded if m["role"] == "tool")
