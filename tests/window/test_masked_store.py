"""Masked outputs in the shared store: any replica answers a fetch line, redacted, within a
budget per scope; a writer that cannot keep up counts what it did not store."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from ctxproxy.proxy.output_store import (
    OutputStore,
    PostgresOutputs,
    Shelf,
    SqliteOutputs,
    Stored,
    scope_of,
)
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream
from tests.memory.conftest import pg_url  # noqa: F401  (the fixture)
from tests.window.test_masking_fetch import (
    BIG,
    GONE,
    WINDOW,
    fetch_line,
    masked_outputs,
    post,
    run_curl,
)

SECRET = "sk-proj-" + "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2Yz3"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_settings(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """What makes two proxies share one store: a data dir (the workers of one machine) or
    one PostgreSQL (replicas, each with a data dir of its own)."""
    if request.param == "sqlite":
        return {"data_dir": tmp_path / "shared"}
    return {"store_url": request.getfixturevalue("pg_url")}


async def test_another_replica_answers_the_line_one_replica_masked(
    store_settings: dict[str, Any], upstream: FakeUpstream, start_proxy: ProxyFactory,
    tmp_path: Path,
) -> None:
    a, b, c = [
        await start_proxy(**WINDOW, **store_settings,
                          **({"data_dir": tmp_path / name} if "store_url" in store_settings
                             else {}))
        for name in "abc"
    ]
    # The masked turn's output carries a secret.
    items = codex.context_items()
    items += codex.tool_turn("turn 1: build it", output=BIG)
    items += codex.tool_turn("turn 2: build it again",
                             output=BIG + f"export OPENAI_API_KEY={SECRET}\n")
    items.append(codex.text("user", "turn 3: what failed?"))
    await post(a.url, items, "sess-a")
    line_a = fetch_line(masked_outputs(upstream)[0])
    await post(b.url, items, "sess-a")
    line_b = fetch_line(masked_outputs(upstream)[0])
    assert line_b == line_a.replace(a.url, b.url)  # one id across the fleet

    # C forwarded nothing: asked at C's address, C reads the store.
    line_c = line_a.replace(a.url, c.url)
    text = await _eventually_fetched(line_c)
    assert text.startswith(BIG) and SECRET not in text and "[REDACTED]" in text
    assert (await run_curl(line_c, session="sess-b"))[::2] == (404, GONE)


async def _eventually_fetched(line: str) -> str:
    """The writer stores off the request path: the line answers within moments."""
    deadline = time.monotonic() + 5
    while True:
        status, _, text = await run_curl(line)
        if status == 200 or time.monotonic() > deadline:
            assert status == 200, text
            return text
        await asyncio.sleep(0.05)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    made: OutputStore = (SqliteOutputs(tmp_path) if request.param == "sqlite"
                         else PostgresOutputs(request.getfixturevalue("pg_url")))
    key = await made.open()
    assert len(key) == 32
    yield made
    await made.close()


async def test_the_store_keeps_its_budget_per_scope_and_its_age(store: OutputStore) -> None:
    now = time.time()
    one, two = scope_of("default", "t", "a", "u1"), scope_of("default", "t", "a", "u2")
    rows = [Stored(f"o{n}", one, "s", "x" * 400, now + n) for n in range(5)]
    rows.append(Stored("other", two, "s", "y" * 400, now))
    for row in rows:
        await store.put([row], max_scope_bytes=1000, before=None)
    # Scope one keeps its newest two (800 bytes); scope two is untouched by one's budget.
    held = [r.output_id for r in rows if await store.get(r.output_id) is not None]
    assert held == ["o3", "o4", "other"]
    await store.put([Stored("late", two, "s", "z", now + 10)], max_scope_bytes=1000,
                    before=now + 5)
    assert await store.get("other") is None and await store.get("o4") is None
    assert (await store.get("late")) == Stored("late", two, "s", "z", now + 10)


async def test_a_full_writer_counts_what_it_did_not_store(tmp_path: Path) -> None:
    store = SqliteOutputs(tmp_path)
    await store.open()
    dropped: list[tuple[str, int]] = []
    shelf = Shelf(store, max_scope_bytes=10**6, max_age_s=3600, max_rows=2,
                  on_drop=lambda reason, n: dropped.append((reason, n)))
    rows = [Stored(f"o{n}", "scope", "s", "text", time.time()) for n in range(3)]
    # Not started: nothing is taken from the queue, so the third does not fit.
    assert [shelf.offer(r) for r in rows] == [True, True, False]
    assert dropped == [("full", 1)]
    shelf.start()
    await asyncio.wait_for(shelf.join(), 5)
    assert shelf.written == 2 and await store.get("o1") is not None
    assert await store.get("o2") is None
    await shelf.close()
