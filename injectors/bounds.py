"""The per-record cap: every text the memory side scans is cut to a bounded size first.

The head and the tail are kept (a long paste usually says what it is at the start and what
came of it at the end); the middle is dropped and the cut is marked, so that the work of every
pattern and rule behind it is bounded by the cap, whatever a request carries.
"""

from __future__ import annotations

__all__ = ["RECORD_CHARS", "WHITESPACE", "clip", "cut_mark", "ends", "whole_words"]

RECORD_CHARS = 64_000  # as memory.turns.TURN_CHARS: a rendered turn is never cut twice
_HEAD = 3 / 4  # of what is kept; the rest is the tail
WHITESPACE = " \t\n\r"


def cut_mark(length: int) -> str:
    """The line that stands for the middle of a text of ``length`` characters."""
    return f"\n[… cut from the middle of {length} characters …]\n"


def ends(text: str, limit: int, mark: str) -> tuple[str, str]:
    """The head and the tail of ``text`` that ``clip`` keeps around ``mark``."""
    room = max(limit - len(mark), 0)
    head = int(room * _HEAD)
    tail = room - head
    return text[:head], text[len(text) - tail :] if tail else ""


def clip(text: str, limit: int = RECORD_CHARS, *, mark: str | None = None) -> str:
    """``text`` if it has at most ``limit`` characters, else its head and its tail joined by
    ``mark`` (by default ``cut_mark``), at most ``limit`` characters in all."""
    if len(text) <= limit:
        return text
    mark = cut_mark(len(text)) if mark is None else mark
    head, tail = ends(text, limit, mark)
    return head + mark[:limit] + tail


def whole_words(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its first ``limit`` without the
    word the cut splits: half a key is still a secret, and no rule knows it for one."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    return head[: max(head.rfind(c) for c in WHITESPACE) + 1]
