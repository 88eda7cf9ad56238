from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from ctxproxy.config import Settings, load_settings
from ctxproxy.ledger import Record
from ctxproxy.proxy.assemble import build_app
from ctxproxy.proxy.ledger_wiring import LEDGER
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.server import Running, free_port, serve
from tests.fakes.upstream import FakeUpstream

SHARED_FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "codex"


def require_shared(path: Path) -> Path:
    """``path`` under ../shared, or skip: a user's clone has no ../shared (CI has it)."""
    if not path.exists():
        pytest.skip(f"{path} is absent: ../shared is not next to this clone (CI has it)")
    return path


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never read the developer's CTXPROXY_* settings."""
    for name in list(os.environ):
        if name.startswith("CTXPROXY_"):
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def _keep_logging() -> Iterator[None]:
    """A test that runs ``main()`` in-process configures logging for a real run (root level,
    a handler on that test's stderr): give the next test the logging it had."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    quiet = {name: logging.getLogger(name).level for name in ("httpx", "aiohttp.access")}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, was in quiet.items():
        logging.getLogger(name).setLevel(was)


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream()
    running = await serve(fake.app())
    fake.url = running.url  # type: ignore[attr-defined]
    yield fake
    await running.close()


@pytest.fixture
async def anthropic() -> AsyncIterator[FakeAnthropic]:
    """A fake Anthropic Messages upstream (pass its ``url`` as ``anthropic_url``)."""
    fake = FakeAnthropic()
    running = await serve(fake.app())
    fake.url = running.url
    yield fake
    await running.close()


ProxyFactory = Callable[..., Awaitable[Running]]


def without_chat_memory(start: ProxyFactory) -> ProxyFactory:
    """``start`` with the proxy's own chat-memory asset left out of the knowledge block unless
    a test asks for it: for tests about the core's assets."""

    async def start_core_assets_only(**overrides: Any) -> Running:
        overrides.setdefault("chat_memory_asset", False)
        return await start(**overrides)

    return start_core_assets_only
# The proxies start_proxy serves, by URL: helpers that only hold a URL reach the app through it.
SERVED: dict[str, Running] = {}


@pytest.fixture
async def start_proxy(
    upstream: FakeUpstream, tmp_path: Path
) -> AsyncIterator[ProxyFactory]:
    """Start ctxproxy (the full app, as served) in front of the fake upstream."""
    started: list[Running] = []

    async def start(**overrides: Any) -> Running:
        values: dict[str, Any] = {
            "upstream_url": upstream.url + "/v1",  # type: ignore[attr-defined]
            "data_dir": tmp_path / "data",
            "upstream_read_timeout_s": 5,
            "port": free_port(),
            # The memory budget guards production latency; a test asserts what memory does,
            # on shared cores that may be busy (a test of the budget sets its own).
            "memory_timeout_ms": 10_000,
            # The rows' counting and memory's background work in threads: a child process
            # per app would spawn an interpreter for every test
            # (tests/ledger/test_counting_process.py and tests/memory/test_cpu_child.py run one).
            "stats_process": False,
            "memory_process": False,
        }
        values.update(overrides)
        if "trim_slack" in overrides or "trim_at_tokens" in overrides:
            values.setdefault("window_policy", "fixed")  # a test of the fixed steps
        settings: Settings = load_settings(env={}, **values)
        running = await serve(build_app(settings), port=settings.port)
        started.append(running)
        SERVED[running.url] = running
        return running

    yield start
    for running in started:
        await running.close()


async def ledger_rows(app: web.Application, session: str, count: int) -> list[Record]:
    """The session's ledger rows, once ``count`` have been written (the row of a request is
    handed over after its answer's last byte)."""
    side = app[LEDGER]
    assert side.recorder is not None and side.ledger is not None
    for _ in range(100):
        await side.recorder.join()
        rows = await side.ledger.timeline(session)
        if len(rows) >= count:
            return rows
        await asyncio.sleep(0.05)
    raise AssertionError(f"{len(rows)} rows of {count}")
