"""Observation masking: shorten old tool outputs to their head and tail, the call untouched.

Masking is a pure function of the output, the kept size and the fetch line an ``Archive``
gives for the output's call, so the same output always masks to the same bytes: requests
between two cuts stay byte-identical prefixes of each other and the provider's prompt cache
keeps working.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from request import Identity, Item, output_text

__all__ = [
    "OUTPUT_TYPES", "Archive", "Pointer", "mask_output", "mask_range", "mask_text",
    "output_text",
]

# The item types that carry a tool's output (function tools and freeform custom tools).
OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output"})

# A call_id to the shell command that fetches that call's whole output (None: no pointer).
Pointer = Callable[[str], str | None]


class Archive(Protocol):
    """Where masked outputs are kept whole, and the command that fetches one back.

    ``fetch_command`` must be a pure function of its arguments (the same line on every
    request, every replica, every restart): it is part of the forwarded bytes.
    """

    def fetch_command(self, identity: Identity, call_id: str) -> str | None: ...

    def keep(self, identity: Identity, call_id: str, text: str) -> None: ...


def _note(removed: int, fetch: str | None) -> str:
    if fetch is None:
        return f"\n[... ctxproxy removed {removed} characters of this output to save context ...]\n"
    # The command on a line of its own, so that it can be copied without the brackets.
    return (
        f"\n[... ctxproxy removed {removed} characters of this output to save context; "
        f"to read the whole output, run:\n{fetch}\n...]\n"
    )


def mask_text(text: str, keep_chars: int, fetch: str | None = None) -> str:
    """``text`` cut to its first and last ``keep_chars // 2`` characters and a note between.

    With ``fetch``, the note holds that command. Texts that masking would not make shorter
    come back unchanged.
    """
    half = max(keep_chars // 2, 0)
    removed = len(text) - 2 * half
    note = _note(removed, fetch)
    if removed <= len(note):
        return text
    tail = text[len(text) - half :] if half else ""
    return text[:half] + note + tail


def _shortens(text: str, keep_chars: int) -> bool:
    """Whether masking ``text`` (with the shortest note) would make it shorter."""
    removed = len(text) - 2 * max(keep_chars // 2, 0)
    return removed > len(_note(removed, None))


def _is_text_part(part: object) -> bool:
    return isinstance(part, dict) and isinstance(part.get("text"), str)


def mask_output(item: Item, keep_chars: int, pointer: Pointer | None = None) -> Item:
    """A copy of a tool-output item with its text masked; other items come back as they are.

    ``pointer`` is asked for the fetch line only when the output is long enough to mask.
    """
    if item.get("type") not in OUTPUT_TYPES:
        return item
    output = item.get("output")
    if isinstance(output, str):
        texts = [output]
    elif isinstance(output, list):
        texts = [part["text"] for part in output if _is_text_part(part)]
    else:
        return item
    if not any(_shortens(text, keep_chars) for text in texts):
        return item
    call_id = item.get("call_id")
    fetch = pointer(call_id) if pointer is not None and isinstance(call_id, str) else None
    if isinstance(output, str):
        masked = mask_text(output, keep_chars, fetch)
        return item if masked == output else {**item, "output": masked}
    # Content parts (text and images): mask the text parts, keep the rest as they are.
    parts = [
        {**part, "text": mask_text(part["text"], keep_chars, fetch)} if _is_text_part(part)
        else part
        for part in output
    ]
    return item if parts == output else {**item, "output": parts}


def mask_range(
    items: list[Item], start: int, end: int, keep_chars: int, pointer: Pointer | None = None
) -> list[Item]:
    """Mask the tool outputs in ``items[start:end]`` in place; returns the items replaced.

    ``items`` must be the caller's own list: the client's items are never modified, changed
    ones are replaced by copies (the originals, whole, are what this returns).
    """
    replaced = []
    for i in range(max(start, 0), min(end, len(items))):
        masked = mask_output(items[i], keep_chars, pointer)
        if masked is not items[i]:
            replaced.append(items[i])
            items[i] = masked
    return replaced
