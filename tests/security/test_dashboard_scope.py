"""The dashboard under client keys: a key sees and acts on its own principal's data only
(the ledger's rows it sent, the memory scopes they name); an admin key sees everyone's. Another
principal's session or memory is as unknown as none: a 404, never a 403."""

from __future__ import annotations

import contextlib
import re
import sqlite3
import time

import aiohttp
import psycopg
import pytest
from lxml import html

from ctxproxy.config import load_settings
from ctxproxy.ledger import store_pg, store_sqlite
from ctxproxy.ledger.sql import TABLE
from ctxproxy.ledger.stores import LEDGER_FILE, make_ledger
from ctxproxy.memory.model import Memory
from ctxproxy.proxy.ledger_wiring import LEDGER
from tests.conftest import ProxyFactory
from tests.fakes.server import Running
from tests.fakes.upstream import FakeUpstream
from tests.memory.conftest import Backend, backend, pg_url
from tests.memory.session import Session, runtime, settle

__all__ = ["backend", "pg_url"]

KEYS = ("ck-alice-4d1e principal=alice teams=team-a;"
        " ck-bob-8c2f principal=bob teams=team-b;"
        " ck-root-6a9b principal=root admin")
ALICE, BOB, ROOT = "ck-alice-4d1e", "ck-bob-8c2f", "ck-root-6a9b"
ALICE_WORD, BOB_WORD = "marmalade", "porcupine"


def as_key(key: str, team: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "x-team-id": team}


