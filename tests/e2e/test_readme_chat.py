"""The README's Chat Completions set-up, as written: its Python block is run by the Python the
tests run on (only the port changed), against the proxy and the fake upstream; its identity
reaches the proxy (the bound wiki's knowledge block is in the system message), its session is
the one the ledger records, and the streamed answer and its usage come back."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

from ctxproxy.config import load_settings
from ctxproxy.proxy.app import METRICS
from ctxproxy.proxy.assemble import build_app
from tests.conftest import ledger_rows
from tests.e2e.test_readme_claude import readme_wiki
from tests.fakes.chat import system_text
from tests.fakes.server import free_port, serve
from tests.fakes.upstream import FakeUpstream

README = Path(__file__).resolve().parents[2] / "README.md"
USER_KEY = "uk-readme-chat"


def readme_block() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    return next(b for b in blocks if "chat.completions" in b)


async def test_the_readme_setup_reaches_the_proxy_with_its_identity_and_session(
    tmp_path: Path,
) -> None:
    data = await readme_wiki(tmp_path, USER_KEY)
    fake = FakeUpstream()
    up = await serve(fake.app())
    port = free_port()
    settings = load_settings(env={}, upstream_url=up.url + "/v1", data_dir=data, port=port,
                             stats_process=False, memory_process=False)
    proxy = await serve(build_app(settings), port=port)
    script = readme_block().replace("127.0.0.1:8787", f"127.0.0.1:{port}")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "LANG": "C.UTF-8", "TDAI_USER_KEY": USER_KEY, "OPENAI_API_KEY": "sk-readme"}
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, cwd=tmp_path, env=env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, (out, err)
        [row] = await ledger_rows(proxy.app, "release-notes-1", 1)
        sent = fake.last.json
        assert fake.last.path == "/v1/chat/completions"
        assert "<knowledge_tools>" in system_text(sent) and "Handbook" in system_text(sent)
        assert sent["messages"][-1] == {"role": "user", "content": "How do tokens rotate?"}
        assert out.decode().strip() == "FAKE-ANSWER to: How do tokens rotate?"
        assert row.input_tokens == proxy.app[METRICS].tokens.labels("input")._value.get() > 0
        assert row.knowledge
    finally:
        await proxy.close()
        await up.close()
