"""Snippets: the lines of a long memory that a question asks about.

A long memory (an episode with whole tool outputs) is shown as the lines a question needs,
each with the call that printed it, so that a recalled turn costs tens of tokens, not
thousands. Recall logic, pure.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from injectors import tokens
from memory.turns import ASSISTANT, CALL, INDENT, OUTPUT, UNNAMED, USER
from memory.words import terms

__all__ = ["GAP", "SNIPPET_TOKENS", "Snippet", "line_matches", "lines_of", "snippet"]

SNIPPET_TOKENS = 160  # what one recalled memory may take at most
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
    the call that printed it, for another continuation line its entry's head; None for a
    head (a line that is not indented) itself."""
    out: list[int | None] = []
    head = call = 0
    for n, line in enumerate(lines):
        if not line.startswith(INDENT):
            # Render puts each output right after its call: the call is the entry before.
            call = head if line.startswith(f"{OUTPUT} ") else n
            head = n
            out.append(None)
        else:
            out.append(call if lines[call].startswith(f"{CALL} ") else head)
    return out


@dataclass(frozen=True, slots=True)
class Snippet:
    """What a recall block shows of a memory for one question, and how well it matches."""

    text: str
    match: float  # the share of the question's words its best line holds (with its call)


_NONE: frozenset[str] = frozenset()


def _line_words(text: str, wanted: set[str]) -> list[frozenset[str]]:
    """For each line of ``text``, the ``wanted`` words it holds.

    Most lines of a long output share no word with a question, so each word is looked for in
    the whole text (str.find runs in C), and an occurrence counts where it stands as a whole
    word, as ``terms`` would split it.
    """
    low = text.lower()
    low_lines = low.split("\n")  # lower() never adds or removes a line break
    out = [_NONE] * len(low_lines)
    if not wanted:
        return out
    starts = list(accumulate((len(line) + 1 for line in low_lines), initial=0))
    found: dict[int, set[str]] = {}
    end = len(low)
    for word in wanted:
        at = low.find(word)
        while at >= 0:
            after = at + len(word)
            alone = at == 0 or not _in_word(low[at - 1])
            if alone and (after == end or not _in_word(low[after])):
                n = bisect_right(starts, at) - 1
                if at - starts[n] >= _label_chars(low_lines[n]):
                    found.setdefault(n, set()).add(word)
                    at = low.find(word, starts[n + 1])  # one is enough: on to the next line
                    continue
            at = low.find(word, at + 1)
    for n, words in found.items():
        out[n] = frozenset(words)
    return out


# The labels memory.turns.render starts an entry's line with (lowered): our words, not the
# turn's, so a question's "tool" or "user" does not match every entry by them.
_LABELS = tuple(label.lower() for label in (
    f"{USER}: ", f"{ASSISTANT}: ", f"{OUTPUT} {UNNAMED}: ", f"{CALL} ", f"{OUTPUT} "))


def _label_chars(line: str) -> int:
    """How many characters at the start of ``line`` are an entry's label."""
    return next((len(label) for label in _LABELS if line.startswith(label)), 0)


MAX_QUESTIONS = 3
LONG_QUERY_WORDS = 40  # a prompt this long is more than its question
QUESTION_SCAN_CHARS = 8000


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
    for at, char in enumerate(text):
        end = at + 1 == len(text) or text[at + 1].isspace()
        if char == "\n":
            before = start = at + 1
        elif char in ".!" and end:
            before, start = start, at + 1
        elif char == "?" and end:
            out.append(text[before : at + 1].strip())
            before = start = at + 1
            if len(out) == MAX_QUESTIONS:
                break
    return out


def _match(
    words_of: Sequence[frozenset[str]], contexts: Sequence[int | None], wanted: set[str]
) -> float:
    """The share of ``wanted`` the best line holds, with the line that says where it comes
    from (the call that printed it)."""
    return max(_line_matches(words_of, contexts, wanted), default=0.0)


def _line_matches(
    words_of: Sequence[frozenset[str]], contexts: Sequence[int | None], wanted: set[str]
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
    lines = text.split("\n")
    contexts = _contexts(lines)
    order = terms(query)
    parts = [set(order), *(set(terms(q)) for q in questions(query))]
    words_of = _line_words(text, parts[0])
    best = [0.0] * len(lines)
    for part in parts:
        matches = _line_matches([ws & part for ws in words_of], contexts, part)
        best = [max(a, b) for a, b in zip(best, matches, strict=True)]
    return best


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
    holds by how few lines hold it: the line with the word few lines have is the answer.
    Deterministic: the same memory and question give the same bytes.
    """
    order = terms(query)
    wanted = set(order)
    lines = text.split("\n")
    words_of = _line_words(text, wanted)
    contexts = _contexts(lines)
    # A long prompt is answered by one of its questions: the memory matches as well as it
    # matches the question it answers best, and shows the lines for that question.
    match = 0.0
    for part in [wanted, *(set(terms(q)) for q in questions(query))]:
        best = _match(words_of, contexts, part)
        if best > match:
            match = best
            if part is not wanted:
                order = [w for w in order if w in part]
                words_of = [ws & part for ws in words_of]
    # A token covers one character at least and rarely more than a dozen: skip counting
    # a text that is surely short, or surely long.
    if len(text) <= max_tokens or (len(text) < 12 * max_tokens and count(text) <= max_tokens):
        return Snippet(text, match)
    df = Counter(w for ws in words_of for w in ws)
    weight = {w: math.log(1 + len(lines) / k) for w, k in df.items()}
    scores = [sum(weight[w] for w in ws) for ws in words_of]
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
        return Snippet(shown[0][: max(max_tokens, 1)], match)
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
    out: list[str] = []
    last = -1
    for n in sorted(chosen):
        if n != last + 1:
            out.append(GAP)
        out.append(shown[n])
        last = n
    if last != len(lines) - 1:
        out.append(GAP)
    return Snippet("\n".join(out), match)


def lines_of(text: str) -> frozenset[str]:
    """The lines a memory's text shows (gap marks aside): what a later snippet of the same
    memory adds nothing to when it shows no other line."""
    return frozenset(line for line in text.split("\n") if line != GAP)
