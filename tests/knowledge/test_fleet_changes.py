"""Replicas on one PostgreSQL hear of knowledge changes at once (LISTEN/NOTIFY on
ctxproxy_knowledge), not when their discovery cache's TTL runs out."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from ctxproxy.knowledge.announce import CHANNEL
from ctxproxy.plumbing.pg import Listener
from ctxproxy.proxy.knowledge_wiring import LISTENER
from tests.conftest import SERVED, ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream
from tests.knowledge.fake_core import FakeCore
from tests.knowledge.test_discovery_e2e import block_of, fake_core, ids, post, remote_item
from tests.knowledge.wikis import add_wiki, ctxproxy, write_wiki
from tests.memory.conftest import fresh_schema, require_pg_url

pytestmark = pytest.mark.postgres
__all__ = ["fake_core"]  # the fixture, imported for the tests here
HOUR = 3600  # a TTL no test waits for: whatever shows, shows because a change was heard
TEAM = {"x-team-id": "t9"}


@pytest.fixture
def pg_url() -> Iterator[str]:
    with fresh_schema(require_pg_url()) as url:
        yield url


async def listed(url: str, upstream: FakeUpstream) -> list[str]:
    await post(url, codex.request(codex.session(2)), codex.headers(**TEAM))
    return ids(block_of(upstream)) if "instructions" in upstream.last.json else []


async def soon_listed(url: str, upstream: FakeUpstream, want: list[str]) -> list[str]:
    """What ``url`` lists once it shows ``want``, or after a few seconds (a notification
    reaches a replica moments after it is sent)."""
    deadline = time.monotonic() + 5
    while (got := await listed(url, upstream)) != want and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return got


async def listening(url: str) -> None:
    listener = SERVED[url].app[LISTENER]
    await asyncio.wait_for(listener.listening.wait(), 10)


async def test_a_remote_cores_change_reaches_every_replica_when_announced(
    pg_url: str, fake_core: FakeCore, upstream: FakeUpstream, start_proxy: ProxyFactory,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    fake_core.items = [remote_item(1)]
    replicas = [
        await start_proxy(core_url=fake_core.url, store_url=pg_url,  # type: ignore[attr-defined]
                          knowledge_ttl_s=HOUR, data_dir=tmp_path / name)
        for name in ("a", "b")
    ]
    for replica in replicas:
        await listening(replica.url)
        assert await listed(replica.url, upstream) == ["cg-00000001"]
    fake_core.items = [remote_item(1), remote_item(2)]
    for replica in replicas:  # cached for an hour
        assert await listed(replica.url, upstream) == ["cg-00000001"]

    code, _, err = ctxproxy(capsys, tmp_path / "a", "knowledge", "changed", store_url=pg_url)
    assert code == 0, err
    for replica in replicas:
        assert await soon_listed(replica.url, upstream, ["cg-00000001", "cg-00000002"]) == [
            "cg-00000001", "cg-00000002"]


async def test_a_knowledge_command_announces_its_change(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    a_dir = tmp_path / "a"
    wiki = add_wiki(capsys, a_dir, write_wiki(tmp_path / "docs"), team="t9")
    heard: list[str | None] = []
    listener = Listener(pg_url, CHANNEL, heard.append)
    listener.start()
    await asyncio.wait_for(listener.listening.wait(), 10)
    try:
        code, _, err = ctxproxy(capsys, a_dir, "knowledge", "remove", wiki, store_url=pg_url)
        assert code == 0, err
        code, _, err = ctxproxy(capsys, a_dir, "knowledge", "list", store_url=pg_url)
        assert code == 0, err
        deadline = time.monotonic() + 5
        while len(heard) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # and nothing more: `list` changes nothing
        assert heard == [None, "default"]
    finally:
        await listener.close()


async def test_a_listener_listens_again_after_its_connection_is_killed(pg_url: str) -> None:
    heard: list[str | None] = []
    listener = Listener(pg_url, CHANNEL + "_test", heard.append, retry_s=0.1)
    listener.start()
    try:
        await asyncio.wait_for(listener.listening.wait(), 10)
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE query = %s", (f"LISTEN {CHANNEL}_test",))
            deadline = time.monotonic() + 10
            while len(heard) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert heard == [None, None]  # listening again, and saying it may have missed some
            await asyncio.wait_for(listener.listening.wait(), 10)
            await admin.execute("SELECT pg_notify(%s, 'svc')", (CHANNEL + "_test",))
            deadline = time.monotonic() + 5
            while len(heard) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        assert heard == [None, None, "svc"]
    finally:
        await listener.close()
