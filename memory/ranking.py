"""How a full-text search ranks what it found: the words it asks for, their weights (IDF) and
the BM25 re-ranking of the best candidates, with the caches that keep those quick. Pure: the
search (memory.sqlite_search) reads the counts and candidates and hands them in."""

from __future__ import annotations

import collections
import functools
import math
import re
import threading
from collections.abc import Callable, Sequence

from cachetools import LRUCache

from ctxproxy.memory.model import Hit, Memory
from ctxproxy.memory.search import BUDGET, MAX_WORDS

__all__ = [
    "BM25_B", "BM25_K1", "MATCH_COUNTS_CACHED", "MATCH_COUNTS_TTL_S", "RERANK", "MatchCounts",
    "bm25", "fold", "idf_of", "rarest", "rerank", "words_like",
]

# BM25: matches of rare words count for more, long records for less. Term frequencies are
# read from the text of the best RERANK candidates only.
BM25_K1, BM25_B = 1.2, 0.75
RERANK = 20  # 40 before 2026-12-03: see memory.search.BUDGET
_TF_CHARS = 2000
_SUFFIXES = ("ing", "ed", "es", "s", "e")
# A word's match count in a scope (up to a cap) ranks the question's words and weighs them
# (IDF): a count some seconds old does as well, and saves a full-text probe per word. A
# word that matched nothing is counted again each time: a memory stored since may hold it.
MATCH_COUNTS_TTL_S = 30.0
MATCH_COUNTS_CACHED = 16384


def rarest(
    count: Callable[[Sequence[str], int], list[int]], words: Sequence[str]
) -> list[tuple[int, str]]:
    """The ``MAX_WORDS`` rarest words that match at all, with their match counts (``count``:
    each word's, up to a cap; up to ``BUDGET + 1``), rarest first. Counted with a low cap
    first, since a long prompt's rare words are usually enough."""
    low = BUDGET // MAX_WORDS + 1
    first = count(words, low)
    # A word no memory holds finds nothing: a long prompt's new names and typos would
    # otherwise be its "rarest" words and leave the search empty.
    counted = [c for c in zip(first, words, strict=True) if c[0] > 0]
    rare = [c for c in counted if c[0] < low]
    common = [w for n, w in counted if n >= low]
    if len(rare) < MAX_WORDS and common:
        again = count(common, BUDGET + 1)
        rare += zip(again, common, strict=True)
    # The commonest words of a long prompt say least about which memory is meant.
    return sorted(rare, key=lambda c: c[0])[:MAX_WORDS]


def idf_of(total: int, matches: int) -> float:
    """A word's weight: BM25's inverse document frequency of a word that ``matches`` of
    ``total`` records hold."""
    return math.log(1.0 + (total - matches + 0.5) / (matches + 0.5))


class MatchCounts:
    """Words' match counts per (scope, cap), each kept for ``ttl_s`` (see MATCH_COUNTS_TTL_S)
    of the searches' own clock (their ``now``: a replay's simulated time gives the same
    results on a fast machine and a slow one); a count of 0 is never kept. Shared by the
    search threads."""

    def __init__(self, ttl_s: float = MATCH_COUNTS_TTL_S,
                 size: int = MATCH_COUNTS_CACHED) -> None:
        self._ttl_s = ttl_s
        self._kept: LRUCache[tuple[str, int, str], tuple[int, float]] = LRUCache(size)
        self._lock = threading.Lock()

    def counts(self, scope: str, words: Sequence[str], cap: int,
               count: Callable[[Sequence[str]], list[int]],
               now: float) -> list[int]:
        """Each of ``words``' count in ``scope`` up to ``cap`` at ``now``: kept, or by
        ``count`` (which is asked only the words not kept)."""
        found: dict[str, int] = {}
        with self._lock:
            for word in words:
                kept = self._kept.get((scope, cap, word))
                if kept is not None and 0 <= now - kept[1] < self._ttl_s:
                    found[word] = kept[0]
        missing = [w for w in dict.fromkeys(words) if w not in found]
        if missing:
            fresh = count(missing)
            found.update(zip(missing, fresh, strict=True))
            with self._lock:
                for word, n in zip(missing, fresh, strict=True):
                    if n:
                        self._kept[(scope, cap, word)] = (n, now)
        return [found[w] for w in words]


def rerank(
    candidates: Sequence[tuple[Memory, set[int]]], words: Sequence[str], idf: Sequence[float]
) -> list[Hit]:
    """The best candidates again, by BM25 with the term frequencies read from their text
    (a record that says a word twice is likelier about it). Each candidate comes with the
    indices (into ``words`` and ``idf``) of the words the index found in it."""
    folded = [fold(w) for w in words]
    # Only the tokens that start like a question word, found by one scan of the text. No
    # leading \b: without it ``re`` skips ahead to a question word's first letters; a match
    # inside a word is dropped below (it consumes only that word's letters).
    forms = re.compile(r"(?:" + "|".join(map(re.escape, set(folded))) + r")[^\W_]*")
    average = max(1.0, sum(len(m.text) for m, _ in candidates) / max(len(candidates), 1))
    scored = []
    for memory, matched in candidates:
        # Counted in the head of the text: a long tool output would cost more than it tells.
        head = memory.text[:_TF_CHARS].lower()
        counts = collections.Counter(fold(t) for t in words_like(forms, head))
        size = len(memory.text) / average
        # The index says the word is there even when folding missed its form: at least 1.
        score = sum(bm25(idf[i], max(1, counts[folded[i]]), size) for i in matched)
        scored.append((len(matched), score, memory.updated_at, memory.memory_id, memory))
    scored.sort(key=lambda s: s[:4], reverse=True)
    # In (0, 1): the share of the question's words matched, BM25 breaking ties.
    return [
        Hit(memory, max((matched + score / (1.0 + score)) / (len(words) + 1), 1e-9))
        for matched, score, _, _, memory in scored
    ]


def bm25(idf: float, tf: int, size: float) -> float:
    """One word's BM25 term; ``size``: the record's length over the average."""
    return idf * tf * (BM25_K1 + 1.0) / (tf + BM25_K1 * (1.0 - BM25_B + BM25_B * size))


def words_like(forms: re.Pattern[str], text: str) -> list[str]:
    """What ``forms`` matches in ``text`` where a word starts (as if it began with ``\b``)."""
    return [m.group() for m in forms.finditer(text)
            if not m.start() or not (text[m.start() - 1].isalnum() or text[m.start() - 1] == "_")]


@functools.lru_cache(maxsize=1 << 16)  # called per token of every candidate a search reranks
def fold(token: str) -> str:
    """A rough stem (rates, rated -> rat; rate -> rat): enough to count a word's forms."""
    for suffix in _SUFFIXES:
        if token.endswith(suffix) and len(token) - len(suffix) >= 3:
            return token[: -len(suffix)]
    return token
