"""Memory recall: do facts cut from the window come back when asked, at what cost and speed.

    python -m bench.recall                      # both stores at 10k and 100k, into RESULTS.md
    python -m bench.recall --quick --no-write   # 2k and 10k, fewer sessions, print only
    python -m bench.recall --stores sqlite --pg-url postgresql://...

For each store (SQLite in a temporary directory; PostgreSQL in a fresh schema of ``--pg-url``,
default ``$CTXPROXY_TEST_PG_URL``) and each size, the store is filled directly with ``upsert``
in batches to that many background memories (synthetic episodes, facts and task notes, most in
the scope the sessions use), then:

- store latency: ``search`` (the ranked full-text candidates of recall) and ``list`` (the recent
  window) over that scope, p50/p95 over many questions;
- end to end: long synthetic Codex sessions (shapes from ../shared/fixtures/codex, text written
  in bench/recall_data.py, as is the background's) go through the real proxy
  (``proxy.assemble.build_app``) to an in-process fake upstream that records what it
  received. Each session states facts in its first turns and asks about them many turns
  later, after the window (5 turns) has cut them. Reported: recall@k (the share of asks whose
  fact was in the forwarded prompt while its statement was not), the memory tokens the memory
  step added to those requests, and the time spent in the memory step.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from bench.harness.postgres import with_search_path
from bench.harness.results import RESULTS, write_block
from bench.harness.serving import serve_plain
from bench.harness.upstream import answer_events
from bench.recall_data import (
    SCOPE,
    SERVICE,
    Fact,
    Text,
    background_scope,
    make_session,
    prompts,
    questions,
    session_requests,
)
from ctxproxy.config import Settings, load_settings
from ctxproxy.injectors import tokens
from ctxproxy.memory.model import Store
from ctxproxy.memory.stores import make_store
from ctxproxy.proxy.app import PIPELINE
from ctxproxy.proxy.assemble import build_app
from ctxproxy.request import Answer, End, Exchange, Hold, Step

SECTION = "## Memory recall"
BEGIN, END = "<!-- recall:begin (written by bench/recall.py) -->", "<!-- recall:end -->"
STORES = ("sqlite", "postgres")
BATCH = 1000


# --- stores --------------------------------------------------------------------------------------


@asynccontextmanager
async def backend(name: str, pg_url: str | None, data_dir: Path) -> AsyncIterator[dict[str, Any]]:
    """Settings values that select a fresh, empty store of kind ``name``."""
    values: dict[str, Any] = {"data_dir": data_dir, "service_id": SERVICE}
    if name == "sqlite":
        yield values
        return
    import psycopg

    if not pg_url:
        raise SystemExit("bench.recall: postgres needs --pg-url or CTXPROXY_TEST_PG_URL")
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield {**values, "store_url": with_search_path(pg_url, schema)}
    finally:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


async def fill(store: Store, text: Text, start: int, stop: int, now: float) -> float:
    """Upsert background memories ``start..stop`` in batches; returns rows per second."""
    began = time.perf_counter()
    for first in range(start, stop, BATCH):
        batch = [text.memory(background_scope(text.rng), n, now)
                 for n in range(first, min(first + BATCH, stop))]
        await store.upsert(batch)
    elapsed = time.perf_counter() - began
    return (stop - start) / elapsed if elapsed > 0 else 0.0


async def analyze(values: dict[str, Any]) -> None:
    """Refresh PostgreSQL's table statistics, as autovacuum does after a bulk of writes (the
    search reads them to tell rare words from common ones)."""
    url = values.get("store_url")
    if not url:
        return
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("ANALYZE memories")


async def store_latency(store: Store, asked: Sequence[str], long: Sequence[str],
                        now: float) -> dict[str, float]:
    """p50/p95 (ms) of recall's two store calls over the sessions' scope."""
    question_ms, prompt_ms, list_ms = [], [], []
    for q, p in zip(asked, long, strict=True):
        t0 = time.perf_counter()
        await store.search(SCOPE, q, limit=20, now=now)
        t1 = time.perf_counter()
        await store.search(SCOPE, p, limit=20, now=now)
        t2 = time.perf_counter()
        await store.list(SCOPE, since=now - 86400, limit=20, now=now)
        t3 = time.perf_counter()
        question_ms.append((t1 - t0) * 1000)
        prompt_ms.append((t2 - t1) * 1000)
        list_ms.append((t3 - t2) * 1000)
    return {
        "question_p50": percentile(question_ms, 50), "question_p95": percentile(question_ms, 95),
        "prompt_p50": percentile(prompt_ms, 50), "prompt_p95": percentile(prompt_ms, 95),
        "list_p50": percentile(list_ms, 50), "list_p95": percentile(list_ms, 95),
    }


def percentile(values: Sequence[float], p: int) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


# --- end to end ----------------------------------------------------------------------------------


class Recorder:
    """The fake upstream: records each body, answers with a complete SSE stream."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.answer = b"".join(answer_events())

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024**3)
        app.router.add_post("/v1/responses", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.read())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(self.answer)
        await resp.write_eof()
        return resp


