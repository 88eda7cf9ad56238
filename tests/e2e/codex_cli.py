"""Drives the real Codex CLI (``codex exec`` / ``codex exec resume --last``) as a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CODEX_ENV = "CTXPROXY_TEST_CODEX"
KEY_ENV = "CTXPROXY_E2E_KEY"
RUN_TIMEOUT_S = 60.0


def codex_binary() -> str:
    """The Codex CLI that ``make test`` installed; a missing one fails in CI, skips elsewhere."""
    path = os.environ.get(CODEX_ENV)
    if path and os.access(path, os.X_OK):
        return path
    why = f"{CODEX_ENV} is not set" if not path else f"{CODEX_ENV}={path} is not executable"
    if os.environ.get("CI"):
        pytest.fail(f"{why}: CI must run the real Codex CLI (run the suite with `make test`)")
    pytest.skip(f"{why}; `make test` installs the Codex CLI and sets it")


def config_toml(base_url: str, headers: dict[str, str]) -> str:
    """A CODEX_HOME config with ctxproxy as a custom provider, as the README documents it.

    Plugins, apps, analytics and the update check are off: with them Codex reaches out to
    github.com and chatgpt.com, and these tests talk to loopback only.
    """
    inline = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in headers.items())
    return f"""\
model = "fake-model"
model_provider = "ctxproxy"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[analytics]
enabled = false

[features]
plugins = false
remote_plugin = false
apps = false

[model_providers.ctxproxy]
name = "ctxproxy under test"
base_url = "{base_url}"
wire_api = "responses"
env_key = "{KEY_ENV}"
http_headers = {{ {inline} }}
"""


@dataclass
class Run:
    """One ``codex exec`` invocation: its exit code, --json events and stderr."""

    prompt: str
    returncode: int
    stdout: str
    stderr: str

    @property
    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.stdout.splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict):
                out.append(event)
        return out

    def items(self, item_type: str) -> list[dict[str, Any]]:
        """Completed items of one type (``agent_message``, ``command_execution``, ...)."""
        return [
            e["item"] for e in self.events
            if e.get("type") == "item.completed" and e.get("item", {}).get("type") == item_type
        ]

    def describe(self) -> str:
        return f"codex exit {self.returncode} for {self.prompt!r}\n{self.stdout}\n{self.stderr}"


@dataclass
class CodexCLI:
    """One Codex thread in a temp home and project folder, one ``exec`` per user turn."""

    binary: str
    root: Path
    base_url: str
    headers: dict[str, str]
    api_key: str = "sk-e2e-client"
    runs: list[Run] = field(default_factory=list)
    env_extra: dict[str, str] = field(default_factory=dict)  # more variables for Codex

    def __post_init__(self) -> None:
        self.home = self.root / "codex-home"
        self.cwd = self.root / "project"
        self.home.mkdir(parents=True)
        self.cwd.mkdir(parents=True)
        (self.home / "config.toml").write_text(config_toml(self.base_url, self.headers))

    def env(self) -> dict[str, str]:
        # A bare environment: Codex must not read the developer's ~/.codex or shell rc files.
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.root),
            "CODEX_HOME": str(self.home),
            KEY_ENV: self.api_key,
            "LANG": "C.UTF-8",
            **self.env_extra,
        }

    async def turn(self, prompt: str) -> Run:
        """The first call starts the thread; each next one resumes the last thread."""
        if self.runs:
            args = ["exec", "resume", "--last", "--skip-git-repo-check", "--json", prompt]
        else:
            args = ["exec", "--skip-git-repo-check", "--json", prompt]
        proc = await asyncio.create_subprocess_exec(
            self.binary, *args, cwd=self.cwd, env=self.env(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        code = proc.returncode if proc.returncode is not None else -1
        run = Run(prompt, code, out.decode(errors="replace"), err.decode(errors="replace"))
        self.runs.append(run)
        return run
