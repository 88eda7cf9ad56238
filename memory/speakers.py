"""Who said a line: the speakers of a transcript a memory holds, and which of them a
question names.

A turn may carry a conversation ("[3 March, 2023] Ada: ..." one line per utterance, or
"Ada: ..." alone). A question that names one of its speakers ("what did Ada ...") asks what
that speaker said: when no line of theirs holds the question's other words, only a reply
of another's that echoes them ("Thanks, Ada! ..."), the question is about something the
memory does not say (memory.recall's gate). So it is too when the lines holding its words
speak of another's things: another's "I ran a race", the named one's "your race"
(``persons_of``, ``Said``). Pure, linear in the text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import NamedTuple

from ctxproxy.memory.turns import INDENT
from ctxproxy.memory.words import WORD

__all__ = ["FIRST", "SECOND", "Said", "labelled", "named", "of_others", "persons_of", "speakers_of",
           "stated"]

# An optional bracketed stamp, then one to three capitalised words and ': '. Bounded
# repetitions, anchored where the line's own text starts: linear.
_SPEAKER = re.compile(
    r"(?:\[[^\]\n]{1,40}\] ?)?([A-Z][\w'.-]{0,30}(?: [A-Z][\w'.-]{0,30}){0,2}): ")


def speakers_of(lines: Sequence[str], starts: Sequence[int]) -> tuple[frozenset[str] | None, ...]:
    """For each line, the words of who said it (lower case), or None; ``starts``: where each
    line's own text starts (after its entry's label or indent). Only in an entry (a line not
    indented and its indented lines, memory.turns.render) that is a dialogue: lines said by
    two speakers at least. "User: Remember: ..." then "Assistant: Done: ..." are no
    dialogue, nor is a lone "Note: " line of a tool's output."""
    found = labelled(lines, starts)
    out: list[frozenset[str] | None] = [None] * len(lines)
    head = 0
    for n in range(len(lines) + 1):
        if n == len(lines) or not lines[n].startswith(INDENT):
            if len({s for s in found[head:n] if s}) >= 2:
                out[head:n] = found[head:n]
            head = n
    return tuple(out)


def labelled(lines: Sequence[str], starts: Sequence[int]
             ) -> tuple[frozenset[str] | None, ...]:
    """For each line, the words of the speaker its label names ("[date] Ada: ..."), or None,
    whether or not its entry is a dialogue (``speakers_of``)."""
    out: list[frozenset[str] | None] = []
    for line, start in zip(lines, starts, strict=True):
        match = _SPEAKER.match(line, start)
        out.append(frozenset(WORD.findall(match.group(1).lower())) if match else None)
    return tuple(out)


def named(speakers: Sequence[frozenset[str] | None], words: AbstractSet[str],
          query: str) -> frozenset[str]:
    """The ``words`` of a question that name a speaker of the text, written with a capital
    in ``query`` as names are ("what did Ada say", not "what did the note say")."""
    said = frozenset().union(*(s for s in speakers if s)) & words
    if not said:
        return frozenset()
    capital = {m.group().lower() for m in WORD.finditer(query) if m.group()[0].isupper()}
    return frozenset(said & capital)



FIRST, SECOND = 1, 2  # a line speaks in the first person, in the second
_FIRST = re.compile(r"\b(?:i|me|my|mine|myself|we|us|our|ours)\b")
_SECOND = re.compile(r"\b(?:you|your|yours|yourself|yourselves)\b")


def persons_of(low_lines: Sequence[str], speakers: Sequence[frozenset[str] | None]
               ) -> tuple[int, ...]:
    """For each line said by a speaker (``speakers_of``), FIRST | SECOND as it holds a word
    of the first person ("I", "my", ...) and of the second ("you", ...); 0 for another line.
    ``low_lines``: the lines in lower case."""
    return tuple(
        (FIRST if _FIRST.search(line) else 0) | (SECOND if _SECOND.search(line) else 0)
        if speaker else 0
        for line, speaker in zip(low_lines, speakers, strict=True))


class Said(NamedTuple):
    """How a dialogue's lines hold a question's words (its words but the speakers it names):
    the best share one line holds, by who said it and of whose things it speaks."""

    said: float  # a line the named speaker said
    other: float  # a line another speaker said
    own: float  # a line about the named speaker's own: theirs in the first person, or
    # another's in the second ("I ran a race" said by them, "your race" said to them)
    others_own: float  # a line about another's own: the reverse
    # The share the best of the speakers' lines holds, and whether every line holding that
    # much speaks of another's things only (another's "I", the named one's "you"): the
    # question's words are most at home in another's story.
    best: float = 0.0
    best_others: bool = False


def of_others(theirs: bool, person: int) -> bool:
    """A line said by the named speaker (``theirs``) or another, in ``person``
    (``persons_of``), speaks of another's things only: the named one's "you" without an
    "I", another's "I" without a "you". A line with both, or neither, is nobody's."""
    return person == (SECOND if theirs else FIRST)


# Where a sentence ends: after '.', '!' or '?' and before white space. A lookbehind of one
# character: linear.
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+")


def stated(line: str) -> str:
    """``line`` without its questions (sentences that end with '?'): what its speaker asks
    is no fact of theirs. "Were the kids upset by the crash?" asked by Ada says nothing of
    Ada's crash; a question that names Ada and holds those words asks about another's."""
    if "?" not in line:
        return line
    return " ".join(s for s in _SENTENCE_BREAK.split(line) if not s.rstrip().endswith("?"))
