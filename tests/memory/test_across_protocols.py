"""One user's Codex and Claude Code sessions share their memory scope: what a Codex session
said comes back in a Claude Code session of the same user (and not of another)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.conftest import ProxyFactory
from tests.fakes.anthropic import FakeAnthropic, system_text
from tests.fakes.claude_code import ClaudeSession
from tests.fakes.server import serve
from tests.fakes.upstream import FakeUpstream
from tests.memory.conftest import Backend
from tests.memory.session import Session, settle

PREFERENCE = "Use Python, not Node, for the build scripts."
OWNER = {"x-team-id": "team-m", "x-agent-id": "agent-m", "x-tdai-user-key": "uk-owner"}


@pytest.fixture
async def anthropic() -> AsyncIterator[FakeAnthropic]:
    fake = FakeAnthropic()
    running = await serve(fake.app())
    fake.url = running.url
    yield fake
    await running.close()


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
