"""The Claude Code client's side of a replayed session (bench/harness/replay.py's ``Shape``):
its Messages requests, reading the SSE answer, its auto-compaction, and the fake model's
answers in Messages blocks.

What Claude Code 2.1.328 sends (``tests/fixtures/claude_code/session.json``, one real session,
read as data): ``system`` as three text blocks, the last two marked ``cache_control``; twelve
tools; the first user message its ``<system-reminder>`` blocks and the prompt, then a
``system``-role message (the environment); later prompts as strings; a Bash call as a
``tool_use`` block and its result as a user message of one ``tool_result``; and one more mark
on the last block of the newest message (the previous newest goes back to its plain form).
A run's system message stands where Claude Code puts a project's CLAUDE.md: in a
reminder of the first message. A step's answer is a ``thinking`` block (the run's thought;
its signature the run's encrypted reasoning) and a Bash ``tool_use``.

Claude Code compacts on its own when the context its last answer reported (input, cache reads
and writes) passes the window less its output reserve (at most 20k) less a 13k buffer:
167k of a 200k window (its ``s4``/``jQ``). The compaction request is the history plus a
user message asking for the summary, with the same system and tools (its prefix stays
cached); after it the history is the context reminders, the summary with the user's
messages (newest first, at most about 20k tokens, as its summary prompt asks for them all)
and the environment message.

Deliberately independent of ``proxy``/``request``: the client must not share the code it
measures.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.harness.agent_runs import WORKDIR, Task
from bench.harness.codex import AutoCompact

Item = dict[str, Any]

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "claude_code"
MARK = "cache_control"
WINDOW = 200_000
AUTO_COMPACT_TOKENS = WINDOW - 20_000 - 13_000
COMPACT_PROMPT = (
    "Your task is to create a detailed summary of the conversation so far, paying close "
    "attention to the user's explicit requests and your previous actions. Include every user "
    "message that is not a tool result, the files and code sections worked on, errors and "
    "fixes, pending tasks and the current work.")
CONTINUED = ("This session is being continued from a previous conversation that ran out of "
             "context. The summary below covers the earlier portion of the conversation.\n\n")
REMINDER = "<system-reminder>\n"
_CARRIED = re.compile(r"<user_message>\n(.*?)\n</user_message>\n", re.S)
_EXIT = re.compile(r"^Process exited with code (-?\d+)$", re.M)


def claude_md(system: str) -> str:
    """A project's CLAUDE.md as Claude Code gives it to the model."""
    return (f"{REMINDER}As you answer the user's questions, you can use the following context:"
            f"\n# claudeMd\nCodebase and user instructions are shown below.\n\nContents of "
            f"{WORKDIR}/CLAUDE.md (project instructions, checked into the codebase):\n\n"
            f"{system}\n</system-reminder>\n")


def bash_result(output: str) -> tuple[str, bool]:
    """A run's output (in Codex's exec format) as Claude Code's Bash tool reports it: the
    output, with the exit code first when it failed."""
    code = _EXIT.search(output)
    body = output.split("Output:\n", 1)[1] if "Output:\n" in output else output
    failed = code is not None and code[1] != "0"
    return (f"Exit code {code[1]}\n{body}" if failed and code else body), failed


def plain(message: Item) -> Item:
    """A message as Claude Code keeps it: no cache mark, one text block as a string."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    blocks = [{k: v for k, v in b.items() if k != MARK} if MARK in b else b for b in content]
    one_text = len(blocks) == 1 and blocks[0].get("type") == "text" and set(blocks[0]) == {
        "type", "text"}
    if message.get("role") in ("user", "system") and one_text:
        return {**message, "content": blocks[0]["text"]}
    return {**message, "content": blocks}


def marked(message: Item) -> Item:
    """The newest message as Claude Code sends it: its last block marked."""
    content = message["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    return {**message, "content": [*blocks[:-1], {**blocks[-1], MARK: {"type": "ephemeral"}}]}


@dataclass
class ClaudeCompact(AutoCompact):
    """Claude Code's trigger: the context its last answer reported against the limit."""

    limit: int = AUTO_COMPACT_TOKENS

    def compacted(self, history: list[Item], n_context: int, summary: str,
                  count_tokens: Callable[[str], int], item_id: str) -> list[Item]:
        """The context reminders, the summary with the user's messages, the environment."""
        self.count += 1
        self.last_reported = 0
        prompts: list[str] = []
        budget = self.user_tokens
        for text in (t for message in reversed(history) for t in _prompts(message)):
            tokens = count_tokens(text)
            if tokens > budget:
                break
            prompts.append(text)
            budget -= tokens
        first, rest = history[0], history[1:n_context]
        reminders = [b for b in first["content"] if b["text"].startswith(REMINDER)]
        asked = "".join(f"<user_message>\n{p}\n</user_message>\n" for p in reversed(prompts))
        words = f"{CONTINUED}{summary}\n\nAll user messages:\n{asked}"
        return [{"role": "user", "content": [*reminders, {"type": "text", "text": words}]},
                *rest]