async def get(proxy: Running, key: str, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(
            proxy.url + path, headers={"Authorization": f"Bearer {key}"}) as resp:
        return resp.status, await resp.text()


async def post(proxy: Running, key: str, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.post(
            proxy.url + path, headers={"Authorization": f"Bearer {key}"}) as resp:
        return resp.status, await resp.text()


def total_requests(page: str) -> int:
    found = re.search(r'id="total-requests" data-value="(\d+)"', page)
    return int(found.group(1)) if found else 0


def rows(page: str, table: str) -> int:
    return len(html.fromstring(page).xpath(f'//table[@id="{table}"]/tbody/tr'))


async def two_principals(backend: Backend, upstream: FakeUpstream,
                         start_proxy: ProxyFactory) -> tuple[Running, Memory, Memory]:
    """Alice and Bob each talk in a session of their own, and Bob once in a session named
    like Alice's; their stored episodes (Alice's, Bob's)."""
    proxy = await start_proxy(**backend.settings, client_keys=KEYS,
                              upstream_api_key="sk-real", keep_turns=1, trim_slack=0)
    alice = Session(proxy, upstream, session_id="alice-s", headers=as_key(ALICE, "team-a"))
    for n in range(1, 4):
        await alice.say(f"turn {n}: label the {ALICE_WORD} jars, batch {n}")
    bob = Session(proxy, upstream, session_id="bob-s", headers=as_key(BOB, "team-b"))
    for n in range(1, 3):
        await bob.say(f"turn {n}: count the {BOB_WORD} quills, pen {n}")
    await Session(proxy, upstream, session_id="alice-s",
                  headers=as_key(BOB, "team-b")).say("turn 1: a session id like hers")
    await settle(proxy)
    side = proxy.app[LEDGER]
    assert side.recorder is not None
    await side.recorder.join()
    stored = await runtime(proxy).store.list(None, types=["episodic"], limit=1000, now=0)
    mine = [m for m in stored if ALICE_WORD in m.text]
    theirs = [m for m in stored if BOB_WORD in m.text]
    assert mine and theirs
    return proxy, mine[0], theirs[0]


async def test_a_key_sees_only_its_principals_requests_and_sessions(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
) -> None:
    proxy, _, _ = await two_principals(backend, upstream, start_proxy)
    assert [total_requests((await get(proxy, key, "/ui?since=all"))[1])
            for key in (ALICE, BOB, ROOT)] == [3, 3, 6]
    listed = {key: (await get(proxy, key, "/ui/sessions?since=all"))[1]
              for key in (ALICE, BOB, ROOT)}
    assert "/ui/sessions/alice-s" in listed[ALICE] and "bob-s" not in listed[ALICE]
    assert "/ui/sessions/bob-s" in listed[BOB]
    assert all(f"/ui/sessions/{s}" in listed[ROOT] for s in ("alice-s", "bob-s"))

    # Bob's request under Alice's session id is his own row, never in her timeline.
    status, page = await get(proxy, ALICE, "/ui/sessions/alice-s")
    assert status == 200 and rows(page, "timeline") == 3
    status, page = await get(proxy, BOB, "/ui/sessions/alice-s")
    assert status == 200 and rows(page, "timeline") == 1 and ALICE_WORD not in page
    status, page = await get(proxy, ROOT, "/ui/sessions/alice-s")
    assert status == 200 and rows(page, "timeline") == 4
    assert (await get(proxy, ALICE, "/ui/sessions/bob-s"))[0] == 404


async def test_rows_from_before_the_principal_are_the_admins_alone(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with monkeypatch.context() as m:  # the ledger as the previous version left it
        m.setattr(store_sqlite, "MIGRATIONS", store_sqlite.MIGRATIONS[:2])
        m.setattr(store_pg, "MIGRATIONS", store_pg.MIGRATIONS[:2])
        old = make_ledger(load_settings(env={}, **backend.settings))
        await old.open()
        await old.close()
    insert_old_row(backend, session="older-s")
    proxy = await start_proxy(**backend.settings, client_keys=KEYS, upstream_api_key="sk-real")
    await Session(proxy, upstream, session_id="alice-s",
                  headers=as_key(ALICE, "team-a")).say("turn 1: a new row")
    side = proxy.app[LEDGER]
    assert side.recorder is not None
    await side.recorder.join()

    assert [total_requests((await get(proxy, key, "/ui?since=all"))[1])
            for key in (ALICE, BOB, ROOT)] == [1, 0, 2]
    assert "older-s" not in (await get(proxy, ALICE, "/ui/sessions?since=all"))[1]
    assert "/ui/sessions/older-s" in (await get(proxy, ROOT, "/ui/sessions?since=all"))[1]
    assert (await get(proxy, ALICE, "/ui/sessions/older-s"))[0] == 404
    assert (await get(proxy, ROOT, "/ui/sessions/older-s"))[0] == 200


def insert_old_row(backend: Backend, *, session: str) -> None:
    """One request row as the previous version wrote it (no principal column)."""
    row = {"at": time.time(), "session_id": session, "model": "m", "status": 200,
           "service_id": "default", "team_id": "", "agent_id": "", "user_ref": "",
           "items_cut": 0, "outputs_masked": 0, "memory_ids": "", "knowledge": 0,
           "degraded": "", "recalled": 0}
    if "store_url" in backend.settings:
        sql = (f"INSERT INTO {TABLE} ({', '.join(row)}) "
               f"VALUES ({', '.join(['%s'] * len(row))})")
        with psycopg.connect(backend.settings["store_url"], autocommit=True) as conn:
            conn.execute(sql, tuple(row.values()))
        return
    with contextlib.closing(sqlite3.connect(backend.settings["data_dir"] / LEDGER_FILE)) as db:
        db.execute(f"INSERT INTO {TABLE} ({', '.join(row)}) "
                   f"VALUES ({', '.join('?' * len(row))})", tuple(row.values()))
        db.commit()


@pytest.mark.parametrize("query", ["", "?q=turn"])  # the newest, or a word of every turn
async def test_a_key_finds_only_its_principals_memories(
    query: str, backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
) -> None:
    proxy, hers, his = await two_principals(backend, upstream, start_proxy)
    for key, shown, hidden in ((ALICE, [hers], [his]), (BOB, [his], [hers]),
                               (ROOT, [hers, his], [])):
        status, page = await get(proxy, key, "/ui/memory" + query)
        assert status == 200
        assert all(m.memory_id in page for m in shown), key
        assert not any(m.memory_id in page or m.text[:40] in page for m in hidden), key
    status, page = await get(proxy, BOB, f"/ui/memory?q={ALICE_WORD}")
    assert status == 200 and rows(page, "memories") == 0


async def test_another_principals_memory_is_unknown_and_cannot_be_forgotten(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
) -> None:
    proxy, hers, his = await two_principals(backend, upstream, start_proxy)
    store = runtime(proxy).store
    status, page = await get(proxy, BOB, f"/ui/memory/{hers.memory_id}")
    assert status == 404 and ALICE_WORD not in page
    status, page = await post(proxy, BOB, f"/ui/memory/{hers.memory_id}/forget")
    assert status == 404 and ALICE_WORD not in page
    assert await store.get(hers.memory_id) is not None
    # The same answer as for an id nobody has.
    assert (await get(proxy, BOB, "/ui/memory/mem_00000000000000000000000000"))[1] == (
        (await get(proxy, BOB, f"/ui/memory/{hers.memory_id}"))[1].replace(
            hers.memory_id, "mem_00000000000000000000000000"))

    status, page = await get(proxy, ALICE, f"/ui/memory/{hers.memory_id}")
    assert status == 200 and ALICE_WORD in page
    status, page = await get(proxy, ROOT, f"/ui/memory/{his.memory_id}")
    assert status == 200 and BOB_WORD in page
    assert (await post(proxy, ALICE, f"/ui/memory/{hers.memory_id}/forget"))[0] == 200
    assert await store.get(hers.memory_id) is None
    assert (await post(proxy, ROOT, f"/ui/memory/{his.memory_id}/forget"))[0] == 200
    assert await store.get(his.memory_id) is None
