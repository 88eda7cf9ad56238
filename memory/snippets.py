"""Snippets: the lines of a long memory that a question asks about.

A long memory (an episode with whole tool outputs) is shown as the lines a question needs,
each with the call that printed it, so that a recalled turn costs tens of tokens, not
thousands. Recall logic, pure.
"""

from __future__ import annotations

import math
import re
import threading
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import accumulate

from cachetools import LRUCache

from ctxproxy.injectors import tokens
from ctxproxy.memory.speakers import (
    FIRST,
    SECOND,
    Said,
    labelled,
    named,
    of_others,
    persons_of,
    speakers_of,
    stated,
)
from ctxproxy.memory.turns import ASSISTANT, CALL, INDENT, OUTPUT, UNNAMED, USER
from ctxproxy.memory.words import WORD, terms

__all__ = [
    "GAP", "SNIPPET_TOKENS", "Snippet", "best_match", "line_matches", "lines_of", "said_match",
    "snippet", "stamps_once", "voices",
]

# What one recalled memory may take at most: fewer, longer snippets found more evidence for
# their tokens than more, shorter ones (bench/RESULTS.md, LoCoMo).
SNIPPET_TOKENS = 250
MAX_LINES = 4  # matching lines a snippet shows at most (each with the call that printed it)
LINE_CHARS = 240  # a shown line longer than this is cut around its first matching word
GAP = INDENT + "…"


def _cut(line: str, words: Sequence[str]) -> str:
    """``line`` within about LINE_CHARS: its start, or when the earliest of ``words`` it holds
    stands further in, its head ("Tool call NAME: " or the indent) and the stretch around
    that word."""
    if len(line) <= LINE_CHARS:
        return line
    lower = line.lower()
    at = min((p for p in (lower.find(w) for w in words) if p >= 0), default=0)
    if at < LINE_CHARS * 2 // 3:
        return line[: LINE_CHARS - 1] + "…"
    lead = INDENT if line.startswith(INDENT) else line.split(": ", 1)[0][:60] + ": "
    start = at - LINE_CHARS // 3
    return lead + "…" + line[start : start + LINE_CHARS - len(lead) - 2] + "…"


def _contexts(lines: Sequence[str]) -> list[int | None]:
    """For each line, the line that says where it comes from: for a line of a tool's output
    (its first line too, which heads the output's entry) the call that printed it, for
    another continuation line its entry's head; None for another head (a line that is not
    indented) itself."""
    out: list[int | None] = []
    head = call = 0
    for n, line in enumerate(lines):
        if not line.startswith(INDENT):
            # Render puts each output right after its call: the call is the entry before.
            output = line.startswith(f"{OUTPUT} ")
            call = head if output else n
            head = n
            out.append(call if output and lines[call].startswith(f"{CALL} ") else None)
        else:
            out.append(call if lines[call].startswith(f"{CALL} ") else head)
    return out


@dataclass(frozen=True, slots=True)
class Snippet:
    """What a recall block shows of a memory for one question, and how well it matches."""

    text: str
    match: float  # the share of the question's words its best line holds (with its call)


_NONE: frozenset[str] = frozenset()
CLIPPED_ECHO_CHARS = 40  # a clipped line this long names the line it was cut from


def _line_words(text: str, wanted: AbstractSet[str]) -> list[frozenset[str]]:
    """For each line of ``text``, the ``wanted`` words it holds."""
    return _words_by_line(_parse(text), wanted)


def _words_by_line(
    parsed: _Text, wanted: AbstractSet[str], echoed: AbstractSet[str] = _NONE
) -> list[frozenset[str]]:
    """For each line of ``parsed``, the ``wanted`` words it holds; none for a line that is one
    of the question's own (``echoed``: its lines, lowered and stripped): the question has it
    in view already, so it says nothing about what the question needs."""
    out = [_NONE] * len(parsed.lines)
    found: dict[int, set[str]] = {}
    if len(wanted) <= FIND_WORDS or (parsed.index is None and not parsed.asked_long):
        parsed.asked_long = parsed.asked_long or len(wanted) > FIND_WORDS
        lines_with = parsed.lines_with
    else:
        index = _indexed(parsed)
        lines_with = lambda word: index.get(word, ())  # noqa: E731
    for word in wanted:
        for n in lines_with(word):
            found.setdefault(n, set()).add(word)
    low_lines, labels = parsed.low_lines, parsed.labels
    for n, words in found.items():
        if not echoed or not _echoes(low_lines[n][labels[n]:].strip(), echoed):
            out[n] = frozenset(words)
    return out


