"""Anthropic Messages requests (Claude Code) as the items every step reads, and back.

A Messages body is read once into Responses-shaped items, the view the window, memory and
knowledge already read: an assistant's ``text`` is an assistant message, ``thinking`` a
reasoning item, ``tool_use`` a ``function_call`` (its ``id`` the ``call_id``), a user's
``tool_result`` a ``function_call_output``; a user message's own words (text, images) are one
user message, its ``<system-reminder>`` blocks (Claude Code's context) another, a context
one; a ``system``-role message in ``messages`` (Claude Code sends one) is context too.
So a turn starts at a user message with words of its own, and a tool_use and its tool_result
go together (they share the call id).

Each item remembers the message and blocks it came from: writing back, a message whose items
all came through unchanged is the client's own object, a message the window cut into is its
kept blocks, as they were; an item a step changed (a masked output) is its block with the new
content; a message a step added (memory, the cut digest) is a user message of text. What
steps append to ``instructions`` (the knowledge block) is a text block at the end of
``system``; the messages steps put before the first forwarded turn that keep their bytes
until the next cut (the cut digest, the standing memory) are one more text block after it
(``request.protocol.Messages.write_back``): there a cut changes the prompt from that block on,
and the client's system and the knowledge block before it stay cached. A turn's recall stays a
user message before its prompt. Then the cache marks are set (``marks``). What Claude Code
2.1.328 sends: ``tests/fixtures/claude_code/``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from ctxproxy.request.items import Item, message_text

__all__ = ["MAX_MARKS", "REMINDER", "MessagesView", "is_messages_body", "mark_count",
           "output_items", "parse", "write_back"]

REMINDER = "<system-reminder>"
MAX_MARKS = 4  # cache_control breakpoints a request may carry
MARK = "cache_control"
# Blocks that may carry a cache mark, and what makes each non-empty.
_MARKABLE = {"text": "text", "tool_use": "id", "tool_result": "tool_use_id",
             "image": "source", "document": "source"}

Block = dict[str, Any]
Origin = tuple[int, tuple[int, ...]]  # the message's position, its blocks' positions


@dataclass(slots=True)
class MessagesView:
    """What writing back needs: the client's messages and where each item came from."""

    messages: list[Any]
    origins: dict[int, Origin] = field(default_factory=dict)  # by id() of the item
    calls: dict[str, tuple[int, int]] = field(default_factory=dict)  # tool_use_id -> result


def _is_reminder(block: Any) -> bool:
    return (isinstance(block, dict) and block.get("type") == "text"
            and isinstance(block.get("text"), str) and block["text"].lstrip().startswith(REMINDER))


def _arguments(value: Any) -> str:
    return orjson.dumps(value).decode() if value is not None else "{}"


def _result_text(block: Block) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b["text"] for b in content
                         if isinstance(b, dict) and isinstance(b.get("text"), str))
    return ""


def _assistant_item(block: Any) -> Item:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text":
        return {"type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": str(block.get("text", ""))}]}
    if kind in ("thinking", "redacted_thinking"):
        text = block.get("thinking")
        summary = [{"type": "summary_text", "text": text}] if isinstance(text, str) else []
        return {"type": "reasoning", "summary": summary}
    if kind in ("tool_use", "server_tool_use"):
        return {"type": "function_call", "call_id": str(block.get("id", "")),
                "name": str(block.get("name", "")), "arguments": _arguments(block.get("input"))}
    return {"type": f"anthropic_{kind}"}  # a block the steps need not read: it goes with its turn


def _user_part(block: Any) -> dict[str, Any]:
    if isinstance(block, dict) and block.get("type") == "text":
        return {"type": "input_text", "text": str(block.get("text", ""))}
    kind = block.get("type") if isinstance(block, dict) else "unknown"
    return {"type": f"input_{kind}"}


