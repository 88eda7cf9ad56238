"""The history window: keep the agent's context and the last N user turns, cut the rest.

Pure functions over the Responses API ``input`` list. A *turn* starts at a user message that
is a real prompt (not one of Codex's context messages) and runs to the next one. Context is
pinned wherever it stands; a turn's reasoning, calls, outputs and unknown items move with it;
items linked by ``call_id`` are kept or cut together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

Item = dict[str, Any]

# Codex's user-role messages that carry context, not a prompt
# (../shared/fixtures/codex/README.md).
CONTEXT_MARKERS = (
    "<environment_context>",
    "# AGENTS.md instructions",
    "You are performing a CONTEXT CHECKPOINT COMPACTION",
    "Another language model started to solve this problem",
    "<user_instructions>",
)
SYSTEM_ROLES = frozenset({"system", "developer"})


@dataclass(frozen=True, slots=True)
class WindowResult:
    """What the window did: the items to forward and the items it cut, both in input order."""

    items: list[Item]
    cut: list[Item] = field(default_factory=list)
    turns_in: int = 0
    turns_kept: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.cut)


def message_text(item: Item) -> str:
    """The concatenated text of a message item's content ('' for anything else)."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = []
    for part in content:
        if isinstance(part, dict):
            text = part.get("text")
            if isinstance(text, str):
                parts.append(text)
    return "\n".join(parts)


def _first_text(item: Item) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                return str(part["text"])
    return ""


def is_message(item: Item) -> bool:
    # The Responses API accepts EasyInputMessage items without a "type".
    return item.get("type", "message") == "message" and "role" in item


def is_context(item: Item) -> bool:
    """A message of the agent's context: system, developer, or a user-role context message."""
    if not is_message(item):
        return item.get("type") == "additional_tools"
    role = item.get("role")
    if role in SYSTEM_ROLES:
        return True
    return role == "user" and _first_text(item).lstrip().startswith(CONTEXT_MARKERS)


def is_turn_start(item: Item) -> bool:
    """A user message that is a real prompt."""
    return is_message(item) and item.get("role") == "user" and not is_context(item)


def turn_starts(items: Sequence[Item]) -> list[int]:
    return [i for i, item in enumerate(items) if isinstance(item, dict) and is_turn_start(item)]


def turns_to_drop(turns: int, keep: int, slack: int = 0) -> int:
    """How many of the oldest turns to cut.

    With slack, the cut point moves in steps of ``slack + 1`` turns, so the forwarded prefix
    changes once per step instead of on every turn (a warmer provider prompt cache). It is a
    function of the turn count alone: the proxy keeps no state, and windowing a windowed
    history changes nothing.
    """
    excess = turns - keep
    if excess <= 0:
        return 0
    step = slack + 1
    if step == 1:
        return excess
    drop = (excess // step) * step
    return drop


def window(items: Sequence[Item], keep: int, slack: int = 0) -> WindowResult:
    """Cut ``items`` down to the context plus the last turns; see the module docstring."""
    if not all(isinstance(item, dict) for item in items):
        raise TypeError("input items must be objects")
    starts = turn_starts(items)
    drop = turns_to_drop(len(starts), keep, slack)
    if drop == 0:
        return WindowResult(list(items), [], len(starts), len(starts))

    boundary = starts[drop]  # index of the first kept turn's user message
    first = starts[0]
    keep_mask = [i < first or i >= boundary or is_context(item) for i, item in enumerate(items)]

    # Calls and their outputs travel together: if any item of a call_id is kept, keep all.
    kept_calls = {
        item["call_id"]
        for item, kept in zip(items, keep_mask, strict=True)
        if kept and isinstance(item.get("call_id"), str)
    }
    for i, item in enumerate(items):
        if not keep_mask[i] and item.get("call_id") in kept_calls:
            keep_mask[i] = True

    kept = [item for item, k in zip(items, keep_mask, strict=True) if k]
    cut = [item for item, k in zip(items, keep_mask, strict=True) if not k]
    return WindowResult(kept, cut, len(starts), len(starts) - drop)