def _prompts(message: Item) -> list[str]:
    """The user's own messages in a message, newest first: its words, or those an earlier
    summary carried."""
    if message.get("role") != "user":
        return []
    content = message["content"]
    texts = [content] if isinstance(content, str) else [
        b["text"] for b in content if b.get("type") == "text"]
    out: list[str] = []
    for text in reversed(texts):
        if text.startswith(CONTINUED[:40]):
            out += reversed(_CARRIED.findall(text))
        elif not text.startswith((REMINDER, COMPACT_PROMPT[:40])):
            out.append(text)
    return out


@dataclass(frozen=True)
class ClaudeShape:
    """Claude Code's Messages requests, from its recorded session."""

    body: dict[str, Any]  # model, system, tools, thinking, ... (key order as Claude Code sends)
    headers: dict[str, str]
    attribution: str  # the first message's own reminder
    environment: Item  # the system-role message after it
    path: str = "/v1/messages"
    writes: bool = True

    # --- the client ---

    def context(self, system: str) -> list[Item]:
        return [{"role": "user", "content": [{"type": "text", "text": self.attribution},
                                             {"type": "text", "text": claude_md(system)}]},
                self.environment]

    def add_prompt(self, history: list[Item], text: str, j: int) -> None:
        if j == 0 and len(history) == 2 and history[1] is self.environment:
            first = history[0]
            history[0] = {**first, "content": [*first["content"], {"type": "text", "text": text}]}
            return
        history.append({"role": "user", "content": text})

    def request(self, history: list[Item], thread: str, turn_id: str, kind: str
                ) -> tuple[bytes, dict[str, str]]:
        user_id = orjson.dumps({"device_id": "d" * 64, "account_uuid": "",
                                "session_id": thread}).decode()
        b = self.body
        body = {"model": b["model"], "messages": [*history[:-1], marked(history[-1])],
                "system": b["system"], "tools": b["tools"], "metadata": {"user_id": user_id},
                **{k: v for k, v in b.items() if k not in ("model", "system", "tools")}}
        return orjson.dumps(body), {**self.headers, "X-Claude-Code-Session-Id": thread}

    def read_answer(self, raw: bytes) -> tuple[list[Item], dict[str, int]]:
        """The answer as the assistant message Claude Code keeps, and its usage."""
        blocks: dict[int, Item] = {}
        partial: dict[int, list[str]] = {}
        usage: dict[str, int] = {}
        stopped = False
        for frame in raw.split(b"\n\n"):
            for line in frame.split(b"\n"):
                if line.startswith(b"data:"):
                    stopped |= _read_event(orjson.loads(line[5:]), blocks, partial, usage)
        if not stopped or not usage:
            raise RuntimeError("stream ended without message_stop")
        for index, parts in partial.items():
            blocks[index]["input"] = orjson.loads("".join(parts) or "{}")
        content = [blocks[i] for i in sorted(blocks)]
        read, written = usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]
        total = usage["input_tokens"] + read + written
        return [{"role": "assistant", "content": content}], {
            "input": total, "cached": read, "written": written}

    def call_output(self, j: int, k: int, output: str) -> Item:
        text, failed = bash_result(output)
        return {"role": "user", "content": [{"tool_use_id": _tool_id(j, k), "type": "tool_result",
                                             "content": text, "is_error": failed}]}

    def compaction_input(self, history: list[Item]) -> list[Item]:
        return [*history, {"role": "user", "content": COMPACT_PROMPT}]

    def summary_of(self, answer: list[Item]) -> str:
        return "".join(b.get("text", "") for m in answer for b in m["content"]
                       if b.get("type") == "text")

    def auto_compact(self, limit: int) -> ClaudeCompact:
        return ClaudeCompact(limit=limit)

    # --- the fake model ---

    def view(self, body: dict[str, Any]) -> tuple[object, object, list[Any], str]:
        """The session in ``metadata.user_id``; system and messages without their marks."""
        meta = body.get("metadata") or {}
        try:
            key = orjson.loads(meta.get("user_id") or "{}").get("session_id")
        except orjson.JSONDecodeError:
            key = None
        system = body.get("system")
        blocks = ([{"type": "text", "text": system}] if isinstance(system, str)
                  else list(system or []))
        head = [plain({"role": "system", "content": blocks})["content"], body.get("tools")]
        text = "\n".join(b.get("text", "") for b in blocks if isinstance(b, dict))
        return key, head, [plain(m) for m in body.get("messages") or []], text

    def step(self, task: Task, j: int, k: int) -> list[Item]:
        if k == len(task.steps):
            return [{"type": "text", "text": f"Submitted the fix for {task.name}; the patch is "
                                             "the output of the last command."}]
        step = task.steps[k]
        return [{"type": "thinking", "thinking": step.thought, "signature": step.encrypted},
                {"type": "tool_use", "id": _tool_id(j, k), "name": "Bash",
                 "input": {"command": step.command, "description": "Run the next command"}}]

    def text(self, text: str, item_id: str | None) -> list[Item]:
        return [{"type": "text", "text": text}]


