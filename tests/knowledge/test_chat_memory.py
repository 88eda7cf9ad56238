"""The chat-memory asset: listed in <knowledge_tools> when memory is on, its curl lines answered
by the proxy from the caller's own memory scope, never another's."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from lxml import etree

from tests.conftest import ProxyFactory
from tests.fakes.server import Running
from tests.fakes.upstream import FakeUpstream
from tests.knowledge.fake_core import FakeCore
from tests.knowledge.test_code_graph import add_code, write_repo
from tests.knowledge.test_discovery_e2e import block_of, fake_core, ids, remote_item, run_curl
from tests.knowledge.wikis import add_wiki, ctxproxy, write_wiki
from tests.memory.session import Session, settle

Capsys = pytest.CaptureFixture[str]
WHO = {"x-team-id": "team-1", "x-agent-id": "coder", "x-tdai-user-key": "uk-alice"}
__all__ = ["fake_core"]  # the fixture, imported for these tests too

FACT = "The staging database answers on port 6543 behind the bastion host."


def chat_memory(block: etree._Element | None) -> etree._Element:
    assert block is not None
    found = [el for el in block.findall("knowledge") if el.get("type") == "chat-memory"]
    assert len(found) == 1
    return found[0]


def with_call(line: str, tool: str, params: dict[str, Any]) -> str:
    """The block's call_tool line with another tool and params (what the model edits)."""
    argv = shlex.split(line)
    payload = json.loads(argv[-1])
    argv[-1] = json.dumps({**payload, "tool_name": tool, "params": params})
    return " ".join(shlex.quote(a) for a in argv)


async def past_a_cut(s: Session, turns: int = 6) -> None:
    """Enough turns that the window has cut (it keeps 5): the chat memory is listed from the
    session's first cut on, when some of it is out of view."""
    for n in range(turns):
        await s.say(f"Small step {n} of the chore.")


async def session_with_fact(proxy: Running, upstream: FakeUpstream, who: dict[str, str],
                            session_id: str) -> Session:
    s = Session(proxy, upstream, session_id=session_id, headers=who)
    await s.say(f"Note for later: {FACT}")
    for n in range(7):
        await s.say(f"Step {n}: refactor the parser module, part {n}.")
    await settle(proxy)
    return s


@pytest.fixture
async def proxy(start_proxy: ProxyFactory) -> Running:
    return await start_proxy(chat_memory_asset=True)


async def test_the_asset_is_listed_last_and_its_tools_answer_from_memory(
    proxy: Running, upstream: FakeUpstream
) -> None:
    s = await session_with_fact(proxy, upstream, WHO, "sess-a")
    await s.say("What port does staging use?")
    block = block_of(upstream)
    asset = chat_memory(block)
    assert asset.get("id") == "chat_memory-team-1-coder"
    assert ids(block)[-1] == "chat_memory-team-1-coder"
    listed = await run_curl(asset.findtext("list_tools") or "")
    assert listed["code"] == 0
    assert {t["name"] for t in listed["data"]["tools"]} == {"search", "read", "recent"}

    call = asset.findtext("call_tool") or ""
    found = await run_curl(with_call(call, "search", {"query": "staging database port"}))
    assert found["code"] == 0, found
    results = found["data"]["results"]
    assert any("6543" in r["snippet"] for r in results)

    memory_id = next(r["memory_id"] for r in results if "6543" in r["snippet"])
    read = await run_curl(with_call(call, "read", {"memory_id": memory_id}))
    assert read["code"] == 0 and FACT in read["data"]["text"]

    recent = await run_curl(with_call(call, "recent", {"limit": 3}))
    assert recent["code"] == 0
    assert len(recent["data"]["results"]) == 3
    assert all(r["session_id"] == "sess-a" for r in recent["data"]["results"])


async def test_the_block_is_the_same_bytes_across_a_session(
    proxy: Running, upstream: FakeUpstream
) -> None:
    s = Session(proxy, upstream, session_id="sess-b", headers=WHO)
    await s.say("turn 0")
    early = block_of(upstream)  # nothing is out of view yet: not listed
    assert early is None or "chat_memory-" not in etree.tostring(early).decode()
    await past_a_cut(s)
    blocks = []
    for n in range(3):
        await s.say(f"turn {n}")
        block = block_of(upstream)
        assert block is not None
        blocks.append(etree.tostring(chat_memory(block)))
    assert len(set(blocks)) == 1


async def test_not_listed_before_the_sessions_first_cut(
    proxy: Running, upstream: FakeUpstream
) -> None:
    s = Session(proxy, upstream, session_id="sess-early", headers=WHO)
    for n in range(5):
        await s.say(f"turn {n}")
        assert block_of(upstream) is None  # no other asset, and the chat memory not yet
    await s.say("turn 5")  # the sixth: the window cuts the first
    chat_memory(block_of(upstream))


