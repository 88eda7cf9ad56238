"""The ``<earlier_turns>`` block: what the window cut, as a map of the names its turns used.

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
NOTE = ("Earlier turns of this session that ctxproxy left out of this request: the newest "
        "one's prompt, and the paths and names they used, most used first. Rerun a command to "
        "see its output again.")
PROMPT_CHARS = 120

# Characters XML 1.0 cannot carry at all; lxml refuses them, so they are dropped.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


@dataclass(frozen=True, slots=True)
class CutTurn:
    """One cut turn as the block reads it."""

    number: int  # from 1, as the session counts its turns
    prompt: str
    names: tuple[str, ...] = ()  # paths and identifiers it used, newest last
    uses: tuple[int, ...] = ()  # for each name, how many of the turn's texts used it


def _clip(text: str, limit: int) -> str:
    text = _NOT_XML.sub("", " ".join(text[: limit * 4].split()))  # bounded work
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _ranked(turns: list[CutTurn]) -> list[str]:
    """Every name, those most turns used first, then those most of their texts used, then
    the newest: what later turns go back to is what earlier ones kept going back to (chosen
    on two repositories' runs and checked on a third: bench/RESULTS.md, Real agent runs)."""
    score: dict[str, tuple[int, int, int]] = {}
    for turn in turns:  # oldest first: a newer turn's use is the newest
        uses = turn.uses or (1,) * len(turn.names)
        for place, (name, count) in enumerate(zip(turn.names, uses, strict=True)):
            in_turns, in_texts, _ = score.get(name, (0, 0, 0))
            score[name] = (in_turns + 1, in_texts + count, turn.number * 1024 + place)
    return sorted(score, key=lambda name: tuple(-v for v in score[name]))


def render(newest_first: Iterable[CutTurn], max_chars: int) -> str | None:
    """The block for the cut turns ``newest_first``: the newest one's prompt, then their
    names, ranked, as many as fit in ``max_chars``; a name inside one already told
    (``query.py`` in ``db/query.py``) is not told again. None when the block's own tags and
    that prompt do not fit."""
    turns = sorted(newest_first, key=lambda t: t.number)
    if not turns:
        return None
    root = etree.Element(TAG, note=NOTE)
    root.text = "\n"
    # The newest cut turn's prompt: what the session was on before this turn.
    newest = etree.SubElement(root, "turn", n=str(turns[-1].number))
    newest.text, newest.tail = _clip(turns[-1].prompt, PROMPT_CHARS), "\n"
    seen = etree.SubElement(root, "seen", turns=f"{turns[0].number}-{turns[-1].number}")
    seen.text, seen.tail = "-", "\n"
    room = max_chars - len(etree.tostring(root, encoding="unicode"))
    told: list[str] = []
    for name in _ranked(turns):
        # Names are words, dots, slashes and dashes (window.digest): nothing XML escapes.
        name = _NOT_XML.sub("", name)
        if not name or len(name) + 1 > room or any(name in other for other in told):
            continue
        inside = [other for other in told if other in name]  # told by this one now
        told = [other for other in told if other not in inside]
        told.append(name)
        room += sum(len(other) + 1 for other in inside) - len(name) - 1
    if room < 0:
        return None  # not even the block's own tags fit
    if told:
        seen.text = " ".join(told)
    else:
        root.remove(seen)
    return str(etree.tostring(root, encoding="unicode"))