def _echoes(line: str, echoed: AbstractSet[str]) -> bool:
    """Whether ``line`` is one of the ``echoed`` lines, or the start of one that memory
    clipped (a long prompt is stored up to a length: its last line ends in '…')."""
    if line in echoed:
        return True
    stem = line[:-1] if line.endswith("…") else ""
    return len(stem) >= CLIPPED_ECHO_CHARS and any(e.startswith(stem) for e in echoed)


# The labels memory.turns.render starts an entry's line with (lowered): our words, not the
# turn's, so a question's "tool" or "user" does not match every entry by them.
_LABELS = tuple(label.lower() for label in (
    f"{USER}: ", f"{ASSISTANT}: ", f"{OUTPUT} {UNNAMED}: ", f"{CALL} ", f"{OUTPUT} "))


def _label_chars(line: str) -> int:
    """How many characters at the start of ``line`` are an entry's label."""
    if not line.startswith(_LABELS):  # most lines (one check, in C)
        return 0
    return next((len(label) for label in _LABELS if line.startswith(label)), 0)


# Recall shows the same memories turn after turn (a session's candidates change little
# between its turns), each for a new question: what a text's lines are does not depend on
# the question, so it is worked out once per text. Bounded by an estimate of the bytes held;
# the lock because recall runs in worker threads.
MEMO_BYTES = 32 * 1024 * 1024
WORDS_PER_TEXT = 64  # the words a parsed text remembers the lines of, at most
WORD_CHARS = 64  # and each of them this long at most (a longer one is looked for each time)
# A question of up to this many words finds each in the text (str.find, in C). So does the
# first longer one (a task's prompt: up to terms' 64 words) a text is asked; from the second
# on, each word's lines are read off an index of the text, built once: a find per word costs
# a pass over the text for each word, again for every new question, and the index about as
# much as one question's finds.
FIND_WORDS = 16
INDEX_WORD_BYTES = 200  # what the index holds per word of the text, about


