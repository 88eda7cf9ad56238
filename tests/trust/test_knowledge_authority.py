"""Knowledge tools with authority: the block's curl lines carry a capability for their asset
and scope; it works with and without client keys, and opens nothing else."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ctxproxy.knowledge.capability import CapabilityKey, Grant, check, mint
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream
from tests.knowledge.test_discovery_e2e import block_of, run_curl
from tests.knowledge.wikis import add_wiki, write_wiki

Capsys = pytest.CaptureFixture[str]
KEY = CapabilityKey(b"k" * 32, period_s=3600.0)
GRANT = Grant("default", "team-a", "", "", "wiki-aaaaaaaa")
T0 = 1_800_000_000.0


def test_a_capability_is_stable_within_its_period_and_expires_after_the_next() -> None:
    token = mint(KEY, GRANT, now=T0)
    start = T0 - T0 % 3600
    assert mint(KEY, GRANT, now=start + 3599) == token  # the block keeps its bytes
    assert check(KEY, token, now=T0) == GRANT
    assert check(KEY, token, now=start + 3600 + 10) == GRANT  # the next period still takes it
    assert check(KEY, token, now=start + 7200 + 10) is None
    assert mint(KEY, GRANT, now=start + 3600) != token
    other = Grant("default", "team-b", "", "", "wiki-aaaaaaaa")
    assert mint(KEY, other, now=T0) != token
    assert check(CapabilityKey(b"x" * 32, 3600.0), token, now=T0) is None
    prefix, _, mac = token.split(".")
    forged = mint(KEY, other, now=T0).split(".")[1]
    assert check(KEY, f"{prefix}.{forged}.{mac}", now=T0) is None
    for junk in ("", "cap1", "cap1..", "cap1.!!.??", "x" * 5000, token + "x"):
        assert check(KEY, junk, now=T0) is None


async def turn(url: str, headers: dict[str, str]) -> None:
    async with aiohttp.ClientSession() as s, s.post(
        url + "/v1/responses", data=json.dumps(codex.request(codex.session(1))),
        headers=codex.headers(**headers),
    ) as r:
        assert r.status == 200, await r.text()


async def core(url: str, path: str, body: dict[str, Any], headers: dict[str, str]
               ) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.post(
        url + path, data=json.dumps(body),
        headers={"x-tdai-service-id": "default", **headers},
    ) as r:
        return dict(await r.json())


@pytest.mark.parametrize("client_keys", [None, "ck-team-a teams=team-a"])
async def test_the_blocks_curl_lines_work_and_open_only_their_own_asset(
    client_keys: str | None, capsys: Capsys, tmp_path: Path, upstream: FakeUpstream,
    start_proxy: ProxyFactory,
) -> None:
    data = tmp_path / "data"
    ours = add_wiki(capsys, data, write_wiki(tmp_path / "a"), team="team-a", name="A docs")
    theirs = add_wiki(capsys, data, write_wiki(tmp_path / "b"), team="team-b", name="B docs")
    auth = {"Authorization": "Bearer ck-team-a"} if client_keys else {}
    extra = {"client_keys": client_keys, "upstream_api_key": "sk-real"} if client_keys else {}
    proxy = await start_proxy(**extra)
    await turn(proxy.url, {"x-team-id": "team-a", **auth})

    block = block_of(upstream)
    assert block is not None
    (knowledge,) = block.findall("knowledge")
    assert knowledge.get("id") == ours
    listed = await run_curl(knowledge.findtext("list_tools") or "")
    assert listed["code"] == 0, listed
    called = await run_curl(knowledge.findtext("call_tool") or "")
    assert called["code"] == 0, called

    # The same line pointed at another team's wiki: refused.
    line = (knowledge.findtext("call_tool") or "").replace(ours, theirs)
    assert (await run_curl(line))["code"] == 403
    # Without the capability, nothing: not even with a client key.
    body = {"knowledge_id": ours, "tool_name": "get_info", "params": {}}
    assert (await core(proxy.url, "/v3/tools/call", body, auth))["code"] == 401


async def test_a_client_key_cannot_list_another_teams_knowledge(
    capsys: Capsys, tmp_path: Path, start_proxy: ProxyFactory,
) -> None:
    add_wiki(capsys, tmp_path / "data", write_wiki(tmp_path / "b"), team="team-b")
    proxy = await start_proxy(client_keys="ck-team-a teams=team-a agents=coder",
                              upstream_api_key="sk-real")
    auth = {"Authorization": "Bearer ck-team-a"}
    async with aiohttp.ClientSession() as s:
        for path, body in (("/v3/knowledge/list", {"team_id": "team-b"}),
                           ("/v3/meta/agent-fixed-asset/list-with-detail",
                            {"agent_id": "reviewer"})):
            async with s.post(proxy.url + path, data=json.dumps(body),
                              headers={"x-tdai-service-id": "default", **auth}) as r:
                assert r.status == 403, path
                assert (await r.json())["error"]["code"] == "identity_not_allowed"
    answer = await core(proxy.url, "/v3/knowledge/list", {"team_id": "team-a"}, auth)
    assert answer["code"] == 0 and answer["data"]["items"] == []
