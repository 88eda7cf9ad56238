"""The store contract: the same suite against every backend (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import random
import string
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from ctxproxy.memory.model import Memory, MemoryType, Scope, Store, StoreError
from ctxproxy.memory.vectors import VectorRow, pack, unpack
from tests.memory.conftest import Backend

SCOPE = Scope("svc", "team-a", "agent-1", "u_1")
T0 = 1_700_000_000.0


def mem(
    text: str,
    key: str | None = None,
    *,
    type: MemoryType = "episodic",
    scope: Scope = SCOPE,
    at: float = T0,
    **extra: Any,
) -> Memory:
    return Memory(
        type=type, scope=scope, key=key or text, text=text, created_at=at, updated_at=at,
        **extra,
    )


# --- upsert and get ----------------------------------------------------------------------


async def test_upsert_twice_keeps_one_record_with_its_first_id(store: Store) -> None:
    first = (await store.upsert([mem("the build uses make", "turn-1", at=T0)]))[0]
    again = mem("the build uses make and ninja", "turn-1", at=T0 + 60)
    second = (await store.upsert([again]))[0]

    assert second.memory_id == first.memory_id
    assert second.created_at == T0
    assert second.updated_at == T0 + 60
    assert second.text == "the build uses make and ninja"
    listed = await store.list(SCOPE, now=T0)
    assert [m.memory_id for m in listed] == [first.memory_id]
    assert listed[0].text == "the build uses make and ninja"


async def test_upsert_returns_stored_records_in_input_order(store: Store) -> None:
    old = (await store.upsert([mem("b text", "b")]))[0]
    batch = [mem("c text", "c"), mem("b text again", "b"), mem("a text", "a")]
    stored = await store.upsert(batch)

    assert [m.key for m in stored] == ["c", "b", "a"]
    assert stored[1].memory_id == old.memory_id
    assert stored[0].memory_id == batch[0].memory_id
    assert stored[2].memory_id == batch[2].memory_id


async def test_same_key_twice_in_one_batch_is_one_record(store: Store) -> None:
    stored = await store.upsert([mem("first", "k", at=T0), mem("second", "k", at=T0 + 1)])

    assert stored[0].memory_id == stored[1].memory_id
    listed = await store.list(SCOPE, now=T0)
    assert [m.text for m in listed] == ["second"]


async def test_same_key_in_another_type_or_scope_is_another_record(store: Store) -> None:
    other = replace(SCOPE, agent_id="agent-2")
    await store.upsert([
        mem("x", "k"), mem("x", "k", type="semantic"), mem("x", "k", scope=other),
    ])

    assert len(await store.list(None, now=T0)) == 3


async def test_set_in_window_changes_that_flag_of_those_keys_and_nothing_else(
    store: Store,
) -> None:
    other = replace(SCOPE, agent_id="agent-2")
    kept = await store.upsert([
        mem("turn one", "k1", in_window=True), mem("turn two", "k2", in_window=True),
        mem("turn one", "k1", scope=other, in_window=True),
        mem("turn one", "k1", type="semantic", in_window=True),
    ])

    assert await store.set_in_window(SCOPE, "episodic", {"k1": False, "gone": False}) == 1

    assert await store.stored(SCOPE, "episodic", ["k1", "k2"]) == {"k1": False, "k2": True}
    assert await store.stored(other, "episodic", ["k1"]) == {"k1": True}
    assert await store.stored(SCOPE, "semantic", ["k1"]) == {"k1": True}
    after = await store.get(kept[0].memory_id)
    assert after == replace(kept[0], in_window=False)  # text, times and the rest as they were
    assert await store.set_in_window(SCOPE, "episodic", {}) == 0


async def test_concurrent_upserts_of_the_same_keys_make_one_record_each(store: Store) -> None:
    def batch(n: int) -> list[Memory]:
        return [mem(f"turn {i} text from writer {n}", f"turn-{i}") for i in range(20)]

    results = await asyncio.gather(*(store.upsert(batch(n)) for n in range(8)))

    ids = {m.key: m.memory_id for m in results[0]}
    assert all({m.key: m.memory_id for m in r} == ids for r in results)
    listed = await store.list(SCOPE, limit=1000, now=T0)
    assert sorted(m.key for m in listed) == sorted(f"turn-{i}" for i in range(20))


async def test_get_returns_every_field_as_stored(store: Store) -> None:
    record = mem(
        "Prefers Python over Node", "pref:language", type="semantic",
        session_id="sess-9", turn_index=4, in_window=True,
        sources=["mem_01aaaaaaaaaaaaaaaaaaaaaaaa", "mem_01bbbbbbbbbbbbbbbbbbbbbbbb"],
        attrs={"subject": "language", "score": 0.82, "seen": [1, 2], "nested": {"a": None}},
        expires_at=T0 + 1800.5,
    )
    await store.upsert([record])

    got = await store.get(record.memory_id)
    assert got == record


async def test_get_unknown_id_is_none(store: Store) -> None:
    assert await store.get("mem_00000000000000000000000000") is None


async def test_delete_removes_the_records_and_counts_them(store: Store) -> None:
    a, b, c = await store.upsert([mem("a"), mem("b"), mem("c")])

    assert await store.delete([a.memory_id, c.memory_id, "mem_unknown"]) == 2
    assert await store.get(a.memory_id) is None
    assert await store.get(b.memory_id) == b
    assert await store.delete([a.memory_id]) == 0
    assert await store.delete([]) == 0


# --- search ------------------------------------------------------------------------------


async def test_search_answers_a_question_that_shares_only_some_words(store: Store) -> None:
    await store.upsert([
        mem("our database is PostgreSQL 15 on port 5433", "fact"),
        mem("the frontend is written in TypeScript", "other"),
    ])

    hits = await store.search(SCOPE, "which port does the database listen on?", now=T0)

    assert [h.memory.key for h in hits] == ["fact"]
    assert hits[0].relevance > 0


async def test_a_long_prompt_whose_rarest_words_no_memory_holds_still_finds(
    store: Store
) -> None:
    # New names and typos are the rarest words of a prompt; they must not be all it
    # searches by.
    await store.upsert([mem(f"ticket {n}: the deploy script failed on the replica", f"t{n}")
                        for n in range(3)])
    unknown = " ".join(f"qzx{n}vbn" for n in range(40))
    hits = await store.search(SCOPE, f"{unknown} why did the deploy script fail?", now=T0)
    assert {h.memory.key for h in hits} == {"t0", "t1", "t2"}
    assert await store.search(SCOPE, unknown, now=T0) == []


async def test_a_word_no_memory_held_is_found_as_soon_as_one_holds_it(store: Store) -> None:
    # Searches keep their words' match counts a while (SQLite); never a count of nothing.
    await store.upsert([mem("the deploy script runs on the replica", "deploy")])
    assert [h.memory.key for h in await store.search(SCOPE, "deploy zanzibar", now=T0)] == [
        "deploy"]
    await store.upsert([mem("zanzibar is the codename of the billing rewrite", "codename")])

    hits = await store.search(SCOPE, "deploy zanzibar", now=T0)

    assert {h.memory.key for h in hits} == {"deploy", "codename"}


async def test_a_word_with_more_matches_than_a_search_ranks_finds_its_newest(
    store: Store
) -> None:
    # More matches than a search ranks, none analyzed yet (PostgreSQL's statistics, as after
    # a fresh start): its newest matches are the candidates.
    await store.upsert([mem(f"ledger entry {n:05d}", f"e{n:05d}", at=T0 + n)
                        for n in range(2_100)])

    hits = await store.search(SCOPE, "ledger", limit=3, now=T0 + 3_000)

    assert [h.memory.key for h in hits] == ["e02099", "e02098", "e02097"]


async def test_search_ranks_the_better_match_first(store: Store) -> None:
    await store.upsert([
        mem("deploy notes: the staging cluster runs in Frankfurt", "one-word"),
        mem("staging deploy uses the blue green deploy script for the staging cluster", "many"),
        mem("nothing relevant here at all", "none"),
    ])

    hits = await store.search(SCOPE, "staging deploy script", now=T0)

    assert [h.memory.key for h in hits] == ["many", "one-word"]
    assert hits[0].relevance > hits[1].relevance > 0


async def test_search_never_crosses_scopes(store: Store) -> None:
    scopes = [
        SCOPE,
        replace(SCOPE, service_id="svc-2"),
        replace(SCOPE, team_id="team-b"),
        replace(SCOPE, agent_id="agent-2"),
        replace(SCOPE, user="u_2"),
    ]
    await store.upsert([mem(f"secret plan {n}", "plan", scope=s) for n, s in enumerate(scopes)])

    for n, scope in enumerate(scopes):
        hits = await store.search(scope, "secret plan", now=T0)
        assert [h.memory.text for h in hits] == [f"secret plan {n}"]
        assert hits[0].memory.scope == scope


async def test_search_keeps_to_the_asked_types_and_limit(store: Store) -> None:
    await store.upsert([
        mem("kafka topic orders", "w", type="working"),
        mem("kafka topic orders", "e", type="episodic"),
        mem("kafka topic orders", "s", type="semantic"),
    ])

    hits = await store.search(SCOPE, "kafka orders", types=["semantic", "working"], now=T0)
    assert sorted(h.memory.type for h in hits) == ["semantic", "working"]
    assert len(await store.search(SCOPE, "kafka orders", limit=1, now=T0)) == 1


async def test_search_and_list_skip_expired_records(store: Store) -> None:
    await store.upsert([
        mem("redis cache warmup", "live", type="working", expires_at=T0 + 100),
        mem("redis cache eviction", "dead", type="working", expires_at=T0 - 1),
        mem("redis cache forever", "forever", type="semantic"),
    ])

    hits = await store.search(SCOPE, "redis cache", now=T0)
    assert sorted(h.memory.key for h in hits) == ["forever", "live"]
    assert sorted(m.key for m in await store.list(SCOPE, now=T0)) == ["forever", "live"]
    later = await store.search(SCOPE, "redis cache", now=T0 + 200)
    assert [h.memory.key for h in later] == ["forever"]


@pytest.mark.parametrize(
    "query",
    ["", "   ", "?!", '"unbalanced', "a AND OR NOT b", "x* -y NEAR(z) col:w", "'; DROP x; --",
     "back\\slash 'quote' it's"],
)
async def test_search_with_odd_queries_never_fails(store: Store, query: str) -> None:
    await store.upsert([mem("plain words about x and y and b", "k")])

    hits = await store.search(SCOPE, query, now=T0)

    assert all(h.memory.key == "k" for h in hits)
    assert len(await store.list(SCOPE, now=T0)) == 1


async def test_words_with_quotes_and_backslashes_are_found_as_written(store: Store) -> None:
    # What the text holds, quotes, a backslash, a percent sign, SQL's own words, comes back
    # from a search that asks for it, on either store.
    await store.upsert([
        mem("o'brien's patch: C:\\temp\\dir at 100% -- ; DROP TABLE memories; $$x$$", "odd"),
        mem("nothing alike here", "other"),
    ])

    for question in ("o'brien's patch", "C:\\temp\\dir 100%", "DROP TABLE memories $$x$$"):
        assert [h.memory.key for h in await store.search(SCOPE, question, now=T0)] == ["odd"]
    assert len(await store.list(SCOPE, now=T0)) == 2


# --- list --------------------------------------------------------------------------------


async def test_list_is_newest_first_and_filters(store: Store) -> None:
    other = replace(SCOPE, team_id="team-b")
    await store.upsert([
        mem("one", "1", at=T0, session_id="s1"),
        mem("two", "2", at=T0 + 10, session_id="s2"),
        mem("three", "3", at=T0 + 20, session_id="s1", type="semantic"),
        mem("four", "4", at=T0 + 30, scope=other, session_id="s1"),
    ])

    assert [m.text for m in await store.list(SCOPE, now=T0)] == ["three", "two", "one"]
    assert [m.text for m in await store.list(None, now=T0)] == ["four", "three", "two", "one"]
    assert [m.text for m in await store.list(SCOPE, types=["episodic"], now=T0)] == ["two", "one"]
    assert [m.text for m in await store.list(SCOPE, session_id="s1", now=T0)] == ["three", "one"]
    assert [m.text for m in await store.list(SCOPE, since=T0 + 5, now=T0)] == ["three", "two"]
    assert [m.text for m in await store.list(None, limit=2, now=T0)] == ["four", "three"]


# --- text ----------------------------------------------------------------------------------


async def test_unicode_text_round_trips_and_is_searchable(store: Store) -> None:
    text = "Ünïcödé: the café in Zürich serves crêpes 🍰; 数据库 is database; שלום; naïve"
    record = mem(text, "ключ-🔑")
    await store.upsert([record])

    assert await store.get(record.memory_id) == record
    hits = await store.search(SCOPE, "Zürich crêpes", now=T0)
    assert [h.memory.text for h in hits] == [text]


async def test_huge_text_round_trips_and_stays_searchable(store: Store) -> None:
    rng = random.Random(7)
    words = ["".join(rng.choices(string.ascii_lowercase, k=9)) for _ in range(200_000)]
    text = "kubernetes ingress misconfigured " + " ".join(words)  # about 2 MB
    record = mem(text, "huge")
    await store.upsert([record, mem("small note about ingress", "small")])

    got = await store.get(record.memory_id)
    assert got is not None and got.text == text
    hits = await store.search(SCOPE, "kubernetes ingress", now=T0)
    assert sorted(h.memory.key for h in hits) == ["huge", "small"]


# --- failure -----------------------------------------------------------------------------


async def test_store_that_cannot_open_raises_store_error(backend: Backend) -> None:
    broken = backend.broken()
    with pytest.raises(StoreError):
        await broken.open()
    await broken.close()


async def test_closed_store_raises_store_error(backend: Backend) -> None:
    closed = backend.make()
    await closed.open()
    await closed.close()

    with pytest.raises(StoreError):
        await closed.upsert([mem("late", "late")])
    with pytest.raises(StoreError):
        await closed.search(SCOPE, "late")
    with pytest.raises(StoreError):
        await closed.list(SCOPE)


# --- vectors (hybrid recall) ----------------------------------------------------------------

MODEL = "fake-embedder"


def _rows(memory: Memory, *chunks: tuple[int, int, list[float]],
          model: str = MODEL) -> list[VectorRow]:
    out = []
    for n, (start, end, values) in enumerate(chunks):
        vector = np.asarray(values, dtype=np.float32)
        vector /= np.linalg.norm(vector)
        out.append(VectorRow(memory.memory_id, n, start, end, model, f"{memory.key}-{n}",
                             pack(vector)))
    return out


def _unit(*values: float) -> np.ndarray:
    vector = np.asarray(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


async def test_vector_search_finds_the_nearest_chunk_first_with_its_span(store: Store) -> None:
    near, far, other = await store.upsert(
        [mem("line one\nthe release train", "near"), mem("unrelated", "far"),
         mem("x", "other", scope=replace(SCOPE, user="u_2"))]
    )
    await store.put_vectors([
        *_rows(near, (0, 9, [0, 0, 1]), (9, 26, [1, 0.1, 0])),
        *_rows(far, (0, 9, [0, 1, 0])),
        *_rows(other, (0, 1, [1, 0, 0])),
    ])

    hits = await store.vector_search(SCOPE, _unit(1, 0, 0), MODEL, now=T0)

    assert [h.memory.memory_id for h in hits] == [near.memory_id, far.memory_id]
    assert hits[0].span == (9, 26)
    assert hits[0].similarity == pytest.approx(1 / np.sqrt(1.01), rel=1e-5)
    assert hits[1].similarity == pytest.approx(0.0, abs=1e-6)
    assert await store.vector_search(SCOPE, _unit(1, 0, 0), "another-model", now=T0) == []


async def test_vector_search_keeps_to_types_limit_and_skips_expired(store: Store) -> None:
    episode, fact, gone = await store.upsert([
        mem("an episode", "e"), mem("a fact", "f", type="semantic"),
        mem("expired", "x", expires_at=T0 - 1),
    ])
    await store.put_vectors([*_rows(episode, (0, 5, [1, 0])), *_rows(fact, (0, 5, [1, 0.2])),
                             *_rows(gone, (0, 5, [1, 0.01]))])

    semantic = await store.vector_search(SCOPE, _unit(1, 0), MODEL, types=["semantic"], now=T0)
    one = await store.vector_search(SCOPE, _unit(1, 0), MODEL, limit=1, now=T0)

    assert [h.memory.memory_id for h in semantic] == [fact.memory_id]
    assert [h.memory.memory_id for h in one] == [episode.memory_id]


async def test_vectors_go_with_the_memory_and_with_its_old_text(store: Store) -> None:
    kept, changed, deleted = await store.upsert(
        [mem("kept", "k"), mem("old text", "c"), mem("deleted", "d")]
    )
    await store.put_vectors([*_rows(kept, (0, 4, [1, 0])), *_rows(changed, (0, 8, [1, 0.1])),
                             *_rows(deleted, (0, 7, [1, 0.2]))])
    assert await store.unembedded(MODEL) == []
    first = await store.vector_search(SCOPE, _unit(1, 0), MODEL, now=T0)
    assert len(first) == 3

    await store.upsert([mem("new text", "c", at=T0 + 1)])  # the text changed
    await store.upsert([mem("kept", "k", at=T0 + 2)])  # the same text again
    await store.delete([deleted.memory_id])

    assert [m.memory_id for m in await store.unembedded(MODEL)] == [changed.memory_id]
    assert await store.count_unembedded(MODEL) == 1
    hits = await store.vector_search(SCOPE, _unit(1, 0), MODEL, now=T0)
    assert [h.memory.memory_id for h in hits] == [kept.memory_id]
    await store.put_vectors(_rows(changed, (0, 8, [0, 1])))
    hits = await store.vector_search(SCOPE, _unit(0, 1), MODEL, now=T0)
    assert hits[0].memory.memory_id == changed.memory_id
    assert hits[0].memory.text == "new text"


async def test_vectors_are_found_by_digest_and_unembedded_is_a_cursor(store: Store) -> None:
    stored = await store.upsert([mem(f"text {n}", f"k{n}") for n in range(5)]
                                + [mem("working", "w", type="working")])
    await store.put_vectors(_rows(stored[2], (0, 6, [1, 0])))

    cached = await store.cached_vectors(MODEL, ["k2-0", "k3-0"])
    assert list(cached) == ["k2-0"]
    assert np.allclose(unpack(cached["k2-0"]), [1, 0])
    assert await store.cached_vectors("another-model", ["k2-0"]) == {}
    # Every episodic and semantic record without a vector, by id; working memory is not.
    ids = sorted(m.memory_id for n, m in enumerate(stored[:5]) if n != 2)
    first = await store.unembedded(MODEL, limit=2)
    rest = await store.unembedded(MODEL, after=first[-1].memory_id, limit=10)
    assert [m.memory_id for m in first + rest] == ids
    assert await store.count_unembedded(MODEL) == 4


async def test_vector_spans_walks_every_record_with_its_chunks_in_order(store: Store) -> None:
    stored = await store.upsert([mem(f"text {n}", f"k{n}") for n in range(3)]
                                + [mem("working", "w", type="working")])
    await store.put_vectors(_rows(stored[1], (0, 4, [1, 0]), (5, 6, [0, 1])))
    await store.put_vectors(_rows(stored[2], (0, 6, [1, 0]), model="another-model"))

    first = await store.vector_spans(MODEL, limit=2)
    rest = await store.vector_spans(MODEL, after=first[-1][0].memory_id, limit=10)

    by_id = {m.memory_id: spans for m, spans in first + rest}
    assert list(by_id) == sorted(m.memory_id for m in stored[:3])  # working memory is not
    assert by_id[stored[1].memory_id] == [(0, 4), (5, 6)]
    assert by_id[stored[0].memory_id] == by_id[stored[2].memory_id] == []  # none of MODEL
    walked = {m.memory_id: m for m, _ in first + rest}
    assert [walked[m.memory_id].text for m in stored[:3]] == ["text 0", "text 1", "text 2"]
    assert await store.count_embeddable() == 3


async def test_vectors_of_a_memory_that_is_gone_are_not_stored(store: Store) -> None:
    memory = (await store.upsert([mem("short lived", "s")]))[0]
    await store.delete([memory.memory_id])
    await store.put_vectors(_rows(memory, (0, 5, [1, 0])))
    assert await store.cached_vectors(MODEL, ["s-0"]) == {}


async def test_a_scope_dropped_from_the_vector_copy_is_read_again_when_searched(
    backend: Backend,
) -> None:
    from ctxproxy.config import Settings
    from ctxproxy.memory.stores import make_store

    # Room for about two scopes' copies: searching a third drops the least recent.
    store = make_store(Settings(**backend.settings, vector_cache_mb=0.01))
    await store.open()
    try:
        scopes = [replace(SCOPE, user=f"u_{n}") for n in range(3)]
        kept = [(await store.upsert([mem(f"memory {n}", "k", scope=scope)]))[0]
                for n, scope in enumerate(scopes)]
        await store.put_vectors([row for n, memory in enumerate(kept)
                                 for row in _rows(memory, (0, 6, [1, float(n), 0, 0]))])
        for _ in range(2):  # the second round finds each scope dropped since it was read
            for scope, memory in zip(scopes, kept, strict=True):
                hits = await store.vector_search(scope, _unit(1, 0, 0, 0), MODEL, now=T0)
                assert [h.memory.memory_id for h in hits] == [memory.memory_id]
    finally:
        await store.close()
