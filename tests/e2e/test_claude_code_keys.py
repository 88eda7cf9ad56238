"""The real Claude Code CLI through ctxproxy under client keys: Claude Code sends its
ANTHROPIC_API_KEY as x-api-key, the proxy takes it as the client's key, and the fake Anthropic
upstream gets CTXPROXY_ANTHROPIC_API_KEY, never the client's. A key the proxy does not know
ends the run with Anthropic's authentication error, and nothing reaches the upstream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from ctxproxy.config import load_settings
from ctxproxy.proxy.assemble import build_app
from tests.e2e.claude_cli import ClaudeCLI, claude_binary
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.server import Running, free_port, serve
from tests.fakes.upstream import FakeUpstream

pytestmark = pytest.mark.claude

CLIENT_KEY = "ck-claude-e2e-4b7d"
ANTHROPIC_KEY = "sk-ant-upstream-e2e"
IDENTITY = {"x-team-id": "team-k", "x-agent-id": "coder"}
# A refused request fails the run at once instead of after Claude Code's retries.
NO_RETRIES = {"CLAUDE_CODE_MAX_RETRIES": "0"}


@dataclass
class Keyed:
    binary: str
    proxy: Running
    anthropic: FakeAnthropic
    openai: FakeUpstream
    root: Path

    def claude(self, name: str, key: str) -> ClaudeCLI:
        return ClaudeCLI(self.binary, self.root / name, self.proxy.url, IDENTITY,
                         api_key=key, extra_env=NO_RETRIES)


@pytest.fixture(scope="module")
def binary() -> str:
    return claude_binary()  # before the environment is cleared for each test


@pytest_asyncio.fixture
async def keyed(binary: str, tmp_path: Path) -> AsyncIterator[Keyed]:
    anthropic, openai = FakeAnthropic(), FakeUpstream()
    up_a, up_o = await serve(anthropic.app()), await serve(openai.app())
    port = free_port()
    settings = load_settings(
        env={}, upstream_url=up_o.url + "/v1", anthropic_url=up_a.url, port=port,
        data_dir=tmp_path / "data", client_keys=f"{CLIENT_KEY} teams=team-k agents=coder",
        upstream_api_key="sk-openai-e2e", anthropic_api_key=ANTHROPIC_KEY,
        upstream_read_timeout_s=30, stats_process=False, memory_process=False,
        memory_timeout_ms=10_000,
    )
    proxy = await serve(build_app(settings), port=port)
    try:
        yield Keyed(binary, proxy, anthropic, openai, tmp_path)
    finally:
        await proxy.close()
        await up_a.close()
        await up_o.close()


async def test_claude_code_with_a_client_key_reaches_the_upstream_with_the_proxys_key(
    keyed: Keyed,
) -> None:
    run = await keyed.claude("ok", CLIENT_KEY).turn("hello through a keyed proxy")
    assert run.returncode == 0, run.describe()
    assert run.result["result"].startswith("FAKE-ANSWER"), run.describe()
    assert keyed.anthropic.messages, "no model call reached the upstream"
    for received in keyed.anthropic.received:
        sent = {k.lower(): v for k, v in received.headers.items()}
        assert sent.get("x-api-key") == ANTHROPIC_KEY, received.path
        assert CLIENT_KEY not in json.dumps(received.headers)
    for received in keyed.openai.received:  # anything Claude Code sent elsewhere
        assert CLIENT_KEY not in json.dumps(received.headers)


async def test_claude_code_with_an_unknown_key_fails_and_nothing_is_forwarded(
    keyed: Keyed,
) -> None:
    run = await keyed.claude("bad", "sk-ant-not-a-client-key").turn("hello")
    assert run.returncode != 0, run.describe()
    assert "missing or unknown client key" in run.stdout + run.stderr, run.describe()
    assert keyed.anthropic.received == []