def parse(body: dict[str, Any]) -> tuple[list[Item], MessagesView]:
    """The items a Messages body's ``messages`` stand for, and what writing back needs.

    Raises TypeError (a message is not an object) and ValueError (no messages list).
    """
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise ValueError("messages is not a list")
    view = MessagesView(messages)
    items: list[Item] = []

    def add(item: Item, m: int, blocks: tuple[int, ...]) -> None:
        items.append(item)
        view.origins[id(item)] = (m, blocks)

    for m, message in enumerate(messages):
        if type(message) is not dict:
            raise TypeError("messages must be objects")
        role = message.get("role")
        content = message.get("content")
        if isinstance(content, str):
            if role == "assistant":
                add(_assistant_item({"type": "text", "text": content}), m, ())
            else:
                context_role = role == "system" or content.lstrip().startswith(REMINDER)
                add({"type": "message", "role": "system" if context_role else "user",
                     "content": [{"type": "input_text", "text": content}]}, m, ())
            continue
        if not isinstance(content, list):
            add({"type": "anthropic_message"}, m, ())
            continue
        if role == "assistant":
            for b, block in enumerate(content):
                add(_assistant_item(block), m, (b,))
            continue
        if role == "system":
            parts = [_user_part(block) for block in content]
            add({"type": "message", "role": "system", "content": parts}, m,
                tuple(range(len(content))))
            continue
        _user_blocks(content, m, view, add)
    return items, view


def _user_blocks(content: list[Any], m: int, view: MessagesView,
                 add: Callable[[Item, int, tuple[int, ...]], None]) -> None:
    """A user message's blocks as items: each tool result its call's output, the
    reminders one context item, the rest one user message."""
    context: list[int] = []
    words: list[int] = []
    for b, block in enumerate(content):
        if isinstance(block, dict) and block.get("type") == "tool_result":
            call_id = str(block.get("tool_use_id", ""))
            view.calls[call_id] = (m, b)
            add({"type": "function_call_output", "call_id": call_id,
                 "output": _result_text(block)}, m, (b,))
        elif _is_reminder(block):
            context.append(b)
        else:
            words.append(b)
    # The reminders are the agent's context: a system-role item, context to every step
    # (request.items.is_context), wherever it stands.
    if context:
        add({"type": "message", "role": "system",
             "content": [_user_part(content[b]) for b in context]}, m, tuple(context))
    if words:
        add({"type": "message", "role": "user",
             "content": [_user_part(content[b]) for b in words]}, m, tuple(words))


def is_messages_body(body: Any) -> bool:
    """Whether a parsed JSON body is a Messages request (not a Responses one)."""
    return isinstance(body, dict) and isinstance(body.get("messages"), list) and (
        "input" not in body)


def mark_count(body: dict[str, Any]) -> int:
    """The cache marks a Messages body carries (in ``system`` and in its messages)."""
    holders = [body.get("system"), *(m.get("content") for m in body.get("messages") or []
                                     if isinstance(m, dict))]
    return sum(1 for content in holders if isinstance(content, list)
               for block in content if isinstance(block, dict) and MARK in block)


def output_items(content: Any) -> list[Item]:
    """An answer's content blocks as output items (what memory keeps of an answer)."""
    if not isinstance(content, list):
        return []
    return [_assistant_item(block) for block in content if isinstance(block, dict)]


# --- writing back ----------------------------------------------------------------------------


def _text_block(text: str) -> Block:
    return {"type": "text", "text": text}


def _changed_block(item: Item, original: Any) -> Any:
    """The block an item a step changed stands for (a masked output: its new text)."""
    if item.get("type") == "function_call_output" and isinstance(original, dict):
        output = item.get("output")
        return {**original, "content": output if isinstance(output, str) else message_text(item)}
    return original


def write_back(
    view: MessagesView, items: Sequence[Item], find: Sequence[Item | None] = (),
) -> tuple[list[Any], list[int | None]]:
    """The messages ``items`` stand for, and the position of the message holding each item
    of ``find`` (None: not among them)."""
    messages: list[Any] = []
    at: dict[int, int] = {}
    wanted = {id(item) for item in find if item is not None}
    group: list[tuple[Item, Origin]] = []

    def flush() -> None:
        if group:
            messages.append(_message_of(view, group))
            group.clear()

    for item in items:
        if id(item) in wanted:
            at[id(item)] = len(messages) + (0 if group and _same(view, group, item) else
                                            1 if group else 0)
        origin = view.origins.get(id(item))
        if origin is None and item.get("type") == "function_call_output":
            found = view.calls.get(str(item.get("call_id", "")))
            origin = (found[0], (-1 - found[1],)) if found is not None else None  # changed
        if origin is None:
            flush()
            text = message_text(item)
            if text:
                messages.append({"role": "user", "content": [_text_block(text)]})
            else:
                at.pop(id(item), None)
            continue
        if group and group[0][1][0] != origin[0]:
            flush()
        group.append((item, origin))
    flush()
    return messages, [at.get(id(item)) if item is not None else None for item in find]


