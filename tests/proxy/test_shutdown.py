"""SIGTERM on a real ``python -m ctxproxy.proxy serve`` process while a stream is open."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.fakes import codex
from tests.fakes.server import free_port
from tests.fakes.upstream import FakeUpstream, Received, message_item, stream_events

GUARD_S = 20  # start-up imports everything; on 2 busy cores that can take a few seconds
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Server:
    """A ``python -m ctxproxy.proxy serve`` subprocess and the log lines it has written so far."""

    proc: asyncio.subprocess.Process
    port: int
    lines: list[str] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def pump(self) -> None:
        assert self.proc.stderr is not None
        async for raw in self.proc.stderr:
            async with self.changed:
                self.lines.append(raw.decode(errors="replace"))
                self.changed.notify_all()

    async def logged(self, text: str) -> None:
        """Wait until a log line contains ``text``."""
        async with self.changed:
            await asyncio.wait_for(
                self.changed.wait_for(lambda: any(text in line for line in self.lines)),
                GUARD_S)


@pytest.fixture
async def server(upstream: FakeUpstream, tmp_path: Path) -> AsyncIterator[Server]:
    async with serving(upstream, tmp_path) as srv:
        yield srv


@contextlib.asynccontextmanager
async def serving(upstream: FakeUpstream, tmp_path: Path, **settings: str
                  ) -> AsyncIterator[Server]:
    """``python -m ctxproxy.proxy serve`` in front of ``upstream``, with ``settings`` in its
    environment besides its address, upstream and data directory."""
    port = free_port()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "CTXPROXY_HOST": "127.0.0.1",
        "CTXPROXY_PORT": str(port),
        "CTXPROXY_UPSTREAM_URL": upstream.url + "/v1",  # type: ignore[attr-defined]
        "CTXPROXY_DATA_DIR": str(tmp_path / "data"),
        "CTXPROXY_LOG_FORMAT": "json",
        **settings,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ctxproxy.proxy", "serve", cwd=ROOT, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    srv = Server(proc, port)
    pump = asyncio.create_task(srv.pump())
    try:
        await srv.logged("ctxproxy listening")
        yield srv
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pump


async def refused(port: int) -> bool:
    """Whether a new TCP connection to ``port`` is refused (the listener is closed)."""
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except ConnectionRefusedError:
        return True
    except ConnectionResetError:
        return False  # queued on the listener as it closed: ask again
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return False


async def test_sigterm_lets_the_open_stream_finish_then_exits_0(
        upstream: FakeUpstream, server: Server) -> None:
    chunks = stream_events([message_item("a long answer that is still coming")], 10)
    half = len(chunks) // 2
    release = asyncio.Event()

    async def held(request: web.Request, rec: Received) -> web.StreamResponse:
        # Half the answer, then hold until the test has seen the proxy start shutting down.
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in chunks[:half]:
            await resp.write(chunk)
        await release.wait()
        for chunk in chunks[half:]:
            await resp.write(chunk)
        await resp.write_eof()
        return resp
    upstream.then(held)

    async with aiohttp.ClientSession() as s, s.post(
            server.url + "/v1/responses", data=json.dumps(codex.request(codex.session(1))),
            headers=codex.headers()) as r:
        assert r.status == 200
        first = await asyncio.wait_for(r.content.readexactly(len(chunks[0])), GUARD_S)

        server.proc.send_signal(signal.SIGTERM)
        await server.logged("shutting down")
        # The listener closes at once: new connections are refused while the stream is open.
        deadline = asyncio.get_running_loop().time() + GUARD_S
        while not await refused(server.port):
            assert asyncio.get_running_loop().time() < deadline, "listener still open"
            await asyncio.sleep(0.02)
        assert server.proc.returncode is None  # still serving the open stream

        release.set()
        rest = await asyncio.wait_for(r.content.read(), GUARD_S)  # raises if the stream broke

    assert first + rest == b"".join(chunks)
    assert await asyncio.wait_for(server.proc.wait(), GUARD_S) == 0
    assert not upstream.closed_early.is_set()
    logged = [json.loads(line) for line in server.lines if line.startswith("{")]
    access = [entry for entry in logged if entry.get("logger") == "ctxproxy.access"]
    assert [(a["path"], a["status"]) for a in access] == [("/v1/responses", 200)]


async def test_sigterm_when_idle_exits_0(server: Server) -> None:
    async with aiohttp.ClientSession() as s, s.get(server.url + "/readyz") as r:
        assert r.status == 200
    server.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(server.proc.wait(), GUARD_S) == 0
    assert await refused(server.port)
