"""``CTXPROXY_WORKERS``: several ``python -m ctxproxy.proxy serve`` processes on one port, one
store."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ctxproxy.config import load_settings
from ctxproxy.memory.model import Store
from ctxproxy.memory.store_pg import PostgresStore
from ctxproxy.memory.store_sqlite import SqliteStore
from tests.fakes import codex
from tests.fakes.server import free_port
from tests.fakes.upstream import FakeUpstream
from tests.memory.conftest import fresh_schema, require_pg_url
from tests.proxy.test_shutdown import GUARD_S, ROOT, Server

Start = Callable[..., Awaitable[Server]]


def _env(tmp_path: Path, port: int, **settings: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "CTXPROXY_HOST": "127.0.0.1",
        "CTXPROXY_PORT": str(port),
        "CTXPROXY_DATA_DIR": str(tmp_path / "data"),
        "CTXPROXY_LOG_FORMAT": "json",
        **{"CTXPROXY_" + name.upper(): value for name, value in settings.items()},
    }


@pytest.fixture
async def start(upstream: FakeUpstream, tmp_path: Path) -> AsyncIterator[Start]:
    """Start ``python -m ctxproxy.proxy serve`` (its stderr read as it comes) before the fake
    upstream."""
    running: list[tuple[Server, asyncio.Task[None]]] = []

    async def start_(port: int | None = None, **settings: str) -> Server:
        port = port or free_port()
        settings.setdefault("upstream_url", upstream.url + "/v1")  # type: ignore[attr-defined]
        # A session of its own: the teardown kills the supervisor and every worker at once.
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "ctxproxy.proxy", "serve", cwd=ROOT,
            env=_env(tmp_path, port, **settings),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, start_new_session=True)
        srv = Server(proc, port)
        running.append((srv, asyncio.create_task(srv.pump())))
        return srv

    yield start_
    for srv, pump in running:
        # Workers first (a failed test may leave some, logged or not): one still holding the
        # supervisor's stderr would keep its wait() from returning.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(srv.proc.pid, signal.SIGKILL)
        await srv.proc.wait()
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pump


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """The store the workers share: None for the SQLite file in the data dir, else a
    PostgreSQL URL confined to a fresh schema (dropped after)."""
    if request.param == "sqlite":
        yield None
        return
    with fresh_schema(require_pg_url(), "t_workers") as url:
        yield url


def _logged(srv: Server) -> list[dict[str, Any]]:
    return [json.loads(line) for line in srv.lines if line.startswith("{")]


def _pids(srv: Server, msg: str) -> list[int]:
    return [int(entry["pid"]) for entry in _logged(srv) if entry["msg"] == msg]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _turn(url: str, session_id: str) -> None:
    """One Codex request whose two earlier turns are complete (the memory side stores them),
    on a connection of its own so that the kernel picks a worker for each."""
    body = json.dumps(codex.request(codex.session(3), session_id=session_id))
    headers = codex.headers(session_id, f"{session_id}-turn-3",
                            **{"x-client-request-id": session_id})
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s, \
            s.post(url + "/v1/responses", data=body, headers=headers) as r:
        assert r.status == 200
        await r.read()


# ``store_url`` before ``start``: set up first, so its schema is dropped only once the
# server and its workers are gone (a worker's open connection would block the DROP).
async def test_two_workers_answer_on_one_port_write_one_store_and_stop_on_sigterm(
        store_url: str | None, start: Start, tmp_path: Path) -> None:
    srv = await start(workers="2", **({} if store_url is None else {"store_url": store_url}))
    await srv.logged("ctxproxy listening")  # the parent's line: every worker listens
    (listening,) = [e for e in _logged(srv) if e["msg"] == "ctxproxy listening"]
    workers = sorted(listening["pids"])
    assert sorted(_pids(srv, "worker listening")) == workers
    assert srv.proc.pid not in workers

    sessions = [f"sess-{n}" for n in range(24)]
    for batch in range(0, len(sessions), 6):
        await asyncio.gather(*(_turn(srv.url, sid) for sid in sessions[batch:batch + 6]))

    srv.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(srv.proc.wait(), GUARD_S) == 0
    assert not any(_alive(pid) for pid in workers)

    logged = _logged(srv)
    answered = {e["request_id"]: e["pid"] for e in logged if e["logger"] == "ctxproxy.access"}
    assert set(answered) == set(sessions)
    # 24 connections, each hashed to one of the two listeners: both answer (1 in 2**23 not).
    assert sorted(set(answered.values())) == workers
    assert [e for e in logged if e["level"] in ("warning", "error")] == []

    # Both processes wrote their sessions' finished turns into the one store (the third
    # finished by the answer relayed).
    store: Store = (SqliteStore(tmp_path / "data" / "memory.sqlite3") if store_url is None
                    else PostgresStore(store_url))
    await store.open()
    try:
        episodes = await store.list(None, types=["episodic"], limit=1000)
    finally:
        await store.close()
    stored = {(m.session_id, m.turn_index) for m in episodes}
    assert stored == {(sid, turn) for sid in sessions for turn in (0, 1, 2)}


def _metric(text: str, name: str, **labels: str) -> float:
    (value,) = [s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == name and s.labels == labels]
    return value


async def _scrape(url: str) -> str:
    # A connection of its own: the kernel picks the worker that answers.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s, \
            s.get(url) as r:
        assert r.status == 200
        return await r.text()


async def test_metrics_count_every_workers_requests_whichever_answers(start: Start) -> None:
    srv = await start(workers="2")
    await srv.logged("ctxproxy listening")
    sessions = [f"count-{n}" for n in range(24)]
    for batch in range(0, len(sessions), 6):
        await asyncio.gather(*(_turn(srv.url, sid) for sid in sessions[batch:batch + 6]))
    answered = {e["pid"] for e in _logged(srv) if e["logger"] == "ctxproxy.access"}
    assert len(answered) == 2  # both workers answered some (1 in 2**23 not)

    for _ in range(6):
        text = await _scrape(srv.url + "/metrics")
        assert _metric(text, "ctxproxy_requests_total", route="responses", status="200") == 24
        assert _metric(text, "ctxproxy_workers_scraped") == 2
    own = await _scrape(srv.url + "/metrics?worker=this")
    assert 0 < _metric(own, "ctxproxy_requests_total", route="responses", status="200") < 24


async def test_a_worker_that_dies_later_is_replaced(start: Start) -> None:
    srv = await start(workers="2")
    await srv.logged("ctxproxy listening")
    first = sorted(_pids(srv, "worker listening"))

    os.kill(first[0], signal.SIGKILL)
    await srv.logged("worker replaced")
    # The supervisor logs the replacement as it starts it; the new worker, once it listens.
    async with srv.changed:
        await asyncio.wait_for(srv.changed.wait_for(
            lambda: len(_pids(srv, "worker listening")) == 3), GUARD_S)
    now = sorted(_pids(srv, "worker listening"))
    assert len(now) == 3 and first[1] in now
    for n in range(4):
        await _turn(srv.url, f"after-{n}")

    srv.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(srv.proc.wait(), GUARD_S) == 0
    assert not any(_alive(pid) for pid in now)
    (died,) = [e for e in _logged(srv) if e["level"] == "error"]
    assert died["msg"] == "worker exited unexpectedly: starting another"
    assert (died["pid"], died["exit_code"]) == (first[0], -signal.SIGKILL)


async def test_workers_that_cannot_listen_stop_the_server_with_exit_1(start: Start) -> None:
    with socket.socket() as taken:  # no SO_REUSEPORT: the workers cannot share it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        srv = await start(port=taken.getsockname()[1], workers="2")
        assert await asyncio.wait_for(srv.proc.wait(), GUARD_S) == 1
    assert any("cannot listen on" in line for line in srv.lines)
    await srv.logged("worker exited before it was listening: stopping")
    assert not any(_alive(pid) for pid in _pids(srv, "worker listening"))


@pytest.mark.parametrize("value", ["many", "-1", "1.5"])
def test_a_bad_workers_value_exits_2_naming_the_variable(tmp_path: Path, value: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ctxproxy.proxy", "serve"], cwd=ROOT, capture_output=True, text=True,
        env=_env(tmp_path, free_port(), workers=value), timeout=GUARD_S)
    assert done.returncode == 2
    assert done.stderr.startswith("ctxproxy: invalid setting: CTXPROXY_WORKERS: ")
    assert done.stderr.count("\n") == 1


@pytest.mark.parametrize("value", ["auto", "AUTO", "0"])
def test_workers_auto_or_0_is_one_per_usable_cpu(value: str) -> None:
    assert load_settings(env={"CTXPROXY_WORKERS": value}).workers == len(os.sched_getaffinity(0))


def test_workers_default_to_one_process() -> None:
    assert load_settings(env={}).workers == 1
