"""The real Codex CLI through ctxproxy to the fake upstream, for a whole multi-turn thread.

One thread is driven once per module (Codex costs about half a second a turn): a wiki is
added and bound to the agent with the ``ctxproxy knowledge`` commands, the proxy starts, and
Codex runs ``PROMPTS`` as one ``exec`` and then ``exec resume --last`` per turn. Each test
then asserts one behaviour on what the upstream received or what Codex printed.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from ctxproxy.config import load_settings
from ctxproxy.proxy.app import PIPELINE
from ctxproxy.proxy.assemble import build_app
from ctxproxy.request import is_turn_start, message_text
from tests.e2e.codex_cli import CodexCLI, codex_binary
from tests.fakes.server import Running, free_port, serve
from tests.fakes.upstream import FakeUpstream, Received

pytestmark = pytest.mark.codex

KEEP_TURNS = 5
TEAM, AGENT = "team-e2e", "agent-e2e"
USER_KEY = "uk-e2e-never-forwarded"
IDENTITY = {"x-team-id": TEAM, "x-agent-id": AGENT, "x-tdai-user-key": USER_KEY}
WIKI_NAME = "E2E handbook"
WIKI_PAGES = {
    "auth.md": "# Authentication\n\nAccess tokens rotate every hour at the gateway.\n",
    "release.md": "# Releases\n\nWe cut a release branch every second Tuesday.\n",
}
FACT = "Our release codename is PLUM-42."
PROMPTS = [
    f"Please remember this for later: {FACT}",
    "[tool] check the working tree",
    "[wiki] access tokens rotate",
    "[tool] list the files",
    "What does the build script do?",
    "[tool] run the linter",
    "Summarise the README in one line.",
    "Which tests are slow?",
    "[tool] run the tests once more, then remind me of our release codename",
]
COMMAND_TURNS = [p for p in PROMPTS if p.startswith(("[tool]", "[wiki]"))]


@dataclass
class Thread:
    """What one Codex thread through the proxy left behind."""

    codex: CodexCLI
    upstream: FakeUpstream
    proxy: Running
    wiki_id: str

    @property
    def requests(self) -> list[Received]:
        return [r for r in self.upstream.received if r.path.endswith("/responses")]

    def has_step(self, name: str) -> bool:
        return any(step.name == name for step in self.proxy.app[PIPELINE].steps)


async def ctxproxy(data_dir: Path, *argv: str) -> str:
    """Run the ``ctxproxy`` command line (``python -m ctxproxy.proxy``); return what it printed."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ctxproxy.proxy", *argv, env={"CTXPROXY_DATA_DIR": str(data_dir)},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, (argv, out, err)
    return out.decode()


async def bind_wiki(root: Path, data_dir: Path) -> str:
    folder = root / "wiki"
    for name, text in WIKI_PAGES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    printed = await ctxproxy(data_dir, "knowledge", "add-wiki", "--team", TEAM,
                             "--name", WIKI_NAME, "--summary", "How we work", str(folder))
    wiki_id = printed.split()[0]
    await ctxproxy(data_dir, "knowledge", "bind", "--agent", AGENT, "--user-key", USER_KEY,
                   wiki_id)
    return wiki_id


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def thread(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Thread]:
    binary = codex_binary()
    root = tmp_path_factory.mktemp("codex-e2e")
    wiki_id = await bind_wiki(root, root / "data")
    upstream = FakeUpstream()
    up = await serve(upstream.app())
    port = free_port()
    settings = load_settings(
        env={}, upstream_url=up.url + "/v1", data_dir=root / "data", port=port,
        keep_turns=KEEP_TURNS, window_policy="fixed", trim_slack=0, mask_tool_outputs=False,
        upstream_read_timeout_s=30,
    )
    proxy = await serve(build_app(settings), port=port)
    codex = CodexCLI(binary, root, proxy.url + "/v1", IDENTITY)
    try:
        for prompt in PROMPTS:
            run = await codex.turn(prompt)
            assert run.returncode == 0, run.describe()
        yield Thread(codex, upstream, proxy, wiki_id)
    finally:
        await proxy.close()
        await up.close()


def real_prompts(body: dict[str, Any]) -> list[str]:
    return [message_text(i) for i in body["input"] if is_turn_start(i)]


