"""Explain and the capture folder under client keys: a key sees only its own requests (an
operator's key sees all), and neither they nor the logs hold a working capability token."""

from __future__ import annotations

import asyncio
import logging
import re
import shlex
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from ctxproxy.config.logs import JsonFormatter
from ctxproxy.proxy.cli import main
from tests.conftest import ProxyFactory
from tests.fakes.server import Running
from tests.fakes.upstream import FakeUpstream
from tests.knowledge.test_chat_memory import FACT, chat_memory, past_a_cut, with_call
from tests.knowledge.test_discovery_e2e import block_of, run_curl
from tests.memory.conftest import Backend, backend, pg_url
from tests.memory.session import Session, settle

__all__ = ["backend", "pg_url"]  # the fixtures: every test here runs on both stores

ALICE, BOB, OPS = "ck-alice-5c1d", "ck-bob-8e2a", "ck-ops-77f0"
KEYS = f"{ALICE} principal=alice; {BOB} principal=bob; {OPS} principal=ops admin"
TEAM = {"x-team-id": "team-a", "x-agent-id": "coder"}
PLAN = "Alice's private plan: migrate billing to the new ledger on Friday."
# The value a <knowledge_tools> curl line gives the capability header, wherever it is shown.
SHOWN_CAPABILITY = re.compile(r"x-ctxproxy-capability: ([^'\"\s\\]+)")


def as_(key: str, user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **TEAM, "x-tdai-user-key": user}


async def start(start_proxy: ProxyFactory, backend: Backend, **extra: Any) -> Running:
    return await start_proxy(client_keys=KEYS, upstream_api_key="sk-real-upstream",
                             chat_memory_asset=True, **backend.settings, **extra)


async def explain_last(proxy: Running, key: str, **params: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(
        proxy.url + "/ctxproxy/explain/last", params=params,
        headers={"Authorization": f"Bearer {key}"},
    ) as r:
        return r.status, await r.json()


async def test_a_client_key_explains_only_its_own_requests_and_an_admin_key_all(
    start_proxy: ProxyFactory, upstream: FakeUpstream, backend: Backend,
) -> None:
    proxy = await start(start_proxy, backend)
    alice = Session(proxy, upstream, session_id="sess-alice", headers=as_(ALICE, "uk-alice"))
    bob = Session(proxy, upstream, session_id="sess-bob", headers=as_(BOB, "uk-bob"))
    await bob.say("Bob's question about the parser.")
    await alice.say(PLAN)  # the newest request is Alice's

    status, report = await explain_last(proxy, BOB, body="1")
    assert status == 200 and report["session"] == "sess-bob"
    assert "billing" not in orjson.dumps(report).decode()
    status, report = await explain_last(proxy, BOB, session="sess-alice", body="1")
    assert status == 404 and "billing" not in orjson.dumps(report).decode()
    assert report["error"]["code"] == "not_found"

    status, report = await explain_last(proxy, ALICE, body="1")
    assert status == 200 and report["session"] == "sess-alice"
    assert PLAN in orjson.dumps(report["body"]).decode()
    status, _ = await explain_last(proxy, ALICE, session="sess-bob")
    assert status == 404

    status, report = await explain_last(proxy, OPS)  # the operator sees every principal's
    assert status == 200 and report["session"] == "sess-alice"
    status, report = await explain_last(proxy, OPS, session="sess-bob")
    assert status == 200 and report["session"] == "sess-bob"


async def called_with(call: str, working: str, token: str) -> int:
    """The code the chat-memory asset answers ``call`` (a block's call_tool line) with when it
    carries ``token`` in place of the working one."""
    answer = await run_curl(call.replace(working, token))
    return int(answer["code"])


async def captured(folder: Path, count: int) -> str:
    """The capture folder's files once ``count`` are written (they are written off the relay)."""
    for _ in range(200):
        files = sorted(folder.glob("*.json")) if folder.exists() else []
        if len(files) >= count:
            return "\n".join(f.read_text() for f in files)
        await asyncio.sleep(0.05)
    raise AssertionError(f"{count} captures were not written")


async def test_explain_captures_and_logs_hold_no_working_capability_token(
    start_proxy: ProxyFactory, upstream: FakeUpstream, backend: Backend, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, every level
    proxy = await start(start_proxy, backend, capture_dir=tmp_path / "captured")
    alice = Session(proxy, upstream, session_id="sess-alice", headers=as_(ALICE, "uk-alice"))
    await alice.say(f"Note for later: {FACT}")
    await past_a_cut(alice)
    await settle(proxy)
    await alice.say("What port does staging use?")

    # The forwarded body carries the working token: the model's curl lines need it.
    call = chat_memory(block_of(upstream)).findtext("call_tool") or ""
    working = next(a.partition(": ")[2] for a in shlex.split(call)
                   if a.startswith("x-ctxproxy-capability: "))
    call = with_call(call, "search", {"query": "staging port"})
    found = await run_curl(call)
    assert found["code"] == 0 and any("6543" in r["snippet"] for r in found["data"]["results"])

    _, report = await explain_last(proxy, ALICE, body="1")
    _, admin_report = await explain_last(proxy, OPS, body="1")
    shown = "\n".join([orjson.dumps(report).decode(), orjson.dumps(admin_report).decode(),
                       await captured(tmp_path / "captured", 2)])
    tokens = SHOWN_CAPABILITY.findall(shown)
    assert tokens, "the block's curl lines are shown (redacted)"
    assert working not in shown and working.rsplit(".", 1)[1] not in shown
    for token in set(tokens):
        assert await called_with(call, working, token) == 401, token

    formatter = JsonFormatter()
    logs = "\n".join(formatter.format(record) for record in caplog.records)
    assert working.rsplit(".", 1)[1] not in logs


async def test_explain_last_on_the_command_line_asks_with_the_operators_key(
    start_proxy: ProxyFactory, upstream: FakeUpstream, backend: Backend, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    proxy = await start(start_proxy, backend)
    await Session(proxy, upstream, session_id="sess-alice",
                  headers=as_(ALICE, "uk-alice")).say(PLAN)
    await Session(proxy, upstream, session_id="sess-bob", headers=as_(BOB, "uk-bob")).say("hi")
    monkeypatch.setenv("CTXPROXY_DATA_DIR", str(tmp_path / "cli"))
    monkeypatch.setenv("CTXPROXY_UPSTREAM_API_KEY", "sk-real-upstream")

    def last_session(keys: str) -> str:
        monkeypatch.setenv("CTXPROXY_CLIENT_KEYS", keys)
        assert main(["explain", "--last", "--json", "--url", proxy.url]) == 0
        return str(orjson.loads(capsys.readouterr().out)["session"])

    # The newest request is Bob's: the operator's key (listed last) sees it; without one,
    # the first key sees only its own principal's.
    assert await asyncio.to_thread(last_session, KEYS) == "sess-bob"
    assert await asyncio.to_thread(last_session, f"{ALICE} principal=alice; {BOB} "
                                   "principal=bob") == "sess-alice"
