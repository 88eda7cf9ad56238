"""`ctxproxy memory add --user-key`: the memory lands in the scope of requests that send that
key (digested, never kept plain), the command says which scope, and such a request sees it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import orjson
import pytest

from ctxproxy.memory.model import user_ref
from ctxproxy.memory.store_sqlite import SqliteStore
from ctxproxy.proxy.cli import main
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream

KEY = "uk-newcomer-secret"
FACT = "Deploys go through ArgoCD, never kubectl apply"


async def add(data_dir: Path, monkeypatch: pytest.MonkeyPatch,
              capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    monkeypatch.setenv("CTXPROXY_DATA_DIR", str(data_dir))
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["memory", "add", FACT, *argv])
    out, err = capsys.readouterr()
    return code, out, err


async def test_add_with_the_user_key_lands_where_its_requests_recall_it(
    start_proxy: ProxyFactory, upstream: FakeUpstream, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    data_dir = tmp_path / "data"
    code, out, err = await add(data_dir, monkeypatch, capsys, "--team", "team-123",
                               "--agent", "coder", "--user-key", KEY)
    assert code == 0
    memory_id = out.strip()
    assert "x-team-id 'team-123'" in err and "x-agent-id 'coder'" in err
    assert user_ref(KEY) in err and KEY not in err
    store = SqliteStore(data_dir / "memory.sqlite3")
    await store.open()
    try:
        stored = await store.get(memory_id)
    finally:
        await store.close()
    assert stored is not None and stored.scope.user == user_ref(KEY)
    assert KEY.encode() not in (data_dir / "memory.sqlite3").read_bytes()

    proxy = await start_proxy(data_dir=data_dir)
    items = [*codex.context_items(), codex.text("user", "how do deploys go out?")]
    headers = codex.headers("sess-k", **{"x-team-id": "team-123", "x-agent-id": "coder",
                                         "x-tdai-user-key": KEY})
    async with aiohttp.ClientSession() as http, http.post(
        proxy.url + "/v1/responses", data=orjson.dumps(codex.request(items, "sess-k")),
        headers=headers,
    ) as resp:
        assert resp.status == 200
        await resp.read()
    assert FACT.encode() in upstream.received[-1].body  # type: ignore[attr-defined]


async def test_add_without_a_user_says_keyed_requests_will_not_see_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = await add(tmp_path, monkeypatch, capsys, "--team", "t", "--agent", "a")
    assert code == 0
    assert "requests that send a user key do not: add --user-key" in err
