"""Vector search in PostgreSQL with pgvector against the in-process copy (A/B, one run).

    .venv/bin/python -m bench.pg_vectors              # into bench/RESULTS.md
    .venv/bin/python -m bench.pg_vectors --no-write   # print only

Needs ``CTXPROXY_TEST_PG_URL`` and the ``vector`` extension in that database (created by a
superuser: docs/operations.md); works in a fresh schema, dropped after. Two scopes of
``--memories`` memories each, two chunks per memory, ``--dim``-dimensional unit vectors drawn
around 64 centres (as a project's turns cluster by topic), are stored through
``PostgresStore.put_vectors``. Then ``--searches`` questions (near a centre too) go through
``PostgresStore.vector_search`` (limit 10) of two stores on those tables, in alternation: one
searching with pgvector, one with ``pgvector=False`` (the copy in process).
Reported per variant: the search's p50 wall time (client and server on this machine), the
client's CPU time per search, what this process's RSS grew by over its first searches, the
bytes of vectors it holds, and how many of the exact search's 10 hits pgvector returned.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import statistics
import sys
import time

import numpy as np

from bench.harness.machine import machine
from bench.harness.postgres import fresh_schema
from bench.harness.results import write_block
from ctxproxy.memory.model import Memory, Scope
from ctxproxy.memory.store_pg import PostgresStore
from ctxproxy.memory.vectors import VectorRow, pack

SECTION = "## Vector search in PostgreSQL: pgvector against the copy in process"
BEGIN = "<!-- pg-vectors:begin (written by bench/pg_vectors.py) -->"
END = "<!-- pg-vectors:end -->"
SCOPES = (Scope("bench", "team", "agent", "user"), Scope("bench", "team", "agent", "other"))
MODEL = "bench-model"
T0 = 1_700_000_000.0


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _near(rng: np.random.Generator, centres: np.ndarray, n: int) -> np.ndarray:
    picked = centres[rng.integers(0, len(centres), n)]
    out = picked + 0.08 * rng.standard_normal(picked.shape).astype(np.float32)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


async def _fill(store: PostgresStore, count: int, centres: np.ndarray) -> None:
    rng = np.random.default_rng(1)
    for scope in SCOPES:
        for at in range(0, count, 500):
            stored = await store.upsert([
                Memory(type="episodic", scope=scope, key=f"k{n}", text="x" * 200,
                       created_at=T0, updated_at=T0) for n in range(at, min(count, at + 500))])
            vectors = _near(rng, centres, 2 * len(stored))
            await store.put_vectors([
                VectorRow(m.memory_id, c, 100 * c, 100 * c + 100, MODEL, f"{m.memory_id}-{c}",
                          pack(vectors[2 * i + c]))
                for i, m in enumerate(stored) for c in range(2)])


async def _search(store: PostgresStore, questions: np.ndarray) -> tuple[list[float], float,
                                                                        list[list[str]]]:
    walls, found = [], []
    cpu = time.process_time()
    for question in questions:
        start = time.perf_counter()
        hits = await store.vector_search(SCOPES[0], question, MODEL, limit=10, now=T0)
        walls.append((time.perf_counter() - start) * 1000)
        found.append([h.memory.memory_id for h in hits])
    return walls, (time.process_time() - cpu) * 1000 / len(questions), found


async def run(base: str, count: int, dim: int, searches: int, rounds: int) -> str:
    """Over 60 lines: the A/B's steps and its table, in the order they run."""
    rng = np.random.default_rng(2)
    centres = rng.standard_normal((64, dim)).astype(np.float32)
    questions = _near(rng, centres, searches)
    with fresh_schema(base, "bench_pg_vectors") as url:
        ann, exact = PostgresStore(url), PostgresStore(url, pgvector=False)
        await ann.open()
        await exact.open()
        try:
            if not ann.pgvector:
                sys.exit("the database has no `vector` extension (docs/operations.md)")
            fill = time.perf_counter()
            await _fill(ann, count, centres)
            fill_s = time.perf_counter() - fill
            walls: dict[str, list[float]] = {"pgvector": [], "copy in process": []}
            cpu: dict[str, list[float]] = {"pgvector": [], "copy in process": []}
            grew: dict[str, int] = {}
            hits: dict[str, list[list[str]]] = {}
            for _ in range(rounds):
                for name, store in (("pgvector", ann), ("copy in process", exact)):
                    before = _rss()
                    w, c, found = await _search(store, questions)
                    grew.setdefault(name, _rss() - before)
                    hits.setdefault(name, found)
                    walls[name] += w
                    cpu[name].append(c)
            held = {"pgvector": ann._vectors.nbytes, "copy in process": exact._vectors.nbytes}
        finally:
            await ann.close()
            await exact.close()
    same = [len(set(a) & set(b)) / max(1, len(b))
            for a, b in zip(hits["pgvector"], hits["copy in process"], strict=True)]
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Measured {now} with `.venv/bin/python -m bench.pg_vectors --memories {count}"
        f" --dim {dim}` on {machine()}.",
        "",
        f"Two scopes of {count:,} memories, 2 chunks each ({2 * count:,} vectors of {dim}"
        f" dimensions per scope), stored in {fill_s:.0f} s through the pgvector store (HNSW"
        f" index kept as they arrive); {searches} questions, limit 10, {rounds} rounds, the"
        " variants in alternation (the copy loaded by its first search, counted in its"
        " first round).",
        "",
        "| variant | search p50 ms | client CPU ms / search | RSS growth, first round |"
        " vectors held in process | hits of the exact search's 10 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in walls:
        lines.append(
            f"| {name} | {statistics.median(walls[name]):.1f} |"
            f" {statistics.median(cpu[name]):.2f} | {grew[name] / 2**20:.1f} MiB |"
            f" {held[name] / 2**20:.1f} MiB |"
            f" {'%.0f%%' % (100 * statistics.fmean(same)) if name == 'pgvector' else '100%'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memories", type=int, default=10000, help="per scope")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--searches", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print, don't touch RESULTS.md")
    args = parser.parse_args()
    base = os.environ.get("CTXPROXY_TEST_PG_URL")
    if not base:
        parser.error("needs CTXPROXY_TEST_PG_URL (`. scripts/services.sh` sets it)")
    text = asyncio.run(run(base, args.memories, args.dim, args.searches, args.rounds))
    print(text)
    if not args.no_write:
        write_block(SECTION, BEGIN, END, text)


if __name__ == "__main__":
    main()
