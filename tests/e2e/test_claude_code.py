"""The real Claude Code CLI through ctxproxy to the fake Anthropic upstream, for a whole
multi-turn session with Bash tool calls.

One session is driven once per module: a wiki is bound to the agent, the proxy starts, and
Claude Code runs ``PROMPTS``, one ``claude -p`` each (``--continue`` after the first). Each test
asserts one behaviour on what the upstream received or what Claude Code printed.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

from ctxproxy.config import load_settings
from ctxproxy.proxy.assemble import build_app
from tests.e2e.claude_cli import ClaudeCLI, claude_binary
from tests.e2e.test_codex import AGENT, IDENTITY, USER_KEY, bind_wiki
from tests.fakes.anthropic import FakeAnthropic, system_text
from tests.fakes.claude_code import marks, user_words
from tests.fakes.server import Running, free_port, serve
from tests.fakes.upstream import FakeUpstream, Received

pytestmark = pytest.mark.claude

KEEP_TURNS = 4
FACT = "Our deploy window opens at 06:15 UTC on Thursdays."
PROMPTS = [
    f"Please remember this for later: {FACT}",
    "[tool] check the working tree",
    "[wiki] access tokens rotate",
    "What does the build script do?",
    "[tool] list the files",
    "Which tests are slow?",
    "Summarise the README in one line.",
    "[tool] run the tests, then remind me when the deploy window opens",
]


@dataclass
class Session:
    claude: ClaudeCLI
    upstream: FakeAnthropic
    proxy: Running

    @property
    def requests(self) -> list[Received]:
        """The model calls of the session (Claude Code's side calls left out: they carry no
        tools)."""
        return [r for r in self.upstream.messages if r.json.get("tools")]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def session(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Session]:
    binary = claude_binary()
    root = tmp_path_factory.mktemp("claude-e2e")
    await bind_wiki(root, root / "data")
    anthropic = FakeAnthropic()
    openai = FakeUpstream()
    up_a, up_o = await serve(anthropic.app()), await serve(openai.app())
    port = free_port()
    settings = load_settings(
        env={}, upstream_url=up_o.url + "/v1", anthropic_url=up_a.url, data_dir=root / "data",
        port=port, keep_turns=KEEP_TURNS, window_policy="fixed", trim_slack=0,
        mask_tool_outputs=False, upstream_read_timeout_s=30, stats_process=False,
        memory_process=False, memory_timeout_ms=10_000,
    )
    proxy = await serve(build_app(settings), port=port)
    claude = ClaudeCLI(binary, root, proxy.url, IDENTITY)
    try:
        for prompt in PROMPTS:
            run = await claude.turn(prompt)
            assert run.returncode == 0, run.describe()
        yield Session(claude, anthropic, proxy)
    finally:
        await proxy.close()
        await up_a.close()
        await up_o.close()


def prompts(body: dict[str, Any]) -> list[str]:
    """The real prompts (what the proxy adds as user text, its digest and memory, left out)."""
    return [w for w in user_words(body) if w.strip() and not w.startswith("<")]


def results(body: dict[str, Any]) -> list[str]:
    return [json.dumps(b.get("content")) for m in body["messages"]
            if isinstance(m["content"], list) for b in m["content"]
            if b.get("type") == "tool_result"]


def test_every_turn_ends_with_the_fake_models_answer(session: Session) -> None:
    answers = [run.result["result"] for run in session.claude.runs]
    assert len(answers) == len(PROMPTS)
    assert all(a.startswith(("FAKE-ANSWER", "FAKE-DONE")) for a in answers), answers


def test_claude_code_runs_the_knowledge_blocks_curl_through_its_bash_tool(
    session: Session,
) -> None:
    # The upstream asked Bash to run the block's curl; its output came back as a tool_result.
    asked = [r.json for r in session.requests if "[wiki]" in prompts(r.json)[-1]]
    assert "<knowledge_tools>" in system_text(asked[0])
    answered = [t for r in session.requests for t in results(r.json)]
    assert any("every hour at the gateway" in t for t in answered), answered


def test_each_request_forwards_only_the_last_turns(session: Session) -> None:
    for r in session.requests:
        assert len(prompts(r.json)) <= KEEP_TURNS, prompts(r.json)
    last = session.requests[-1].json
    assert prompts(last) == PROMPTS[-KEEP_TURNS:]
    # Claude Code's context stays: its first reminder and its system-role message.
    assert "<system-reminder>" in json.dumps(last["messages"][0])
    assert any(m["role"] == "system" for m in last["messages"])


def test_every_request_carries_the_knowledge_block_in_system(session: Session) -> None:
    for r in session.requests:
        assert system_text(r.json).count("<knowledge_tools>") == 1


def test_the_last_turn_recalls_the_fact_from_turn_one(session: Session) -> None:
    last = session.requests[-1].json
    outside = json.dumps(last["messages"]) + system_text(last)
    assert "06:15 UTC" not in json.dumps(prompts(last))  # turn 1 was cut...
    assert re.search(r"<memory\b[^>]*>[^<]*06:15 UTC", outside), outside[-3000:]  # ...recalled


def test_the_cut_digest_ends_system_marked_and_stays_out_of_the_messages(
    session: Session,
) -> None:
    last = session.requests[-1].json
    assert last["system"][-1]["text"].startswith("<earlier_turns")
    assert "cache_control" in last["system"][-1] and "cache_control" in last["system"][-2]
    assert "<earlier_turns" not in json.dumps(last["messages"])


def test_tool_uses_and_results_are_never_split_and_marks_stay_valid(session: Session) -> None:
    for r in session.requests:
        messages = r.json["messages"]
        for n, m in enumerate(messages):
            content = m["content"] if isinstance(m["content"], list) else []
            for b in content:
                if b.get("type") == "tool_result":
                    prior = messages[n - 1]["content"]
                    assert b["tool_use_id"] in {x.get("id") for x in prior}
        found = marks(r.json)
        assert len(found) <= 4
        assert all(b.get("text", "x") for _, b in found)


def test_the_session_and_identity_reach_the_upstream_but_the_user_key_does_not(
    session: Session,
) -> None:
    for r in session.requests:
        sent = {k.lower(): v for k, v in r.headers.items()}
        assert sent["x-agent-id"] == AGENT
        assert "x-tdai-user-key" not in sent and USER_KEY not in r.body.decode()
        assert sent["x-claude-code-session-id"]
