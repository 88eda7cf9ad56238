"""Dependency faults seen from outside, and the metrics that report them.

A memory store that is locked, unwritable, missing or stopped, and a core that goes away and
comes back: requests keep flowing (status 200, the window still cut), memory comes back
afterwards with every turn stored exactly once (Codex resends the whole history, so the next
request re-derives what was lost), and ``GET /metrics`` shows each part of the traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import shutil
import sqlite3
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from ctxproxy.knowledge.client import Discovery
from ctxproxy.memory import sqlite_conn, store_pg
from ctxproxy.memory.model import Memory, StoreError
from ctxproxy.proxy import knowledge_wiring, memory_wiring
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.postgres import PrivatePostgres, cannot_run_reason
from tests.fakes.server import Running, free_port, serve
from tests.fakes.upstream import FakeUpstream, Received, event, message_item
from tests.knowledge.fake_core import FakeCore
from tests.memory.session import Session, memory_text, runtime, user_texts

FACT = "Our database is PostgreSQL 15 on port 5433."
ASK = "Which port does the database listen on?"
KEEP = 2
Action = Callable[[], Awaitable[None]]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


# --- helpers -----------------------------------------------------------------------------------


async def scrape(url: str) -> Samples:
    """Every sample of ``GET /metrics``, keyed by (name, labels)."""
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        assert r.status == 200
        text = await r.text()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def memory_degraded(samples: Samples) -> float:
    return value(samples, "ctxproxy_degraded_total", source="memory")


async def episodes_of(proxy: Running, session_id: str) -> list[Memory]:
    store = runtime(proxy).store
    return await store.list(None, types=["episodic"], session_id=session_id, limit=1000)


async def run_through_a_fault(
    proxy: Running, upstream: FakeUpstream, *, break_: Action, mend: Action,
    healthy_turns: int = 3, faulty_turns: int = 3, blocks_while_broken: bool = False,
) -> None:
    """One session: healthy turns, turns while the store is broken, then turns after it is
    mended; asserts the session never noticed and memory caught up without loss or duplicates.

    ``blocks_while_broken``: reads still work (a write lock, a read-only journal), so recall
    may still inject what was stored before; otherwise no memory block may appear.
    """
    s = Session(proxy, upstream, session_id=f"fault-{uuid.uuid4().hex[:8]}")
    await s.say(f"{FACT} Set up the migrations folder.")
    for n in range(2, healthy_turns + 1):
        await s.say(f"turn {n}: please do step {n}")
    await runtime(proxy).queue.join()
    before = await scrape(proxy.url)

    await break_()
    for n in range(s.turns + 1, s.turns + faulty_turns + 1):
        prompt = f"turn {n}: check the database port again"
        sent = await s.say(prompt)  # asserts the client got 200
        prompts = user_texts(sent)
        assert prompts[-1] == prompt
        # What the window cuts is in memory, or (no memory this request) sent whole.
        turns = len([p for p in prompts if p.startswith(("turn", "Our database"))])
        assert turns == (KEEP if "_memory" in memory_text(sent) else n)
        if not blocks_while_broken:
            assert "_memory" not in memory_text(sent)
    await runtime(proxy).queue.join()  # the writes queued meanwhile were tried, and failed
    during = await scrape(proxy.url)
    assert memory_degraded(during) > memory_degraded(before)
    statuses = [dict(labels)["status"] for name, labels in during
                if name == "ctxproxy_requests_total"]
    assert statuses and not [st for st in statuses if st.startswith("5")]

    await mend()
    await s.say(f"turn {s.turns + 1}: add a health check")  # re-derives the whole history
    sent = await s.say(ASK)
    await runtime(proxy).queue.join()

    episodes = await episodes_of(proxy, s.session_id)
    completed = s.turns  # the newest turn too: by the answer relayed to it
    assert sorted(m.turn_index or 0 for m in episodes) == list(range(completed))
    assert len({m.key for m in episodes}) == completed
    working = await runtime(proxy).store.list(None, types=["working"], session_id=s.session_id)
    assert [m.attrs["kind"] for m in working] == ["task"]
    assert "PostgreSQL 15 on port 5433" in memory_text(sent)  # and recall works again


# --- SQLite --------------------------------------------------------------------------------------


@pytest.fixture
def quick_busy_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each write under a lock waits the busy timeout (5 s) before it fails, and the reads of
    # the next turn queue behind it on the store's one thread: a few turns would take most of
    # a minute. The behaviour is the same with a shorter wait.
    monkeypatch.setattr(sqlite_conn, "_BUSY_TIMEOUT_S", 0.2)


@pytest.mark.usefixtures("quick_busy_timeout")
async def test_sqlite_locked_by_another_writer_keeps_requests_flowing_then_catches_up(
    upstream: FakeUpstream, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    proxy = await start_proxy(keep_turns=KEEP, trim_slack=0, data_dir=tmp_path / "data")
    other = sqlite3.connect(tmp_path / "data" / "memory.sqlite3", isolation_level=None,
                            timeout=5)

    async def lock() -> None:
        other.execute("BEGIN EXCLUSIVE")  # what a backup tool or a second program might hold

    async def unlock() -> None:
        other.execute("ROLLBACK")

    try:
        await run_through_a_fault(proxy, upstream, break_=lock, mend=unlock,
                                  blocks_while_broken=True)
    finally:
        other.close()


def _chattr(flag: str, path: Path) -> str | None:
    """Run ``chattr FLAG PATH``; the reason when it cannot be done here."""
    if shutil.which("chattr") is None:
        return "chattr is not installed"
    done = subprocess.run(["chattr", flag, str(path)], capture_output=True, text=True,
                          check=False)
    return None if done.returncode == 0 else f"chattr {flag} failed: {done.stderr.strip()}"


@contextlib.contextmanager
def unwritable(path: Path) -> Iterator[None]:
    """``path`` refuses writes, even from descriptors already open, until the block ends."""
    reason = _chattr("+i", path)
    if reason is not None:
        pytest.skip(f"cannot make a file unwritable for root here: {reason}")
    try:
        yield
    finally:
        _chattr("-i", path)


@pytest.mark.usefixtures("quick_busy_timeout")
async def test_sqlite_journal_made_unwritable_keeps_requests_flowing_then_catches_up(
    upstream: FakeUpstream, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    # Root ignores file modes, and an open descriptor ignores a later chmod: the immutable
    # flag is what makes a file the proxy already has open refuse writes (EPERM, which SQLite
    # reports as a disk I/O error). Only the journal: an immutable -shm would fault its mmap.
    proxy = await start_proxy(keep_turns=KEEP, trim_slack=0, data_dir=tmp_path / "data")
    wal = tmp_path / "data" / "memory.sqlite3-wal"
    assert wal.exists()
    with contextlib.ExitStack() as frozen:  # thawed on the way out, or tmp_path stays forever

        async def freeze() -> None:
            frozen.enter_context(unwritable(wal))

        async def thaw() -> None:
            frozen.close()

        await run_through_a_fault(proxy, upstream, break_=freeze, mend=thaw,
                                  blocks_while_broken=True)


@pytest.mark.usefixtures("quick_busy_timeout")
async def test_an_unwritable_journal_is_reported_with_its_real_cause(
    upstream: FakeUpstream, start_proxy: ProxyFactory, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    proxy = await start_proxy(keep_turns=KEEP, trim_slack=0, data_dir=tmp_path / "data")
    s = Session(proxy, upstream, session_id="io-error")
    await s.say("Set up the project.")
    await runtime(proxy).queue.join()
    with caplog.at_level(logging.WARNING), unwritable(tmp_path / "data" / "memory.sqlite3-wal"):
        await s.say("turn 2: please do step 2")
        await s.say("turn 3: please do step 3")
        await runtime(proxy).queue.join()
    reported = [r.getMessage() for r in caplog.records if r.name == "ctxproxy.memory"]
    assert reported, "the failed writes were not reported at all"
    assert any("disk I/O error" in message for message in reported), reported


async def test_sqlite_file_replaced_by_a_directory_serves_without_memory_then_catches_up(
    upstream: FakeUpstream, start_proxy: ProxyFactory, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memory_wiring, "REOPEN_S", 0.01)
    blocker = tmp_path / "data" / "memory.sqlite3"
    blocker.mkdir(parents=True)
    proxy = await start_proxy(keep_turns=KEEP, trim_slack=0, data_dir=tmp_path / "data")

    async def nothing() -> None:
        pass  # broken from the start

    async def remove_the_directory() -> None:
        blocker.rmdir()
        opening = runtime(proxy).opening
        assert opening is not None
        await asyncio.wait_for(opening, 10)  # the proxy opens the store on its own

    await run_through_a_fault(proxy, upstream, break_=nothing, mend=remove_the_directory,
                              healthy_turns=0)


# --- PostgreSQL ----------------------------------------------------------------------------------


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    """A PostgreSQL server of this test's own (the shared one must never be stopped)."""
    reason = cannot_run_reason()
    if reason is not None:
        if os.environ.get("CI") or os.geteuid() == 0:
            pytest.fail(f"cannot start a private PostgreSQL: {reason}")
        pytest.skip(f"cannot start a private PostgreSQL: {reason}")
    server = PrivatePostgres.create()
    try:
        server.start()
        yield server
    finally:
        server.destroy()


