"""The real Codex CLI using the seed's other two asset types through ctxproxy: a code graph
indexed with ``ctxproxy knowledge add-code`` and bound to the agent, and the chat-memory asset
of its own scope. The fake model runs each asset's call_tool line from the block with the
tool and params its prompt names (``[asset TYPE TOOL] {params}``); Codex's shell runs it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from ctxproxy.config import load_settings
from ctxproxy.proxy.assemble import build_app
from tests.e2e.codex_cli import CodexCLI, Run, codex_binary
from tests.e2e.test_codex import ctxproxy
from tests.fakes.server import free_port, serve
from tests.fakes.upstream import FakeUpstream

pytestmark = pytest.mark.codex

TEAM, AGENT = "team-assets", "agent-assets"
IDENTITY = {"x-team-id": TEAM, "x-agent-id": AGENT, "x-tdai-user-key": "uk-assets-e2e"}
REPO = {
    "shop/config.py": 'def parse_config(path):\n    """Read the shop\'s settings file."""\n'
                      "    return open(path).read()\n",
    "shop/app.py": "from shop.config import parse_config\n\n\ndef main():\n"
                   "    return parse_config('shop.toml')\n",
}
PROMPTS = [
    "Remember for later: the staging database answers on port 6543 behind the bastion.",
    "Summarise where we are in one line.",
    '[asset code-graph search_symbols] {"query": "parse_config"}',
    '[asset code-graph get_definition] {"name": "parse_config"}',
    "Summarise it again, shorter.",
    # The sixth turn: the window cuts the first (it keeps 5), so the chat memory is listed.
    '[asset chat-memory search] {"query": "staging database port"}',
]


@dataclass
class Thread:
    runs: list[Run]

    def answer(self, prompt_start: str) -> dict[str, object]:
        """The JSON the command of the turn starting with ``prompt_start`` printed."""
        run = next(r for r in self.runs if r.prompt.startswith(prompt_start))
        commands = run.items("command_execution")
        assert [c["exit_code"] for c in commands] == [0], run.describe()
        answer: dict[str, object] = json.loads(commands[0]["aggregated_output"])
        return answer


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def thread(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Thread]:
    binary = codex_binary()
    root = tmp_path_factory.mktemp("codex-assets")
    repo = root / "repo"
    for name, text in REPO.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    data = root / "data"
    graph = (await ctxproxy(data, "knowledge", "add-code", "--team", TEAM, "--name", "Shop",
                            str(repo))).split()[0]
    await ctxproxy(data, "knowledge", "bind", "--agent", AGENT, "--user-key",
                   IDENTITY["x-tdai-user-key"], graph)
    upstream = FakeUpstream()
    up = await serve(upstream.app())
    port = free_port()
    settings = load_settings(env={}, upstream_url=up.url + "/v1", data_dir=data, port=port,
                             upstream_read_timeout_s=30)
    proxy = await serve(build_app(settings), port=port)
    codex = CodexCLI(binary, root, proxy.url + "/v1", IDENTITY)
    runs = []
    try:
        for prompt in PROMPTS:
            run = await codex.turn(prompt)
            assert run.returncode == 0, run.describe()
            runs.append(run)
        yield Thread(runs)
    finally:
        await proxy.close()
        await up.close()


def test_codex_searches_the_code_graph(thread: Thread) -> None:
    answer = thread.answer("[asset code-graph search_symbols]")
    assert answer["code"] == 0, answer
    assert "parse_config" in json.dumps(answer["data"])


def test_codex_gets_a_definition_from_the_code_graph(thread: Thread) -> None:
    answer = thread.answer("[asset code-graph get_definition]")
    assert answer["code"] == 0, answer
    text = json.dumps(answer["data"])
    assert "shop/config.py" in text and "Read the shop" in text


def test_codex_searches_its_own_chat_memory(thread: Thread) -> None:
    answer = thread.answer("[asset chat-memory search]")
    assert answer["code"] == 0, answer
    assert "6543" in json.dumps(answer["data"])
