"""Where memory goes in a Claude Code (Anthropic Messages) request: the cut digest and the
standing memory in one block at the end of ``system`` (pinned until the next cut, after the
client's system and the knowledge block), each turn's recall a user message before its prompt,
and the cache marks placed around them."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.conftest import ProxyFactory
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.claude_code import MARK, ClaudeSession, marks
from tests.fakes.upstream import FakeUpstream
from tests.memory.conftest import Backend
from tests.memory.session import Session, settle

PREFERENCE = "Use Python, not Node, for the build scripts."
FACT = "The staging database lives on host db-seven in rack twelve."
OWNER = {"x-team-id": "team-p", "x-agent-id": "agent-p", "x-tdai-user-key": "uk-placement"}


def messages_text(body: dict[str, Any]) -> str:
    return json.dumps(body["messages"])


async def test_digest_and_standing_memory_share_one_block_at_the_end_of_system(
    backend: Backend, upstream: FakeUpstream, anthropic: FakeAnthropic,
    start_proxy: ProxyFactory,
) -> None:
    proxy = await start_proxy(**backend.settings, anthropic_url=anthropic.url, keep_turns=2,
                              window_policy="fixed", trim_slack=0)
    for n in (1, 2):  # said in two sessions: distillation keeps it as a standing preference
        codex = Session(proxy, upstream, session_id=f"codex-{n}", headers=OWNER)
        await codex.say(PREFERENCE)
        await codex.say("Now add a lint step.")
    await settle(proxy)

    claude = ClaudeSession(proxy, anthropic, extra_headers=OWNER)
    first = await claude.say("Write a release script.")
    # No cut yet: the standing block alone is the last block of system, marked.
    assert "<semantic_memory" in first["system"][-1]["text"]
    assert "<earlier_turns" not in first["system"][-1]["text"]
    assert "<semantic_memory" not in messages_text(first)
    assert first["system"][-1]["cache_control"] == MARK

    await claude.say(FACT)
    await settle(proxy)
    for prompt in ("Add a changelog entry.", "Bump the version."):
        await claude.say(prompt)
    last = await claude.say("Which host is the staging database on?")

    block = last["system"][-1]
    # One block: the digest of the cut turns, then the standing memory.
    assert block["text"].startswith("<earlier_turns")
    assert block["text"].index("<earlier_turns") < block["text"].index("<semantic_memory")
    assert [b["text"].count("<semantic_memory") for b in last["system"]].count(1) == 1
    assert "<earlier_turns" not in messages_text(last)
    assert "<semantic_memory" not in messages_text(last)
    # The turn's recall stays a user message, right before its prompt.
    recall = last["messages"][-2]
    assert recall["role"] == "user" and "db-seven" in json.dumps(recall)
    assert "<episodic_memory" in json.dumps(recall)
    # Marks: after the pinned block and at the end of the stable context before it, and the
    # client's newest; never more than four, none on an empty block.
    assert block["cache_control"] == MARK
    assert last["system"][-2]["cache_control"] == MARK
    assert "cache_control" in last["messages"][-1]["content"][-1]
    found = marks(last)
    assert len(found) <= 4
    assert all(b.get("text", "x") for _, b in found)
    # explain --last reads it so: the recall is an item added (no turn), the digest and the
    # standing memory text added to system.
    async with aiohttp.ClientSession() as http, http.get(
            proxy.url + "/ctxproxy/explain/last", params={"session": claude.session_id}) as r:
        report = await r.json()
    assert report["turns_forwarded"] == 2
    assert [a["item"].split(":")[0] for a in report["items_added"]] == ["message/user"]
    assert "episodic_memory" in report["items_added"][0]["item"]
    assert {"earlier_turns", "semantic_memory"} <= set(report["instructions_added"]["blocks"])
