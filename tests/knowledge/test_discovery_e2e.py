"""End to end: identity headers in, a <knowledge_tools> block in the upstream's instructions,
and the block's own curl commands answered by the proxy's embedded wiki service."""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from lxml import etree

from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.server import free_port, serve
from tests.fakes.upstream import FakeUpstream
from tests.knowledge.fake_core import FakeCore
from tests.knowledge.wikis import add_wiki, ctxproxy, write_wiki

Capsys = pytest.CaptureFixture[str]
WHO = {"x-team-id": "team-1", "x-agent-id": "coder", "x-tdai-user-key": "uk-secret-1"}


async def post(url: str, body: dict[str, Any], headers: dict[str, str]) -> bytes:
    async with aiohttp.ClientSession() as s, s.post(
        url + "/v1/responses", data=json.dumps(body), headers=headers
    ) as r:
        assert r.status == 200
        return await r.read()


def block_of(upstream: FakeUpstream) -> etree._Element | None:
    instructions = upstream.last.json.get("instructions")
    if instructions is None:
        return None
    start = instructions.index("<knowledge_tools>")
    end = instructions.index("</knowledge_tools>") + len("</knowledge_tools>")
    return etree.fromstring(instructions[start:end].encode())


def ids(block: etree._Element | None) -> list[str]:
    assert block is not None
    return [el.get("id", "") for el in block.findall("knowledge")]


async def run_curl(line: str) -> dict[str, Any]:
    """Make the HTTP call a block's curl line describes (the argv as a shell would split it)."""
    argv = shlex.split(line)
    assert argv[:4] == ["curl", "-sS", "-X", "POST"]
    url, headers, data = argv[4], {}, None
    rest = iter(argv[5:])
    for flag in rest:
        value = next(rest)
        if flag == "-H":
            name, _, header = value.partition(": ")
            headers[name] = header
        else:
            assert flag == "-d"
            data = value
    async with aiohttp.ClientSession() as s, s.post(url, data=data, headers=headers) as r:
        answer: dict[str, Any] = await r.json()
        return answer


# --- the embedded core -----------------------------------------------------------------------