@dataclass
class Timed:
    """Wraps the memory step: its wall time, and the text it added to each request."""

    inner: Step
    name: str
    ms: list[float] = field(default_factory=list)
    added: list[str] = field(default_factory=list)

    async def __call__(self, ex: Exchange) -> None:
        before_instr = ex.body.get("instructions") or ""
        before = ex.body.get("input")
        before_ids = {id(item) for item in before} if isinstance(before, list) else set()
        t0 = time.perf_counter()
        try:
            await self.inner(ex)
        finally:
            self.ms.append((time.perf_counter() - t0) * 1000)
        after_instr = ex.body.get("instructions") or ""
        added = after_instr.removeprefix(before_instr)
        after = ex.body.get("input")
        for item in after if isinstance(after, list) else []:
            if id(item) not in before_ids:  # steps add new items, never edit the client's
                added += "\n" + _item_text(item)
        self.added.append(added)

    # The memory step's other phases, passed on: the pipeline finds each phase's steps by
    # the methods they have, and the memory step keeps what a turn brought in them.
    def answering(self, ex: Exchange, status: int) -> Hold | None:
        return self.inner.answering(ex, status)  # type: ignore[union-attr]

    def completed(self, ex: Exchange, answer: Answer) -> None:
        self.inner.completed(ex, answer)  # type: ignore[union-attr]

    def ended(self, end: End) -> None:
        self.inner.ended(end)  # type: ignore[union-attr]


def timed_memory(app: web.Application) -> Timed | None:
    """The app's memory step wrapped in ``Timed``, put in its place; None without one.
    Through the pipeline's ``steps`` setter: it sorts the steps by phase, and a step put
    into the list it returns would never run."""
    pipeline = app[PIPELINE]
    steps = list(pipeline.steps)
    at = next((i for i, s in enumerate(steps) if "memory" in s.name), None)
    if at is None:
        return None
    timed = Timed(steps[at], steps[at].name)
    steps[at] = timed  # type: ignore[call-overload]
    pipeline.steps = steps
    return timed


