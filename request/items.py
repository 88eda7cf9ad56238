"""What the items of a Responses ``input`` list are: the one place that tells a prompt from
the agent's context, and a compaction from an ordinary turn.

The markers come from what Codex CLI 0.169.0 sends (``../shared/fixtures/codex/README.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "COMPACTION_MARKERS", "CONTEXT_MARKERS", "Item", "call_pairs", "is_compaction_message",
    "is_context", "is_message", "is_turn_start", "message_text", "output_text",
    "prompt_message",
]

Item = dict[str, Any]

# Codex's compaction prompt, and the summary message that replaces a compacted history.
COMPACTION_MARKERS = (
    "You are performing a CONTEXT CHECKPOINT COMPACTION",
    "Another language model started to solve this problem",
)
# User-role messages that carry the agent's context, not a prompt.
CONTEXT_MARKERS = (
    "<environment_context>",
    "# AGENTS.md instructions",
    "<user_instructions>",
    *COMPACTION_MARKERS,
)
SYSTEM_ROLES = frozenset({"system", "developer"})


def prompt_message(text: str) -> Item:
    """The user message a string ``input`` stands for (the Responses API reads it so)."""
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def message_text(item: Item) -> str:
    """The concatenated text of a message item's content ('' for anything else)."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(
        part["text"] for part in content
        if isinstance(part, dict) and isinstance(part.get("text"), str)
    )


def output_text(item: Item) -> str:
    """A tool output's whole text: the string, or its non-empty text parts, one a line."""
    output = item.get("output")
    if isinstance(output, str):
        return output
    if not isinstance(output, list):
        return ""
    return "\n".join(
        part["text"] for part in output
        if isinstance(part, dict) and isinstance(part.get("text"), str) and part["text"]
    )


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


def _user_starts_with(item: Item, markers: tuple[str, ...]) -> bool:
    return item.get("role") == "user" and _first_text(item).lstrip().startswith(markers)


def is_context(item: Item) -> bool:
    """A message of the agent's context: system, developer, or a user-role context message."""
    if not is_message(item):
        return item.get("type") == "additional_tools"
    role = item.get("role")
    return (isinstance(role, str) and role in SYSTEM_ROLES) or _user_starts_with(
        item, CONTEXT_MARKERS
    )


def is_compaction_message(item: Item) -> bool:
    """Codex's compaction prompt or the summary a compaction left in the history."""
    return is_message(item) and _user_starts_with(item, COMPACTION_MARKERS)


def is_turn_start(item: Item) -> bool:
    """A user message that is a real prompt."""
    return is_message(item) and item.get("role") == "user" and not is_context(item)


def call_pairs(items: Sequence[Item]) -> dict[int, int]:
    """Each tool call's output: the position of a call to that of the nearest output after it
    with its ``call_id`` (an output answers the latest call of its id still unanswered).

    Not a map by ``call_id`` alone: some clients number calls per turn or per response
    (``call_1`` again and again), and an id then names a call of every turn.
    """
    pairs: dict[int, int] = {}
    unanswered: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        call_id = item.get("call_id")
        if type(call_id) is not str:
            continue
        kind = item.get("type")
        if type(kind) is str and kind.endswith("_output"):
            calls = unanswered.get(call_id)
            if calls:
                pairs[calls.pop()] = i
        else:
            unanswered.setdefault(call_id, []).append(i)
    return pairs
