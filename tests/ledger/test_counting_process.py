"""The rows' counting in a child process (CTXPROXY_STATS_PROCESS, the default of a served
proxy): the same numbers as counted in a thread, a child that dies costs its batch only, and
the child ends with the proxy."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from ctxproxy.ledger import measure
from ctxproxy.ledger.measure import InProcess, InThread
from ctxproxy.ledger.model import Record
from ctxproxy.proxy.ledger_wiring import LEDGER
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.server import Running
from tests.ledger.test_recording import rows

# Long enough for a shared prefix to pass the provider's 1,024-token minimum of a cached one.
INSTRUCTIONS = "You are a careful coding agent working in a checkout. " * 200
COUNTED = ("client_tokens", "forwarded_tokens", "direct_input", "direct_cached")


async def post(proxy: Running, items: list[dict[str, Any]], session: str) -> None:
    async with aiohttp.ClientSession() as http, http.post(
        proxy.url + "/v1/responses",
        data=orjson.dumps(codex.request(items, session, instructions=INSTRUCTIONS)),
        headers=codex.headers(session),
    ) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()


def numbers(row: Record) -> tuple[object, ...]:
    return tuple(getattr(row, name) for name in COUNTED)


def child_pid(proxy: Running) -> int:
    recorder = proxy.app[LEDGER].recorder
    assert recorder is not None and isinstance(recorder.counting, InProcess)
    executor = recorder.counting._executor
    assert executor is not None, "no child yet: no batch was counted"
    [pid] = executor._processes  # type: ignore[attr-defined]
    return int(pid)


def alive(pid: int) -> bool:
    """Running (an orphan that exited may wait as a zombie for whoever reaps orphans here)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def ended(pid: int) -> bool:
    """Whether process ``pid`` is gone within 5 s (a child looks for its parent once a
    second)."""
    for _ in range(100):
        if not alive(pid):
            return True
        await asyncio.sleep(0.05)
    return not alive(pid)


async def test_a_child_process_counts_the_rows_as_a_thread_does(
    start_proxy: ProxyFactory, tmp_path: Path,
) -> None:
    # A growing session that the window cuts: rows with shared prefixes and a forwarded body
    # that differs from the client's, the direct counterfactual's cache read at each.
    in_thread = await start_proxy(keep_turns=2)
    in_child = await start_proxy(keep_turns=2, stats_process=True, data_dir=tmp_path / "child")
    history = codex.session(8)
    for n in range(3, 9):
        for proxy in (in_thread, in_child):
            await post(proxy, history[: 2 * n - 1], "sess-1")
    expected, got = await rows(in_thread, "sess-1"), await rows(in_child, "sess-1")
    assert len(got) == len(expected) == 6
    assert [numbers(r) for r in got] == [numbers(r) for r in expected]
    assert all(r.client_tokens and r.forwarded_tokens for r in got)
    assert any(r.direct_cached for r in got)  # the chains were kept across batches
    assert os.getpid() != child_pid(in_child)


async def test_a_dead_child_costs_its_batch_and_the_next_batch_starts_another(
    start_proxy: ProxyFactory,
) -> None:
    proxy = await start_proxy(stats_process=True)
    recorder = proxy.app[LEDGER].recorder
    assert recorder is not None
    history = codex.session(2)
    await post(proxy, history, "first")
    [first] = await rows(proxy, "first")
    dead = child_pid(proxy)
    os.kill(dead, signal.SIGKILL)
    await post(proxy, history, "lost")
    assert await rows(proxy, "lost") == []  # its batch went with the child, counted
    assert recorder.dropped == 1
    await post(proxy, history, "after")
    [after] = await rows(proxy, "after")
    assert after.client_tokens == first.client_tokens  # the same body, counted again
    assert after.forwarded_tokens and after.direct_input
    assert child_pid(proxy) != dead


async def test_the_child_ends_with_the_proxy(start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy(stats_process=True)
    await post(proxy, codex.session(2), "sess-1")
    await rows(proxy, "sess-1")
    pid = child_pid(proxy)
    await proxy.close()
    assert await ended(pid)


def no_semaphores(*args: object, **kwargs: object) -> None:
    """As in a container with no /dev/shm: the counting process's queue has no lock."""
    raise OSError(38, "Function not implemented")


class NoFork(ProcessPoolExecutor):
    """As at a process limit: the child cannot be spawned."""

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        raise OSError(11, "Resource temporarily unavailable")


@pytest.mark.parametrize("executor", [no_semaphores, NoFork], ids=["no-shm", "no-fork"])
async def test_where_no_child_can_start_the_rows_are_counted_in_a_thread(
    start_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, executor: object,
) -> None:
    monkeypatch.setattr(measure, "ProcessPoolExecutor", executor)
    proxy = await start_proxy(stats_process=True)
    recorder = proxy.app[LEDGER].recorder
    assert recorder is not None and isinstance(recorder.counting, InThread)
    assert "counted in a thread of the worker" in caplog.text
    await post(proxy, codex.session(2), "sess-1")
    [row] = await rows(proxy, "sess-1")
    assert row.client_tokens and row.forwarded_tokens


PARENT = """
import asyncio, sys
from ctxproxy.ledger.measure import InProcess

async def main():
    counting = InProcess()
    counting.start()
    [pid] = counting._executor._processes
    with open(sys.argv[1], "w") as f:
        f.write(str(pid))
    await asyncio.sleep(60)

asyncio.run(main())
"""


async def test_the_child_ends_when_its_parent_is_killed_outright(tmp_path: Path) -> None:
    # SIGKILL (the OOM killer, a supervisor's last resort) shuts nothing down, and the child
    # holds both ends of its queue: it must notice on its own.
    said = tmp_path / "child"
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PARENT, str(said), stdout=asyncio.subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parents[2])
    for _ in range(600):
        if said.exists() and said.read_text():
            break
        await asyncio.sleep(0.05)
    child = int(said.read_text())
    assert alive(child)
    parent.kill()
    await parent.wait()
    assert await ended(child)