def _item_text(item: Any) -> str:
    content = item.get("content") if isinstance(item, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


@dataclass
class E2E:
    asks: int = 0
    recalled: int = 0
    still_in_window: int = 0
    memory_tokens: list[int] = field(default_factory=list)  # per ask
    step_ms: list[float] = field(default_factory=list)  # every request
    skipped: str = ""


async def end_to_end(values: dict[str, Any], n_sessions: int, turns: int, n_facts: int,
                     seed: int) -> E2E:
    """Run synthetic sessions through the full proxy; score every ask."""
    result = E2E()
    recorder = Recorder()
    upstream, upstream_url = await serve_plain(recorder.app())
    settings = load_settings(env={}, **{**values, "upstream_url": upstream_url + "/v1"})
    app = build_app(settings)
    proxy, proxy_url = await serve_plain(app)
    started = time.time()
    try:
        timed = timed_memory(app)
        if timed is None and settings.memory_enabled:
            result.skipped = "the app has no memory step (proxy/memory_wiring.py returns None)"
            return result
        rng = random.Random(seed)
        async with aiohttp.ClientSession() as client:
            for n in range(n_sessions):
                session = make_session(rng, turns, n_facts)
                for turn, body, headers in session_requests(session, seed + n):
                    async with client.post(proxy_url + "/v1/responses", data=orjson.dumps(body),
                                           headers=headers) as resp:
                        await resp.read()
                        if resp.status != 200:
                            raise RuntimeError(f"proxy answered {resp.status}")
                    fact = session.asks.get(turn)
                    if fact is not None:
                        added = timed.added[-1] if timed else ""
                        score_ask(result, fact, recorder.bodies[-1], added)
        result.step_ms = timed.ms if timed else []
    finally:
        await proxy.cleanup()  # drains the memory writes
        await upstream.cleanup()
        await _forget_run(settings, started)
    return result


def score_ask(result: E2E, fact: Fact, forwarded: bytes, added: str) -> None:
    body = orjson.loads(forwarded)
    items = body.get("input") or []
    said = [_item_text(i) for i in items if isinstance(i, dict) and i.get("role") == "user"]
    result.asks += 1
    if any(fact.statement in text for text in said):  # the window kept the user's own words
        result.still_in_window += 1
        return
    if fact.value in (body.get("instructions") or "") or fact.value in orjson.dumps(items).decode():
        result.recalled += 1
    result.memory_tokens.append(tokens.count(added))


async def _forget_run(settings: Settings, started: float) -> None:
    """Delete what the sessions wrote, so the next size starts from background only."""
    store = make_store(settings)
    await store.open()
    try:
        written = await store.list(None, since=started - 1, limit=10_000_000)
        await store.delete([m.memory_id for m in written])
    finally:
        await store.close()


# --- the run ---------------------------------------------------------------------------------


@dataclass
class Row:
    store: str
    size: int
    in_scope: int
    fill_rate: float
    latency: dict[str, float]
    e2e: E2E


async def baseline(args: argparse.Namespace, tmp: Path) -> Row:
    """The same sessions through a proxy without memory: what the window alone keeps."""
    values = {"data_dir": tmp / "baseline", "service_id": SERVICE, "memory_enabled": False}
    e2e = await end_to_end(values, args.sessions, args.turns, args.facts, seed=1)
    nan = float("nan")
    latency = dict.fromkeys(("question_p50", "question_p95", "prompt_p50", "prompt_p95",
                             "list_p50", "list_p95"), nan)
    return Row("memory off", 0, 0, nan, latency, e2e)


async def run_store(name: str, args: argparse.Namespace, tmp: Path) -> list[Row]:
    rows: list[Row] = []
    async with backend(name, args.pg_url, tmp / name) as values:
        settings = load_settings(env={}, **values)
        store = make_store(settings)
        await store.open()
        text = Text(seed=11)
        asked, long = questions(args.queries), prompts(text, args.queries)
        now, filled = time.time(), 0
        try:
            for size in args.sizes:
                print(f"[{name}] filling to {size} memories ...", flush=True)
                rate = await fill(store, text, filled, size, now)
                filled = size
                # As a running store would be: table statistics fresh, caches reset.
                await store.close()
                await analyze(values)
                store = make_store(settings)
                await store.open()
                in_scope = len(await store.list(SCOPE, types=("episodic", "semantic"),
                                                limit=10_000_000, now=now))
                latency = await store_latency(store, asked, long, time.time())
                print(f"[{name}] {size}: search p50 {latency['question_p50']:.1f} ms; "
                      "sessions through the proxy ...", flush=True)
                e2e = await end_to_end(values, args.sessions, args.turns, args.facts, seed=size)
                rows.append(Row(name, size, in_scope, rate, latency, e2e))
        finally:
            await store.close()
    return rows


def report(rows: Sequence[Row], args: argparse.Namespace) -> str:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"### Run of {stamp}",
        "",
        f"`python -m bench.recall {' '.join(args.argv)}`".replace(" `", "`"),
        f"on {platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} CPUs (shared); {args.sessions} sessions of {args.turns} turns, "
        f"{args.facts} facts stated in turns 1-{args.facts} and asked in the last "
        f"{args.facts} turns (window: 5 turns); tokens: {tokens.encoding_name()}.",
        "",
        "| store | memories | in scope | fill rows/s | search: question p50 / p95 ms "
        "| search: long prompt p50 / p95 ms | list p50 / p95 ms "
        "| recall@k | memory tokens / ask (mean) | memory step p50 / p95 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lat, e = r.latency, r.e2e
        if e.skipped:
            recall = tokens_cell = step = "n/a"
        else:
            scored = e.asks - e.still_in_window
            recall = f"{e.recalled / scored:.0%} ({e.recalled}/{scored})" if scored else "n/a"
            tokens_cell = f"{statistics.mean(e.memory_tokens):.0f}" if e.memory_tokens else "0"
            step = f"{percentile(e.step_ms, 50):.1f} / {percentile(e.step_ms, 95):.1f}"
        if r.size == 0:
            lines.append(f"| {r.store} | - | - | - | - | - | - | {recall} | 0 | - |")
            continue
        lines.append(
            f"| {r.store} | {r.size:,} | {r.in_scope:,} | {r.fill_rate:,.0f} "
            f"| {lat['question_p50']:.1f} / {lat['question_p95']:.1f} "
            f"| {lat['prompt_p50']:.1f} / {lat['prompt_p95']:.1f} "
            f"| {lat['list_p50']:.1f} / {lat['list_p95']:.1f} "
            f"| {recall} | {tokens_cell} | {step} |"
        )
    skipped = {r.e2e.skipped for r in rows if r.e2e.skipped}
    for reason in sorted(skipped):
        lines += ["", f"End to end not measured: {reason}."]
    notes = [r for r in rows if r.e2e.still_in_window]
    for r in notes:
        lines += ["", f"{r.store} {r.size:,}: {r.e2e.still_in_window} asks still had their "
                  "fact inside the window (not scored)."]
    lines += ["", "Background: synthetic episodes, facts and task notes (Zipf-distributed "
              "words), half of them in the sessions' scope (\"in scope\": live episodic and "
              "semantic ones), upserted in batches of 1,000 (PostgreSQL: then `ANALYZE`, as "
              "autovacuum would). search: `Store.search` over that scope (limit 20) with the "
              "facts' questions, and with long prompts of the "
              "background's own frequent words, which match most of the scope (the worst case "
              "for a ranked search); list: `Store.list` of the last day (limit 20). recall@k: "
              "asks whose fact value reached the upstream while its statement had been cut; "
              "memory tokens: what the memory step added to those requests; memory step: its "
              "wall time on every request, as the proxy runs it."]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.recall", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stores", default=",".join(STORES),
                        help="comma-separated: sqlite, postgres (with only one, nothing is "
                             "written to RESULTS.md)")
    parser.add_argument("--sizes", default="10000,100000", help="background memories")
    parser.add_argument("--pg-url", default=os.environ.get("CTXPROXY_TEST_PG_URL"),
                        help="PostgreSQL server to create a scratch schema in")
    parser.add_argument("--sessions", type=int, default=16)
    # 20: the asks come 17 turns after the statements, past what the cut digest shows (the
    # newest 12 cut turns, window/digest.py), so the figure is memory's; at 14 the digest
    # alone carried every fact (memory off: 48/48).
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--facts", type=int, default=3)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="2k and 10k, 6 sessions")
    parser.add_argument("--no-write", action="store_true", help="print, don't touch RESULTS.md")
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    if args.quick:
        args.sizes, args.sessions, args.queries = "2000,10000", 6, 40
    args.sizes = [int(s) for s in str(args.sizes).split(",")]
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    # The block holds one run of every store: a run of some would drop the others' rows.
    args.partial = not args.no_write and sorted(args.stores) != sorted(STORES)
    args.no_write = args.no_write or args.partial
    if args.turns < 2 * args.facts + 7:
        parser.error("--turns must leave the window (5 turns) between statements and asks")
    return args


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ctxproxy-recall-") as tmp:
        rows = [await baseline(args, Path(tmp))]
        for name in args.stores:
            rows += await run_store(name, args, Path(tmp))
    text = report(rows, args)
    print(text)
    if args.partial:
        print(f"\nnot written to {RESULTS}: its block holds a run of every store")
    if not args.no_write:
        write_results(text)
        print(f"\nwritten to {RESULTS}")
    return 0


def write_results(text: str) -> None:
    write_block(SECTION, BEGIN, END, text)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
