"""A Chat Completions agent's side of a replayed session (bench/harness/replay.py's
``Shape``): its requests to /v1/chat/completions, reading the ``data:`` chunks of its answer,
its auto-compaction, and the fake model's answers as assistant messages.

The agent is Codex as a Chat Completions client (modelled on its recorded Responses request,
not recorded itself): the same context, tools and compaction as the Codex sessions, sent as
Chat messages, so the two shapes differ only in the protocol. Its requests: one system message
(Codex's developer messages and the run's system message), Codex's context user messages
(AGENTS.md, the environment: the proxy reads them as context by their markers), each prompt a
user message, each model call an assistant message (the run's thought as its text; Chat has no
place for encrypted reasoning) with one ``exec_command`` tool call, its output a ``tool``
message in Codex's exec format; the function tools as Chat tools (Codex's namespace and
web-search tools have no Chat form); ``prompt_cache_key`` the session (OpenAI's Chat API takes
it, and the proxy reads it as the session); ``stream_options.include_usage``, so the last
chunk carries the usage.

Compaction is Codex's (bench/harness/codex.py), chosen because it is the one client compaction
recorded here (with a custom provider: ``../shared/fixtures/codex/
10_autocompact_custom_provider``): when the reported ``prompt_tokens`` pass the limit, the
history plus the compaction prompt without tools (so its prefix is not the turns'), then the
system message, the prompts (newest first, at most about 20k tokens), the context messages,
the newest prompt and the summary.

Deliberately independent of ``proxy``/``request``: the client must not share the code it
measures.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.harness.agent_runs import WORKDIR, Task
from bench.harness.codex import (
    COMPACTION_PROMPT,
    FIXTURES,
    SHAPE,
    AutoCompact,
    is_prompt,
    load_shapes,
)
from bench.harness.codex import message_text as text_of
from bench.harness.pricing import Rules

Item = dict[str, Any]


@dataclass
class ChatCompact(AutoCompact):
    """Codex's compaction over Chat messages."""

    def is_prompt(self, item: Item) -> bool:
        return is_prompt({**item, "type": "message"})

    def text_of(self, item: Item) -> str:
        return text_of(item)

    def prompt(self, text: str, like: Item) -> Item:
        return {"role": "user", "content": text}


def chat_tools(tools: list[Item]) -> list[Item]:
    """Codex's function tools as Chat tools (the others have no Chat form)."""
    return [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
            for t in tools if t.get("type") == "function"]


def read_answer(raw: bytes) -> tuple[list[Item], dict[str, int]]:
    """The assistant message a Chat stream's chunks add up to, and its usage."""
    text: list[str] = []
    calls: dict[int, Item] = {}
    usage: dict[str, int] | None = None
    done = False
    for line in raw.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        if line[5:].strip() == b"[DONE]":
            done = True
            continue
        data = orjson.loads(line[5:])
        if data.get("usage"):
            u = data["usage"]
            usage = {"input": u["prompt_tokens"],
                     "cached": u["prompt_tokens_details"]["cached_tokens"]}
        for choice in data.get("choices") or ():
            delta = choice["delta"]
            text.append(delta.get("content") or "")
            for call in delta.get("tool_calls") or ():
                whole = calls.setdefault(call["index"], {
                    "id": call.get("id"), "type": "function",
                    "function": {"name": call["function"].get("name", ""), "arguments": ""}})
                whole["function"]["arguments"] += call["function"].get("arguments", "")
    if usage is None or not done:
        raise RuntimeError("stream ended without its usage chunk and [DONE]")
    message: Item = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = [calls[k] for k in sorted(calls)]
    return [message], usage


