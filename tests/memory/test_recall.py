"""Recall: scoring by relevance, type weight and decay; k; the token budget; scope."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import hypothesis
import pytest
from hypothesis import strategies as st

from ctxproxy.injectors import memory_blocks, tokens
from ctxproxy.memory.model import Hit, Memory, MemoryType, Scope
from ctxproxy.memory.recall import (
    TAIL_SNIPPET_TOKENS,
    Candidate,
    Recaller,
    Weights,
    decay,
    fuse,
    mentioned_ids,
    score,
    select,
)
from ctxproxy.memory.store_sqlite import SqliteStore

SCOPE = Scope("svc", "team", "agent", "u_1")
NOW = 1_800_000_000.0
DAY = 86400.0


def mem(
    text: str, kind: MemoryType = "episodic", *, age: float = 0.0, session_id: str | None = None,
    attrs: dict[str, object] | None = None,
) -> Memory:
    at = NOW - age
    return Memory(type=kind, scope=SCOPE, key=text, text=text, created_at=at, updated_at=at,
                  session_id=session_id, attrs=dict(attrs or {}))


def cost(memory: Memory) -> int:
    return tokens.count(memory_blocks.item(memory)) + 1


def overhead(kind: MemoryType) -> int:
    return tokens.count(memory_blocks.block_overhead(kind))


DEFAULT = Weights()


def choose(candidates: list[Candidate], *, weights: Weights = DEFAULT, k: int = 5,
           budget: int = 10_000) -> list[str]:
    chosen = select(candidates, weights=weights, now=NOW, k=k, budget=budget, cost=cost,
                    overhead=overhead)
    return [m.text for m in chosen]


def test_equal_relevance_ranks_working_then_episodic_then_semantic() -> None:
    candidates = [Candidate(mem(t, t), 0.5) for t in ("semantic", "episodic", "working")]
    assert choose(candidates) == ["working", "episodic", "semantic"]


def test_type_weights_are_configurable() -> None:
    candidates = [Candidate(mem(t, t), 0.5) for t in ("semantic", "episodic", "working")]
    weights = Weights(working=0.1, episodic=1.0, semantic=2.0)
    assert choose(candidates, weights=weights) == ["semantic", "episodic", "working"]


def test_relevance_beats_a_small_type_weight() -> None:
    candidates = [Candidate(mem("weak working", "working"), 0.2),
                  Candidate(mem("strong episode"), 1.0)]
    assert choose(candidates) == ["strong episode", "weak working"]


def test_older_memories_fade() -> None:
    old, new = mem("old", age=90 * DAY), mem("new", age=DAY)
    assert decay(old, NOW) < decay(new, NOW) < 1.0
    assert decay(mem("x", age=30 * DAY), NOW) == pytest.approx(0.5)
    assert choose([Candidate(old, 1.0), Candidate(new, 0.9)]) == ["new", "old"]


def test_at_most_k_memories() -> None:
    candidates = [Candidate(mem(f"m{n}"), 1.0 - n / 10) for n in range(8)]
    assert choose(candidates, k=3) == ["m0", "m1", "m2"]


def test_the_budget_counts_items_and_block_wrappers() -> None:
    big = mem("big " * 300)
    small = [mem(f"small note {n}") for n in range(3)]
    candidates = [Candidate(big, 1.0)] + [Candidate(m, 0.5 - n / 10) for n, m in enumerate(small)]
    budget = overhead("episodic") + sum(cost(m) for m in small)
    assert choose(candidates, budget=budget) == [m.text for m in small]
    assert choose(candidates, budget=budget - 1) == [m.text for m in small[:2]]
    assert choose(candidates, budget=0) == []


def test_duplicates_count_once_at_their_best_relevance() -> None:
    m = mem("same")
    assert choose([Candidate(m, 0.1), Candidate(m, 0.9), Candidate(mem("other"), 0.5)]) == [
        "same", "other",
    ]


def test_memory_ids_in_a_prompt_are_found() -> None:
    text = "see mem_01m8mwa4cfb9sazjcfa6msb7fq and mem_01m8mwa4cfb9sazjcfa6msb7fq, mem_bad"
    assert mentioned_ids(text) == ["mem_01m8mwa4cfb9sazjcfa6msb7fq"]


# --- the Recaller against a store ----------------------------------------------------------


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    opened = SqliteStore(tmp_path / "memory.sqlite3")
    await opened.open()
    yield opened
    await opened.close()


def recaller(store: SqliteStore, k: int = 5, budget: int = 1200) -> Recaller:
    return Recaller(store, weights=Weights(), k=k, budget=budget, cost=cost, overhead=overhead)


async def test_a_memory_id_from_another_scope_is_never_recalled(store: SqliteStore) -> None:
    other = replace(SCOPE, agent_id="someone-else")
    (theirs,) = await store.upsert([replace(mem("their secret plan"), scope=other)])
    (mine,) = await store.upsert([mem("my unrelated note")])

    got = await recaller(store).recall(
        SCOPE, "s", f"show {theirs.memory_id} and {mine.memory_id}", window=(), exclude=(),
        budget=1200, now=NOW,
    )
    assert [m.text for m in got] == ["my unrelated note"]


async def test_turns_still_in_the_window_are_not_recalled(store: SqliteStore) -> None:
    await store.upsert([
        mem("the deploy target is eu-west-1", attrs={"prompt": "prompt:inside"}),
        mem("the deploy script lives in ops/", attrs={"prompt": "prompt:cut"}),
    ])
    got = await recaller(store).recall(
        SCOPE, "s", "where does the deploy go?", window={"prompt:inside"}, exclude=(),
        budget=1200, now=NOW,
    )
    assert [m.text for m in got] == ["the deploy script lives in ops/"]


async def test_standing_candidates_are_this_sessions_working_memory_and_semantic(
    store: SqliteStore,
) -> None:
    await store.upsert([
        mem("task of this session", "working", session_id="s", attrs={"prompt": "p1"}),
        mem("constraint still in view", "working", session_id="s", attrs={"prompt": "p2"}),
        mem("task of another session", "working", session_id="other"),
        mem("Use Python, not Node.", "semantic", attrs={"score": 0.8}),
        mem("an episode", "episodic", session_id="s"),
    ])
    r = recaller(store)
    candidates = await r.standing_candidates(SCOPE, "s", {"p2"}, NOW)
    assert sorted(c.memory.text for c in candidates) == ["Use Python, not Node.",
                                                         "task of this session"]
    assert [m.text for m in r.standing(candidates, NOW)] == ["task of this session",
                                                              "Use Python, not Node."]


def test_fusion_ranks_by_reciprocal_rank_and_keeps_the_vector_hits_chunk() -> None:
    def m(key: str) -> Memory:
        return Memory(type="episodic", scope=Scope("s"), key=key, text=key, memory_id=key)

    lexical = [Hit(m("a"), 0.9), Hit(m("b"), 0.5)]
    vector = [Hit(m("c"), 0.8, 0.8, (3, 9)), Hit(m("b"), 0.7, 0.7, (0, 4))]
    fused = {c.memory.memory_id: c for c in fuse([lexical, vector], k=60)}

    # b is in both lists (ranks 2 and 2): above a and c, each first in one list only.
    assert fused["b"].relevance == 1.0
    assert fused["a"].relevance == fused["c"].relevance == pytest.approx((1 / 61) / (2 / 62))
    assert (fused["b"].similarity, fused["b"].span) == (0.7, (0, 4))
    assert fused["a"].similarity is None


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(
    st.lists(st.tuples(st.integers(0, 7), st.floats(0.01, 1.0), st.integers(0, 3)),
             max_size=30),
    st.integers(1, 5), st.integers(20, 400),
)
def test_asking_for_views_lazily_chooses_what_viewing_every_candidate_would(
    drawn: list[tuple[int, float, int]], k: int, budget: int,
) -> None:
    # Several candidates per memory, some of which may not be shown (their view is None)
    # and some shown shorter: showing only the best few, on demand, picks the same.
    kinds: list[MemoryType] = ["episodic", "semantic", "working"]
    memories = [mem(f"memory {n} " + "word " * (n * 7), kinds[n % 3], age=n * DAY)
                for n in range(8)]
    candidates = [Candidate(memories[n], relevance) for n, relevance, _ in drawn]
    shape = {(n, relevance): how for n, relevance, how in drawn}
    def view(c: Candidate) -> Candidate | None:
        how = shape[(int(c.memory.text.split()[1]), c.relevance)]
        if how == 0:
            return None
        text = c.memory.text[: len(c.memory.text) // how]
        return Candidate(replace(c.memory, text=text), c.relevance)

    def pick(candidates: list[Candidate], **extra: object) -> list[Memory]:
        return select(candidates, weights=DEFAULT, now=NOW, k=k, budget=budget, cost=cost,
                      overhead=overhead, **extra)  # type: ignore[arg-type]

    def every_viewed() -> list[Memory]:
        # As recall chose before views were asked lazily: view every candidate, keep each
        # memory's best, rank, fill the budget.
        best: dict[str, Candidate] = {}
        for c in candidates:
            v = view(c)
            if v is not None and (v.memory.memory_id not in best
                                  or v.relevance > best[v.memory.memory_id].relevance):
                best[v.memory.memory_id] = v
        ranked = sorted(best.values(), key=lambda c: (-score(c, DEFAULT, NOW),
                                                      c.memory.memory_id))
        chosen: list[Memory] = []
        used, kinds = 0, set()
        for c in ranked:
            if len(chosen) >= k:
                break
            price = cost(c.memory) + (0 if c.memory.type in kinds else overhead(c.memory.type))
            if used + price <= budget:
                chosen.append(c.memory)
                kinds.add(c.memory.type)
                used += price
        return chosen

    assert pick(candidates, view=view) == every_viewed()


def test_fusion_of_several_vector_rankings_keeps_the_nearest_chunk() -> None:
    # A long prompt's questions are searched one by one: the chunk shown is the one nearest
    # any of them, whichever ranking came first.
    fact = Memory(type="episodic", scope=Scope("s"), key="f", text="f", memory_id="f")
    first = [Hit(fact, 0.6, 0.6, (6, 20))]
    second = [Hit(fact, 0.3, 0.3, (0, 5))]
    lexical = [Hit(fact, 0.9)]

    (fused,) = fuse([lexical, first, second])

    assert (fused.similarity, fused.span) == (0.6, (6, 20))


def test_a_memory_found_well_below_the_best_is_shown_as_fewer_lines(tmp_path: Path) -> None:
    # Two turns alike, each a question's line among many others; one found at half the best.
    def turn(topic: str) -> str:
        filler = [f"  line {n} of the {topic} notes, about nothing the question asks"
                  for n in range(12)]
        return "\n".join([f"User: the {topic} notes", *filler[:6],
                          f"  the {topic} deploy port is 5433", *filler[6:]])

    best, weak = mem(turn("alpha")), mem(turn("beta"))
    picked = recaller(SqliteStore(tmp_path / "unused.sqlite3"))._pick(
        [Candidate(best, 1.0), Candidate(weak, 0.5)], "which deploy port?", session="s",
        exclude=(), shown={}, min_score=0.0, budget=10_000, now=NOW)
    assert [m.key for m in picked] == [best.key, weak.key]
    shown_best, shown_weak = picked
    assert "port is 5433" in shown_best.text and "port is 5433" in shown_weak.text
    assert tokens.count(shown_weak.text) <= TAIL_SNIPPET_TOKENS
    assert tokens.count(shown_best.text) > TAIL_SNIPPET_TOKENS
