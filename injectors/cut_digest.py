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
NAMES_CHARS = 3000
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


def _fit(names: Iterable[str], limit: int, told: set[str], shown: str) -> list[str]:
    """The names not yet told and not in ``shown``, newest first, whole, within ``limit``."""
    out: list[str] = []
    used = 0
    for name in names:
        if name in told or name in shown:
            continue
        if used + len(name) + 1 > limit:
            break
        out.append(name)
        used += len(name) + 1
    return out


def _seen(el: etree._Element, names: list[str]) -> etree._Element:
    if names:
        etree.SubElement(el, "seen").text = _NOT_XML.sub("", " ".join(names))
    el.tail = "\n"
    return el


def _brief(turn: CutTurn, told: set[str]) -> tuple[etree._Element, list[str]]:
    """A turn in a line: its prompt's start and the names it used (older turns, when the
    budget has no room for their commands)."""
    el = etree.Element("turn", n=str(turn.number))
    etree.SubElement(el, "prompt").text = _clip(turn.prompt, BRIEF_CHARS)
    names = _fit(reversed(turn.names), NAMES_CHARS // 2, told, "")
    return _seen(el, names), names


def _turn(
    turn: CutTurn, calls: Sequence[tuple[str, str]], skipped: int, told: set[str]
) -> tuple[etree._Element, list[str]]:
    el = etree.Element("turn", n=str(turn.number))
    etree.SubElement(el, "prompt").text = _clip(turn.prompt, PROMPT_CHARS)
    if skipped:
        etree.SubElement(el, "skipped", calls=str(skipped))
    for name, args in calls:
        etree.SubElement(el, "call", name=_clip(name, 60)).text = _clip(args, CALL_CHARS)
    if turn.answer:
        etree.SubElement(el, "answer").text = _clip(turn.answer, ANSWER_CHARS)
    names = _fit(reversed(turn.names), NAMES_CHARS, told, etree.tostring(el, encoding="unicode"))
    return _seen(el, names), names


def _size(el: etree._Element) -> int:
    return len(etree.tostring(el, encoding="unicode"))


def render(newest_first: Iterable[CutTurn], max_chars: int) -> str | None:
    """The block for the newest turns that fit in ``max_chars`` (a turn's oldest calls go
    first when it alone is too long), shown oldest first; None when nothing fits. A name is
    told once, with the newest turn that used it. Reads ``newest_first`` only as far as the
    budget goes."""
    root = etree.Element(TAG, note=NOTE)
    root.text = "\n"
    used = _size(root)
    shown: list[etree._Element] = []
    told: set[str] = set()
    full = True
    for turn in newest_first:
        made = None
        if full:
            calls = list(turn.calls)
            made = _turn(turn, calls, 0, told)
            while _size(made[0]) + used > max_chars * FULL_SHARE and calls:
                calls = calls[max(len(calls) // 4, 1):]  # the newest calls stay
                made = _turn(turn, calls, len(turn.calls) - len(calls), told)
            if _size(made[0]) + used > max_chars * FULL_SHARE:
                full, made = False, None
        if made is None:
            made = _brief(turn, told)
            if _size(made[0]) + used > max_chars:
                break
        el, names = made
        told.update(names)
        used += _size(el)
        shown.append(el)
    if not shown:
        return None
    for el in reversed(shown):
        root.append(el)
    return str(etree.tostring(root, encoding="unicode"))