async def test_another_users_capability_never_reads_this_users_memory(
    proxy: Running, upstream: FakeUpstream
) -> None:
    alice = await session_with_fact(proxy, upstream, WHO, "sess-alice")
    await alice.say("and the port?")
    alice_call = chat_memory(block_of(upstream)).findtext("call_tool") or ""
    found = await run_curl(with_call(alice_call, "search", {"query": "staging port"}))
    memory_id = next(r["memory_id"] for r in found["data"]["results"] if "6543" in r["snippet"])

    bob = Session(proxy, upstream, session_id="sess-bob", headers={**WHO,
                                                                   "x-tdai-user-key": "uk-bob"})
    await past_a_cut(bob)
    await bob.say("What port does staging use?")
    bob_call = chat_memory(block_of(upstream)).findtext("call_tool") or ""
    # The same asset id, but Bob's capability grants Bob's scope: Alice's memory is not there.
    assert json.loads(shlex.split(bob_call)[-1])["knowledge_id"] == "chat_memory-team-1-coder"
    found = await run_curl(with_call(bob_call, "search", {"query": "staging port"}))
    assert found["code"] == 0 and not any("6543" in r["snippet"]
                                          for r in found["data"]["results"])
    read = await run_curl(with_call(bob_call, "read", {"memory_id": memory_id}))
    assert read["code"] == 404

    # Bob's token presented for another team's asset id is refused.
    argv = shlex.split(bob_call)
    argv[-1] = json.dumps({"knowledge_id": "chat_memory-team-2-coder", "tool_name": "recent",
                           "params": {}})
    refused = await run_curl(" ".join(shlex.quote(a) for a in argv))
    assert refused["code"] == 403


async def test_no_capability_no_answer_and_bad_calls_are_clear(
    proxy: Running, upstream: FakeUpstream
) -> None:
    s = Session(proxy, upstream, session_id="sess-c", headers=WHO)
    await past_a_cut(s)
    call = chat_memory(block_of(upstream)).findtext("call_tool") or ""
    argv = [a for a in shlex.split(call)]
    at = next(i for i, a in enumerate(argv) if a.startswith("x-ctxproxy-capability"))
    del argv[at - 1 : at + 1]
    assert (await run_curl(" ".join(shlex.quote(a) for a in argv)))["code"] == 401
    assert (await run_curl(with_call(call, "nope", {})))["code"] == 404
    assert (await run_curl(with_call(call, "search", {})))["code"] == 400
    assert (await run_curl(with_call(call, "recent", {"limit": 0})))["code"] == 400


async def test_not_listed_with_memory_off(
    start_proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    proxy = await start_proxy(chat_memory_asset=True, memory_enabled=False)
    async with aiohttp.ClientSession() as http, http.post(
        proxy.url + "/v1/responses", json={"model": "m", "input": "hi", "stream": True},
        headers=WHO,
    ) as r:
        await r.read()
    assert "chat_memory-" not in (upstream.last.json.get("instructions") or "")


async def test_with_a_remote_core_the_asset_is_served_here_beside_its_assets(
    fake_core: FakeCore, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    fake_core.items = [remote_item(1)]
    proxy = await start_proxy(chat_memory_asset=True, core_url=fake_core.url,  # type: ignore[attr-defined]
                              core_token="core-secret")
    s = await session_with_fact(proxy, upstream, {"x-team-id": "t9"}, "sess-r")
    await s.say("which port again?")
    block = block_of(upstream)
    assert ids(block) == ["cg-00000001", "chat_memory-t9-"]
    asset = chat_memory(block)
    assert (asset.get("service_url") or "").startswith(proxy.url)
    call = asset.findtext("call_tool") or ""
    found = await run_curl(with_call(call, "search", {"query": "staging database port"}))
    assert any("6543" in r["snippet"] for r in found["data"]["results"])
    assert "core-secret" not in call


def test_knowledge_list_shows_all_three_types(tmp_path: Path, capsys: Capsys) -> None:
    data = tmp_path / "data"
    wiki = add_wiki(capsys, data, write_wiki(tmp_path / "docs"))
    graph, _ = add_code(capsys, data, write_repo(tmp_path / "shop"))
    code, out, _ = ctxproxy(capsys, data, "knowledge", "list", "--team", "team-1")
    assert code == 0
    kinds = {line.split()[1] for line in out.splitlines() if line and not line[0].isspace()}
    assert kinds == {"wiki", "code-graph", "chat-memory"}
    assert wiki in out and graph in out and "chat_memory-team-1-<agent>" in out


async def test_read_gives_a_masked_output_whole_to_its_own_session(
    start_proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    from tests.window.test_masking_fetch import BIG, fetch_line, masked_outputs, session_items

    proxy = await start_proxy(chat_memory_asset=True, window_policy="fixed", keep_turns=2,
                              trim_slack=0, mask_tool_outputs=True)
    hdrs = {**WHO, "session_id": "sess-m", "x-codex-turn-metadata": "{}"}
    async with aiohttp.ClientSession() as http, http.post(
        proxy.url + "/v1/responses", json={"model": "m", "input": session_items(),
                                           "stream": True, "prompt_cache_key": "sess-m"},
        headers=hdrs,
    ) as r:
        await r.read()
    [masked] = masked_outputs(upstream)
    output_id = fetch_line(masked).rsplit("/", 1)[1].strip("'")
    call = chat_memory(block_of(upstream)).findtext("call_tool") or ""
    read = await run_curl(with_call(call, "read", {"output_id": output_id}))
    assert read["code"] == 0 and read["data"]["text"] == BIG
    # Another session (the line's conversation header changed) gets nothing.
    other = with_call(call, "read", {"output_id": output_id}).replace("sess-m", "sess-x")
    assert (await run_curl(other))["code"] == 404
    # Nor does another scope in the same session: another agent's grant names its own.
    async with aiohttp.ClientSession() as http, http.post(
        proxy.url + "/v1/responses", json={"model": "m", "input": session_items(),
                                           "stream": True, "prompt_cache_key": "sess-m"},
        headers={**hdrs, "x-agent-id": "reviewer"},
    ) as r:
        await r.read()
    call = chat_memory(block_of(upstream)).findtext("call_tool") or ""
    assert "reviewer" in call
    assert (await run_curl(with_call(call, "read", {"output_id": output_id})))["code"] == 404