@dataclass(frozen=True)
class ChatShape:
    """Codex's requests as a Chat Completions client sends them."""

    system: str  # Codex's developer messages, one text
    context_messages: list[Item]  # Codex's context user messages
    body: dict[str, Any]  # model, tools, ... (without messages)
    headers: dict[str, str]
    path: str = "/v1/chat/completions"
    writes: bool = False

    # --- the client ---

    def context(self, system: str) -> list[Item]:
        return [{"role": "system", "content": f"{self.system}\n\n{system}"},
                *self.context_messages]

    def add_prompt(self, history: list[Item], text: str, j: int) -> None:
        history.append({"role": "user", "content": text})

    def request(self, history: list[Item], thread: str, turn_id: str, kind: str
                ) -> tuple[bytes, dict[str, str]]:
        """One request; a compaction has no tools (as Codex sends it: ``tools: []``, which
        Chat refuses empty, so none)."""
        body = {"model": self.body["model"], "messages": history,
                **{k: v for k, v in self.body.items() if k != "model"},
                "prompt_cache_key": thread}
        if kind == "compaction":
            for key in ("tools", "tool_choice", "parallel_tool_calls"):
                body.pop(key, None)
        return orjson.dumps(body), {**self.headers, "session-id": thread}

    def read_answer(self, raw: bytes) -> tuple[list[Item], dict[str, int]]:
        return read_answer(raw)

    def call_output(self, j: int, k: int, output: str) -> Item:
        return {"role": "tool", "tool_call_id": _call_id(j, k), "content": output}

    def compaction_input(self, history: list[Item]) -> list[Item]:
        return [*history, {"role": "user", "content": COMPACTION_PROMPT}]

    def summary_of(self, answer: list[Item]) -> str:
        return "".join(text_of(m) for m in answer)

    def auto_compact(self, limit: int) -> ChatCompact:
        return ChatCompact(limit=limit)

    # --- the fake model ---

    def view(self, body: dict[str, Any]) -> tuple[object, object, list[Any], str]:
        """The session in ``prompt_cache_key``; the tools and the system message (where the
        proxy adds its blocks) as the head."""
        messages = list(body.get("messages") or [])
        system = messages.pop(0) if messages and messages[0].get("role") == "system" else None
        head_text = text_of(system) if system else ""
        return body.get("prompt_cache_key"), (body.get("tools"), system), messages, head_text

    def step(self, task: Task, j: int, k: int) -> list[Item]:
        if k == len(task.steps):
            return self.text(f"Submitted the fix for {task.name}; the patch is the output of "
                             "the last command.", None)
        step = task.steps[k]
        args = orjson.dumps({"cmd": step.command, "workdir": WORKDIR, "yield_time_ms": 10000})
        return [{"role": "assistant", "content": step.thought or None, "tool_calls": [
            {"id": _call_id(j, k), "type": "function",
             "function": {"name": "exec_command", "arguments": args.decode()}}]}]

    def text(self, text: str, item_id: str | None) -> list[Item]:
        return [{"role": "assistant", "content": text}]


def _call_id(j: int, k: int) -> str:
    return f"call_{j:03d}_{k:03d}"


def load_chat_shape(path: Path = FIXTURES / SHAPE, rules: Rules = "prefix") -> ChatShape:
    """Codex's recorded request (bench/harness/codex.py's ``load_shapes``) as Chat."""
    shapes = load_shapes(path, rules)
    developer = [i for i in shapes.context if i.get("role") in ("developer", "system")]
    users = [i for i in shapes.context if i.get("role") == "user"]
    body = shapes.body
    return ChatShape(
        system="\n\n".join(text_of(i) for i in developer),
        context_messages=[{"role": "user", "content": text_of(i)} for i in users],
        body={"model": body["model"], "stream": True,
              "stream_options": {"include_usage": True}, "tools": chat_tools(body["tools"]),
              "tool_choice": "auto", "parallel_tool_calls": False},
        headers={k: v for k, v in shapes.headers.items() if k != "x-codex-beta-features"},
    )


def chat_note(limit: int, ttl_s: float) -> str:
    """What a report says of the replay in the Chat Completions shape."""
    return (
        "Each model call is one request in the Chat Completions shape of Codex with a Chat "
        "provider (bench/harness/chat.py): one system message (Codex's developer messages and "
        "the run's system message), Codex's context user messages, each prompt a user "
        "message, each model call an assistant message (the run's thought as its text: Chat "
        "has no place for encrypted reasoning) with one `exec_command` tool call and its "
        "`tool` message in Codex's exec format, `prompt_cache_key` the session, usage by "
        "`stream_options.include_usage`; the task's end is one more request with a closing "
        "text. Prices: `bench/harness/chat_pricing.py` (OpenAI's rules as for the Codex "
        f"sessions: input tokens only, cached at 10%, cache TTL {ttl_s:.0f} s of simulated "
        "time). Client auto-compaction as Codex does it (the one client compaction recorded "
        f"here): when the reported `prompt_tokens` pass {limit:,}, one compaction "
        "request (history + compaction prompt, no tools, so no cached prefix; the proxy "
        "forwards it whole), then the system message, the prompts (at most 20k tokens), the "
        "context messages, the newest prompt and the summary (the fake summariser lists the "
        "tasks and the newest 80 names the commands used). ")
