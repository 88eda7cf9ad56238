"""Hostile input through the whole app (window, knowledge, memory on): every request gets an
answer, forwarded or an OpenAI-shaped 4xx, and another session's small request meanwhile is
answered too. How fast is a benchmark figure (bench/), not asserted here."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.server import Running
from tests.fakes.upstream import FakeUpstream
from tests.memory.session import settle

Item = dict[str, Any]
MB = 1024 * 1024


def with_output(output: str) -> list[Item]:
    return [*codex.context_items(), *codex.tool_turn("run it", output=output),
            *codex.tool_turn("and again", output=output), codex.text("user", "what now?")]


def long_word() -> bytes:
    return json.dumps(codex.request(
        [*codex.context_items(), codex.text("user", "q" * MB)])).encode()


def base64_output() -> bytes:
    blob = base64.b64encode(os.urandom(3 * MB // 4)).decode()
    return json.dumps(codex.request(with_output(blob))).encode()


def use_x_not_y(turns: int = 2000) -> bytes:
    items = codex.context_items()
    for n in range(turns):
        items += codex.text_turn(f"Use lib{n} not lib{n + 1}. Always run check{n}. "
                                 f"Our db{n} is postgres{n}.")
    return json.dumps(codex.request([*items, codex.text("user", "go")])).encode()


def many_items(count: int = 50_000) -> bytes:
    items = [*codex.context_items(), codex.text("user", "start")]
    items += [{"type": "reasoning", "summary": [], "encrypted_content": f"e{n}"}
              for n in range(count)]
    return json.dumps(codex.request([*items, codex.text("user", "end")])).encode()


def huge_numbers() -> bytes:
    body = json.dumps(codex.request(codex.session(8), max_output_tokens="@@"))
    return body.replace('"@@"', str(2**80)).encode()


def deep_nesting() -> bytes:
    body = json.dumps(codex.request(codex.session(8), metadata="@@"))
    return body.replace('"@@"', "[" * 5000 + "]" * 5000).encode()


def invalid_utf8() -> bytes:
    return json.dumps(codex.request(codex.session(6))).encode().replace(b"step 3", b"step \xff\xfe")


def surrogates() -> bytes:
    lone = "\\ud800 \\udfff"
    items = with_output("@@out")
    items[-1] = codex.text("user", "@@user")
    call = next(i for i in items if i.get("type") == "function_call")
    call["arguments"] = "@@args"
    reasoning = next(i for i in items if i.get("type") == "reasoning")
    reasoning["summary"] = [{"type": "summary_text", "text": "@@summary"}]
    body = json.dumps(codex.request(items))
    for mark in ("@@out", "@@user", "@@args", "@@summary"):
        body = body.replace(mark, f"{mark[2:]} {lone}")
    return body.encode()


CASES: dict[str, Callable[[], bytes]] = {
    "a 1 MB single word": long_word,
    "a 1 MB base64 tool output": base64_output,
    "2,000 turns of 'use X not Y'": use_x_not_y,
    "50k input items": many_items,
    "integers beyond 64 bits": huge_numbers,
    "5,000 levels of nesting": deep_nesting,
    "invalid UTF-8": invalid_utf8,
    "lone surrogates in every text field": surrogates,
}


async def post(proxy: Running, raw: bytes, session: str) -> tuple[int, bytes]:
    headers = codex.headers(session_id=session, turn_id=f"{session}-t")
    async with aiohttp.ClientSession() as http, http.post(
        proxy.url + "/v1/responses", data=io.BytesIO(raw), headers=headers,
        timeout=aiohttp.ClientTimeout(total=60),
    ) as r:
        return r.status, await r.read()


@pytest.fixture
async def proxy(start_proxy: ProxyFactory, tmp_path: Path) -> Running:
    return await start_proxy(team_id="team-1", data_dir=tmp_path / "data")


@pytest.mark.parametrize("case", list(CASES))
async def test_hostile_input_is_answered_and_others_are_served_meanwhile(
    proxy: Running, upstream: FakeUpstream, case: str
) -> None:
    raw = CASES[case]()
    small = json.dumps(codex.request(codex.session(3))).encode()
    (status, body), (other, _) = await asyncio.gather(
        post(proxy, raw, "hostile"), post(proxy, small, "bystander"))
    assert other == 200
    if status != 200:
        assert 400 <= status < 500, (status, body[:200])
        error = json.loads(body)["error"]
        assert error["message"] and error["type"]
    # The memory side digests what it was given without failing, and the proxy still serves.
    await settle(proxy)
    status, _ = await post(proxy, small, "after")
    assert status == 200
