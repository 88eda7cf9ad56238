"""The ``<earlier_turns>`` block: what the window cut, as the prompts, commands and answers.

Pure: the same turns give the same bytes, so the block stays put between two cuts and the
provider's prompt cache keeps it. Built with lxml: no prompt or command can close it early.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lxml import etree

__all__ = ["CutTurn", "render"]

TAG = "earlier_turns"
NOTE = ("Earlier turns of this session that ctxproxy left out of this request to save "
        "context: each prompt, the commands run, the answer and names their output showed, "
        "shortened. Rerun a command if you need its output.")
PROMPT_CHARS = 400
CALL_CHARS = 200
ANSWER_CHARS = 400
NAMES_CHARS = 1200
BRIEF_CHARS = 120
FULL_SHARE = 0.75  # of the budget, for turns shown with their commands; the rest in brief

# Characters XML 1.0 cannot carry at all; lxml refuses them, so they are dropped.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


@dataclass(frozen=True, slots=True)
class CutTurn:
    """One cut turn as the block shows it."""

    number: int  # from 1, as the session counts its turns
    prompt: str
    calls: tuple[tuple[str, str], ...]  # (tool name, what it was asked to do)
    answer: str
    names: tuple[str, ...] = ()  # paths and identifiers its outputs showed, newest last


def _clip(text: str, limit: int) -> str:
    text = _NOT_XML.sub("", " ".join(text[: limit * 4].split()))  # bounded work
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _brief(turn: CutTurn) -> etree._Element:
    """A turn in a line: its prompt's start and the names it used (older turns, when the
    budget has no room for their commands)."""
    el = etree.Element("turn", n=str(turn.number))
    etree.SubElement(el, "prompt").text = _clip(turn.prompt, BRIEF_CHARS)
    used = [w for _, args in turn.calls for w in args.split() if "/" in w or "_" in w]
    names = list(dict.fromkeys([*turn.names, *used]))
    if names:
        etree.SubElement(el, "seen").text = _clip(" ".join(names), NAMES_CHARS // 2)
    el.tail = "\n"
    return el


def _turn(turn: CutTurn, calls: Sequence[tuple[str, str]], skipped: int) -> etree._Element:
    el = etree.Element("turn", n=str(turn.number))
    etree.SubElement(el, "prompt").text = _clip(turn.prompt, PROMPT_CHARS)
    if skipped:
        etree.SubElement(el, "skipped", calls=str(skipped))
    for name, args in calls:
        etree.SubElement(el, "call", name=_clip(name, 60)).text = _clip(args, CALL_CHARS)
    if turn.answer:
        etree.SubElement(el, "answer").text = _clip(turn.answer, ANSWER_CHARS)
    if turn.names:
        etree.SubElement(el, "seen").text = _clip(" ".join(turn.names), NAMES_CHARS)
    el.tail = "\n"
    return el


def _size(el: etree._Element) -> int:
    return len(etree.tostring(el, encoding="unicode"))


def render(newest_first: Iterable[CutTurn], max_chars: int) -> str | None:
    """The block for the newest turns that fit in ``max_chars`` (a turn's oldest calls go
    first when it alone is too long), shown oldest first; None when nothing fits. Reads
    ``newest_first`` only as far as the budget goes."""
    root = etree.Element(TAG, note=NOTE)
    root.text = "\n"
    used = _size(root)
    shown: list[etree._Element] = []
    full = True
    for turn in newest_first:
        el = None
        if full:
            calls = list(turn.calls)
            el = _turn(turn, calls, 0)
            while _size(el) + used > max_chars * FULL_SHARE and calls:
                calls = calls[max(len(calls) // 4, 1):]  # the newest calls stay
                el = _turn(turn, calls, len(turn.calls) - len(calls))
            if _size(el) + used > max_chars * FULL_SHARE:
                full, el = False, None
        if el is None:
            el = _brief(turn)
            if _size(el) + used > max_chars:
                break
        used += _size(el)
        shown.append(el)
    if not shown:
        return None
    for el in reversed(shown):
        root.append(el)
    return str(etree.tostring(root, encoding="unicode"))
