"""The dashboard with a full ledger: each /ui page's load time with 100k request rows (goal:
under 200 ms), beside /healthz on the same server as the floor; and `ctxproxy stats`' query.

    python -m bench.dashboard [--rows 100000] [--store-url postgresql://...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import aiohttp

from bench.harness.machine import revision
from bench.harness.postgres import fresh_schema
from bench.harness.results import write_block
from bench.harness.serving import free_port, serve
from ctxproxy.config import load_settings
from ctxproxy.ledger.model import Record
from ctxproxy.ledger.stores import make_ledger
from ctxproxy.proxy.assemble import build_app

SECTION = "## Dashboard"
BEGIN = "<!-- dashboard:begin (written by bench/dashboard.py) -->"
END = "<!-- dashboard:end -->"
DAY = 86_400.0
MODELS = ("gpt-5", "gpt-5-codex", "gpt-5-mini", "some-local-model")


def rows(n: int, sessions: int, now: float, seed: int = 7) -> list[Record]:
    """``n`` rows over the last 30 days, in ``sessions`` sessions of growing requests."""
    r = random.Random(seed)
    out = []
    for i in range(n):
        at = now - 30 * DAY + 30 * DAY * i / n
        client = r.randint(5_000, 150_000)
        forwarded = int(client * r.uniform(0.3, 1.0))
        out.append(Record(
            at=at, session_id=f"session-{i * sessions // n:05d}", model=r.choice(MODELS),
            status=200, client_tokens=client, forwarded_tokens=forwarded,
            input_tokens=forwarded, cached_tokens=int(forwarded * r.uniform(0.5, 0.95)),
            output_tokens=r.randint(50, 2000), direct_input=client,
            direct_cached=int(client * r.uniform(0.8, 0.98)), turns_in=r.randint(1, 40),
            turns_forwarded=r.randint(1, 5), items_cut=r.randint(0, 200),
            outputs_masked=r.randint(0, 5),
            memory_ids=tuple(f"mem_{r.getrandbits(64):016x}" for _ in range(r.randint(0, 3))),
            knowledge=r.random() < 0.5, degraded=("memory",) if r.random() < 0.01 else (),
            ttfb_ms=r.uniform(200, 3000),
        ))
    return out


async def fill(settings_kw: dict[str, object], n: int, sessions: int, now: float) -> float:
    settings = load_settings(env={}, **settings_kw)
    ledger = make_ledger(settings)
    await ledger.open()
    started = time.perf_counter()
    try:
        batch = rows(n, sessions, now)
        for i in range(0, n, 5000):
            await ledger.insert(batch[i : i + 5000])
    finally:
        await ledger.close()
    return time.perf_counter() - started


async def measure(settings_kw: dict[str, object], pages: Sequence[str],
                  repeat: int) -> dict[str, list[float]]:
    settings = load_settings(env={}, port=free_port(), log_level="WARNING",
                             upstream_url="http://127.0.0.1:9/v1", **settings_kw)
    proxy = await serve(build_app(settings), port=settings.port)
    times: dict[str, list[float]] = {p: [] for p in pages}
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(repeat + 1):  # the first round warms caches: not counted
                for page in pages:
                    started = time.perf_counter()
                    async with http.get(proxy.url + page) as resp:
                        await resp.read()
                        assert resp.status == 200, (page, resp.status)
                    times[page].append(time.perf_counter() - started)
    finally:
        await proxy.close()
    return {p: t[1:] for p, t in times.items()}


@contextmanager
def scratch(url: str | None) -> Iterator[str | None]:
    """A schema of its own in the database at ``url`` (dropped after), or None."""
    if not url:
        yield None
        return
    with fresh_schema(url, "bench_dashboard") as scoped:
        yield scoped


async def main_async(args: argparse.Namespace) -> str:
    now = time.time()
    with (tempfile.TemporaryDirectory(prefix="ctxproxy-dash-") as tmp,
          scratch(args.store_url) as url):
        kw: dict[str, object] = {"data_dir": Path(tmp)}
        if url:
            kw["store_url"] = url
        filled = await fill(kw, args.rows, args.sessions, now)
        pages = ["/healthz", "/ui", "/ui?since=24h", "/ui?since=all", "/ui/sessions",
                 "/ui/sessions?since=all", "/ui/sessions/session-00500", "/ui/memory"]
        times = await measure(kw, pages, args.repeat)
        # `ctxproxy stats` reads the same sums: time its query the same way.
        settings = load_settings(env={}, **kw)
        ledger = make_ledger(settings)
        await ledger.open()
        stats: list[float] = []
        try:
            for _ in range(args.repeat):
                started = time.perf_counter()
                await ledger.totals("day", since=now - 7 * DAY)
                stats.append(time.perf_counter() - started)
        finally:
            await ledger.close()
    store = "PostgreSQL" if args.store_url else "SQLite"
    lines = [
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC at `{revision()}` with "
        f"`{args.command}` on {os.cpu_count()} shared cores, Python "
        f"{platform.python_version()}, load average {os.getloadavg()[0]:.2f}: {args.rows:,} "
        f"request rows in {args.sessions:,} sessions over 30 days ({store}, inserted in "
        f"{filled:.1f} s), each page fetched {args.repeat} times after one warm-up, over "
        "loopback (the whole request, HTML included). Goal: every page under 200 ms.",
        "",
        "| page | median ms | max ms |",
        "| --- | ---: | ---: |",
    ]
    for page, t in times.items():
        lines.append(f"| `{page}` | {statistics.median(t) * 1000:.1f} | {max(t) * 1000:.1f} |")
    lines.append(f"| `ctxproxy stats` query (7 days, by day) | "
                 f"{statistics.median(stats) * 1000:.1f} | {max(stats) * 1000:.1f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--sessions", type=int, default=2_000)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--store-url", help="a PostgreSQL URL (default: SQLite)")
    parser.add_argument("--no-write", action="store_true", help="don't touch bench/RESULTS.md")
    args = parser.parse_args(argv)
    shown = [a if "://" not in a else "postgresql://..." for a in
             (sys.argv[1:] if argv is None else argv)]
    args.command = "python -m bench.dashboard" + "".join(f" {shlex.quote(a)}" for a in shown)
    text = asyncio.run(main_async(args))
    print(text)
    if not args.no_write:
        begin = BEGIN if not args.store_url else BEGIN.replace("dashboard:", "dashboard-pg:")
        end = END if not args.store_url else END.replace("dashboard:", "dashboard-pg:")
        write_block(SECTION, begin, end, text)


if __name__ == "__main__":
    main()
