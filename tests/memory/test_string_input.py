"""A Responses request whose ``input`` is a plain string: one user message, kept and recalled
like any other turn."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream
from tests.memory.session import codex_text, runtime

DB_FACT = "Our database is PostgreSQL 15 on port 5433."


async def ask(url: str, prompt: str, session: str) -> bytes:
    """POST a string-input request; the bytes sent (the answer read to its end)."""
    raw = json.dumps({"model": "fake-model", "stream": True, "input": prompt}).encode()
    async with aiohttp.ClientSession() as s, s.post(
        url + "/v1/responses", data=raw, headers=codex.headers(session, turn_id=prompt[:20])
    ) as r:
        assert r.status == 200, await r.text()
        await r.read()
    return raw


async def test_a_string_input_is_forwarded_as_sent_and_its_turn_is_stored(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy()
    raw = await ask(proxy.url, f"{DB_FACT} Set up the migrations folder.", "str-1")

    assert upstream.last.body == raw  # nothing to add to a first turn: the client's bytes
    await runtime(proxy).queue.join()
    stored = await runtime(proxy).store.list(None, types=["episodic"], limit=10)
    [episode] = [m.text for m in stored]
    assert f"User: {DB_FACT}" in episode
    assert "Assistant: FAKE-ANSWER to: Our database" in episode


async def test_a_later_string_input_of_the_session_recalls_it(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy()
    await ask(proxy.url, f"{DB_FACT} Set up the migrations folder.", "str-1")
    await runtime(proxy).queue.join()

    await ask(proxy.url, "Which port does the database listen on?", "str-1")

    # The recall went in as a message: the input is written back as a list, the prompt last.
    sent: dict[str, Any] = upstream.last.json
    *before, prompt = sent["input"]
    assert prompt == {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "Which port does the database listen on?"}]}
    assert any("PostgreSQL 15 on port 5433" in codex_text(i) for i in before
               if i.get("role") == "developer")