@pytest.mark.postgres
async def test_postgres_stopped_mid_session_and_started_again(
    private_pg: PrivatePostgres, upstream: FakeUpstream, start_proxy: ProxyFactory,
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    # With the store's default 5 s pool timeout every turn of the outage waits 5-10 s before
    # it is forwarded; a shorter timeout shows the same behaviour in a fraction of the time.
    monkeypatch.setattr(store_pg, "PostgresStore",
                        functools.partial(store_pg.PostgresStore, timeout_s=1.0))
    proxy = await start_proxy(keep_turns=KEEP, trim_slack=0, store_url=private_pg.url,
                              data_dir=tmp_path / "data")

    async def stop() -> None:
        await asyncio.to_thread(private_pg.stop)

    async def start_and_wait_until_reachable() -> None:
        await asyncio.to_thread(private_pg.start)
        store = runtime(proxy).store
        async with asyncio.timeout(30):  # the pool reconnects with a backoff of its own
            while True:
                try:
                    await store.list(None, limit=1)
                    return
                except StoreError:
                    continue  # each try waits out the pool timeout: no busy loop

    await run_through_a_fault(proxy, upstream, break_=stop, mend=start_and_wait_until_reachable)


# --- the core ------------------------------------------------------------------------------------


class Clock:
    """Discovery's clock, moved by the test: TTLs pass without waiting for them."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(knowledge_wiring, "Discovery", functools.partial(Discovery, clock=fake))
    return fake


def core_item(team: str, n: int = 1) -> dict[str, Any]:
    return {"knowledge_id": f"wiki-{n:08d}", "type": "wiki", "name": f"Docs {n}",
            "service_url": "http://knowledge.internal/v3", "summary": f"the wiki of {team}"}


@contextlib.asynccontextmanager
async def core_on(core: FakeCore, port: int) -> AsyncIterator[None]:
    running = await serve(core.app(), port=port)
    try:
        yield
    finally:
        await running.close()


async def test_core_down_mid_session_and_back_returns_the_block_after_the_negative_ttl(
    clock: Clock, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    core, port = FakeCore(items=[core_item("team-1")]), free_port()
    proxy = await start_proxy(core_url=f"http://127.0.0.1:{port}", core_timeout_ms=500,
                              knowledge_ttl_s=60, knowledge_negative_ttl_s=10,
                              memory_enabled=False, keep_turns=KEEP, trim_slack=0)
    headers = codex.headers(session_id="sess-core", **{"x-team-id": "team-1"})
    raw = json.dumps(codex.request(codex.session(1), session_id="sess-core")).encode()

    async def send() -> Received:
        async with aiohttp.ClientSession() as s, s.post(
            proxy.url + "/v1/responses", data=raw, headers=headers
        ) as r:
            assert r.status == 200
            await r.read()
        return upstream.last

    async with core_on(core, port):
        assert "<knowledge_tools>" in (await send()).json["instructions"]
    calls = len(core.calls)

    clock.now += 61  # the cached catalogue expires while the core is down
    assert (await send()).body == raw  # no block: exactly what the window alone sends
    degraded = value(await scrape(proxy.url), "ctxproxy_degraded_total", source="knowledge")
    assert degraded == 1

    async with core_on(core, port):
        clock.now += 5  # back up, but the failure is remembered for 10 s
        assert (await send()).body == raw
        assert len(core.calls) == calls  # not even asked

        clock.now += 6
        sent = await send()
        assert "<knowledge_tools>" in sent.json["instructions"]
        assert "wiki-00000001" in sent.json["instructions"]
        assert len(core.calls) > calls


# --- metrics -------------------------------------------------------------------------------------


@pytest.fixture
async def core() -> AsyncIterator[FakeCore]:
    fake = FakeCore(items=[core_item("team-ok")])
    running = await serve(fake.app())
    fake.url = running.url  # type: ignore[attr-defined]
    yield fake
    fake.release.set()
    await running.close()


def cached_answer(cached: int) -> Callable[[web.Request, Received], Awaitable[web.StreamResponse]]:
    """An answer whose usage reports ``cached`` cached input tokens (the fake reports 0)."""
    async def handler(request: web.Request, rec: Received) -> web.StreamResponse:
        usage = {"input_tokens": 900, "input_tokens_details": {"cached_tokens": cached},
                 "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": 905}
        done = {"type": "response.completed", "response": {
            "id": "resp_cached", "object": "response", "status": "completed",
            "output": [message_item("ok")], "usage": usage}}
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(event(done))
        await resp.write_eof()
        return resp
    return handler


async def test_metrics_expose_and_move_with_traffic(
    core: FakeCore, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(core_url=core.url,  # type: ignore[attr-defined]
                              core_timeout_ms=500, keep_turns=KEEP, trim_slack=0,
                              max_body_mb=0.1)
    before = await scrape(proxy.url)

    # A session long enough to cut turns and recall its first one; knowledge for its team.
    s = Session(proxy, upstream, session_id="metrics", headers={"x-team-id": "team-ok"})
    await s.say(f"{FACT} Set up the migrations folder.")
    for n in range(2, 5):
        await s.say(f"turn {n}: the database port matters in step {n}")
        await runtime(proxy).queue.join()
    upstream.then(cached_answer(cached=640))
    await s.say(ASK)
    # Writes waiting: hold the write queue on a job of our own, then send a turn.
    release = asyncio.Event()
    assert runtime(proxy).queue.put(release.wait)
    await s.say("turn 6: and the replica?")
    held = await scrape(proxy.url)
    release.set()
    await runtime(proxy).queue.join()
    # The other routes and outcomes.
    core.mode = "garbage"
    await Session(proxy, upstream, session_id="broken-core",
                  headers={"x-team-id": "team-garbage"}).say("Set up the project.")
    async with aiohttp.ClientSession() as client:
        async with client.post(proxy.url + "/v1/responses", data=b"not json {",
                               headers=codex.headers()) as r:
            await r.read()  # fails open: forwarded as it came
        async with client.post(proxy.url + "/v1/responses", data=b"x" * 200_000,
                               headers=codex.headers()) as r:
            assert r.status == 413
        async with client.get(proxy.url + "/v1/models", headers=codex.headers()) as r:
            assert r.status == 200
    # The turns just answered are being stored: the gauge is read once they are.
    await runtime(proxy).queue.join()
    after = await scrape(proxy.url)

    moved = {
        "requests by route and status": ("ctxproxy_requests_total",
                                         {"route": "responses", "status": "200"}),
        "a 4xx by route": ("ctxproxy_requests_total", {"route": "responses", "status": "413"}),
        "the passthrough route": ("ctxproxy_requests_total",
                                  {"route": "passthrough", "status": "200"}),
        "upstream latency": ("ctxproxy_request_seconds_count", {}),
        "upstream latency buckets": ("ctxproxy_request_seconds_bucket", {"le": "+Inf"}),
        "time to first byte": ("ctxproxy_upstream_ttfb_seconds_count", {}),
        "time to first byte buckets": ("ctxproxy_upstream_ttfb_seconds_bucket", {"le": "+Inf"}),
        "turns cut": ("ctxproxy_turns_cut_total", {}),
        "memory recall latency": ("ctxproxy_memory_recall_seconds_count", {}),
        "memory recall hits": ("ctxproxy_memory_recalled_total", {}),
        "knowledge cache misses": ("ctxproxy_knowledge_cache_total", {"result": "miss"}),
        "knowledge cache hits": ("ctxproxy_knowledge_cache_total", {"result": "hit"}),
        "knowledge failures": ("ctxproxy_degraded_total", {"source": "knowledge"}),
        "fail-open count": ("ctxproxy_fail_open_total", {"reason": "NotAResponsesRequest"}),
        "input tokens": ("ctxproxy_upstream_tokens_total", {"kind": "input"}),
        "cached tokens": ("ctxproxy_upstream_tokens_total", {"kind": "cached"}),
    }
    stuck = {what: (value(before, name, **labels), value(after, name, **labels))
             for what, (name, labels) in moved.items()
             if not value(after, name, **labels) > value(before, name, **labels)}
    assert not stuck, f"metrics that did not move: {stuck}"
    assert value(after, "ctxproxy_upstream_tokens_total", kind="cached") >= 640
    # Queue depth is a gauge: up while writes wait, back to zero once they are done.
    assert ("ctxproxy_ingest_queue_depth", frozenset()) in before
    assert value(held, "ctxproxy_ingest_queue_depth") >= 1
    assert value(after, "ctxproxy_ingest_queue_depth") == 0
