"""The README's Codex configuration, as written: its provider block and its sandbox block go
into Codex's config.toml (only the port changed), and a turn that curls the knowledge service
from the sandbox reaches it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ctxproxy.config import load_settings
from ctxproxy.proxy.assemble import build_app
from tests.e2e.codex_cli import CodexCLI, codex_binary
from tests.e2e.test_codex import ctxproxy
from tests.fakes.server import free_port, serve
from tests.fakes.upstream import FakeUpstream

pytestmark = pytest.mark.codex

README = Path(__file__).resolve().parents[2] / "README.md"
README_URL = "http://127.0.0.1:8787/v1"
# Test-only lines: no network beyond loopback, no prompts for approval.
TEST_ONLY = """model = "fake-model"
approval_policy = "never"
check_for_update_on_startup = false

[analytics]
enabled = false

[features]
plugins = false
remote_plugin = false
apps = false
"""


def readme_toml(containing: str) -> str:
    blocks = re.findall(r"```toml\n(.*?)```", README.read_text(), re.S)
    return next(b for b in blocks if containing in b)


def readme_config(base_url: str) -> str:
    """The README's sandbox and provider blocks as written, top-level keys first."""
    sandbox = readme_toml("[sandbox_workspace_write]")
    provider = readme_toml("[model_providers.ctxproxy]").replace(README_URL, base_url)
    top, _, tables = sandbox.partition("[")
    head, _, provider_tables = provider.partition("[")
    return f"{top}{head}{TEST_ONLY}\n[{tables}\n[{provider_tables}"


@pytest.fixture(scope="module")
def binary() -> str:
    """Module scope: read before the autouse fixture clears CTXPROXY_* for each test."""
    return codex_binary()


async def test_the_readme_config_lets_codex_curl_the_knowledge_service(
    binary: str, tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    (tmp_path / "wiki").mkdir()
    (tmp_path / "wiki" / "auth.md").write_text(
        "# Authentication\n\nAccess tokens rotate every hour at the gateway.\n")
    wiki = (await ctxproxy(data_dir, "knowledge", "add-wiki", "--team", "team-123", "--name",
                           "Handbook", "--summary", "How we work", str(tmp_path / "wiki")))
    await ctxproxy(data_dir, "knowledge", "bind", "--agent", "coder", "--user-key", "uk-readme",
                   wiki.split()[0])
    upstream = FakeUpstream()
    up = await serve(upstream.app())
    port = free_port()
    settings = load_settings(env={}, upstream_url=up.url + "/v1", data_dir=data_dir, port=port,
                             upstream_read_timeout_s=30)
    proxy = await serve(build_app(settings), port=port)
    try:
        codex = CodexCLI(binary, tmp_path, proxy.url + "/v1", {})
        (codex.home / "config.toml").write_text(readme_config(proxy.url + "/v1"))
        codex.env_extra = {"OPENAI_API_KEY": "sk-readme", "TDAI_USER_KEY": "uk-readme"}
        run = await codex.turn("[wiki] access tokens rotate")
    finally:
        await proxy.close()
        await up.close()
    assert run.returncode == 0, run.describe()
    commands = run.items("command_execution")
    assert [c["exit_code"] for c in commands] == [0], run.describe()
    assert "every hour at the gateway" in commands[0]["aggregated_output"], run.describe()