async def test_a_bound_wiki_is_announced_and_its_curl_commands_work(
    wiki_id: str, data_dir: Path, capsys: Capsys, upstream: FakeUpstream,
    start_proxy: ProxyFactory,
) -> None:
    ctxproxy(capsys, data_dir, "knowledge", "bind", "--agent", "coder", "--user-key",
             "uk-secret-1", wiki_id)
    proxy = await start_proxy(keep_turns=3, trim_slack=0)
    await post(proxy.url, codex.request(codex.session(6), session_id="sess-42"),
               codex.headers(session_id="sess-42", **WHO))

    sent = upstream.last
    block = block_of(upstream)
    assert ids(block) == [wiki_id]
    assert block is not None
    wiki = block.find("knowledge")
    assert wiki is not None
    assert wiki.get("service_url") == proxy.url + "/v3"
    assert wiki.get("name") == "Design docs"
    assert wiki.findtext("summary") == "How the backend is built"
    # The window still ran, the user's turns are untouched, and no secret went upstream.
    assert sum(1 for i in sent.json["input"] if i.get("role") == "user") == 4
    assert "<knowledge_tools>" not in json.dumps(sent.json["input"])
    assert b"uk-secret-1" not in sent.body
    assert not any(k.lower() == "x-tdai-user-key" for k in sent.headers)

    listing = await run_curl(wiki.findtext("list_tools") or "")
    assert listing["code"] == 0 and listing["data"]["knowledge_id"] == wiki_id
    assert "read_page" in [t["name"] for t in listing["data"]["tools"]]
    call_line = wiki.findtext("call_tool") or ""
    assert "x-conversation-id: sess-42" in shlex.split(call_line)
    found = await run_curl(call_line.replace("what you are looking for", "helm rollback"))
    assert found["data"]["results"][0]["page_id"] == "ops/deploy"
    page = await run_curl(call_line.replace(
        '"tool_name": "search", "params": {"query": "what you are looking for"}',
        '"tool_name": "read_page", "params": {"page_id": "ops/deploy"}'))
    assert "helm charts" in page["data"]["content"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs the curl binary")
async def test_the_curl_line_runs_as_is_in_a_shell(
    wiki_id: str, upstream: FakeUpstream, start_proxy: ProxyFactory,
) -> None:
    proxy = await start_proxy()
    await post(proxy.url, codex.request(codex.session(1)), codex.headers(**{"x-team-id": "team-1"}))
    block = block_of(upstream)
    assert block is not None
    line = block.findtext("knowledge/list_tools") or ""
    shell = await asyncio.create_subprocess_exec(
        "/bin/sh", "-c", line, stdout=asyncio.subprocess.PIPE)
    out, _ = await shell.communicate()
    assert json.loads(out)["data"]["knowledge_id"] == wiki_id


async def test_without_a_user_key_the_team_catalogue_is_used(
    tmp_path: Path, wiki_id: str, data_dir: Path, capsys: Capsys, upstream: FakeUpstream,
    start_proxy: ProxyFactory,
) -> None:
    other = add_wiki(capsys, data_dir, write_wiki(tmp_path / "other"), team="team-2")
    proxy = await start_proxy()
    await post(proxy.url, codex.request(codex.session(2)),
               codex.headers(**{"x-team-id": "team-1", "x-agent-id": "coder"}))
    assert ids(block_of(upstream)) == [wiki_id]  # unbound, yet the team's; not team-2's
    assert other not in upstream.last.json["instructions"]


async def test_team_and_user_key_can_come_from_the_settings(
    wiki_id: str, data_dir: Path, capsys: Capsys, upstream: FakeUpstream,
    start_proxy: ProxyFactory,
) -> None:
    ctxproxy(capsys, data_dir, "knowledge", "bind", "--agent", "coder", "--user-key", "uk-env",
             wiki_id)
    proxy = await start_proxy(team_id="team-1", agent_id="coder", user_key="uk-env")
    await post(proxy.url, codex.request(codex.session(2)), codex.headers())
    assert ids(block_of(upstream)) == [wiki_id]


async def test_with_agent_and_user_key_only_bound_assets_are_listed(
    tmp_path: Path, wiki_id: str, data_dir: Path, capsys: Capsys, upstream: FakeUpstream,
    start_proxy: ProxyFactory,
) -> None:
    second = add_wiki(capsys, data_dir, write_wiki(tmp_path / "more"), name="Runbooks")
    third = add_wiki(capsys, data_dir, write_wiki(tmp_path / "third"), name="Unbound")
    for kid, priority in ((wiki_id, "10"), (second, "90")):
        ctxproxy(capsys, data_dir, "knowledge", "bind", "--agent", "coder", "--user-key",
                 "uk-secret-1", kid, "--priority", priority)
    proxy = await start_proxy()
    await post(proxy.url, codex.request(codex.session(2)), codex.headers(**WHO))
    assert ids(block_of(upstream)) == [second, wiki_id]  # higher priority first; not `third`
    assert third not in upstream.last.json["instructions"]

    # Another user of the same agent has bound nothing: no block at all.
    raw = json.dumps(codex.request(codex.session(2))).encode()
    async with aiohttp.ClientSession() as s, s.post(
        proxy.url + "/v1/responses", data=raw,
        headers=codex.headers(**{**WHO, "x-tdai-user-key": "uk-someone-else"}),
    ) as r:
        await r.read()
    assert upstream.last.body == raw


async def test_an_empty_catalogue_leaves_the_request_byte_for_byte(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy()
    raw = json.dumps(codex.request(codex.session(2)), indent=2).encode()
    async with aiohttp.ClientSession() as s, s.post(
        proxy.url + "/v1/responses", data=raw, headers=codex.headers(**WHO)
    ) as r:
        await r.read()
    assert upstream.last.body == raw


async def test_no_team_no_block_and_existing_instructions_are_kept(
    wiki_id: str, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy()
    body = codex.request(codex.session(2), instructions="Be terse.")
    await post(proxy.url, body, codex.headers())
    assert upstream.last.json["instructions"] == "Be terse."
    await post(proxy.url, body, codex.headers(**{"x-team-id": "team-1"}))
    instructions = upstream.last.json["instructions"]
    assert instructions.startswith("Be terse.\n\n<knowledge_tools>")


async def test_a_compaction_request_gets_no_block(
    wiki_id: str, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy()
    await post(proxy.url, codex.request(codex.session(2)),
               codex.headers(kind="compaction", **{"x-team-id": "team-1"}))
    assert "instructions" not in upstream.last.json


async def test_the_block_is_the_same_bytes_on_every_request_of_a_session(
    wiki_id: str, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy()
    seen = set()
    for turns in (1, 2, 3):
        await post(proxy.url, codex.request(codex.session(turns)),
                   codex.headers(**{"x-team-id": "team-1"}))
        seen.add(upstream.last.json["instructions"])
    assert len(seen) == 1


# --- a remote core ---------------------------------------------------------------------------


@pytest.fixture
async def fake_core() -> AsyncIterator[FakeCore]:
    core = FakeCore()
    running = await serve(core.app())
    core.url = running.url  # type: ignore[attr-defined]
    yield core
    core.release.set()
    await running.close()


def remote_item(n: int, **extra: Any) -> dict[str, Any]:
    return {"knowledge_id": f"cg-{n:08d}", "type": "code-graph", "name": f"repo {n}",
            "service_url": "http://knowledge.internal:8421/v3", "summary": None,
            "repo_url": "ssh://git@git.internal:2222/acme/backend.git", **extra}


async def test_a_remote_core_is_asked_with_token_and_service_id(
    fake_core: FakeCore, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    fake_core.items = [remote_item(1)]
    proxy = await start_proxy(core_url=fake_core.url,  # type: ignore[attr-defined]
                              core_token="core-secret", service_id="tenant_7")
    await post(proxy.url, codex.request(codex.session(2)), codex.headers(**{"x-team-id": "t9"}))
    block = block_of(upstream)
    assert ids(block) == ["cg-00000001"]
    assert block is not None
    graph = block.find("knowledge")
    assert graph is not None
    assert graph.get("repo_slug") == "acme/backend"
    assert graph.get("service_url") == "http://knowledge.internal:8421/v3"
    assert "x-tdai-service-id: tenant_7" in shlex.split(graph.findtext("list_tools") or "")
    assert "core-secret" not in upstream.last.json["instructions"]
    path, headers, body = fake_core.calls[0]
    assert path == "/v3/knowledge/list" and body["team_id"] == "t9"
    assert headers["Authorization"] == "Bearer core-secret"
    assert headers["x-tdai-service-id"] == "tenant_7"


async def test_a_remote_core_gets_the_agent_path_with_the_user_key(
    fake_core: FakeCore, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    fake_core.bindings = [{"asset_id": "cg-00000002", "asset_type": "code_graph",
                           "status": "active", "priority": 60}]
    fake_core.items = [remote_item(2)]
    proxy = await start_proxy(core_url=fake_core.url)  # type: ignore[attr-defined]
    await post(proxy.url, codex.request(codex.session(2)), codex.headers(**WHO))
    assert ids(block_of(upstream)) == ["cg-00000002"]
    (agent_path, agent_headers, _), (list_path, _, list_body) = fake_core.calls
    assert list_path == "/v3/knowledge/list"
    assert agent_path == "/v3/meta/agent-fixed-asset/list-with-detail"
    assert agent_headers["x-tdai-user-key"] == "uk-secret-1"
    assert list_body == {"team_id": "team-1", "knowledge_ids": ["cg-00000002"]}


async def test_a_remote_cores_answer_is_kept_for_the_ttl(
    fake_core: FakeCore, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    # Only the embedded core says when its catalogue changed: a remote one is asked again
    # when the TTL runs out (a change made there shows within it).
    fake_core.items = [remote_item(1)]
    proxy = await start_proxy(core_url=fake_core.url)  # type: ignore[attr-defined]
    headers = codex.headers(**{"x-team-id": "t9"})
    await post(proxy.url, codex.request(codex.session(2)), headers)
    fake_core.items = [remote_item(1), remote_item(2)]
    for _ in range(2):
        await post(proxy.url, codex.request(codex.session(2)), headers)
        assert ids(block_of(upstream)) == ["cg-00000001"]
    assert len(fake_core.calls) == 1


@pytest.mark.parametrize("mode", ["slow", "garbage"])
async def test_a_slow_or_broken_core_costs_one_call_per_ttl_and_no_block(
    mode: str, fake_core: FakeCore, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    fake_core.mode = mode  # type: ignore[assignment]
    fake_core.items = [remote_item(1)]
    proxy = await start_proxy(core_url=fake_core.url,  # type: ignore[attr-defined]
                              core_timeout_ms=200)
    raw = json.dumps(codex.request(codex.session(2))).encode()
    for _ in range(2):
        async with aiohttp.ClientSession() as s, s.post(
            proxy.url + "/v1/responses", data=raw, headers=codex.headers(**WHO)
        ) as r:
            assert r.status == 200
            await r.read()
        assert upstream.last.body == raw  # no block: exactly what the window alone sends
    assert len(fake_core.calls) == 1  # the second request did not ask (nor wait) again
    assert len(upstream.received) == 2


async def test_a_core_that_is_down_is_remembered_as_down(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(core_url=f"http://127.0.0.1:{free_port()}", core_timeout_ms=200)
    raw = json.dumps(codex.request(codex.session(2))).encode()
    for _ in range(3):
        async with aiohttp.ClientSession() as s, s.post(
            proxy.url + "/v1/responses", data=raw, headers=codex.headers(**WHO)
        ) as r:
            await r.read()
        assert upstream.last.body == raw
    async with aiohttp.ClientSession() as s, s.get(proxy.url + "/metrics") as r:
        metrics = await r.text()
    assert 'ctxproxy_degraded_total{source="knowledge"} 1.0' in metrics
    assert 'ctxproxy_knowledge_cache_total{result="negative_hit"} 2.0' in metrics