def _tool_id(j: int, k: int) -> str:
    return f"toolu_{j:03d}_{k:03d}"


def _read_event(data: Item, blocks: dict[int, Item], partial: dict[int, list[str]],
                usage: dict[str, int]) -> bool:
    """One Messages event into the blocks and usage; True at ``message_stop``."""
    kind = data.get("type")
    if kind == "message_start":
        usage.update(data["message"]["usage"])
    elif kind == "content_block_start":
        blocks[data["index"]] = dict(data["content_block"])
    elif kind == "content_block_delta":
        block, delta = blocks[data["index"]], data["delta"]
        if delta["type"] == "text_delta":
            block["text"] += delta["text"]
        elif delta["type"] == "thinking_delta":
            block["thinking"] += delta["thinking"]
        elif delta["type"] == "signature_delta":
            block["signature"] = delta["signature"]
        elif delta["type"] == "input_json_delta":
            partial.setdefault(data["index"], []).append(delta["partial_json"])
    elif kind == "message_delta":
        usage.update(data.get("usage") or {})
    return kind == "message_stop"


def load_claude_shape(folder: Path = FIXTURE) -> ClaudeShape:
    """The shapes of Claude Code's recorded session: its body without the messages, its
    first message's own reminder and its environment message."""
    body = orjson.loads((folder / "session.json").read_bytes())
    headers = orjson.loads((folder / "headers.json").read_bytes())
    first, environment = body["messages"][0], body["messages"][1]
    keep = ("Accept", "Content-Type", "User-Agent", "anthropic-beta", "anthropic-version",
            "x-app")
    return ClaudeShape(
        body={k: v for k, v in body.items() if k not in ("messages", "metadata")},
        headers={**{k: headers[k] for k in keep}, "x-api-key": "sk-ant-bench"},
        attribution=first["content"][0]["text"],
        environment=environment,
    )


def claude_note(limit: int, ttl_s: float) -> str:
    """What a report says of the replay in Claude Code's shape."""
    return (
        "Each model call is one request in Claude Code 2.1.328's Messages shape "
        "(bench/harness/claude.py: its system blocks, tools and marks from its recorded "
        "session; the run's system message as a CLAUDE.md reminder): a `thinking` block "
        "(signature: the run's encrypted reasoning) and a Bash `tool_use`, its `tool_result`, "
        "Claude Code's `cache_control` on the newest message's last block; the task's end is "
        "one more request with a closing text. Prices: bench/harness/anthropic_pricing.py "
        f"(input tokens only, cache TTL {ttl_s:.0f} s of simulated time). Client "
        f"auto-compaction as Claude Code does it: when the reported context passes {limit:,} "
        "tokens (200k window less 20k output reserve less 13k), one compaction request "
        "(history + summary prompt, the same system and tools: its prefix is read from the "
        "cache; through the proxy it goes through the pipeline like any turn), then the "
        "context reminders, the summary with the user's messages (at most 20k tokens; the fake "
        "summariser lists the tasks and the newest 80 names the commands used) and the "
        "environment message. ")
