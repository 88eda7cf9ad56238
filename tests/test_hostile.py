"""Hostile input through the whole app (window, knowledge, memory on): every request gets an
answer, forwarded or an OpenAI-shaped 4xx, and another session's small request meanwhile is
answered too, on each memory store, and what was answered is in memory. How fast is a benchmark
figure (bench/), not asserted here."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.harness.hostile import CASES, Item
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.server import Running, raw_request
from tests.fakes.upstream import FakeUpstream
from tests.memory.conftest import fresh_schema, require_pg_url
from tests.memory.session import runtime, settle

# The turns of each body that is a conversation the proxy reads (lone surrogates are not JSON to
# it: forwarded untouched): once answered, every one is in memory.
TURNS = {"a 1 MB single word": 1, "a 1 MB base64 tool output": 3,
         "2,000 turns of 'use X not Y'": 2001, "50k input items": 2, "integers beyond 64 bits": 8}


def conversation(tag: str, turns: int = 3) -> list[Item]:
    """A valid session of ``turns`` turns whose prompts name it (its request is found upstream
    by them)."""
    items = codex.context_items()
    for n in range(1, turns):
        items += codex.text_turn(f"{tag} turn {n}")
    return [*items, codex.text("user", f"{tag} turn {turns}")]


# Raw bytes in a header value; aiohttp's server decodes what is not UTF-8 to lone surrogates.
ODD_BYTES = {
    "invalid UTF-8": b"\xff\xfe",
    "a lone surrogate": "\ud800".encode("utf-8", "surrogatepass"),
    "non-ASCII UTF-8": "é🙂".encode(),  # valid: may be forwarded, and must arrive unchanged
}
HEADERS = ("session-id", "x-agent-id", "x-team-id", "x-tdai-user-key", "x-client-request-id",
           "x-codex-turn-metadata", "x-hostile-custom")


def header_value(name: str, bad: bytes) -> bytes:
    if name == "x-codex-turn-metadata":
        return b'{"session_id": "hostile", "turn_id": "t-' + bad + b'", "request_kind": "turn"}'
    return b"hostile-" + bad + b"-1"


HEADER_CASES = [
    *(pytest.param(name, header_value(name, bad), id=f"{kind} in {name}")
      for name in HEADERS for kind, bad in ODD_BYTES.items()),
    # Valid UTF-8 whose JSON escapes a lone surrogate.
    pytest.param("x-codex-turn-metadata", header_value("x-codex-turn-metadata", b"\\ud800"),
                 id="an escaped lone surrogate in x-codex-turn-metadata"),
]


async def post(proxy: Running, raw: bytes, session: str) -> tuple[int, bytes]:
    headers = codex.headers(session_id=session, turn_id=f"{session}-t")
    async with aiohttp.ClientSession() as client, client.post(
        proxy.url + "/v1/responses", data=io.BytesIO(raw), headers=headers,
        timeout=aiohttp.ClientTimeout(total=60),
    ) as r:
        return r.status, await r.read()


async def post_raw(
    proxy: Running, raw: bytes, session: str, header: tuple[str, bytes]
) -> tuple[int, bytes]:
    """``post`` over a bare stream, with one header's value as raw bytes: aiohttp's client will
    not send bytes that are not UTF-8, nor a lone surrogate."""
    name, value = header
    headers = codex.headers(session_id=session, turn_id=f"{session}-t")
    lines = [f"{k}: {v}".encode() for k, v in headers.items() if k.lower() != name]
    head = b"\r\n".join([b"POST /v1/responses HTTP/1.1", *lines, name.encode() + b": " + value])
    return await raw_request(proxy.url, head, raw, timeout_s=60)


def assert_answered(status: int, body: bytes) -> None:
    """Forwarded, or refused with an OpenAI-shaped 4xx."""
    if status != 200:
        assert 400 <= status < 500, (status, body[:200])
        error = json.loads(body)["error"]
        assert error["message"] and error["type"]


async def assert_kept(proxy: Running, session: str, turns: int) -> None:
    """Every turn of ``session`` is in memory, once (of whatever scope its headers named)."""
    await settle(proxy)
    kept = await runtime(proxy).store.list(None, types=["episodic"], session_id=session,
                                           limit=10_000)
    assert sorted(-1 if m.turn_index is None else m.turn_index for m in kept) == [
        *range(turns)], session


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_settings(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """Settings selecting each memory store (PostgreSQL: a fresh schema, dropped after)."""
    if request.param == "sqlite":
        yield {}
        return
    with fresh_schema(require_pg_url(), "t_hostile") as url:
        yield {"store_url": url}


@pytest.fixture
async def proxy(store_settings: dict[str, Any], start_proxy: ProxyFactory,
                tmp_path: Path) -> Running:
    # store_settings first: its schema is dropped after the proxy has stopped writing to it.
    return await start_proxy(team_id="team-1", data_dir=tmp_path / "data", **store_settings)


@pytest.mark.parametrize("case", list(CASES))
async def test_hostile_input_is_answered_and_others_are_served_meanwhile(
    proxy: Running, upstream: FakeUpstream, case: str
) -> None:
    raw = CASES[case]()
    small = json.dumps(codex.request(conversation("bystander"))).encode()
    (status, body), (other, _) = await asyncio.gather(
        post(proxy, raw, "hostile"), post(proxy, small, "bystander"))
    assert other == 200
    assert_answered(status, body)
    # The memory side digests what it was given without failing or losing a turn, and the
    # proxy still serves.
    await assert_kept(proxy, "bystander", 3)
    if status == 200 and case in TURNS:
        await assert_kept(proxy, "hostile", TURNS[case])
    status, _ = await post(proxy, small, "after")
    assert status == 200


@pytest.mark.parametrize(("name", "value"), HEADER_CASES)
async def test_hostile_header_is_answered_and_others_are_served_meanwhile(
    proxy: Running, upstream: FakeUpstream, name: str, value: bytes
) -> None:
    raw = json.dumps(codex.request(conversation("hostile"))).encode()
    small = json.dumps(codex.request(conversation("bystander"))).encode()
    (status, body), (other, _) = await asyncio.gather(
        post_raw(proxy, raw, "hostile", (name, value)), post(proxy, small, "bystander"))
    assert other == 200
    assert_answered(status, body)
    as_sent = value.decode("utf-8", "surrogateescape")  # as aiohttp's server decodes it
    if status == 200:  # forwarded as sent, ctxproxy's own identity headers left out
        sent = next(r for r in upstream.received if b"hostile turn 3" in r.body)
        forwarded = {k.lower(): v for k, v in sent.headers.items()}
        assert forwarded.get(name) == (None if name.startswith("x-tdai-") else as_sent)
    # Nothing answered is lost: the hostile session's turns too, when it was forwarded; a
    # refused request is refused before anything reads it (no step, no store, no upstream).
    await assert_kept(proxy, "bystander", 3)
    if status == 200:
        await assert_kept(proxy, as_sent if name == "session-id" else "hostile", 3)
    else:
        await assert_kept(proxy, "hostile", 0)
        assert not any(b"hostile turn 3" in r.body for r in upstream.received)
