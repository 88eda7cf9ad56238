"""The Codex client's side of a replayed session: what a prompt is, reading the SSE answer,
and Codex's local auto-compaction (``../shared/fixtures/codex/10_autocompact_custom_provider``).

Codex 0.169.0 with a custom provider compacts on its own: when the input tokens the server
reported for its last request pass its limit, it sends one compaction request (the whole
history plus ``COMPACTION_PROMPT``, ``tools: []``, ``request_kind: "compaction"``), and its
history becomes the system prompt, the real prompts so far (newest first, at most about 20k
tokens), the other context messages, the newest prompt and the summary message. The bench
models exactly that, direct and through the proxy: through the proxy the server reports the
forwarded size, so the client compacts later or never.

Deliberately independent of ``proxy``/``request``: the client must not share the code it
measures.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.harness.pricing import BREAKPOINT_MODEL, Rules

Item = dict[str, Any]

AUTO_COMPACT_TOKENS = 220_000
USER_MESSAGES_TOKENS = 20_000
COMPACTION_PROMPT = (
    "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for another "
    "LLM that will resume the task.\n\nInclude:\n- Current progress and key decisions made\n- "
    "Important context, constraints, or user preferences\n- What remains to be done (clear "
    "next steps)\n- Any critical data, examples, or references needed to continue\n\nBe "
    "concise, structured, and focused on helping the next LLM seamlessly continue the work.\n"
)
SUMMARY_PREFIX = (
    "Another language model started to solve this problem and produced a summary of its "
    "thinking process. You also have access to the state of the tools that were used by that "
    "language model. Use this to build on the work that has already been done and avoid "
    "duplicating work. Here is the summary produced by the other language model, use the "
    "information in this summary to assist with your own analysis:\n"
)
_CONTEXT_PREFIXES = ("<environment_context>", "# AGENTS.md instructions", "<user_instructions>",
                     COMPACTION_PROMPT[:40], SUMMARY_PREFIX[:40])


def message_text(item: Item) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return ""


def is_prompt(item: Item) -> bool:
    """A user message that is a real prompt, not one of Codex's context messages."""
    return (item.get("type") == "message" and item.get("role") == "user"
            and not message_text(item).lstrip().startswith(_CONTEXT_PREFIXES))


def is_summary(item: Item) -> bool:
    return item.get("type") == "message" and message_text(item).startswith(SUMMARY_PREFIX)


def is_compaction_request(items: list[Item]) -> bool:
    return bool(items) and message_text(items[-1]).startswith(COMPACTION_PROMPT[:40])


def prompt_starts(items: list[Item]) -> list[int]:
    return [n for n, item in enumerate(items) if is_prompt(item)]


def user_message(text: str, item_id: str) -> Item:
    return {"type": "message", "id": item_id, "role": "user",
            "content": [{"type": "input_text", "text": text}]}


def read_answer(raw: bytes) -> tuple[list[Item], dict[str, int]]:
    """The output items and usage of a streamed Responses answer."""
    output: list[Item] = []
    usage: dict[str, int] | None = None
    for frame in raw.split(b"\n\n"):
        for line in frame.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            data = orjson.loads(line[5:])
            if data.get("type") == "response.output_item.done":
                output.append(data["item"])
            elif data.get("type") == "response.completed":
                u = data["response"]["usage"]
                usage = {"input": u["input_tokens"],
                         "cached": u["input_tokens_details"]["cached_tokens"]}
    if usage is None:
        raise RuntimeError("stream ended without response.completed")
    return output, usage


@dataclass
class AutoCompact:
    """Codex's client-side trigger: the last *reported* input tokens against the limit."""

    limit: int = AUTO_COMPACT_TOKENS
    user_tokens: int = USER_MESSAGES_TOKENS
    last_reported: int = 0
    count: int = 0

    def seen(self, input_tokens: int) -> None:
        self.last_reported = input_tokens

    @property
    def due(self) -> bool:
        return self.last_reported > self.limit

    def compacted(self, history: list[Item], n_context: int, summary: str,
                  count_tokens: Callable[[str], int], item_id: str) -> list[Item]:
        """The history after a compaction: as in the fixture's requests 0005, 0008 and 0011."""
        self.count += 1
        self.last_reported = 0
        context, prompts = history[:n_context], [i for i in history if self.is_prompt(i)]
        kept: list[Item] = []
        budget = self.user_tokens
        for item in reversed(prompts):
            text = self.text_of(item)
            tokens = count_tokens(text)
            if tokens > budget:
                if budget > 0:  # the oldest one that fits only in part is cut to the budget
                    kept.append(self.prompt(text[-budget * 4:], item))
                break
            kept.append(item)
            budget -= tokens
        kept.reverse()
        older, newest = kept[:-1], kept[-1:]
        return [*context[:1], *older, *context[1:], *newest,
                self.prompt(SUMMARY_PREFIX + summary, {"id": item_id})]

    # The client's messages: Codex's Responses items here (a Chat client's: bench/harness/chat.py).

    def is_prompt(self, item: Item) -> bool:
        return is_prompt(item)

    def text_of(self, item: Item) -> str:
        return message_text(item)

    def prompt(self, text: str, like: Item) -> Item:
        """A user message of ``text`` (with the id of ``like``)."""
        return user_message(text, str(like.get("id")))


