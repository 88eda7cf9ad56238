"""Hygiene at the edges: a malformed request line or header is answered without a byte of it
(not in the answer, not in a log line: it may carry a bearer token); data files are 0600."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.conftest import ProxyFactory
from tests.fakes.upstream import FakeUpstream

TOKEN = "sk-leak-5d0c2e9a71b4f3"
MALFORMED = [
    f"Authorization Bearer {TOKEN}",  # no colon
    f"Authorization: Bearer {TOKEN}\x01",  # a control character
    f"X-Bad Header: Bearer {TOKEN}",  # a space in the name
]


async def raw_exchange(url: str, head: str) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"POST /v1/responses HTTP/1.1\r\nHost: {host}\r\n{head}\r\n"
                 "Content-Length: 2\r\n\r\n{}".encode("latin-1"))
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(65536), 5)
    writer.close()
    return answer


@pytest.mark.parametrize("head", MALFORMED)
async def test_a_malformed_header_is_neither_echoed_nor_logged(
    head: str, upstream: FakeUpstream, start_proxy: ProxyFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    proxy = await start_proxy()
    with caplog.at_level(logging.DEBUG):
        answer = await raw_exchange(proxy.url, head)
    assert answer.split(b" ", 2)[1] == b"400"
    assert b"malformed_request" in answer  # OpenAI-shaped JSON
    assert TOKEN.encode() not in answer
    assert b"Bearer" not in answer
    logged = "\n".join(r.getMessage() + str(r.exc_info) + str(r.exc_text) for r in caplog.records)
    assert TOKEN not in logged
    assert upstream.received == []


async def test_data_files_are_readable_by_their_owner_only(
    upstream: FakeUpstream, start_proxy: ProxyFactory, tmp_path
) -> None:
    import os
    import stat

    from tests.memory.session import Session, settle

    data = tmp_path / "data"
    data.mkdir()
    (data / "memory.sqlite3").touch(mode=0o644)  # left by an older version
    os.chmod(data / "memory.sqlite3", 0o644)
    proxy = await start_proxy(data_dir=data, keep_turns=1, trim_slack=0)
    s = Session(proxy, upstream)
    await s.say("Set up the project.")
    await s.say("turn 2: please do step 2")
    await settle(proxy)
    files = [p for p in data.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"memory.sqlite3", "knowledge.sqlite3"}
    loose = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in files
             if stat.S_IMODE(p.stat().st_mode) & 0o077}
    assert loose == {}
