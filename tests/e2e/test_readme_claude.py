"""The README's Claude Code set-up, as written: its shell block is run by bash (only the port
changed), then ``claude -p`` with the README's ``--allowedTools``; the identity reaches the
proxy and Claude Code's Bash tool curls the knowledge service from the block."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import pytest

from ctxproxy.config import load_settings
from ctxproxy.proxy.assemble import build_app
from tests.e2e.claude_cli import claude_binary
from tests.e2e.test_codex import ctxproxy
from tests.fakes.anthropic import FakeAnthropic, system_text
from tests.fakes.server import free_port, serve

pytestmark = pytest.mark.claude

README = Path(__file__).resolve().parents[2] / "README.md"
USER_KEY = "uk-readme-claude"


def readme_block() -> str:
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), re.S)
    return next(b for b in blocks if "ANTHROPIC_BASE_URL" in b)


def allowed_tools() -> str:
    found = re.search(r'--allowedTools "([^"]+)"', README.read_text())
    assert found is not None
    return found.group(1)


async def readme_wiki(tmp_path: Path, user_key: str) -> Path:
    """A data directory with a wiki bound to the README's team, agent and ``user_key``."""
    data = tmp_path / "data"
    wiki = tmp_path / "wiki"
    wiki.mkdir()
    (wiki / "auth.md").write_text("# Authentication\n\nTokens rotate every hour at the gate.\n")
    printed = await ctxproxy(data, "knowledge", "add-wiki", "--team", "team-123", "--name",
                             "Handbook", "--summary", "How we work", str(wiki))
    await ctxproxy(data, "knowledge", "bind", "--agent", "coder", "--user-key", user_key,
                   printed.split()[0])
    return data


@pytest.fixture(scope="module")
def binary() -> str:
    return claude_binary()


async def test_the_readme_setup_lets_claude_code_curl_the_knowledge_service(
    binary: str, tmp_path: Path,
) -> None:
    data = await readme_wiki(tmp_path, USER_KEY)
    fake = FakeAnthropic()
    up = await serve(fake.app())
    port = free_port()
    settings = load_settings(env={}, anthropic_url=up.url, upstream_url=up.url + "/v1",
                             data_dir=data, port=port, stats_process=False,
                             memory_process=False)
    proxy = await serve(build_app(settings), port=port)
    (tmp_path / "project").mkdir()
    script = readme_block().replace("127.0.0.1:8787", f"127.0.0.1:{port}") + (
        f'exec "$CLAUDE" -p "[wiki] tokens rotate" --output-format json'
        f' --allowedTools "{allowed_tools()}"\n')
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "LANG": "C.UTF-8", "CLAUDE": binary, "TDAI_USER_KEY": USER_KEY,
           "ANTHROPIC_API_KEY": "sk-ant-readme", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "DISABLE_AUTOUPDATER": "1"}
    try:
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", script, cwd=tmp_path / "project", env=env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 90)
    finally:
        await proxy.close()
        await up.close()
    assert proc.returncode == 0, (out, err)
    calls = [r.json for r in fake.messages if r.json.get("tools")]
    assert "<knowledge_tools>" in system_text(calls[0])
    results = json.dumps([m["content"] for m in calls[-1]["messages"]])
    assert "every hour at the gate" in results, results[-2000:]
    assert json.loads(out.decode().strip().splitlines()[-1])["result"].startswith("FAKE-DONE")
