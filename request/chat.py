"""OpenAI Chat Completions requests (opencode, Aider, Continue, Cline, Goose) as the items
every step reads, and back.

A Chat body's ``messages`` are read once into Responses-shaped items, the view the window,
memory and knowledge already read: a ``system`` or ``developer`` message is context; a
``user`` message is a user message (a prompt, unless it holds the agent's context markers,
``request.items.is_context``); an ``assistant`` message is its text as an assistant message
and each of its ``tool_calls`` a ``function_call`` (the call's ``id`` the ``call_id``); a
``tool`` message a ``function_call_output``. So a turn starts at a real user prompt, and a
tool call and its result go together (they share the call id).

Each item remembers the message it came from: writing back, a message whose items all came
through unchanged is the client's own object; an assistant message the window cut into keeps
its kept parts; a tool message a step changed (a masked output) is that message with the new
content; a message a step added (memory, the cut digest) is a user message of text (the role
every Chat model takes anywhere in a conversation). What steps append to ``instructions``
(knowledge, memory blocks) goes at the end of the first system or developer message, or in
a new system message first when there is none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxproxy.request.items import SYSTEM_ROLES, Item, message_text

__all__ = ["ChatView", "answer_items", "parse", "system_with", "write_back"]

SEPARATOR = "\n\n"  # between the client's system text and a block a step appended
TEXT = -1  # an item's part of its message: the content (tool calls: their index)

Origin = tuple[int, int]  # the message's position, the part of it


@dataclass(slots=True)
class ChatView:
    """What writing back needs: the client's messages and where each item came from."""

    messages: list[Any]
    origins: dict[int, Origin] = field(default_factory=dict)  # by id() of the item
    parts: dict[int, int] = field(default_factory=dict)  # message -> items read from it
    calls: dict[str, list[int]] = field(default_factory=dict)  # tool_call_id -> tool messages


def _texts(content: Any) -> str:
    """A content's text: the string, or its text parts one a line."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(p["text"] for p in content
                     if isinstance(p, dict) and isinstance(p.get("text"), str))


def _input_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    if not isinstance(content, list):
        return []
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else "unknown"
        if kind == "text":
            parts.append({"type": "input_text", "text": str(part.get("text", ""))})
        else:  # images, audio, files: the steps need not read them
            parts.append({"type": f"input_{kind}"})
    return parts


def _assistant_text(content: Any) -> Item:
    return {"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": _texts(content)}]}


def _call_item(call: Any) -> Item:
    call = call if isinstance(call, dict) else {}
    function = call.get("function")
    function = function if isinstance(function, dict) else {}
    arguments = function.get("arguments")
    return {"type": "function_call", "call_id": str(call.get("id", "")),
            "name": str(function.get("name", "")),
            "arguments": arguments if isinstance(arguments, str) else "{}"}


def _message_items(message: dict[str, Any]) -> list[tuple[Item, int]]:
    """The items one message stands for, each with its part of it."""
    role = message.get("role")
    content = message.get("content")
    if role in SYSTEM_ROLES or role == "user":
        return [({"type": "message", "role": role, "content": _input_parts(content)}, TEXT)]
    if role == "tool":
        return [({"type": "function_call_output", "call_id": str(message.get("tool_call_id", "")),
                  "output": _texts(content)}, TEXT)]
    if role != "assistant":  # "function" (the old calls), or a role of its own
        return [({"type": f"chat_{role}"}, TEXT)]
    calls = message.get("tool_calls")
    calls = calls if isinstance(calls, list) else []
    found: list[tuple[Item, int]] = []
    if _texts(content) or not calls:
        found.append((_assistant_text(content), TEXT))
    found.extend((_call_item(call), k) for k, call in enumerate(calls))
    return found


def parse(body: dict[str, Any]) -> tuple[list[Item], ChatView]:
    """The items a Chat body's ``messages`` stand for, and what writing back needs.

    Raises TypeError (a message is not an object) and ValueError (no messages list, or an
    ``input`` or ``instructions`` key, which the steps' own would be confused with).
    """
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise ValueError("messages is not a list")
    if "instructions" in body or "input" in body:
        raise ValueError("a Chat Completions body has no input or instructions")
    view = ChatView(messages)
    items: list[Item] = []
    for m, message in enumerate(messages):
        if type(message) is not dict:
            raise TypeError("messages must be objects")
        found = _message_items(message)
        view.parts[m] = len(found)
        if message.get("role") == "tool":
            view.calls.setdefault(str(message.get("tool_call_id", "")), []).append(m)
        for item, part in found:
            items.append(item)
            view.origins[id(item)] = (m, part)
    return items, view


def answer_items(message: Any) -> list[Item]:
    """An answer's message (a choice's ``message``) as output items: what memory keeps."""
    if not isinstance(message, dict):
        return []
    return [item for item, _ in _message_items({**message, "role": "assistant"})]


# --- writing back ----------------------------------------------------------------------------


def write_back(view: ChatView, items: Sequence[Item]) -> list[Any]:
    """The messages ``items`` stand for, in the client's shape."""
    messages: list[Any] = []
    group: list[tuple[Item, int]] = []
    at = -1  # the message the group came from
    written = -1  # the last client message written: a changed output's is after it

    def flush() -> None:
        if group:
            messages.append(_message_of(view.messages[at], group, view.parts[at]))
            group.clear()

    for item in items:
        origin = view.origins.get(id(item))
        if origin is None and item.get("type") == "function_call_output":
            m = _tool_message(view, item, written)
            if m is not None:  # a step changed it (masked): its message, the new text
                flush()
                messages.append({**view.messages[m], "content": _output(item)})
                written = m
                continue
        if origin is None:
            flush()
            text = message_text(item)
            if text:
                messages.append({"role": "user", "content": text})
            continue
        if group and origin[0] != at:
            flush()
        at = written = origin[0]
        group.append((item, origin[1]))
    flush()
    return messages


