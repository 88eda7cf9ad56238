"""How a full-text search bounds its work, the same for every store.

Ranking every match of a question is what made recall slow (hundreds of ms at 100k
memories): a common word matches a good part of a store. So the candidates are bounded first
(``bound``): every match of the question's rarer words, up to BUDGET rows, and the newest
RECENT matches of its commoner words; then they are ranked exactly. Below BUDGET matches (a
store of modest size) that is every match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["BUDGET", "MAX_WORDS", "RECENT", "Bounds", "bound"]

# 500 and 100 since 2026-12-03 (1000 and 200 before): a search took a third to a half less
# time on bench/load.py's store and bench/recall.py's, and recall held (bench/recall.py,
# both stores; the real agent runs' earlier-task facts, within their spread between runs of
# the same code; bench/RESULTS.md, Load, seventeenth session).
BUDGET = 500
RECENT = 100
MAX_WORDS = 8  # the rarest words of a long prompt are enough to rank by


@dataclass(frozen=True, slots=True)
class Bounds:
    """How a search reads a question's words (by index)."""

    rare: tuple[int, ...]  # every match of these words is a candidate
    common: tuple[int, ...]  # of these only the newest matches are


def bound(df: Sequence[int], budget: int) -> Bounds:
    """Spend ``budget`` candidate rows on the rarest words first (``df``: matches per word).

    The rare words are what tell one memory from another; a word too common to fit says
    little, and its newest matches are the likeliest of its many to matter.
    """
    order = sorted(range(len(df)), key=lambda i: (df[i], i))
    spent = 0
    rare: list[int] = []
    for i in order:
        if spent + df[i] > budget:
            break
        rare.append(i)
        spent += df[i]
    return Bounds(tuple(rare), tuple(i for i in order if i not in rare))
