"""The embeddings client (respx), chunking, and the indexer with a fake embedder."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Sequence
from pathlib import Path

import httpx
import numpy as np
import pytest
import respx

from ctxproxy.memory.embed import Breaker, EmbedError, HttpEmbedder
from ctxproxy.memory.indexer import Indexer
from ctxproxy.memory.model import Memory, Scope, Store
from ctxproxy.memory.vectors import CHUNK_CHARS, MAX_CHUNKS, VectorIndex, VectorRow, chunks, pack
from tests.fakes import embeddings as fake

URL = "http://embed.test/v1"
SCOPE = Scope("svc", "team", "agent", "u")


def ok(texts: int, dim: int = 3) -> httpx.Response:
    return httpx.Response(200, json={"object": "list", "data": [
        {"object": "embedding", "index": i, "embedding": [1.0, float(i), 2.0][:dim]}
        for i in reversed(range(texts))  # out of order: the index decides
    ]})


@respx.mock
async def test_embed_sends_the_model_and_key_and_returns_unit_vectors_in_input_order() -> None:
    route = respx.post(URL + "/embeddings").mock(return_value=ok(2))
    client = HttpEmbedder(URL, model="text-embedding-3-small", api_key="sk-embed")
    try:
        got = await client.embed(["first", "second"], timeout_s=1)
    finally:
        await client.aclose()
    sent = route.calls.last.request
    assert json.loads(sent.content) == {"input": ["first", "second"],
                                        "model": "text-embedding-3-small"}
    assert sent.headers["authorization"] == "Bearer sk-embed"
    assert got.shape == (2, 3)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0)
    assert np.allclose(got[1], np.array([1, 1, 2]) / np.sqrt(6))


@respx.mock
async def test_embed_without_a_key_sends_no_authorization() -> None:
    route = respx.post(URL + "/embeddings").mock(return_value=ok(1))
    client = HttpEmbedder(URL, model="m")
    try:
        await client.embed(["x"], timeout_s=1)
    finally:
        await client.aclose()
    assert "authorization" not in route.calls.last.request.headers


@pytest.mark.parametrize("answer", [
    httpx.Response(500, json={"error": "down"}),
    httpx.Response(200, content=b"not json"),
    httpx.Response(200, json={"data": []}),  # fewer vectors than texts
    httpx.Response(200, json={"data": [{"index": 0, "embedding": [1, "x"]},
                                       {"index": 1, "embedding": [1, 2]}]}),
    httpx.Response(200, json={"data": [{"index": 0, "embedding": [1, 2]},
                                       {"index": 1, "embedding": [1, 2, 3]}]}),  # ragged
    httpx.Response(200, json={"data": [{"index": 0, "embedding": [0, 0]},
                                       {"index": 1, "embedding": [1, 2]}]}),  # zeros
    httpx.Response(200, json={"data": [{"index": 0, "embedding": [1, 2]},
                                       {"index": 0, "embedding": [1, 2]}]}),  # same index
    httpx.Response(200, content=b'{"data": [{"index": 0, "embedding": [NaN, 1]},'
                                b' {"index": 1, "embedding": [1, 2]}]}'),
], ids=["http-500", "not-json", "too-few", "not-numbers", "ragged", "zeros", "same-index",
        "nan"])
@respx.mock
async def test_embed_refuses_anything_but_one_finite_vector_per_text(
    answer: httpx.Response,
) -> None:
    respx.post(URL + "/embeddings").mock(return_value=answer)
    client = HttpEmbedder(URL, model="m")
    try:
        with pytest.raises(EmbedError):
            await client.embed(["a", "b"], timeout_s=1)
    finally:
        await client.aclose()


@respx.mock
async def test_embed_refuses_a_model_that_changes_its_size() -> None:
    respx.post(URL + "/embeddings").mock(side_effect=[ok(1, dim=3), ok(1, dim=2)])
    client = HttpEmbedder(URL, model="m")
    try:
        await client.embed(["a"], timeout_s=1)
        with pytest.raises(EmbedError, match="3-dimensional"):
            await client.embed(["a"], timeout_s=1)
    finally:
        await client.aclose()


@respx.mock
async def test_a_slow_endpoint_is_an_error_within_the_timeout() -> None:
    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return ok(1)

    respx.post(URL + "/embeddings").mock(side_effect=slow)
    client = HttpEmbedder(URL, model="m")
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        with pytest.raises(EmbedError, match="no answer within 100 ms"):
            await client.embed(["a"], timeout_s=0.1)
    finally:
        await client.aclose()
    assert loop.time() - started < 2


@respx.mock
async def test_the_breaker_opens_after_repeated_failures_and_tries_again_after_cooldown(
) -> None:
    route = respx.post(URL + "/embeddings").mock(return_value=httpx.Response(503))
    now = [0.0]
    client = HttpEmbedder(URL, model="m", breaker=Breaker(3, 30.0, clock=lambda: now[0]))
    try:
        for _ in range(3):
            with pytest.raises(EmbedError, match="HTTP 503"):
                await client.embed(["a"], timeout_s=1)
        with pytest.raises(EmbedError, match="circuit open"):
            await client.embed(["a"], timeout_s=1)
        assert route.call_count == 3  # open: no call made
        now[0] = 31.0
        route.mock(return_value=ok(1))
        await client.embed(["a"], timeout_s=1)
        assert route.call_count == 4
        assert not client.breaker.open
    finally:
        await client.aclose()


# --- chunks ------------------------------------------------------------------------------------


def test_a_short_text_is_one_chunk_and_a_blank_one_none() -> None:
    assert chunks("one line") == [(0, 8)]
    assert chunks("  \n ") == []


def test_a_long_text_is_cut_into_whole_lines_within_the_chunk_size() -> None:
    lines = [f"line {n}: " + "word " * (n % 40) for n in range(2000)]
    text = "\n".join(lines)
    spans = chunks(text)
    assert len(spans) == MAX_CHUNKS
    assert spans[0][0] == 0
    for (a, b), (c, _) in itertools.pairwise(spans):
        assert b == c  # contiguous
        assert 0 < b - a <= CHUNK_CHARS
        assert text[b - 1] == "\n"  # ends at a line's end


def test_a_line_longer_than_a_chunk_is_cut() -> None:
    text = "head\n" + "x" * (3 * CHUNK_CHARS) + "\ntail"
    spans = chunks(text)
    assert spans[0] == (0, 5)
    assert all(b - a <= CHUNK_CHARS for a, b in spans)
    assert spans[-1][1] == len(text)


def test_each_statement_of_a_prompt_is_a_chunk_of_its_own_without_the_label() -> None:
    text = ("User: Let's ship every second Tuesday; Carol reviews. Now fix the flaky test in "
            "workers/settle.py. Thanks.\nTool call exec_command: {}\nTool output exec_command: ok")
    shown = [text[a:b] for a, b in chunks(text)]
    assert shown[0] == text[: text.index("\n") + 1]  # the whole prompt first
    assert shown[1:4] == ["Let's ship every second Tuesday;", "Carol reviews.",
                          "Now fix the flaky test in workers/settle.py."]  # not "Thanks."
    assert shown[4].startswith("Tool call")


def test_a_prompt_of_one_statement_gets_no_second_vector() -> None:
    text = "User: What did we decide about the release train?\nAssistant: every second Tuesday"
    assert len(chunks(text)) == 2


# --- the indexer -------------------------------------------------------------------------------


class CountingEmbedder:
    """The tests' fake embedder in process, counting the texts it was asked for."""

    model = "fake"

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.fail = False

    async def embed(self, texts: Sequence[str], *, timeout_s: float) -> np.ndarray:
        if self.fail:
            raise EmbedError("fake outage")
        self.texts += texts
        return np.asarray([fake.embed(t) for t in texts], dtype=np.float32)