def _same(view: MessagesView, group: list[tuple[Item, Origin]], item: Item) -> bool:
    """Whether ``item`` joins the group being written (it came from the same message)."""
    origin = view.origins.get(id(item))
    return origin is not None and origin[0] == group[0][1][0]


def _message_of(view: MessagesView, group: list[tuple[Item, Origin]]) -> Any:
    """One client message from its items: its own object when all came through unchanged."""
    m = group[0][1][0]
    message = view.messages[m]
    content = message.get("content")
    if not isinstance(content, list):
        return message
    blocks: dict[int, Any] = {}
    changed = False
    for item, (_, positions) in group:
        for b in positions:
            if b < 0:  # an item a step replaced: its block with the new content
                blocks[-1 - b] = _changed_block(item, content[-1 - b])
                changed = True
            else:
                blocks[b] = content[b]
    if not changed and len(blocks) == len(content):
        return message
    return {**message, "content": [blocks[b] for b in sorted(blocks)]}


def system_blocks(system: Any, added: Any) -> Any:
    """``system`` with the text steps appended to ``instructions`` as its last block."""
    if not isinstance(added, str) or not added:
        return system
    if isinstance(system, str):
        return [_text_block(system), _text_block(added)] if system else [_text_block(added)]
    blocks = list(system) if isinstance(system, list) else []
    return [*blocks, _text_block(added)]


# --- cache marks -----------------------------------------------------------------------------


def _markable(block: Any) -> bool:
    if not isinstance(block, dict):
        return False
    key = _MARKABLE.get(str(block.get("type")))
    return key is not None and bool(block.get(key))


def _last_markable(content: Any, upto: int | None = None) -> int | None:
    if not isinstance(content, list):
        return None
    last = len(content) - 1 if upto is None else min(upto, len(content) - 1)
    for b in range(last, -1, -1):
        if _markable(content[b]):
            return b
    return None


# Where a mark is wanted: a message's position (-1: ``system``), and the block it goes on or
# the last markable one before it (None: the message's last markable block).
Place = tuple[int, int | None]


def marks(
    system: Any, messages: list[Any], wanted: Sequence[Place | None],
) -> tuple[Any, list[Any]]:
    """``system`` and ``messages`` with a valid set of cache marks: the client's newest mark
    kept, then a mark at each place in ``wanted``, most wanted first, then the client's other
    marks newest first, never more than MAX_MARKS and none on an empty block. Only the
    blocks that change are copied.
    """
    own: list[tuple[int, int]] = []  # (message, block); message -1: system
    places = [(-1, system), *enumerate(messages)]
    for m, holder in places:
        content = holder if m == -1 else holder.get("content") if isinstance(holder, dict) else None
        if isinstance(content, list):
            own.extend((m, b) for b, block in enumerate(content)
                       if isinstance(block, dict) and MARK in block)
    style: Any = {"type": "ephemeral"}
    keep: list[tuple[int, int]] = []
    if own:
        newest = own[-1]
        style = _content(system, messages, newest[0])[newest[1]][MARK]
        if _markable(_content(system, messages, newest[0])[newest[1]]):
            keep.append(newest)
    messages = list(messages)
    for want in wanted:
        if want is None or len(keep) >= MAX_MARKS:
            continue
        m, upto = want
        message = messages[m] if m >= 0 else None
        if isinstance(message, dict) and isinstance(message.get("content"), str) and (
                message["content"]):  # a string's end is marked as its one text block
            messages[m] = {**message, "content": [_text_block(message["content"])]}
        at = _last_markable(_content(system, messages, m), upto)
        if at is not None and (m, at) not in keep:
            keep.append((m, at))
    for place in reversed(own):
        if len(keep) >= MAX_MARKS:
            break
        if place not in keep and _markable(_content(system, messages, place[0])[place[1]]):
            keep.append(place)
    chosen = set(keep)
    drop = [p for p in own if p not in chosen]
    add = [p for p in keep if p not in set(own)]
    if not drop and not add:
        return system, messages
    system = list(system) if isinstance(system, list) else system
    for m, b in drop + add:
        content = list(_content(system, messages, m))
        block = content[b]
        content[b] = ({k: v for k, v in block.items() if k != MARK} if (m, b) in drop
                      else {**block, MARK: style})
        if m == -1:
            system = content
        else:
            messages[m] = {**messages[m], "content": content}
    return system, messages


def _content(system: Any, messages: list[Any], m: int) -> Any:
    if m == -1:
        return system if isinstance(system, list) else []
    message = messages[m]
    return message.get("content") if isinstance(message, dict) else None
