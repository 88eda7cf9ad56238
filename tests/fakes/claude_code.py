"""Claude-Code-shaped Messages requests, written for these tests from what Claude Code 2.1.328
sent (``tests/fixtures/claude_code/``): ``system`` as three text blocks, the last two marked;
a first user message whose first block is a ``<system-reminder>``; a ``system``-role message
after it; the newest block marked; the session in a header and in ``metadata.user_id``."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.server import Running

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "claude_code"
MARK = {"type": "ephemeral"}
REMINDER = ("<system-reminder>\nAs you answer the user's questions, you can use the following "
            "context:\n# claudeMd\nUse tabs.\n</system-reminder>\n")
ENVIRONMENT = "# Environment\nYou have been invoked in the following environment:\n - cwd: /w\n"

Message = dict[str, Any]


def system() -> list[dict[str, Any]]:
    return [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328"},
        {"type": "text", "text": "You are a Claude agent.", "cache_control": MARK},
        {"type": "text", "text": "You are an agent working with the user. " * 40,
         "cache_control": MARK},
    ]


def headers(session_id: str, **extra: str) -> dict[str, str]:
    return {"x-api-key": "sk-ant-client", "anthropic-version": "2023-06-01",
            "X-Claude-Code-Session-Id": session_id, "content-type": "application/json",
            **extra}


def request(messages: list[Message], session_id: str, *, stream: bool = True) -> dict[str, Any]:
    """The body Claude Code sends: its newest block marked, as it marks it."""
    marked = [*messages[:-1], _marked(messages[-1])] if messages else []
    user_id = json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": session_id})
    return {"model": "claude-opus-5-5", "messages": marked, "system": system(),
            "tools": [{"name": "Bash", "description": "Run a command",
                       "input_schema": {"type": "object",
                                        "properties": {"command": {"type": "string"}}}}],
            "metadata": {"user_id": user_id}, "max_tokens": 32000, "stream": stream}


def _marked(message: Message) -> Message:
    content = message["content"]
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    return {**message, "content": [*content[:-1], {**content[-1], "cache_control": MARK}]}


def first_messages(prompt: str) -> list[Message]:
    return [{"role": "user", "content": [{"type": "text", "text": REMINDER},
                                         {"type": "text", "text": prompt}]},
            {"role": "system", "content": ENVIRONMENT}]


def tool_turn(prompt: str, n: int) -> list[Message]:
    """A turn with one Bash call and its result, then the closing text."""
    call = f"toolu_{n:04d}{uuid.uuid4().hex[:8]}"
    return [{"role": "user", "content": prompt},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "run it", "signature": "sig"},
                {"type": "tool_use", "id": call, "name": "Bash",
                 "input": {"command": f"echo {n}"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call,
                                          "content": f"output of {n} " * 30}]},
            {"role": "assistant", "content": [{"type": "text", "text": f"done {n}"}]}]


@dataclass
class ClaudeSession:
    """One Claude Code session through the proxy: each request resends the whole history."""

    proxy: Running
    upstream: FakeAnthropic
    session_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    extra_headers: dict[str, str] = field(default_factory=dict)
    messages: list[Message] = field(default_factory=list)

    async def say(self, prompt: str) -> dict[str, Any]:
        """A text turn; returns what the upstream received."""
        if not self.messages:
            self.messages = first_messages(prompt)
        else:
            self.messages = [*self.messages, {"role": "user", "content": prompt}]
        status, answer = await post(self.proxy.url, request(self.messages, self.session_id),
                                    headers(self.session_id, **self.extra_headers))
        assert status == 200, answer
        self.messages.append({"role": "assistant", "content": answer or [
            {"type": "text", "text": "ok"}]})
        return dict(self.upstream.messages[-1].json)


async def post(url: str, body: dict[str, Any], hdrs: dict[str, str]
               ) -> tuple[int, list[dict[str, Any]]]:
    """POST /v1/messages; the status and the answer's content blocks (from its stream)."""
    async with aiohttp.ClientSession() as s, s.post(
            url + "/v1/messages", data=json.dumps(body), headers=hdrs) as r:
        raw = await r.read()
    if r.headers.get("content-type", "").startswith("application/json"):
        parsed = json.loads(raw)
        return r.status, parsed.get("content") or []
    blocks: dict[int, dict[str, Any]] = {}
    for chunk in raw.split(b"\n\n"):
        for line in chunk.split(b"\n"):
            if not line.startswith(b"data: "):
                continue
            data = json.loads(line[6:])
            if data["type"] == "content_block_start":
                blocks[data["index"]] = dict(data["content_block"])
            elif data["type"] == "content_block_delta" and data["delta"]["type"] == "text_delta":
                blocks[data["index"]]["text"] += data["delta"]["text"]
    return r.status, [blocks[i] for i in sorted(blocks)]


def user_words(body: dict[str, Any]) -> list[str]:
    """The real prompts of a Messages body (reminders and tool results left out)."""
    out = []
    for message in body["messages"]:
        if message["role"] != "user":
            continue
        content = message["content"]
        texts = [content] if isinstance(content, str) else [
            b["text"] for b in content if b.get("type") == "text"]
        words = [t for t in texts if not t.startswith("<system-reminder>")]
        out.extend(words)
    return out


def marks(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every block with a cache mark: (where, block)."""
    found = [("system", b) for b in body.get("system") or [] if "cache_control" in b]
    for n, message in enumerate(body["messages"]):
        if isinstance(message["content"], list):
            found.extend((f"messages[{n}]", b) for b in message["content"]
                         if "cache_control" in b)
    return found