def episode(text: str, key: str) -> Memory:
    return Memory(type="episodic", scope=SCOPE, key=key, text=text)


async def test_indexer_embeds_each_text_once_and_chunks_long_ones(store: Store) -> None:
    embedder = CountingEmbedder()
    indexer = Indexer(store, embedder, batch=4, timeout_s=1)
    long_text = "fix the build\n" + "".join(f"output line {n}\n" for n in range(200))
    stored = await store.upsert([episode("we ship every second Tuesday", "a"),
                                 episode("we ship every second Tuesday", "b"),
                                 episode(long_text, "c")])

    indexer.notify(stored)
    await indexer.drain()

    assert embedder.texts.count("we ship every second Tuesday") == 1
    assert len(embedder.texts) == 1 + len(chunks(long_text))
    assert await store.unembedded("fake") == []
    again = await store.upsert([episode("we ship every second Tuesday", "d")])
    await indexer.index(again)  # found by its digest: no call
    assert len(embedder.texts) == 1 + len(chunks(long_text))
    question = np.asarray(fake.embed("what did we decide about the release cadence"))
    hits = await store.vector_search(SCOPE, question, "fake", limit=2)
    assert {h.memory.key for h in hits} <= {"a", "b", "d"}


async def test_indexer_keeps_what_failed_pending_and_reindex_resumes(store: Store) -> None:
    embedder = CountingEmbedder()
    indexer = Indexer(store, embedder, batch=2, timeout_s=1)
    stored = await store.upsert([episode(f"episode number {n}", f"k{n}") for n in range(5)])
    embedder.fail = True
    indexer.notify(stored)
    assert not await indexer._step()
    assert await store.count_unembedded("fake") == 5

    embedder.fail = False
    seen: list[int] = []
    assert await indexer.reindex(progress=seen.append) == 5
    assert seen == [2, 4, 5]
    assert await store.count_unembedded("fake") == 0
    assert await indexer.reindex() == 0  # nothing left: a second run is a no-op


