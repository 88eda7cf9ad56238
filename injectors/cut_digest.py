"""The ``<earlier_turns>`` block: what the window cut, as a map of its prompts and names.

Pure: the same turns give the same bytes, so the block stays put between two cuts and the
provider's prompt cache keeps it. Built with lxml: no prompt or command can close it early.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from lxml import etree

__all__ = ["CutTurn", "render"]

TAG = "earlier_turns"
NOTE = ("Earlier turns of this session that ctxproxy left out of this request to save "
        "context: the start of each prompt and the paths and names its commands used. Rerun "
        "a command if you need its output.")
PROMPT_CHARS = 120
NAMES_CHARS = 3000  # of one turn

# Characters XML 1.0 cannot carry at all; lxml refuses them, so they are dropped.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


@dataclass(frozen=True, slots=True)
class CutTurn:
    """One cut turn as the block shows it."""

    number: int  # from 1, as the session counts its turns
    prompt: str
    names: tuple[str, ...] = ()  # paths and identifiers it used, newest last


def _clip(text: str, limit: int) -> str:
    text = _NOT_XML.sub("", " ".join(text[: limit * 4].split()))  # bounded work
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _fit(names: Iterable[str], limit: int, told: set[str]) -> list[str]:
    """The names not yet told, newest first, whole, within ``limit``."""
    out: list[str] = []
    used = 0
    for name in names:
        if name in told:
            continue
        if used + len(name) + 1 > limit:
            break
        out.append(name)
        used += len(name) + 1
    return out


def _turn(turn: CutTurn, told: set[str]) -> tuple[etree._Element, list[str]]:
    """A turn as its prompt's start and the names it used that no newer turn told: a map of
    what the session touched. Commands and answers cost more than they bring back (the
    measure: bench/RESULTS.md, Real agent runs)."""
    el = etree.Element("turn", n=str(turn.number))
    etree.SubElement(el, "prompt").text = _clip(turn.prompt, PROMPT_CHARS)
    names = _fit(reversed(turn.names), NAMES_CHARS, told)
    if names:
        etree.SubElement(el, "seen").text = _NOT_XML.sub("", " ".join(names))
    el.tail = "\n"
    return el, names


def _size(el: etree._Element) -> int:
    return len(etree.tostring(el, encoding="unicode"))


def render(newest_first: Iterable[CutTurn], max_chars: int) -> str | None:
    """The block for the newest turns that fit in ``max_chars``, shown oldest first; None
    when nothing fits. A name is told once, with the newest turn that used it. Reads
    ``newest_first`` only as far as the budget goes."""
    root = etree.Element(TAG, note=NOTE)
    root.text = "\n"
    used = _size(root)
    shown: list[etree._Element] = []
    told: set[str] = set()
    for turn in newest_first:
        el, names = _turn(turn, told)
        if _size(el) + used > max_chars:
            break
        told.update(names)
        used += _size(el)
        shown.append(el)
    if not shown:
        return None
    for el in reversed(shown):
        root.append(el)
    return str(etree.tostring(root, encoding="unicode"))
