"""Observation masking: shorten old tool outputs to their head and tail, the call untouched.

Masking is a pure function of the output text and the kept size, so the same output always
masks to the same bytes: requests between two cuts stay byte-identical prefixes of each other
and the provider's prompt cache keeps working.
"""

from __future__ import annotations

from request import Item

# The item types that carry a tool's output (function tools and freeform custom tools).
OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output"})


def mask_text(text: str, keep_chars: int) -> str:
    """``text`` cut to its first and last ``keep_chars // 2`` characters and a note between.

    Texts that masking would not make shorter come back unchanged.
    """
    half = max(keep_chars // 2, 0)
    removed = len(text) - 2 * half
    note = f"\n[... ctxproxy removed {removed} characters of this output to save context ...]\n"
    if removed <= len(note):
        return text
    tail = text[len(text) - half :] if half else ""
    return text[:half] + note + tail


def mask_output(item: Item, keep_chars: int) -> Item:
    """A copy of a tool-output item with its text masked; other items come back as they are."""
    if item.get("type") not in OUTPUT_TYPES:
        return item
    output = item.get("output")
    if isinstance(output, str):
        masked = mask_text(output, keep_chars)
        return item if masked == output else {**item, "output": masked}
    if isinstance(output, list):
        # Content parts (text and images): mask the text parts, keep the rest as they are.
        parts = [
            {**part, "text": mask_text(part["text"], keep_chars)}
            if isinstance(part, dict) and isinstance(part.get("text"), str)
            else part
            for part in output
        ]
        return item if parts == output else {**item, "output": parts}
    return item


def mask_range(items: list[Item], start: int, end: int, keep_chars: int) -> int:
    """Mask the tool outputs in ``items[start:end]`` in place; returns how many changed.

    ``items`` must be the caller's own list: the client's items are never modified, changed
    ones are replaced by copies.
    """
    changed = 0
    for i in range(max(start, 0), min(end, len(items))):
        masked = mask_output(items[i], keep_chars)
        if masked is not items[i]:
            items[i] = masked
            changed += 1
    return changed