def _tool_message(view: ChatView, item: Item, after: int) -> int | None:
    """The tool message a changed output stands for: the first of its call id after
    ``after`` (ids may repeat across turns)."""
    for m in view.calls.get(str(item.get("call_id", "")), ()):
        if m > after:
            return m
    return None


def _output(item: Item) -> str:
    output = item.get("output")
    return output if isinstance(output, str) else message_text(item)


def _message_of(message: dict[str, Any], group: list[tuple[Item, int]], parts: int) -> Any:
    """One client message from the items kept of it: its own object when all were."""
    if len(group) == parts:
        return message
    kept = {part for _, part in group}
    calls = message.get("tool_calls")
    out = {**message, "tool_calls": [c for k, c in enumerate(calls) if k in kept]} if (
        isinstance(calls, list)) else dict(message)
    if TEXT not in kept and "content" in message:
        out["content"] = None
    if isinstance(calls, list) and not out["tool_calls"]:
        del out["tool_calls"]
    return out


def first_system(messages: Any) -> Item | None:
    """The first system or developer message (where the steps' instructions go)."""
    if not isinstance(messages, list):
        return None
    return next((m for m in messages if isinstance(m, dict) and m.get("role") in SYSTEM_ROLES),
                None)


def system_with(messages: list[Any], added: Any) -> list[Any]:
    """``messages`` with the text steps appended to ``instructions`` at the end of the first
    system or developer message (a new system message first when there is none)."""
    if not isinstance(added, str) or not added:
        return messages
    for m, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") in SYSTEM_ROLES:
            content = message.get("content")
            if isinstance(content, list):
                content = [*content, {"type": "text", "text": added}]
            else:
                text = content if isinstance(content, str) else ""
                content = text + SEPARATOR + added if text else added
            return [*messages[:m], {**message, "content": content}, *messages[m + 1:]]
    return [{"role": "system", "content": added}, *messages]
