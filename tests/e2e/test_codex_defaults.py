"""The real Codex CLI through ctxproxy as installed: the cost window, its digest, masking,
knowledge and memory with their defaults. The same thread as test_codex.py, asserting what
must hold whatever the policy decides."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
from lxml import etree

from ctxproxy.config import load_settings
from ctxproxy.proxy.assemble import build_app
from ctxproxy.request import is_turn_start, message_text
from tests.e2e.codex_cli import CodexCLI, codex_binary
from tests.e2e.test_codex import IDENTITY, KEEP_TURNS, PROMPTS, bind_wiki, real_prompts
from tests.fakes.server import free_port, serve
from tests.fakes.upstream import FakeUpstream, Received

pytestmark = pytest.mark.codex


@dataclass
class Thread:
    requests: list[Received]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def thread(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Thread]:
    binary = codex_binary()
    root = tmp_path_factory.mktemp("codex-defaults")
    await bind_wiki(root, root / "data")
    upstream = FakeUpstream()
    up = await serve(upstream.app())
    port = free_port()
    settings = load_settings(env={}, upstream_url=up.url + "/v1", data_dir=root / "data",
                             port=port, upstream_read_timeout_s=30)
    proxy = await serve(build_app(settings), port=port)
    codex = CodexCLI(binary, root, proxy.url + "/v1", IDENTITY)
    try:
        for prompt in PROMPTS:
            run = await codex.turn(prompt)
            assert run.returncode == 0, run.describe()
        yield Thread([r for r in upstream.received if r.path.endswith("/responses")])
    finally:
        await proxy.close()
        await up.close()


def test_every_turn_is_forwarded_with_its_newest_prompt_and_at_most_keep_turns(
    thread: Thread,
) -> None:
    newest = [real_prompts(r.json)[-1] for r in thread.requests]
    assert list(dict.fromkeys(newest)) == PROMPTS
    assert all(len(real_prompts(r.json)) <= KEEP_TURNS for r in thread.requests)


def test_between_cuts_each_request_extends_the_one_before(thread: Thread) -> None:
    cuts = 0
    for before, after in zip(thread.requests, thread.requests[1:], strict=False):
        a, b = before.json["input"], after.json["input"]
        if b[: len(a)] == a:
            continue
        # Not an extension: the window moved, at a new turn, and only forward.
        cuts += 1
        assert real_prompts(after.json)[-1] != real_prompts(before.json)[-1]
        assert PROMPTS.index(real_prompts(after.json)[0]) >= PROMPTS.index(
            real_prompts(before.json)[0])
    assert 1 <= cuts < len(PROMPTS)  # nine turns cannot all fit in KEEP_TURNS


def test_what_the_proxy_adds_to_the_input_is_well_formed(thread: Thread) -> None:
    for r in thread.requests:
        for item in r.json["input"]:
            text = message_text(item)
            if item.get("role") == "developer" and text.startswith("<earlier_turns"):
                root = etree.fromstring(text.encode())
                assert [t.tag for t in root] in (["turn"], ["turn", "seen"])
                assert not any(is_turn_start(i) for i in [item])
    json.dumps([r.json for r in thread.requests])  # every body was valid JSON
