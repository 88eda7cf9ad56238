"""Explicit prompt-cache breakpoints, for the models that cache a prompt only at one.

Such a model (OpenAI's gpt-5.6 and later) writes and reads its cache at the end of the
prompt and at up to three content parts marked ``prompt_cache_breakpoint``; a prefix that
ended at no breakpoint is never matched. A client like Codex marks nothing, so after the
window cuts, no earlier entry ends where the new prompt stops sharing bytes with the old
one. The proxy knows where its stable boundaries are: the end of the agent's context (the
same bytes for the whole session) and the end of the blocks it puts before the first
forwarded turn (the same bytes until the next cut). Marking them makes those prefixes
reusable; each mark lands on the same part with the same bytes on every request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ctxproxy.request import Exchange, Item, is_context, is_message

__all__ = [
    "MARK_KEY", "MAX_MARKS", "Breakpoints", "client_marks", "context_end", "place", "unmarked",
]

MARK_KEY = "prompt_cache_breakpoint"
MAX_MARKS = 3  # explicit marks a request may carry
_ACCEPTED = frozenset({"input_text", "input_image", "input_file"})
# What makes a part of each accepted type non-empty.
_FILLED = {
    "input_text": ("text",),
    "input_image": ("image_url", "file_id"),
    "input_file": ("file_id", "file_data", "file_url"),
}


def _parts(item: Any) -> list[Any]:
    content = item.get("content") if isinstance(item, dict) and is_message(item) else None
    return content if isinstance(content, list) else []


def _marked(part: Any) -> bool:
    return isinstance(part, dict) and MARK_KEY in part


def markable(item: Item) -> int | None:
    """The position of the message's last content part a mark may go on, or None."""
    parts = _parts(item)
    for at in range(len(parts) - 1, -1, -1):
        part = parts[at]
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in _ACCEPTED and any(part.get(key) for key in _FILLED[kind]):
            return at
    return None


def client_marks(items: Sequence[Item]) -> list[tuple[int, int]]:
    """(item, part) of every marked part, in input order."""
    return [(i, at) for i, item in enumerate(items)
            for at, part in enumerate(_parts(item)) if _marked(part)]


def context_end(items: Sequence[Item], head: int) -> int | None:
    """The last context message among ``items[:head]`` with a part a mark may go on."""
    for i in range(min(head, len(items)) - 1, -1, -1):
        if is_context(items[i]) and markable(items[i]) is not None:
            return i
    return None


def place(items: Sequence[Item], wanted: Sequence[int]) -> list[Item] | None:
    """``items`` with a mark at the last markable part of each item in ``wanted`` (most
    wanted first) while the marks stay within MAX_MARKS; the client's own marks are kept,
    its oldest left out when it sent more than MAX_MARKS. None when nothing changes."""
    own = client_marks(items)
    drop = own[: max(0, len(own) - MAX_MARKS)]
    room = MAX_MARKS - (len(own) - len(drop))
    marked_items = {i for i, _ in own}
    add: list[tuple[int, int]] = []
    for i in wanted:
        if room <= 0:
            break
        at = markable(items[i])
        if at is None or i in marked_items or any(i == j for j, _ in add):
            continue
        add.append((i, at))
        room -= 1
    if not add and not drop:
        return None
    out = list(items)
    for i, at in drop:
        out[i] = _with_part(out[i], at, {k: v for k, v in out[i]["content"][at].items()
                                        if k != MARK_KEY})
    for i, at in add:
        out[i] = _with_part(out[i], at, {**out[i]["content"][at], MARK_KEY: {"mode": "explicit"}})
    return out


def unmarked(item: Any) -> Any:
    """``item`` without breakpoint marks (the same object when it has none)."""
    if not isinstance(item, dict) or not any(_marked(part) for part in _parts(item)):
        return item
    content = [{k: v for k, v in part.items() if k != MARK_KEY} if _marked(part) else part
               for part in item["content"]]
    return {**item, "content": content}


def _with_part(item: Item, at: int, part: dict[str, Any]) -> Item:
    """A copy of the message with its content part ``at`` replaced (never in place: the
    item may be the client's, or a block the proxy resends on every request)."""
    content = list(item["content"])
    content[at] = part
    return {**item, "content": content}


class Breakpoints:
    """The step that marks the breakpoints, last in the pipeline (it reads where the window
    and memory steps put their blocks). Only for ``follows(model)``: every other request
    goes out as the earlier steps left it."""

    name = "breakpoints"

    def __init__(self, follows: Callable[[object], bool]) -> None:
        self._follows = follows

    async def __call__(self, ex: Exchange) -> None:
        items = ex.items
        if not ex.protocol.item_marks:
            return  # none (Chat), or its own (Messages' cache_control, set as written back)
        if not items or ex.history_is_foreign or not self._follows(ex.body.get("model")):
            return
        wanted: list[int] = []
        if ex.history.starts:  # the head before the first turn is forwarded as it came
            end = context_end(items, ex.history.starts[0])
            if end is not None:
                wanted.append(end)
        if ex.stable_blocks:
            last = ex.stable_blocks[-1]
            wanted.extend(i for i, item in enumerate(items) if item is last)
        marked = place(items, wanted)
        if marked is not None:
            ex.body = {**ex.body, "input": marked}
            ex.changed = True
