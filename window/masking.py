"""Observation masking: shorten old tool outputs to their head and tail, the call untouched.

Masking is a pure function of the output, the kept size and the fetch line an ``Archive``
gives for the output, so the same output always masks to the same bytes: requests between two
cuts stay byte-identical prefixes of each other and the provider's prompt cache keeps working.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ctxproxy.request import Identity, Item, output_text

__all__ = [
    "OUTPUT_TYPES", "Archive", "Output", "Pointer", "mask_output", "mask_range", "mask_text",
    "output_text",
]

# The item types that carry a tool's output (function tools and freeform custom tools).
OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output"})

# An output item and its place (its index in the list being masked) to the shell command that
# fetches it whole (None: no pointer).
Pointer = Callable[[int, Item], str | None]


@dataclass(frozen=True, slots=True)
class Output:
    """One tool output, as its fetch line names it.

    Not by its ``call_id`` alone: clients that number calls per turn send ``call_1`` in many
    turns. Its place and its text's digest tell two such outputs apart (an id never fetches
    another output's text); both stay the same on every request between cuts, as the client's
    history only grows.
    """

    place: int  # its index in the client's input
    call_id: str
    digest: str  # SHA-256 of its whole text

    @classmethod
    def of(cls, place: int, item: Item) -> Output | None:
        """The output ``item`` at ``place``; None when it has no call_id to go by."""
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            return None
        text = output_text(item).encode("utf-8", "surrogatepass")
        return cls(place, call_id, hashlib.sha256(text).hexdigest())


class Archive(Protocol):
    """Where masked outputs are kept whole, and the command that fetches one back.

    ``fetch_command`` must be a pure function of its arguments (the same line on every
    request, every replica, every restart): it is part of the forwarded bytes.
    """

    def fetch_command(self, identity: Identity, output: Output) -> str | None: ...

    def keep(self, identity: Identity, output: Output, text: str) -> None: ...


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


def mask_output(
    item: Item, keep_chars: int, pointer: Pointer | None = None, place: int = 0
) -> Item:
    """A copy of a tool-output item with its text masked; other items come back as they are.

    ``pointer`` is asked for the fetch line (with ``place``) only when the output is long
    enough to mask.
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
    fetch = pointer(place, item) if pointer is not None else None
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
) -> list[tuple[int, Item]]:
    """Mask the tool outputs in ``items[start:end]`` in place; returns the items replaced,
    each with its index. ``pointer`` is asked with an item's index in ``items``.

    ``items`` must be the caller's own list: the client's items are never modified, changed
    ones are replaced by copies (the originals, whole, are what this returns).
    """
    replaced = []
    for i in range(max(start, 0), min(end, len(items))):
        masked = mask_output(items[i], keep_chars, pointer, i)
        if masked is not items[i]:
            replaced.append((i, items[i]))
            items[i] = masked
    return replaced
