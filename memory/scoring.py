"""How recall scores and chooses memories, whatever found them: type weight x time decay x
relevance, the fusion of several rankings, and the choice within ``k`` and a token budget.
Pure (memory.recall gathers the candidates and shows them)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ctxproxy.config import Settings
from ctxproxy.memory.model import Hit, Memory, MemoryType

__all__ = ["HALF_LIFE_S", "RRF_K", "Candidate", "Weights", "decay", "fuse", "score", "select"]

DAY = 86400.0
# How fast a memory fades, by type: a session's task within days, a turn within weeks, a
# distilled preference within months.
HALF_LIFE_S: dict[MemoryType, float] = {
    "working": 1 * DAY,
    "episodic": 30 * DAY,
    "semantic": 180 * DAY,
}
RRF_K = 60  # the constant of reciprocal rank fusion (Cormack et al.): flattens the top ranks


@dataclass(frozen=True, slots=True)
class Weights:
    working: float = 1.5
    episodic: float = 1.0
    semantic: float = 0.8

    @classmethod
    def from_settings(cls, settings: Settings) -> Weights:
        return cls(settings.weight_working, settings.weight_episodic, settings.weight_semantic)

    def of(self, kind: MemoryType) -> float:
        return float(getattr(self, kind))


@dataclass(frozen=True, slots=True)
class Candidate:
    memory: Memory
    relevance: float
    similarity: float | None = None  # found by meaning: its best chunk's cosine similarity
    span: tuple[int, int] | None = None  # and where that chunk stands in the text


def fuse(rankings: Sequence[Sequence[Hit]], k: int = RRF_K) -> list[Candidate]:
    """Reciprocal rank fusion of full-text and vector rankings: each memory scores the sum
    of 1 / (k + rank) over the rankings it is in, scaled so the best has 1. Ranks, not
    scores: BM25 and cosine similarity are on scales that do not compare."""
    scores: dict[str, float] = {}
    first: dict[str, Hit] = {}  # the hit of the nearest chunk when vectors found it
    for hits in rankings:
        for rank, hit in enumerate(hits):
            memory_id = hit.memory.memory_id
            scores[memory_id] = scores.get(memory_id, 0.0) + 1.0 / (k + rank + 1)
            held = first.get(memory_id)
            if held is None or _nearer(hit, held):
                first[memory_id] = hit
    top = max(scores.values(), default=1.0)
    return [Candidate(h.memory, scores[i] / top, h.similarity, h.span) for i, h in first.items()]


def _nearer(hit: Hit, than: Hit) -> bool:
    return hit.similarity is not None and (than.similarity is None
                                           or hit.similarity > than.similarity)


def decay(memory: Memory, now: float) -> float:
    """1 for a memory from now, 1/2 after its type's half-life. An episode ages from when it
    happened; working and semantic memory from when it was last confirmed."""
    since = memory.created_at if memory.type == "episodic" else memory.updated_at
    age = max(0.0, now - since)
    return math.pow(0.5, age / HALF_LIFE_S[memory.type])


def score(candidate: Candidate, weights: Weights, now: float) -> float:
    memory = candidate.memory
    return candidate.relevance * weights.of(memory.type) * decay(memory, now)


def select(
    candidates: Iterable[Candidate],
    *,
    weights: Weights,
    now: float,
    k: int,
    budget: int,
    cost: Callable[[Memory], int],
    overhead: Callable[[MemoryType], int],
    view: Callable[[Candidate], Candidate | None] | None = None,
) -> list[Memory]:
    """The best ``k`` memories whose blocks fit in ``budget`` tokens, best first.

    A memory too big for what is left is skipped for a smaller one further down. A type's
    first memory also pays for its block's wrapper (``overhead``). ``view(c)`` says how a
    candidate is shown (a snippet), or None when it may not be: it is asked best first and
    only until ``k`` are chosen, since it may cost more than everything else here. A memory
    counts as its best candidate that may be shown.
    """
    ranked = sorted(enumerate(candidates), key=lambda at: (
        -score(at[1], weights, now), at[1].memory.memory_id, at[0]))
    chosen: list[Memory] = []
    kinds: set[MemoryType] = set()
    decided: set[str] = set()
    used = 0
    for _, c in ranked:
        if len(chosen) >= k:
            break
        if c.memory.memory_id in decided:
            continue  # a lesser candidate of a memory already placed or passed over
        if score(c, weights, now) <= 0:
            break
        shown = c if view is None else view(c)
        if shown is None:
            continue
        decided.add(c.memory.memory_id)
        kind = shown.memory.type
        price = cost(shown.memory) + (0 if kind in kinds else overhead(kind))
        if used + price > budget:
            continue
        chosen.append(shown.memory)
        kinds.add(kind)
        used += price
    return chosen