def test_the_vector_copy_picks_up_a_row_committed_below_the_newest_it_read() -> None:
    index = VectorIndex(reread=10)

    def row(memory_id: str, values: list[float]) -> VectorRow:
        return VectorRow(memory_id, 0, 0, 1, "m", memory_id, pack(np.asarray(values)))

    index.apply(SCOPE, "m", [(5, row("a", [1, 0]))])
    # seq 3 was handed out first but committed after 5 was read: a look back finds it.
    since = index.since(SCOPE, "m")
    assert since < 3
    assert index.unknown(SCOPE, "m", [3, 5]) == [3]
    index.apply(SCOPE, "m", [(3, row("b", [0, 1]))])
    index.apply(SCOPE, "m", [(5, row("a", [0, 1]))])  # read again: already held, no change

    top = index.top(SCOPE, "m", np.asarray([0, 1], dtype=np.float32), 2)
    assert [(m.memory_id, round(m.similarity, 3)) for m in top] == [("b", 1.0), ("a", 0.0)]


async def test_a_match_deep_in_a_long_output_is_recalled_as_that_chunks_lines(
    tmp_path: Path,
) -> None:
    from ctxproxy.memory.recall import Recaller, Weights
    from ctxproxy.memory.store_sqlite import SqliteStore

    store = SqliteStore(tmp_path / "memory.sqlite3")
    await store.open()
    try:
        noise = "  build step: compiled module without warnings\n" * 300
        text = ("User: check the build log\nTool call exec_command: cat build.log\n"
                "Tool output exec_command: " + noise
                + "  note from the lead: we ship every second Tuesday\n" + noise)
        (episode,) = await store.upsert([episode_with(text)])
        embedder = CountingEmbedder()
        await Indexer(store, embedder, batch=8, timeout_s=1).index([episode])
        recall = Recaller(store, weights=Weights(), k=5, budget=1200,
                          cost=lambda m: len(m.text) // 4, overhead=lambda kind: 10,
                          # The fake's bag of words is diluted by a chunk's other lines.
                          embedder=embedder, min_similarity=0.01)

        got, mode = await recall.recall_mode(
            SCOPE, "", "What did we agree on for the release cadence?", window=(),
            exclude=(), budget=1200, now=episode.created_at, min_score=0.25)
    finally:
        await store.close()

    assert mode == "hybrid"
    assert [m.memory_id for m in got] == [episode.memory_id]
    shown = got[0].text
    assert shown.startswith("User: check the build log")
    assert "we ship every second Tuesday" in shown
    assert len(shown) < len(text) // 10  # the chunk's lines, not the whole output


def episode_with(text: str) -> Memory:
    return Memory(type="episodic", scope=SCOPE, key="long", text=text, session_id="other")


def test_the_vector_copy_keeps_to_its_bytes_dropping_the_least_recently_searched() -> None:
    def rows(memory_id: str) -> list[tuple[int, VectorRow]]:
        return [(1, VectorRow(memory_id, 0, 0, 1, "m", memory_id, pack(np.ones(64))))]

    one = VectorIndex()
    one.apply(SCOPE, "m", rows("a"))
    index = VectorIndex(max_bytes=2 * one.nbytes)
    scopes = [Scope("svc", "team", "agent", f"u{n}") for n in range(3)]
    index.apply(scopes[0], "m", rows("u0"))
    index.apply(scopes[1], "m", rows("u1"))
    index.apply(scopes[0], "m", [])  # searched again: now the most recent
    index.apply(scopes[2], "m", rows("u2"))

    assert index.nbytes <= index.max_bytes
    assert index.since(scopes[1], "m") == -1  # dropped: read whole at its next search
    assert index.since(scopes[0], "m") >= 0 and index.since(scopes[2], "m") >= 0

    alone = VectorIndex(max_bytes=1)  # one scope larger than the bound is still searchable
    alone.apply(SCOPE, "m", rows("a"))
    assert [m.memory_id for m in alone.top(SCOPE, "m", np.ones(64, dtype=np.float32), 1)] == ["a"]
