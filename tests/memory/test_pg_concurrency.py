"""Two OS processes against one PostgreSQL store: nothing lost, nothing duplicated.

Each child is this module run as a small program; both wait on a "go" line so that their
work really overlaps.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from ctxproxy.memory.model import Memory, Scope
from ctxproxy.memory.pg_schema import MIGRATIONS
from ctxproxy.memory.store_pg import PostgresStore

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
SCOPE = Scope("svc", "team-a", "agent-1", "u_1")
TURNS = 30


def session_batch(writer: str, request: int) -> list[Memory]:
    """What one replica writes for request ``request`` of the session: every turn so far
    (Codex resends the whole history), the session's task (sliding TTL), and one record of
    its own."""
    batch = [
        Memory(type="episodic", scope=SCOPE, key=f"turn-{t}", text=f"turn {t}: step {t} done",
               session_id="sess-shared", turn_index=t)
        for t in range(request)
    ]
    batch.append(Memory(type="working", scope=SCOPE, key="task", text="migrate the billing db",
                        session_id="sess-shared", expires_at=4_000_000_000.0 + request))
    batch.append(Memory(type="episodic", scope=SCOPE, key=f"{writer}-req-{request}",
                        text=f"request {request} seen by {writer}", session_id="sess-shared"))
    if writer == "b":
        batch.reverse()  # the other replica meets the same rows in the opposite order
    return batch


async def _child(mode: str, url: str, writer: str) -> None:
    store = PostgresStore(url)
    if mode == "migrate":
        print("ready", flush=True)
        sys.stdin.readline()
        await store.open()
        await store.close()
        print(json.dumps({}), flush=True)
        return
    await store.open()
    print("ready", flush=True)
    sys.stdin.readline()
    ids: dict[str, str] = {}
    try:
        for request in range(1, TURNS + 1):
            for m in await store.upsert(session_batch(writer, request)):
                ids[m.key] = m.memory_id
    finally:
        await store.close()
    print(json.dumps(ids), flush=True)


def run_together(mode: str, url: str) -> list[dict[str, str]]:
    """Start writers a and b, release them at once, return what each reported."""
    code = "import asyncio, sys; from tests.memory.test_pg_concurrency import _child; " \
           "asyncio.run(_child(*sys.argv[1:]))"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, mode, url, writer], cwd=ROOT,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for writer in ("a", "b")
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outputs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0]
    return [json.loads(out.strip().splitlines()[-1]) for out in outputs]


async def test_two_processes_writing_one_session_lose_and_duplicate_nothing(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.open()  # schema in place, so both children race on rows only
    try:
        a_ids, b_ids = await asyncio.to_thread(run_together, "write", pg_url)
        stored = await store.list(SCOPE, limit=10_000, now=0)
    finally:
        await store.close()

    shared = {f"turn-{t}" for t in range(TURNS)} | {"task"}
    own = {f"{w}-req-{r}" for w in "ab" for r in range(1, TURNS + 1)}
    keys = [m.key for m in stored]
    assert sorted(keys) == sorted(shared | own)  # every key once: none lost, none doubled
    by_key = {m.key: m for m in stored}
    assert {k: a_ids[k] for k in shared} == {k: b_ids[k] for k in shared}
    assert all(by_key[k].memory_id == a_ids[k] for k in shared)
    assert all(by_key[k].memory_id == {**a_ids, **b_ids}[k] for k in own)
    assert by_key["turn-7"].text == "turn 7: step 7 done"
    assert by_key["task"].text == "migrate the billing db"


async def test_two_processes_starting_at_once_migrate_the_schema_once(pg_url: str) -> None:
    await asyncio.to_thread(run_together, "migrate", pg_url)

    with psycopg.connect(pg_url) as conn:
        versions = [v for (v,) in conn.execute("SELECT version FROM ctxproxy_migrations")]
    assert sorted(versions) == [v for v, _ in MIGRATIONS]
    store = PostgresStore(pg_url)
    await store.open()  # a third start finds nothing to do
    try:
        stored = await store.upsert([Memory(type="semantic", scope=SCOPE, key="k", text="t")])
        assert await store.get(stored[0].memory_id) == stored[0]
    finally:
        await store.close()
