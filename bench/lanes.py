"""A turn's own store write while episode writes queue for the one SQLite writer thread.

    .venv/bin/python -m bench.lanes             # into RESULTS.md
    .venv/bin/python -m bench.lanes --no-write  # print only

What a restart looks like to the store: every session is new to the process, so each one's
first request writes its working memory before it is forwarded, while the write queue stores
the sessions' earlier turns (``--sessions`` jobs of ``--turns`` episodes each, up to four at
once, as memory.queue runs them). Timed: how long each turn's write took, handed in while the
backlog was there, with the lanes as they are (memory.lanes: a turn's work first, background
work as if handed in ``BACKGROUND_DELAY_S`` later) and first come, first served (what a
ThreadPoolExecutor did before). The store, the writes and the backlog are the same both ways.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from bench.harness import session as bench_session
from bench.harness.results import write_block
from ctxproxy.memory import lanes
from ctxproxy.memory.model import Memory, Scope
from ctxproxy.memory.store_sqlite import SqliteStore

SECTION = "## A turn's write behind episode writes"
BEGIN = "<!-- lanes:begin (written by bench/lanes.py) -->"
END = "<!-- lanes:end -->"
SCOPE = Scope("default", "team", "agent", "user")


@contextlib.contextmanager
def first_come_first_served() -> Iterator[None]:
    """Every lane in the order work was handed in, whatever it is for."""
    kept = lanes.due
    lanes.due = lambda: (time.monotonic(), math.inf)
    try:
        yield
    finally:
        lanes.due = kept


def _episodes(session: int, turns: int, now: float) -> list[Memory]:
    rng = random.Random(session)
    return [Memory(type="episodic", scope=SCOPE, key=f"s{session}-t{n}",
                   text="\n".join(bench_session.sentence(rng, 14) for _ in range(60)),
                   session_id=f"s{session}", turn_index=n, created_at=now, updated_at=now)
            for n in range(turns)]


async def _run(store: SqliteStore, sessions: int, turns: int) -> list[float]:
    """Each session: its episodes on the backlog, then (a moment later) its turn's write."""
    now = time.time()
    backlog = asyncio.Semaphore(4)  # memory.queue.CONCURRENCY

    async def store_episodes(session: int) -> None:
        lanes.background()
        async with backlog:
            await store.upsert(_episodes(session, turns, now))

    async def turn_write(session: int) -> float:
        lanes.turn(time.monotonic())
        began = time.perf_counter()
        await store.upsert([Memory(type="working", scope=SCOPE, key=f"task:s{session}",
                                   text="Port the settle worker to the new ledger API.",
                                   session_id=f"s{session}", created_at=now, updated_at=now,
                                   expires_at=now + 1800)])
        return time.perf_counter() - began

    jobs = []
    waits: list[asyncio.Task[float]] = []
    for session in range(sessions):
        jobs.append(asyncio.ensure_future(store_episodes(session)))
        await asyncio.sleep(0.002)  # sessions arrive a little apart
        waits.append(asyncio.ensure_future(turn_write(session)))
    await asyncio.gather(*jobs)
    return list(await asyncio.gather(*waits))


async def measure(sessions: int, turns: int, rounds: int) -> dict[str, list[list[float]]]:
    out: dict[str, list[list[float]]] = {"lanes": [], "fifo": []}
    for _ in range(rounds):
        for name in ("lanes", "fifo"):
            with tempfile.TemporaryDirectory(prefix="ctxproxy-lanes-") as tmp:
                store = SqliteStore(Path(tmp) / "memory.sqlite3")
                await store.open()
                order = first_come_first_served() if name == "fifo" else contextlib.nullcontext()
                try:
                    with order:
                        out[name].append(await _run(store, sessions, turns))
                finally:
                    await store.close()
    return out


def _ms(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(results: dict[str, list[list[float]]], args: argparse.Namespace) -> str:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"`{' '.join(['.venv/bin/python -m bench.lanes', *args.argv])}` ({stamp}, Python "
        f"{sys.version.split()[0]}): {args.sessions} sessions new to the process, each with "
        f"{args.turns} earlier turns to store (60 lines each) and its turn's working-memory "
        f"write; {args.rounds} rounds each way, alternating; SQLite, one writer thread.",
        "",
        "| lanes | a turn's write p50 ms | p90 ms | max ms | median of the rounds' p90 |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, label in (("fifo", "first come, first served (before)"),
                        ("lanes", "the turn's work first (memory.lanes)")):
        every = [v for run in results[name] for v in run]
        p90s = [_ms(run, 0.9) for run in results[name]]
        lines.append(f"| {label} | {_ms(every, .5):.1f} | {_ms(every, .9):.1f} "
                     f"| {1000 * max(every):.1f} | {statistics.median(p90s):.1f} |")
    return "\n".join(lines)


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lanes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--turns", type=int, default=8, help="earlier turns a session stores")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print, don't touch RESULTS.md")
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    text = report(await measure(args.sessions, args.turns, args.rounds), args)
    print(text)
    if not args.no_write:
        write_block(SECTION, BEGIN, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