def context_prefix(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The items before the first prompt, but for what the proxy puts there: the digest of
    cut turns, the standing memory block."""
    items: list[dict[str, Any]] = body["input"]
    first = next(n for n, item in enumerate(items) if is_turn_start(item))
    added = ("<earlier_turns", "<working_memory", "<semantic_memory")
    return [i for i in items[:first] if not message_text(i).startswith(added)]


def call_ids(body: dict[str, Any], kind: str = "function_call") -> list[str]:
    return [i["call_id"] for i in body["input"] if i.get("type") == kind]


def knowledge_block(body: dict[str, Any]) -> str:
    """The one ``<knowledge_tools>`` block in ``instructions``."""
    instructions = body.get("instructions")
    assert isinstance(instructions, str)
    assert instructions.count("<knowledge_tools>") == instructions.count("</knowledge_tools>") == 1
    start = instructions.index("<knowledge_tools>")
    return instructions[start:instructions.index("</knowledge_tools>", start)]


def test_codex_exits_0_with_the_fake_models_final_answer(thread: Thread) -> None:
    assert len(thread.codex.runs) == len(PROMPTS) >= 8
    assert all(run.returncode == 0 for run in thread.codex.runs)
    last = thread.codex.runs[-1]
    answers = [m["text"] for m in last.items("agent_message")]
    assert answers, last.describe()
    assert answers[-1].startswith("FAKE-DONE: the command ran.")
    assert PROMPTS[-1][:60] in answers[-1]
    assert any(e.get("type") == "turn.completed" for e in last.events)


def test_codex_runs_the_command_the_fake_model_asks_for(thread: Thread) -> None:
    tool_turns = [run for run in thread.codex.runs if run.prompt.startswith("[tool]")]
    assert len(tool_turns) == 4
    for run in tool_turns:
        commands = run.items("command_execution")
        assert [c["exit_code"] for c in commands] == [0], run.describe()
        assert "fake-tool-ran" in commands[0]["aggregated_output"]
    # ...and what it ran went back to the model through the proxy.
    outputs = [str(i["output"]) for r in thread.requests for i in r.json["input"]
               if i.get("type") == "function_call_output"]
    assert any("fake-tool-ran" in out for out in outputs)
    last_items = thread.requests[-1].json["input"]
    assert last_items[-1]["type"] == "function_call_output"
    assert "fake-tool-ran" in str(last_items[-1]["output"])


def test_each_request_forwards_only_the_last_turns(thread: Thread) -> None:
    # A turn with a command makes two requests, any other turn one.
    assert len(thread.requests) == len(PROMPTS) + len(COMMAND_TURNS)
    seen: list[str] = []
    for req in thread.requests:
        prompts = real_prompts(req.json)
        if prompts[-1] not in seen:
            seen.append(prompts[-1])
        assert prompts == seen[-KEEP_TURNS:]
    assert seen == PROMPTS


def test_last_turn_forwards_the_context_and_the_last_five_turns(thread: Thread) -> None:
    first, last = thread.requests[0].json, thread.requests[-1].json
    assert real_prompts(last) == PROMPTS[-KEEP_TURNS:]
    context = context_prefix(first)
    assert any(i.get("role") == "developer" for i in context)
    assert any("<environment_context>" in message_text(i) for i in context)
    assert context_prefix(last) == context
    # The cut turns' calls and outputs are gone too.
    early = {c for r in thread.requests[:4] for c in call_ids(r.json)}
    assert early and not early & set(call_ids(last) + call_ids(last, "function_call_output"))


def test_no_call_is_forwarded_without_its_output_or_the_reverse(thread: Thread) -> None:
    for req in thread.requests:
        assert call_ids(req.json) == call_ids(req.json, "function_call_output"), req.json
    assert call_ids(thread.requests[-1].json)


def test_identity_reaches_the_upstream_but_the_user_key_does_not(thread: Thread) -> None:
    for req in thread.requests:
        headers = {k.lower(): v for k, v in req.headers.items()}
        assert "x-tdai-user-key" not in headers
        assert USER_KEY not in json.dumps(headers)
        assert USER_KEY.encode() not in req.body
        assert headers["x-team-id"] == TEAM
        assert headers["x-agent-id"] == AGENT
        assert headers["authorization"] == "Bearer sk-e2e-client"
        assert headers["session-id"] == req.json["prompt_cache_key"]
    assert len({r.headers["session-id"] for r in thread.requests}) == 1


def test_every_request_carries_the_bound_wikis_knowledge_block(thread: Thread) -> None:
    if not thread.has_step("knowledge"):
        pytest.skip("knowledge/wiring.py returns no pipeline step yet")
    blocks = [knowledge_block(r.json) for r in thread.requests]
    # The same bytes every request until the window's first cut, and from it on the same
    # bytes again with the chat memory listed (only then is any of it out of view).
    changes = [n for n in range(1, len(blocks)) if blocks[n] != blocks[n - 1]]
    assert len(changes) == 1, changes
    before, after = blocks[changes[0] - 1], blocks[changes[0]]
    cut = changes[0]
    assert "chat_memory-" not in before and "chat_memory-" in after
    earlier, now = thread.requests[cut - 1].json["input"], thread.requests[cut].json["input"]
    assert now[: len(earlier)] != earlier  # the window cut here: the history did not extend
    block = after
    assert f'id="{thread.wiki_id}"' in block and f'id="{thread.wiki_id}"' in before
    assert f'name="{WIKI_NAME}"' in block
    assert "/tools/list" in block and "/tools/call" in block


def test_codex_queries_the_wiki_with_the_blocks_command(thread: Thread) -> None:
    if not thread.has_step("knowledge"):
        pytest.skip("knowledge/wiring.py returns no pipeline step yet")
    run = next(r for r in thread.codex.runs if r.prompt.startswith("[wiki]"))
    commands = run.items("command_execution")
    assert [c["exit_code"] for c in commands] == [0], run.describe()
    assert "/tools/call" in commands[0]["command"]
    # The knowledge service on the proxy's port answered, and the answer reached the model.
    answer = commands[0]["aggregated_output"]
    assert '"code":0' in answer.replace(" ", "")
    assert "every hour at the gateway" in answer  # from auth.md (search marks the query words)
    outputs = [str(i["output"]) for r in thread.requests for i in r.json["input"]
               if i.get("type") == "function_call_output"]
    assert any("every hour at the gateway" in out for out in outputs)


def test_last_turn_recalls_the_fact_from_turn_one(thread: Thread) -> None:
    if not thread.has_step("memory"):
        pytest.skip("memory/wiring.py returns no pipeline step yet: no recall to assert on")
    last = thread.requests[-1].json
    assert PROMPTS[0] not in real_prompts(last)  # turn 1 itself was cut by the window...
    # ...and what it said comes back as a <memory> element (in instructions or the input).
    forwarded = str(last.get("instructions", "")) + "".join(
        message_text(i) for i in last["input"] if isinstance(i, dict))
    assert re.search(r"<memory\b[^>]*>[^<]*PLUM-42", forwarded), forwarded[-3000:]