class _Text:
    """What snippets read of a text whatever the question: its lines, the line each comes
    from (``_contexts``), their labels, and the lines each word asked about stands in (as a
    whole word, after the label), remembered as questions ask."""

    __slots__ = ("_words", "asked_long", "contexts", "index", "labels", "lines", "low",
                 "low_lines", "persons", "size", "speakers", "starts", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.index: dict[str, tuple[int, ...]] | None = None  # every word's lines, on demand
        self.asked_long = False  # by a question longer than FIND_WORDS
        self.lines = tuple(text.split("\n"))
        self.contexts = tuple(_contexts(self.lines))
        self.low = text.lower()
        self.low_lines = tuple(self.low.split("\n"))  # lower() never adds or removes a break
        self.starts = tuple(accumulate((len(line) + 1 for line in self.low_lines), initial=0))
        self.labels = tuple(_label_chars(line) for line in self.low_lines)
        self.speakers = speakers_of(self.lines, _own_starts(self.lines, self.labels))
        self.persons: tuple[int, ...] | None = None  # memory.speakers.persons_of, on demand
        self._words: dict[str, tuple[int, ...]] = {}
        # About the bytes held: the text, its lines and their lower case (the key and this),
        # each line's entries (with its speaker), and the words remembered; an over-estimate of
        # what tracemalloc saw for bench.load's episodes, on the safe side for the cache's byte
        # budget.
        self.size = 5 * len(text) + 168 * len(self.lines) + 100 * WORDS_PER_TEXT

    def lines_with(self, word: str) -> tuple[int, ...]:
        """The lines that hold ``word`` (one of ``terms``: letters and digits only)."""
        held = self._words.get(word)
        if held is None:
            held = self._find(word)
            if len(word) <= WORD_CHARS and len(self._words) < WORDS_PER_TEXT:
                self._words[word] = held  # a race only writes the same value twice
        return held

    def build_index(self) -> dict[str, tuple[int, ...]]:
        """The lines each word of the text stands in (as a whole word, after the label)."""
        lines: dict[str, list[int]] = {}
        findall = WORD.findall  # the runs _in_word finds
        for n, (line, label) in enumerate(zip(self.low_lines, self.labels, strict=True)):
            for word in set(findall(line, label)):
                lines.setdefault(word, []).append(n)
        return {word: tuple(held) for word, held in lines.items()}

    def _find(self, word: str) -> tuple[int, ...]:
        # Most lines of a long output share no word with a question, so the word is looked
        # for in the whole text (str.find runs in C), and an occurrence counts where it
        # stands as a whole word, as ``terms`` would split it.
        low, starts = self.low, self.starts
        end = len(low)
        out: list[int] = []
        at = low.find(word)
        while at >= 0:
            after = at + len(word)
            alone = at == 0 or not _in_word(low[at - 1])
            if alone and (after == end or not _in_word(low[after])):
                n = bisect_right(starts, at) - 1
                if at - starts[n] >= self.labels[n]:
                    out.append(n)
                    at = low.find(word, starts[n + 1])  # one is enough: on to the next line
                    continue
            at = low.find(word, at + 1)
        return tuple(out)


def _own_starts(lines: Sequence[str], labels: Sequence[int]) -> list[int]:
    """Where each line's own text starts: after its entry's label or its indent."""
    return [len(INDENT) if line.startswith(INDENT) else label
            for line, label in zip(lines, labels, strict=True)]


def _text_size(parsed: _Text) -> int:
    return parsed.size


_texts: LRUCache[str, _Text] = LRUCache(MEMO_BYTES, getsizeof=_text_size)
_texts_lock = threading.Lock()


def _indexed(parsed: _Text) -> dict[str, tuple[int, ...]]:
    """``parsed``'s index, built on first use; the memo then counts its bytes too."""
    index = parsed.index
    if index is None:
        index = parsed.build_index()  # a race builds the same twice
        with _texts_lock:
            parsed.index = index
            parsed.size += INDEX_WORD_BYTES * len(index)
            if _texts.get(parsed.text) is parsed:  # again: the memo reads its new size
                if parsed.size <= MEMO_BYTES // 16:
                    _texts[parsed.text] = parsed
                else:
                    del _texts[parsed.text]
    return index


def _parse(text: str) -> _Text:
    """``text``'s lines as snippets read them, from the memo when it was parsed before."""
    with _texts_lock:
        parsed = _texts.get(text)
    if parsed is None:
        parsed = _Text(text)
        if parsed.size <= MEMO_BYTES // 16:  # one huge text never empties the memo
            with _texts_lock:
                _texts[text] = parsed
    return parsed


MAX_QUESTIONS = 3
LONG_QUERY_WORDS = 40  # a prompt this long is more than its question
QUESTION_SCAN_CHARS = 8000


# Where a sentence ends: a line break, or '.', '!' or '?' before a space or the end.
_SENTENCE_END = re.compile(r"\n|[.!?](?=\s|\Z)")


def questions(query: str) -> list[str]:
    """The first few questions of a long prompt, each with the sentence before it in its
    paragraph (where what it asks about is often named); none for a short prompt, which is its
    own question. A sentence ends at '.', '!' or '?' before a space, or at a line break: a
    path's or a version's dots do not end one."""
    if len(query.split(None, LONG_QUERY_WORDS)) <= LONG_QUERY_WORDS:
        return []
    text = query[:QUESTION_SCAN_CHARS]
    out = []
    before = start = 0  # where the sentence before this one starts, and this one
    for end in _SENTENCE_END.finditer(text):  # a step per sentence, not per character
        at, char = end.start(), end.group()
        if char == "\n":
            before = start = at + 1
        elif char == "?":
            out.append(text[before : at + 1].strip())
            before = start = at + 1
            if len(out) == MAX_QUESTIONS:
                break
        else:
            before, start = start, at + 1
    return out


@dataclass(frozen=True, slots=True)
class _Asked:
    """A query's words as snippets match them: all of them in order, and each part a line
    may match: the whole query's words, then each of its ``questions``' words."""

    order: tuple[str, ...]
    parts: tuple[frozenset[str], ...]
    lines: frozenset[str]  # the query's own lines, lowered and stripped


QUERIES_MEMO = 1024  # a pick asks each of its candidates the same question
_asked_memo: LRUCache[tuple[int, bytes], _Asked] = LRUCache(QUERIES_MEMO)
_asked_lock = threading.Lock()


_last_asked: tuple[str, _Asked] | None = None  # the last query object: a pick asks it again


def _asked(query: str) -> _Asked:
    global _last_asked
    last = _last_asked
    if last is not None and last[0] is query:  # the same object: the same words
        return last[1]
    # By the query's digest: a prompt may be long, and the memo holds only its words.
    key = tokens.text_key(query)
    with _asked_lock:
        asked = _asked_memo.get(key)
    if asked is None:
        order = tuple(terms(query))
        asked = _Asked(order, (frozenset(order),
                               *(frozenset(terms(q)) for q in questions(query))),
                       frozenset(filter(None, (line.strip() for line in
                                               query.lower().split("\n")))))
        with _asked_lock:
            _asked_memo[key] = asked
    _last_asked = (query, asked)
    return asked


def _match(
    words_of: Sequence[frozenset[str]], contexts: Sequence[int | None],
    wanted: AbstractSet[str],
) -> float:
    """The share of ``wanted`` the best line holds, with the line that says where it comes
    from (the call that printed it)."""
    return max(_line_matches(words_of, contexts, wanted), default=0.0)


def _line_matches(
    words_of: Sequence[frozenset[str]], contexts: Sequence[int | None],
    wanted: AbstractSet[str],
) -> list[float]:
    """For each line, the share of ``wanted`` it holds with the line that says where it
    comes from."""
    out = [0.0] * len(words_of)
    if not wanted:
        return out
    for n, words in enumerate(words_of):
        if words & wanted:
            at = contexts[n]
            held = (words | words_of[at] if at is not None else words) & wanted
            out[n] = len(held) / len(wanted)
    return out


def line_matches(text: str, query: str) -> list[float]:
    """For each line of ``text``, how well it matches ``query`` as ``Snippet.match`` counts
    it: the share of the question's words it holds with the call that printed it (for a long
    prompt, of the words of the question it answers best)."""
    parsed = _parse(text)
    asked = _asked(query)
    parts = asked.parts
    words_of = _words_by_line(parsed, parts[0], asked.lines)
    best = [0.0] * len(parsed.lines)
    for part in parts:
        matches = _line_matches([ws & part for ws in words_of], parsed.contexts, part)
        best = [max(a, b) for a, b in zip(best, matches, strict=True)]
    return best


@dataclass(frozen=True, slots=True)
class _Best:
    """How a text matches a question: the share of its words the best line holds, and what
    the lines are picked by (the words of the part of the question it answers best)."""

    parsed: _Text
    match: float
    order: tuple[str, ...]
    words_of: tuple[frozenset[str], ...]


# The last text and query objects asked (a pick asks ``best_match`` of a memory, then ``snippet``
# of the same objects) and their _Best. One tuple, replaced whole: threads see one or another.
_last_best: tuple[str, str, _Best] | None = None


def _best(text: str, query: str) -> _Best:
    global _last_best
    last = _last_best
    if last is not None and last[0] is text and last[1] is query:
        return last[2]
    asked = _asked(query)
    order = list(asked.order)
    parsed = _parse(text)
    words_of = _words_by_line(parsed, asked.parts[0], asked.lines)
    # A long prompt is answered by one of its questions: the memory matches as well as it
    # matches the question it answers best, and shows the lines for that question.
    best = 0.0
    for i, part in enumerate(asked.parts):
        held = _match(words_of, parsed.contexts, part)
        if held > best:
            best = held
            if i > 0:
                order = [w for w in order if w in part]
                words_of = [ws & part for ws in words_of]
    found = _Best(parsed, best, tuple(order), tuple(words_of))
    _last_best = (text, query, found)
    return found


def whole_match(text: str, query: str) -> float:
    """The share of the whole query's words the best line of ``text`` holds (with the call
    that printed it), not of one of a long prompt's questions: a long prompt's question may be
    a few words any text holds, so this asks more of a text the question is less sure of."""
    parsed = _parse(text)
    asked = _asked(query)
    words_of = _words_by_line(parsed, asked.parts[0], asked.lines)
    return _match(words_of, parsed.contexts, asked.parts[0])


def said_match(text: str, query: str) -> Said | None:
    """When ``query`` names speakers of a dialogue in ``text`` (memory.speakers): the best
    share of its other words one line holds, by who said it and of whose things it speaks
    (``Said``); None otherwise. A line counts alone here, not with the line before it, and a
    line of the named speaker without its questions (memory.speakers.stated)."""
    parsed = _parse(text)
    asked = _asked(query)
    names = named(parsed.speakers, asked.parts[0], query)
    wanted = asked.parts[0] - names
    if not names or not wanted:
        return None
    if parsed.persons is None:
        parsed.persons = persons_of(parsed.low_lines, parsed.speakers)  # a race: the same
    said = [0.0] * 4
    best, others = 0.0, False
    for n, (words, speaker, person) in enumerate(zip(
            _words_by_line(parsed, wanted, asked.lines), parsed.speakers, parsed.persons,
            strict=True)):
        theirs = bool(speaker and speaker & names)
        if theirs and words:  # what the named one asks is not what they said
            words = words & frozenset(WORD.findall(stated(parsed.low_lines[n])))
        share = len(words) / len(wanted)
        said[0 if theirs else 1] = max(said[0 if theirs else 1], share)
        if person & (FIRST if theirs else SECOND):
            said[2] = max(said[2], share)
        if person & (SECOND if theirs else FIRST):
            said[3] = max(said[3], share)
        if speaker and share > 0 and share >= best:
            # Of lines holding as much, one that is not another's story is enough.
            mine = not of_others(theirs, person)
            others = (not mine) if share > best else others and not mine
            best = share
    return Said(said[0], said[1], said[2], said[3], best, others)


def voices(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """The words of the speakers of ``text``'s dialogues (memory.speakers.speakers_of), and
    of those any of its lines' labels name, in a dialogue or not (a lone "[date] Ada: ..."
    line of a conversation)."""
    parsed = _parse(text)
    heard = labelled(parsed.lines, _own_starts(parsed.lines, parsed.labels))
    return (frozenset().union(*(s for s in parsed.speakers if s)),
            frozenset().union(*(s for s in heard if s)))


def best_match(text: str, query: str) -> float:
    """``snippet(text, query).match`` without making the snippet: what a pick asks of every
    candidate, most of which it then passes over."""
    return _best(text, query).match


def _in_word(char: str) -> bool:
    return char.isalnum()  # what memory.words' [^\W_] matches


def snippet(
    text: str, query: str, max_tokens: int = SNIPPET_TOKENS,
    count: Callable[[str], int] = tokens.count,
) -> Snippet:
    """The lines of a memory's ``text`` that a question needs, within ``max_tokens``.

    The whole text when it fits. Otherwise its first line (the turn's prompt), then the lines
    that match ``query`` best (at most MAX_LINES, none under half the best line's match),
    each with the call that printed it, in their original order, '…' where lines were left
    out; with no line in common, the first lines. A line's match weighs each query word it
    holds by how few lines hold it: the line with the word few lines have is the answer. A
    line's stamp that repeats the line above's is left out (``stamps_once``).
    Deterministic: the same memory and question give the same bytes.
    """
    found = _best(text, query)
    order, words_of = found.order, found.words_of
    lines, contexts = found.parsed.lines, found.parsed.contexts
    # A token covers one character at least and rarely more than a dozen: skip counting
    # a text that is surely short, or surely long.
    if len(text) <= max_tokens or (len(text) < 12 * max_tokens and count(text) <= max_tokens):
        return Snippet(stamps_once(text), found.match)
    df = Counter(w for ws in words_of for w in ws)
    weight = {w: math.log(1 + len(lines) / k) for w, k in df.items()}
    scores = [sum(map(weight.__getitem__, ws)) if ws else 0 for ws in words_of]  # sum(()): 0
    best = max(scores[1:], default=0.0)
    matched = sorted((n for n in range(1, len(lines)) if scores[n] > 0 and scores[n] >= best / 2),
                     key=lambda n: (-scores[n], n))[:MAX_LINES]
    present = [w for w in order if w in df]
    shown: dict[int, str] = {}

    def cost(n: int) -> int:
        if n not in shown:
            shown[n] = _cut(lines[n], present)
        return count(shown[n]) + 1  # and its line break

    used = cost(0)
    if used > max_tokens:
        return Snippet(stamps_once(shown[0][: max(max_tokens, 1)]), found.match)
    chosen = {0}
    # With no line in common, the first lines in order; when only the prompt matches, the
    # prompt alone.
    for n in matched or (range(1, len(lines)) if scores[0] == 0 else ()):
        with_call = [m for m in (contexts[n], n) if m is not None and m not in chosen]
        # A matching line right after it goes with it (a diff's index line after its file
        # line, a grep hit's next line): the answer often stands next to what names it.
        after = n + 1
        follow = (after < len(lines) and scores[after] > 0 and after not in chosen
                  and contexts[after] == contexts[n])
        groups = ([[*with_call, after]] if follow and matched else []) + [with_call, [n]]
        for group in groups:  # with the call that printed it, else alone
            price = sum(cost(m) + 2 for m in group)  # and a gap mark
            if used + price <= max_tokens:
                chosen.update(group)
                used += price
                break
        else:
            if not matched:
                break  # in order: no gaps
    return Snippet(stamps_once(_joined(chosen, shown, len(lines))), found.match)


def _joined(chosen: Collection[int], shown: Mapping[int, str], n_lines: int) -> str:
    """The chosen lines in their order, a gap mark wherever lines were left out."""
    out: list[str] = []
    last = -1
    for n in sorted(chosen):
        if n != last + 1:
            out.append(GAP)
        out.append(shown[n])
        last = n
    if last != n_lines - 1:
        out.append(GAP)
    return "\n".join(out)


# A bracketed stamp with a digit where a line's own text starts (after its entry's label or
# indent): a transcript's "[3 March, 2023] Ada: ...", a log's "[12:00] ..."; not a checkbox's
# "[ ] " or a level's "[INFO] ". Bounded: linear.
_STAMP = re.compile(r"\[(?=[^\]\n]{0,40}\d)[^\]\n]{1,40}\] ")


def stamps_once(text: str) -> str:
    """``text`` with a line's stamp left out where it repeats the stamp the line above it
    showed: a transcript dates every line of a session alike, and the date cost about 7
    tokens a line in a recall block."""
    out: list[str] = []
    last = None
    for line in text.split("\n"):
        start = len(INDENT) if line.startswith(INDENT) else _label_chars(line.lower())
        found = _STAMP.match(line, start)
        if found is not None:
            if found.group() == last:
                line = line[:start] + line[found.end():]
            last = found.group()
        out.append(line)
    return "\n".join(out)


def lines_of(text: str) -> frozenset[str]:
    """The lines a memory's text shows (gap marks aside): what a later snippet of the same
    memory adds nothing to when it shows no other line."""
    return frozenset(line for line in text.split("\n") if line != GAP)
