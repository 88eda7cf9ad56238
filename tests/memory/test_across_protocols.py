"""One user's Codex, Claude Code and Chat Completions sessions share their memory scope: what
a session said in one protocol comes back in a session of the same user in another (and not
of another user)."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.conftest import ProxyFactory
from tests.fakes.anthropic import FakeAnthropic, system_text
from tests.fakes.chat import ChatSession
from tests.fakes.claude_code import ClaudeSession
from tests.fakes.upstream import FakeUpstream
from tests.memory.conftest import Backend
from tests.memory.session import Session, settle

PREFERENCE = "Use Python, not Node, for the build scripts."
OWNER = {"x-team-id": "team-m", "x-agent-id": "agent-m", "x-tdai-user-key": "uk-owner"}


def memory_of(body: dict[str, Any]) -> str:
    """The text of a Messages body's system and messages, where memory goes."""
    texts = [system_text(body)]
    for message in body["messages"]:
        content = message["content"]
        texts.extend([content] if isinstance(content, str) else
                     [b.get("text", "") for b in content if isinstance(b, dict)])
    return "\n".join(texts)


async def test_a_codex_sessions_memory_is_recalled_in_a_claude_code_session_of_its_user(
    backend: Backend, upstream: FakeUpstream, anthropic: FakeAnthropic,
    start_proxy: ProxyFactory,
) -> None:
    proxy = await start_proxy(**backend.settings, anthropic_url=anthropic.url)
    for n in (1, 2):  # said in two sessions: distillation keeps it as a preference
        codex = Session(proxy, upstream, session_id=f"codex-{n}", headers=OWNER)
        await codex.say(PREFERENCE)
        await codex.say("Now add a lint step.")
    await settle(proxy)

    same = await ClaudeSession(proxy, anthropic, extra_headers=OWNER).say(
        "Write a release script.")
    other = await ClaudeSession(proxy, anthropic, extra_headers={
        **OWNER, "x-tdai-user-key": "uk-someone-else"}).say("Write a release script.")

    assert re.search(r'<memory id="mem_[0-9a-z]{26}" source="[^"]*">Use Python, not Node',
                     memory_of(same)), memory_of(same)[-2000:]
    assert "Use Python, not Node" not in memory_of(other)


def chat_memory_of(body: dict[str, Any]) -> str:
    """The text of a Chat body's messages, where memory goes (its system message included)."""
    return "\n".join(m["content"] if isinstance(m.get("content"), str) else json.dumps(
        m.get("content")) for m in body["messages"])


async def test_a_codex_sessions_memory_is_recalled_in_a_chat_session_of_its_user(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
) -> None:
    proxy = await start_proxy(**backend.settings)
    for n in (1, 2):
        codex = Session(proxy, upstream, session_id=f"codex-{n}", headers=OWNER)
        await codex.say(PREFERENCE)
        await codex.say("Now add a lint step.")
    await settle(proxy)

    same = await ChatSession(proxy, upstream.received, extra_headers=OWNER).say(
        "Write a release script.")
    other = await ChatSession(proxy, upstream.received, extra_headers={
        **OWNER, "x-tdai-user-key": "uk-someone-else"}).say("Write a release script.")

    assert re.search(r'<memory id="mem_[0-9a-z]{26}"[^>]*>Use Python, not Node',
                     chat_memory_of(same)), chat_memory_of(same)[-2000:]
    assert "Use Python, not Node" not in chat_memory_of(other)
    assert same["messages"][-1] == {"role": "user", "content": "Write a release script."}


async def test_a_chat_sessions_words_are_remembered_for_a_codex_session_of_its_user(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
) -> None:
    proxy = await start_proxy(**backend.settings)
    for n in (1, 2):
        said = ChatSession(proxy, upstream.received, session_id=f"chat-{n}",
                           extra_headers=OWNER)
        await said.say(PREFERENCE)
        await said.say("Now add a lint step.")
    await settle(proxy)

    sent = await Session(proxy, upstream, session_id="codex-after", headers=OWNER).say(
        "Write a release script.")
    assert "Use Python, not Node" in sent.get("instructions", "") + json.dumps(sent["input"])
