"""With the embedded core, a `ctxproxy knowledge` command run while the proxy serves shows on
the proxy's very next request (not when the discovery TTL runs out): the catalogue's
generation, SQLite's data_version, moves with every commit of another connection."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import sys
from pathlib import Path

import aiohttp
import pytest

from ctxproxy.knowledge.store import FILENAME, Catalogue, Generation
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream
from tests.knowledge.test_discovery_e2e import WHO, block_of, ids, post
from tests.knowledge.wikis import add_wiki, ctxproxy, write_wiki

Capsys = pytest.CaptureFixture[str]
ROOT = Path(__file__).resolve().parents[2]
HOUR = 3600  # a TTL no test waits for: whatever shows, shows because the catalogue changed


async def listed(url: str, upstream: FakeUpstream) -> list[str]:
    """The ids of the block the upstream gets for WHO's next request; [] for no block."""
    await post(url, codex.request(codex.session(2)), codex.headers(**WHO))
    return ids(block_of(upstream)) if "instructions" in upstream.last.json else []


def summary_of(upstream: FakeUpstream, knowledge_id: str) -> str | None:
    block = block_of(upstream)
    assert block is not None
    [asset] = [k for k in block.findall("knowledge") if k.get("id") == knowledge_id]
    summary: str | None = asset.findtext("summary")
    return summary


def cli(capsys: Capsys, data_dir: Path, *argv: str) -> None:
    code, _, err = ctxproxy(capsys, data_dir, "knowledge", *argv)
    assert code == 0, err


def bind_argv(knowledge_id: str, priority: int = 50) -> list[str]:
    return ["bind", "--agent", "coder", "--user-key", WHO["x-tdai-user-key"], knowledge_id,
            "--priority", str(priority)]


@pytest.fixture
def bound_id(wiki_id: str, data_dir: Path, capsys: Capsys) -> str:
    """The wiki, bound to WHO's agent and user key before the proxy starts."""
    cli(capsys, data_dir, *bind_argv(wiki_id))
    return wiki_id


async def test_every_knowledge_command_shows_on_the_next_request(
    tmp_path: Path, data_dir: Path, bound_id: str, capsys: Capsys, upstream: FakeUpstream,
    start_proxy: ProxyFactory,
) -> None:
    first = bound_id
    proxy = await start_proxy(knowledge_ttl_s=HOUR)
    assert await listed(proxy.url, upstream) == [first]

    second = add_wiki(capsys, data_dir, write_wiki(tmp_path / "runbooks"), name="Runbooks",
                      summary="How we operate")
    assert await listed(proxy.url, upstream) == [first]  # made, not bound yet
    cli(capsys, data_dir, *bind_argv(second, priority=90))
    assert await listed(proxy.url, upstream) == [second, first]

    cli(capsys, data_dir, "unbind", "--agent", "coder", "--user-key",
        WHO["x-tdai-user-key"], first)
    assert await listed(proxy.url, upstream) == [second]

    # add-wiki again on the same folder: a sync, here with a new summary.
    assert add_wiki(capsys, data_dir, tmp_path / "runbooks", name="Runbooks",
                    summary="On-call and deploys") == second
    assert await listed(proxy.url, upstream) == [second]
    assert summary_of(upstream, second) == "On-call and deploys"

    cli(capsys, data_dir, "remove", second)
    assert await listed(proxy.url, upstream) == []
    assert "<knowledge_tools>" not in upstream.last.body.decode()


async def test_a_command_in_another_process_shows_on_the_next_request(
    data_dir: Path, wiki_id: str, upstream: FakeUpstream, start_proxy: ProxyFactory,
) -> None:
    proxy = await start_proxy(knowledge_ttl_s=HOUR)
    assert await listed(proxy.url, upstream) == []  # nothing bound: remembered for an hour

    env = {**os.environ, "PYTHONPATH": str(ROOT), "CTXPROXY_DATA_DIR": str(data_dir)}
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ctxproxy.proxy", "knowledge", *bind_argv(wiki_id), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(child.communicate(), timeout=60)
    assert child.returncode == 0, err.decode()
    assert b"bound " + wiki_id.encode() in out
    assert await listed(proxy.url, upstream) == [wiki_id]


async def test_the_cached_answer_is_served_while_the_catalogue_is_unchanged(
    data_dir: Path, bound_id: str, capsys: Capsys, upstream: FakeUpstream,
    start_proxy: ProxyFactory,
) -> None:
    proxy = await start_proxy(knowledge_ttl_s=HOUR)
    for _ in range(3):
        assert await listed(proxy.url, upstream) == [bound_id]
    cli(capsys, data_dir, "list")  # a read changes nothing
    assert await listed(proxy.url, upstream) == [bound_id]
    async with aiohttp.ClientSession() as s, s.get(proxy.url + "/metrics") as r:
        metrics = await r.text()
    assert 'ctxproxy_knowledge_cache_total{result="miss"} 1.0' in metrics
    assert 'ctxproxy_knowledge_cache_total{result="hit"} 3.0' in metrics


# --- the generation itself --------------------------------------------------------------------


def test_the_generation_moves_with_other_connections_commits_only(tmp_path: Path) -> None:
    path = tmp_path / FILENAME
    catalogue = Catalogue.open(path)
    generation = Generation.open(path)
    try:
        start = generation.current()
        assert generation.current() == start
        catalogue.knowledge("default")  # a read
        assert generation.current() == start
        catalogue.sync_wiki("default", "team-1", "W", None, "/src", [])
        moved = generation.current()
        assert moved != start
        assert generation.current() == moved
        with pytest.raises(sqlite3.OperationalError):  # it never writes
            generation._conn.execute("CREATE TABLE t (x)")
    finally:
        generation.close()
        catalogue.close()


def test_a_generation_that_cannot_be_read_keeps_the_last_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / FILENAME
    Catalogue.open(path).close()
    generation = Generation.open(path)
    last = generation.current()
    generation.close()  # every call now fails
    with caplog.at_level(logging.WARNING, logger="ctxproxy.knowledge"):
        assert generation.current() == last
        assert generation.current() == last
    assert len([r for r in caplog.records if "catalogue changed" in r.getMessage()]) == 1
