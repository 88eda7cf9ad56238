"""Small Codex-shaped requests (the shapes of Codex CLI 0.169.0): the tests' requests
(``tests/fakes/codex.py`` re-exports them) and the hostile benches' bodies."""

from __future__ import annotations

import json
import uuid
from typing import Any

SYSTEM_PROMPT = "You are a test coding agent. Be brief. " * 20


def text(role: str, body: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    item: dict[str, Any] = {
        "type": "message", "role": role, "content": [{"type": kind, "text": body}],
    }
    if role == "assistant":
        item["status"] = "completed"
    return item


def context_items(cwd: str = "/home/dev/proj") -> list[dict[str, Any]]:
    return [
        text("developer", SYSTEM_PROMPT),
        {"type": "message", "role": "developer", "content": [{
            "type": "input_text",
            "text": "<permissions instructions>\nsandbox: none\n</permissions instructions>",
        }]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text",
             "text": f"# AGENTS.md instructions for {cwd}\n\n<INSTRUCTIONS>\nUse tabs.\n"
                     "</INSTRUCTIONS>"},
            {"type": "input_text",
             "text": f"<environment_context>\n  <cwd>{cwd}</cwd>\n</environment_context>"},
        ]},
    ]


def tool_turn(prompt: str, output: str = "ok\n", n_calls: int = 1) -> list[dict[str, Any]]:
    """A user prompt, reasoning, n calls, their outputs in order, and the final answer."""
    calls = [f"call_{uuid.uuid4().hex[:12]}" for _ in range(n_calls)]
    items: list[dict[str, Any]] = [
        text("user", prompt),
        {"type": "reasoning", "id": f"rs_{uuid.uuid4().hex[:8]}", "summary": [],
         "encrypted_content": "gAAAA_test"},
    ]
    items += [{"type": "function_call", "name": "exec_command", "call_id": c,
               "arguments": json.dumps({"cmd": "ls"}), "status": "completed"} for c in calls]
    items += [{"type": "function_call_output", "call_id": c, "output": output} for c in calls]
    items.append(text("assistant", f"Done with: {prompt}"))
    return items


def text_turn(prompt: str) -> list[dict[str, Any]]:
    return [text("user", prompt), text("assistant", f"Answer to: {prompt}")]


def session(turns: int, *, tools_every: int = 2, tail_prompt: bool = True) -> list[dict[str, Any]]:
    """Context, then ``turns`` user turns (every ``tools_every``-th with a tool call).

    With ``tail_prompt`` the last turn is an unanswered prompt, as on a live request.
    """
    items = context_items()
    for n in range(1, turns + 1):
        prompt = f"turn {n}: please do step {n}"
        if n == turns and tail_prompt:
            items.append(text("user", prompt))
        elif n % tools_every == 0:
            items += tool_turn(prompt)
        else:
            items += text_turn(prompt)
    return items


def request(
    items: list[dict[str, Any]], session_id: str = "sess-1", **extra: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "fake-model", "stream": True, "input": items, "tools": [],
        "tool_choice": "auto", "parallel_tool_calls": True, "store": False,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": session_id,
    }
    body.update(extra)
    return body


def headers(session_id: str = "sess-1", turn_id: str = "turn-1", kind: str = "turn",
            **extra: str) -> dict[str, str]:
    meta = json.dumps({"session_id": session_id, "turn_id": turn_id, "request_kind": kind})
    out = {"session-id": session_id, "x-codex-turn-metadata": meta,
           "Authorization": "Bearer sk-client-test", "Accept": "text/event-stream",
           "Content-Type": "application/json"}
    out.update(extra)
    return out
