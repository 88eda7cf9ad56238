"""Identity bound to credentials: a client key decides its principal and what identity
headers it may send; two keys never share memory, whatever headers they send."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import aiohttp
import pytest

from ctxproxy.memory.model import Store
from ctxproxy.proxy.auth import load_client_keys
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream
from tests.memory.conftest import Backend
from tests.memory.session import runtime, settle

KEYS = ("ck-alice-7f3e principal=alice teams=team-a agents=coder users=any;"
        " ck-bob-19ac principal=bob teams=team-a agents=coder users=none;"
        " ck-ops-55d1")
SAME = {"x-team-id": "team-a", "x-agent-id": "coder"}
FIRST = "Set up the project and run the tests."
Item = dict[str, Any]


def anonymous_headers(key: str, **extra: str) -> dict[str, str]:
    """What a client without a session id sends: no session-id, no turn metadata (and a
    test header, forwarded, saying which key sent it)."""
    return {"Authorization": f"Bearer {key}", "Content-Type": "application/json",
            "Accept": "text/event-stream", "x-test-sender": key, **extra}


def anonymous_body(items: list[Item]) -> dict[str, Any]:
    body = codex.request(items)
    body.pop("prompt_cache_key")
    return body


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any],
               headers: dict[str, str]) -> tuple[int, bytes]:
    async with http.post(url + "/v1/responses", data=json.dumps(body), headers=headers) as r:
        return r.status, await r.read()


async def test_a_claim_beyond_the_key_gets_an_openai_shaped_403_and_nothing_is_forwarded(
    upstream: FakeUpstream, start_proxy: ProxyFactory,
) -> None:
    proxy = await start_proxy(client_keys=KEYS, upstream_api_key="sk-real")
    body = codex.request(codex.session(1))
    async with aiohttp.ClientSession() as http:
        refused = [
            await post(http, proxy.url, body, codex.headers(
                Authorization="Bearer ck-alice-7f3e", **{"x-team-id": "team-b"})),
            await post(http, proxy.url, body, codex.headers(
                Authorization="Bearer ck-alice-7f3e", **{"x-agent-id": "deployer"})),
            await post(http, proxy.url, body, codex.headers(
                Authorization="Bearer ck-bob-19ac", **{"x-tdai-user-key": "uk-secret-bob"})),
        ]
        assert upstream.received == []
        allowed = [
            await post(http, proxy.url, body, codex.headers(
                Authorization="Bearer ck-alice-7f3e", **SAME, **{"x-tdai-user-key": "uk-a"})),
            await post(http, proxy.url, body, codex.headers(
                Authorization="Bearer ck-ops-55d1", **{"x-team-id": "team-z"})),  # any
        ]
    for status, raw in refused:
        assert status == 403
        error = json.loads(raw)["error"]
        assert error["type"] == "invalid_request_error"
        assert error["code"] == "identity_not_allowed"
        assert "uk-secret-bob" not in raw.decode()
    assert [status for status, _ in allowed] == [200, 200]
    assert len(upstream.received) == 2


def test_client_keys_parse_principals_and_claims_and_the_old_list() -> None:
    alice, bob, ops = load_client_keys(KEYS)
    assert (alice.principal, alice.teams, alice.agents, alice.users) == (
        "alice", frozenset({"team-a"}), frozenset({"coder"}), None)
    assert bob.users == frozenset()
    assert ops.teams is None and ops.principal.startswith("key-")
    assert "ck-ops" not in ops.principal and "ck-ops" not in repr(ops)
    assert [k.key for k in load_client_keys("ck-1,ck-2")] == [b"ck-1", b"ck-2"]
    assert not alice.admin and not ops.admin
    (root,) = load_client_keys("ck-root principal=root admin")
    assert root.admin and root.principal == "root"
    with pytest.raises(ValueError, match="bad field"):
        load_client_keys("ck-1 team=a")


async def no_session_turns(http: aiohttp.ClientSession, url: str, key: str, marker: str
                           ) -> list[Item]:
    """A client with no session id: the same first prompt as the other, its own facts."""
    items: list[Item] = [*codex.context_items(), codex.text("user", FIRST)]
    headers = anonymous_headers(key, **SAME)
    for n in range(1, 6):
        status, _ = await post(http, url, anonymous_body(items), headers)
        assert status == 200
        items += [codex.text("assistant", f"Done step {n}."),
                  codex.text("user", f"turn {n + 1}: the {marker} vault is number {n}. "
                                     f"Always use {marker} for builds.")]
    return items


async def test_isolation_hammer_two_keys_same_headers_same_first_prompt_no_session(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
) -> None:
    # The plain list of keys: each key is its own principal.
    proxy = await start_proxy(**backend.settings, client_keys="ck-alice-7f3e,ck-bob-19ac",
                              upstream_api_key="sk-real", keep_turns=2, trim_slack=0,
                              semantic_threshold=0.0)
    markers = {"ck-alice-7f3e": "alicemark" + uuid.uuid4().hex[:6],
               "ck-bob-19ac": "bobmark" + uuid.uuid4().hex[:6]}
    async with aiohttp.ClientSession() as http:
        for _ in range(3):  # rounds: each one's memory exists while the other asks
            histories = await asyncio.gather(*(
                no_session_turns(http, proxy.url, key, marker)
                for key, marker in markers.items()))
            await settle(proxy)
        for (key, _), items in zip(markers.items(), histories, strict=True):
            asked = [*items, codex.text("user", "Which vault number and build tool again?")]
            assert (await post(http, proxy.url, anonymous_body(asked),
                               anonymous_headers(key, **SAME)))[0] == 200

    reads = {key: 0 for key in markers}
    cross = []
    for rec in upstream.received:
        owner = rec.headers["x-test-sender"]
        text = (rec.json.get("instructions") or "") + json.dumps(rec.json["input"])
        reads[owner] += 1
        cross += [(owner, other) for other, m in markers.items() if other != owner and m in text]
    assert reads == {key: 3 * 5 + 1 for key in markers}
    assert cross == [], f"cross-principal reads: {len(cross)}"

    store: Store = runtime(proxy).store
    stored = await store.list(None, limit=100_000, now=0)
    assert {m.type for m in stored} >= {"episodic"}
    assert [m for m in stored if m.type == "working"] == []  # no session: no working memory
    users = {m.scope.user for m in stored}
    assert len(users) == 2 and all(u.startswith("p_") for u in users)