def compaction_input(history: list[Item]) -> list[Item]:
    return [*history, user_message(COMPACTION_PROMPT, f"msg_compact_{len(history)}")]


# --- the real shapes -------------------------------------------------------------------------

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "codex"
SHAPE = "03_resume_7turns/0001_POST_v1_responses.json"


@dataclass(frozen=True)
class Shapes:
    """What every request of a Codex session carries besides its history."""

    context: list[Item]  # system prompt, developer and context messages
    body: dict[str, Any]  # model, tools, reasoning, include, ... (key order as Codex sends)
    headers: dict[str, str]
    meta: dict[str, Any]  # x-codex-turn-metadata

    def request(
        self, history: list[Item], thread: str, turn_id: str, kind: str = "turn"
    ) -> tuple[bytes, dict[str, str]]:
        """The body and headers of one request; ``kind="compaction"`` as Codex sends its local
        compaction (no tools, ``request_kind`` and ``compaction`` in the turn metadata)."""
        meta = {**self.meta, "session_id": thread, "thread_id": thread, "turn_id": turn_id,
                "root_turn_id": turn_id, "window_id": f"{thread}:0", "request_kind": kind}
        if kind == "compaction":
            meta["compaction"] = {"trigger": "auto", "reason": "context_limit",
                                  "implementation": "responses", "strategy": "memento"}
        meta_json = orjson.dumps(meta).decode()
        body = {**self.body, "input": history, "prompt_cache_key": thread,
                "client_metadata": {"thread_id": thread, "turn_id": turn_id,
                                    "x-codex-turn-metadata": meta_json}}
        if kind == "compaction":
            body["tools"] = []
        headers = {**self.headers, "x-codex-turn-metadata": meta_json, "session-id": thread,
                   "thread-id": thread, "x-client-request-id": thread,
                   "x-codex-window-id": f"{thread}:0"}
        return orjson.dumps(body), headers


def load_shapes(path: Path = FIXTURES / SHAPE, rules: Rules = "prefix") -> Shapes:
    """The shapes of a recorded request; under breakpoint rules its requests name a model the
    provider prices by them (as a proxy that marks breakpoints for such models sees it)."""
    data = orjson.loads(path.read_bytes())
    body, headers = data["body"], data["headers"]
    items = body["input"]
    context = items[: prompt_starts(items)[0]]
    keep = ("x-codex-beta-features", "originator", "User-Agent", "Accept", "Content-Type")
    body = {k: v for k, v in body.items() if k not in ("client_metadata",)}
    if rules == "breakpoint":
        body["model"] = BREAKPOINT_MODEL
    return Shapes(
        context=context,
        body=body,
        headers={**{k: headers[k] for k in keep}, "Authorization": "Bearer sk-bench"},
        meta=orjson.loads(headers["x-codex-turn-metadata"]),
    )


# --- the chat-memory tool, as the model calls it ---------------------------------------------

_CALL_TOOL = re.compile(
    r"<knowledge [^>]*type=\"chat-memory\"[^>]*>.*?<call_tool>(.*?)</call_tool>", re.S)


def chat_memory_call(instructions: str) -> str | None:
    """The chat-memory asset's call_tool line in the block, unescaped, if it is there."""
    found = _CALL_TOOL.search(instructions)
    if found is None:
        return None
    return found[1].replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">") \
        .replace("&amp;", "&")


def search_command(line: str, query: str) -> str:
    """The block's call_tool line as a search of the chat memory for ``query``."""
    argv = shlex.split(line)
    argv[-1] = orjson.dumps({**orjson.loads(argv[-1]), "tool_name": "search",
                             "params": {"query": query}}).decode()
    return " ".join(shlex.quote(a) for a in argv)


async def run_curl(http: aiohttp.ClientSession, cmd: str) -> str:
    """What the model's shell would print for a block's curl line (POST, -H, -d)."""
    argv = shlex.split(cmd)
    url = next(a for a in argv if a.startswith("http"))
    headers = dict(argv[i + 1].split(": ", 1) for i, a in enumerate(argv) if a == "-H")
    data = argv[argv.index("-d") + 1]
    async with http.post(url, data=data, headers=headers) as resp:
        return await resp.text()
