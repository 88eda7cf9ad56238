"""`ctxproxy memory reindex` on a store made before embeddings (every migration but the
vectors one), and on one embedded before per-statement vectors; both stores.

The fake upstream serves the embeddings (tests.fakes.embeddings) on a thread of its own, since
the CLI runs its own event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from ctxproxy.config import load_settings
from ctxproxy.memory import pg_schema, sqlite_schema, vectors
from ctxproxy.memory.embed import HttpEmbedder
from ctxproxy.memory.indexer import Indexer
from ctxproxy.memory.model import Memory, Scope, Store
from tests.fakes import embeddings as fake
from tests.fakes.server import Running, serve
from tests.fakes.upstream import FakeUpstream
from tests.memory.conftest import Backend
from tests.memory.test_cli import Cli, _keep_logging, _with

# main() configures the root logger for a real run: each test here gets it back as it was.
__all__ = ["_keep_logging"]

SCOPE = Scope("svc", "team-a", "agent-1", "u_1")
MODEL = "fake-embedder"
FACT = "Let's ship every second Tuesday, starting next month."


class Served:
    """A FakeUpstream on its own loop in a thread."""

    def __init__(self) -> None:
        self.upstream = FakeUpstream()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.running: Running = asyncio.run_coroutine_threadsafe(
            serve(self.upstream.app()), self.loop).result(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.running.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def served() -> Iterator[Served]:
    s = Served()
    yield s
    s.close()


@pytest.fixture
def cli(backend: Backend, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], served: Served) -> Cli:
    c = Cli(backend, monkeypatch, capsys)
    c.use({"embeddings_url": served.running.url + "/v1", "embeddings_model": MODEL,
           "embeddings_batch": 4})
    return c


def old_store(backend: Backend, monkeypatch: pytest.MonkeyPatch, n: int) -> list[Memory]:
    """A store at the schema before vectors (every migration but the last) holding ``n``
    episodes and the fact."""
    records = [Memory(type="episodic", scope=SCOPE, key=f"k{i}", text=f"turn {i}: step {i}")
               for i in range(n)]
    records.append(Memory(type="episodic", scope=SCOPE, key="fact", text=FACT))
    with monkeypatch.context() as m:
        m.setattr(sqlite_schema, "MIGRATIONS", sqlite_schema.MIGRATIONS[:-1])
        m.setattr(pg_schema, "MIGRATIONS", pg_schema.MIGRATIONS[:-1])
        return asyncio.run(_with(backend.make(), lambda s: s.upsert(records)))


async def _nearest(store: Store, question: str) -> list[str]:
    vector = np.asarray(fake.embed(question), dtype=np.float32)
    return [h.memory.text for h in await store.vector_search(SCOPE, vector, MODEL, limit=1)]


def test_reindex_embeds_a_store_made_before_embeddings(
    cli: Cli, backend: Backend, served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    old_store(backend, monkeypatch, 9)

    code, out, err = cli("reindex")

    assert code == 0, err
    assert "embedded 10 memories with fake-embedder" in out
    assert "10/10 (100%)" in err
    found = asyncio.run(_with(backend.make(), lambda s: _nearest(
        s, "What did we agree on for the release train?")))
    assert found == [FACT]
    assert cli("reindex")[1].strip() == "every memory has a vector of fake-embedder"


def test_an_interrupted_reindex_goes_on_where_it_stopped(
    cli: Cli, backend: Backend, served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    old_store(backend, monkeypatch, 11)  # 12 memories: 3 batches of 4
    served.upstream.embeddings_down_after = 1

    code, _, err = cli("reindex")
    assert code == 1
    assert "embeddings failed: HTTP 503; run it again to go on" in err
    assert len(served.upstream.embedding_requests) == 2

    served.upstream.embeddings_down_after = None
    code, out, _ = cli("reindex")
    assert code == 0
    assert "embedded 8 memories" in out  # the first batch was kept
    texts = [t for r in served.upstream.embedding_requests[2:] for t in r.json["input"]]
    assert len(texts) == 8


# Twenty-odd words the fake embedder maps to nothing near the release train: in one vector
# with the statement they outweigh it.
TASK = ("Refactor the settle worker so that retries stay idempotent, batch postings per "
        "tenant, log durations, drop dead helpers, rename confusing variables, split huge "
        "modules, pin flaky fixtures and document exported functions thoroughly.")
STATEMENT = "Let's ship every second Tuesday."
OLD_FACT = f"User: {TASK} {STATEMENT}"


def store_of_the_old_chunking(backend: Backend, served: Served, monkeypatch: pytest.MonkeyPatch,
                              n: int) -> None:
    """``n`` episodes and OLD_FACT embedded as the code before per-statement vectors did: a
    one-line prompt was one chunk, its statements had no vector of their own."""
    records = [Memory(type="episodic", scope=SCOPE, key=f"k{i}", text=f"turn {i}: step {i}")
               for i in range(n)]
    records.append(Memory(type="episodic", scope=SCOPE, key="fact", text=OLD_FACT))

    async def embed_the_old_way(store: Store) -> None:
        embedder = HttpEmbedder(served.running.url + "/v1", model=MODEL)
        try:
            stored = await store.upsert(records)
            await Indexer(store, embedder, batch=4, timeout_s=10).index(stored)
        finally:
            await embedder.aclose()

    with monkeypatch.context() as m:
        m.setattr(vectors, "_sentences", lambda text, end: [])
        asyncio.run(_with(backend.make(), embed_the_old_way))


async def _best(store: Store, question: str) -> tuple[str, str, float]:
    """The nearest memory's text, the chunk that matched and its similarity."""
    vector = np.asarray(fake.embed(question), dtype=np.float32)
    hit = (await store.vector_search(SCOPE, vector, MODEL, limit=1))[0]
    assert hit.span is not None and hit.similarity is not None
    return hit.memory.text, hit.memory.text[slice(*hit.span)], hit.similarity


def test_reindex_gives_memories_chunked_the_old_way_their_statement_vectors(
    cli: Cli, backend: Backend, served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_of_the_old_chunking(backend, served, monkeypatch, 9)
    question = "What did we agree on for the release train?"
    text, chunk, before = asyncio.run(_with(backend.make(), lambda s: _best(s, question)))
    gate = load_settings(env={}).embeddings_min_similarity
    assert chunk == OLD_FACT and before < gate  # diluted by the task: under the default gate
    served.upstream.embedding_requests.clear()

    code, out, err = cli("reindex")

    assert code == 0, err
    assert "embedded 1 memories with fake-embedder" in out  # the others are chunked as today
    assert "10/10 (100%)" in err  # every memory was looked at
    sent = [t for r in served.upstream.embedding_requests for t in r.json["input"]]
    assert STATEMENT in sent and OLD_FACT not in sent  # the prompt's own vector is reused
    text, chunk, after = asyncio.run(_with(backend.make(), lambda s: _best(s, question)))
    assert (text, chunk) == (OLD_FACT, STATEMENT)
    assert after >= gate
    # Idempotent: a second run finds every memory chunked as today and embeds nothing.
    served.upstream.embedding_requests.clear()
    assert cli("reindex")[1].strip() == "every memory has a vector of fake-embedder"
    assert served.upstream.embedding_requests == []


def test_reindex_without_an_embeddings_url_says_so(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = Cli(backend, monkeypatch, capsys)("reindex")
    assert code == 2
    assert "CTXPROXY_EMBEDDINGS_URL is not set" in err
