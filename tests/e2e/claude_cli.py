"""Drives the real Claude Code CLI (``claude -p``, then ``claude -p --continue``) as a
subprocess, against a loopback ``ANTHROPIC_BASE_URL``."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CLAUDE_ENV = "CTXPROXY_TEST_CLAUDE"
RUN_TIMEOUT_S = 90.0


def claude_binary() -> str:
    """The Claude Code CLI that ``make test`` installed; a missing one fails in CI, skips
    elsewhere."""
    path = os.environ.get(CLAUDE_ENV)
    if path and os.access(path, os.X_OK):
        return path
    why = f"{CLAUDE_ENV} is not set" if not path else f"{CLAUDE_ENV}={path} is not executable"
    if os.environ.get("CI"):
        pytest.fail(f"{why}: CI must run the real Claude Code CLI (run the suite with `make test`)")
    pytest.skip(f"{why}; `make test` installs Claude Code and sets it")


@dataclass
class Run:
    prompt: str
    returncode: int
    stdout: str
    stderr: str

    @property
    def result(self) -> dict[str, Any]:
        """The ``--output-format json`` summary Claude Code prints last."""
        return dict(json.loads(self.stdout.strip().splitlines()[-1]))

    def describe(self) -> str:
        return f"claude exit {self.returncode} for {self.prompt!r}\n{self.stdout}\n{self.stderr}"


@dataclass
class ClaudeCLI:
    """One Claude Code session in a temp home and project folder, one ``-p`` per user turn.
    Identity goes in ANTHROPIC_CUSTOM_HEADERS, as the README says."""

    binary: str
    root: Path
    base_url: str
    headers: dict[str, str]
    api_key: str = "sk-ant-e2e-client"
    extra_env: dict[str, str] = field(default_factory=dict)  # on top of env()'s
    runs: list[Run] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cwd = self.root / "project"
        self.cwd.mkdir(parents=True)

    def env(self) -> dict[str, str]:
        # A bare environment: Claude Code must not read the developer's ~/.claude.
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.root),
            "LANG": "C.UTF-8",
            "ANTHROPIC_BASE_URL": self.base_url,
            "ANTHROPIC_API_KEY": self.api_key,
            "ANTHROPIC_CUSTOM_HEADERS": "\n".join(f"{k}: {v}" for k, v in self.headers.items()),
            # No update check, telemetry or error reports: loopback only.
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            **self.extra_env,
        }

    async def turn(self, prompt: str) -> Run:
        """The first call starts the session; each next one continues it."""
        args = ["-p", prompt, "--output-format", "json", "--allowedTools", "Bash"]
        if self.runs:
            args.append("--continue")
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
