"""PostgreSQL search while memories keep arriving: the GIN index's pending list, the ranking.

    .venv/bin/python -m bench.pg_search              # into bench/RESULTS.md
    .venv/bin/python -m bench.pg_search --no-write   # print only

Needs ``CTXPROXY_TEST_PG_URL`` (``. scripts/services.sh`` sets it); each variant works in a
fresh schema of that database, dropped after. A store is opened (every migration), then
``--memories`` episodes of a few KB each (words drawn from a Zipf-like vocabulary, as turns
repeat a project's names) are stored in batches of 50, as the ingest does, with autovacuum off
for the table: what a search meets between two vacuums while a team works. Then
``--searches`` questions of 6-10 words go through ``PostgresStore.search``; reported per
variant: the search's p50 and mean wall time (client and server on this machine: both).

Variants, in alternation (A, B, A, B ...) so that the machine's speed weighs on both alike:
- ``fastupdate on``: the index as migration 1 made it (new entries go to the pending list
  that every search reads whole, until a vacuum or 4 MB of it);
- ``fastupdate off``: as migration 5 makes it (entries go straight into the index);
- ``each use detoasts``: the ranking as before 2026-12-02's thirteenth session, where each of a
  row's nine uses of its tsvector decompresses it again (``fastupdate off`` otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import random
import statistics
import time
from unittest import mock

import psycopg

from bench.harness.machine import machine
from bench.harness.postgres import fresh_schema
from bench.harness.results import write_block
from ctxproxy.memory import pg_search
from ctxproxy.memory.model import Memory, Scope
from ctxproxy.memory.store_pg import PostgresStore

SECTION = "## PostgreSQL search while memories arrive"
BEGIN = "<!-- pg-search:begin (written by bench/pg_search.py) -->"
END = "<!-- pg-search:end -->"
SCOPE = Scope("bench", "team", "agent", "user")
VOCABULARY = 4000
# The ranking statement before the thirteenth session: the tsvector read at each use.
_EACH_USE = pg_search._RANKED.replace("d.v", "m.tsv").replace(
    "CROSS JOIN LATERAL (SELECT m.tsv || ''::tsvector AS v OFFSET 0) AS d\n", "")
assert "d.v" not in _EACH_USE and "LATERAL" not in _EACH_USE, "the ranking statement changed"


def _words(rng: random.Random, n: int) -> list[str]:
    # Zipf-like: word k drawn with weight 1 / (k + 1).
    return [f"w{int(VOCABULARY ** rng.random()) - 1}" for _ in range(n)]


def _memories(count: int, seed: int) -> list[Memory]:
    rng = random.Random(seed)
    return [
        Memory(type="episodic", scope=SCOPE, key=f"turn-{n}",
               text=" ".join(_words(rng, 450)), session_id=f"s{n // 12}", turn_index=n % 12,
               created_at=1_700_000_000.0 + n, updated_at=1_700_000_000.0 + n)
        for n in range(count)
    ]


async def _variant(base: str, name: str, memories: list[Memory], questions: list[str]
                   ) -> list[float]:
    with fresh_schema(base, "bench_pg_search") as url:
        store = PostgresStore(url)
        await store.open()
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("ALTER TABLE memories SET (autovacuum_enabled = false)")
                if name == "fastupdate on":
                    conn.execute("ALTER INDEX memories_tsv SET (fastupdate = on)")
            for at in range(0, len(memories), 50):
                await store.upsert(memories[at : at + 50])
            ranked = _EACH_USE if name == "each use detoasts" else pg_search._RANKED
            times = []
            with mock.patch.object(pg_search, "_RANKED", ranked):
                for question in questions:
                    start = time.perf_counter()
                    await store.search(SCOPE, question, now=1_800_000_000.0)
                    times.append((time.perf_counter() - start) * 1000)
            return times
        finally:
            await store.close()


async def run(base: str, count: int, searches: int, rounds: int) -> str:
    memories = _memories(count, seed=1)
    rng = random.Random(2)
    questions = [" ".join(_words(rng, rng.randint(6, 10))) for _ in range(searches)]
    names = ("fastupdate on", "fastupdate off", "each use detoasts")
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            times[name] += await _variant(base, name, memories, questions)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    about = machine()
    lines = [
        f"Measured {now} with `.venv/bin/python -m bench.pg_search` on {about}.",
        "",
        f"{count:,} episodes of about 450 words (a {VOCABULARY:,}-word Zipf-like "
        f"vocabulary) stored in batches of 50 with autovacuum off for the table, then "
        f"{searches} questions of 6-10 words through `PostgresStore.search`; "
        f"{rounds} rounds, the variants in alternation.",
        "",
        "| variant | search p50 ms | search mean ms | p50 against the store as it is |",
        "|---|---:|---:|---:|",
    ]
    ours = statistics.median(times["fastupdate off"])
    for name in names:
        p50 = statistics.median(times[name])
        lines.append(f"| {name}{' (as it is)' if name == 'fastupdate off' else ''} | "
                     f"{p50:.1f} | {statistics.fmean(times[name]):.1f} | {p50 / ours:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memories", type=int, default=3000)
    parser.add_argument("--searches", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print, don't touch RESULTS.md")
    args = parser.parse_args()
    base = os.environ.get("CTXPROXY_TEST_PG_URL")
    if not base:
        parser.error("needs CTXPROXY_TEST_PG_URL (`. scripts/services.sh` sets it)")
    text = asyncio.run(run(base, args.memories, args.searches, args.rounds))
    print(text)
    if not args.no_write:
        write_block(SECTION, BEGIN, END, text)


if __name__ == "__main__":
    main()
