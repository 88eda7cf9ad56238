"""What ctxproxy costs on top of the upstream: latency, CPU per request, throughput.

    make bench                      # = python -m bench.overhead; writes bench/RESULTS.md
    python -m bench.overhead --quick --no-write
    python -m bench.overhead --profile /tmp/proxy.prof [--concurrency 32]   # cProfile the proxy

The fake upstream (bench/harness/upstream.py) and ctxproxy (``python -m ctxproxy.proxy serve``)
run as their own processes on loopback; this process is the client. The same ~150 KB, 30-turn Codex
request goes straight to the upstream and through three proxies: ctxproxy with the default window
(it cuts 25 of the 30 turns, so the body is parsed, cut and re-serialised), ctxproxy with a window
that keeps everything (parsed, then the client's original bytes are forwarded), and, for
reference, a bare aiohttp relay (bench/harness/naive.py). CPU times are read from /proc for each
server process. Each figure is the median over repeated rounds, because the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench import components
from bench.harness import session as bench_session
from bench.harness.client import Client, p99
from bench.harness.machine import machine
from bench.harness.processes import (
    NAIVE_CMD,
    UPSTREAM_CMD,
    Proc,
    server_env,
    start,
    start_proxy,
    stop,
)
from bench.harness.results import RESULTS, write_block
from bench.harness.serving import free_port
from bench.harness.upstream import answer_events

SECTION = "## Proxy overhead"
BEGIN, END = "<!-- overhead:begin (written by bench/overhead.py) -->", "<!-- overhead:end -->"
TURNS = 30
SHARED = ("The machine is shared with other jobs: figures are medians over rounds, and the "
          "throughput ratio is the noisiest of them.")


# --- processes -------------------------------------------------------------------------------

@contextlib.contextmanager
def servers(workdir: Path, profile: Path | None = None) -> Iterator[list[Proc]]:
    """The upstream, then the proxies in front of it; all stopped on the way out."""
    procs: list[Proc] = []
    try:
        port = free_port()
        upstream = start("upstream", [*UPSTREAM_CMD, "--port",
                                      str(port)], server_env({}), port, workdir)
        procs.append(upstream)
        procs.append(start_proxy("defaults", upstream, workdir, profile=profile, defaults=True))
        if profile is None:
            procs.append(start_proxy("window", upstream, workdir, keep_turns=5))
            procs.append(start_proxy("passthrough", upstream, workdir, keep_turns=1000))
            port = free_port()
            procs.append(start("naive", [*NAIVE_CMD, "--port",
                                         str(port), "--upstream", upstream.url.rsplit("/", 1)[0]],
                               server_env({}), port, workdir))
        yield procs
    finally:
        for proc in reversed(procs):
            stop(proc)


def rotate(items: Sequence[Proc | None], n: int) -> list[Proc | None]:
    n %= len(items)
    return [*items[n:], *items[:n]]


@dataclass(frozen=True)
class Sizes:
    """How much to send: requests per round, rounds per phase."""

    latency_rounds: int = 5
    latency_requests: int = 200  # per target and round, c=1, interleaved
    cpu_rounds: int = 11
    cpu_requests: int = 100  # per target and round, c=1, one target at a time
    tput_rounds: int = 7
    tput_requests: int = 480  # per target and round, c=32
    paced_rounds: int = 5
    paced_requests: int = 160  # per target and round, c=32, events PACE_MS apart


QUICK = Sizes(1, 40, 2, 30, 2, 96, 1, 64)
PACE_MS = 1


@dataclass
class Results:
    """One figure per round, keyed by target name ('direct' or a proxy's name)."""

    ttfb: dict[str, list[float]] = field(default_factory=dict)  # median of the round
    ttfb_p99: dict[str, list[float]] = field(default_factory=dict)
    total: dict[str, list[float]] = field(default_factory=dict)
    total_p99: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)  # the target's s per request, c=1
    upstream_cpu: dict[str, list[float]] = field(default_factory=dict)  # the upstream's, c=1
    cpu32: dict[str, list[float]] = field(default_factory=dict)  # the target's, c=32
    client_cpu32: dict[str, list[float]] = field(default_factory=dict)  # this process's, c=32
    rps: dict[str, list[float]] = field(default_factory=dict)  # c=32
    paced_cpu: dict[str, list[float]] = field(default_factory=dict)  # c=32, paced events

    @staticmethod
    def add(table: dict[str, list[float]], key: str, value: float) -> None:
        table.setdefault(key, []).append(value)


async def measure(procs: list[Proc], sizes: Sizes) -> Results:
    upstream, proxies = procs[0], procs[1:]
    targets: list[Proc | None] = [None, *proxies]  # None: straight to the upstream
    res = Results()
    body = bench_session.encode(bench_session.request(TURNS))
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        client = Client(session, body, bench_session.headers(TURNS), b"".join(answer_events()))
        paced = Client(session, body, {**client.headers, "x-bench-pace-ms": str(PACE_MS)},
                       client.expected)
        for target in targets:  # warm up connections, caches and the proxies' code paths
            await client.batch((target or upstream).url, 32, 4)

        # Latency at concurrency 1, the targets interleaved request by request.
        for _ in range(sizes.latency_rounds):
            ttfb: dict[str, list[float]] = {}
            total: dict[str, list[float]] = {}
            for i in range(sizes.latency_requests):
                for target in rotate(targets, i):
                    name = target.name if target else "direct"
                    first, end = await client.one((target or upstream).url)
                    Results.add(ttfb, name, first)
                    Results.add(total, name, end)
            for name in ttfb:
                Results.add(res.ttfb, name, statistics.median(ttfb[name]))
                Results.add(res.ttfb_p99, name, p99(ttfb[name]))
                Results.add(res.total, name, statistics.median(total[name]))
                Results.add(res.total_p99, name, p99(total[name]))

        # CPU per request (c=1), throughput (c=32), then CPU with a paced stream (c=32): one
        # target per batch, so that each process's CPU time over the batch belongs to that
        # target's requests alone.
        phases = (("c1", client, 1, sizes.cpu_requests, sizes.cpu_rounds),
                  ("c32", client, 32, sizes.tput_requests, sizes.tput_rounds),
                  ("paced", paced, 32, sizes.paced_requests, sizes.paced_rounds))
        for phase, sender, concurrency, count, rounds in phases:
            for r in range(rounds):
                for target in rotate(targets, r):
                    name = target.name if target else "direct"
                    server = target or upstream
                    up0, cpu0, me0 = upstream.cpu_s(), server.cpu_s(), time.process_time()
                    wall = await sender.batch(server.url, count, concurrency)
                    up1, cpu1, me1 = upstream.cpu_s(), server.cpu_s(), time.process_time()
                    if phase == "c1":
                        Results.add(res.cpu, name, (cpu1 - cpu0) / count)
                        Results.add(res.upstream_cpu, name, (up1 - up0) / count)
                    elif phase == "c32":
                        Results.add(res.cpu32, name, (cpu1 - cpu0) / count)
                        Results.add(res.client_cpu32, name, (me1 - me0) / count)
                        Results.add(res.rps, name, count / wall)
                    else:
                        Results.add(res.paced_cpu, name, (cpu1 - cpu0) / count)
    return res


# --- the report ------------------------------------------------------------------------------

LABELS = {
    "defaults": "ctxproxy, the defaults (window, knowledge, memory)",
    "window": "ctxproxy, window only (memory off)",
    "passthrough": "ctxproxy, nothing to cut (client's bytes forwarded)",
    "naive": "reference: bare aiohttp relay (bench/harness/naive.py)",
}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def report(res: Results, proxies: list[str], body_kb: float) -> str:
    """The markdown table and the notes under it."""
    med = statistics.median

    def added(table: dict[str, list[float]], p: str) -> str:
        # Proxied minus direct within each round, then the median over the rounds.
        return _ms(med([a - b for a, b in zip(table[p], table["direct"], strict=True)]))

    def ratio(num: dict[str, list[float]], den: dict[str, list[float]], p: str) -> float:
        return med([a / b for a, b in zip(num[p], den["direct"], strict=True)])

    rows = [
        "| | target | " + " | ".join(LABELS.get(p, p) for p in proxies) + " |",
        "|---|---|" + "---|" * len(proxies),
    ]

    def row(label: str, target: str, cells: list[str]) -> None:
        rows.append(f"| {label} | {target} | " + " | ".join(cells) + " |")

    row("added TTFB, median (ms), c=1", "< 1", [added(res.ttfb, p) for p in proxies])
    row("added TTFB, p99 (ms), c=1", "", [added(res.ttfb_p99, p) for p in proxies])
    row("added time to end of stream, median (ms)", "", [added(res.total, p) for p in proxies])
    row("added time to end of stream, p99 (ms)", "", [added(res.total_p99, p) for p in proxies])
    row("CPU per request (ms), c=1", "", [_ms(med(res.cpu[p])) for p in proxies])
    row("CPU per request / upstream's, c=1", "<= 2x",
        [f"{ratio(res.cpu, res.upstream_cpu, p):.2f}x" for p in proxies])
    row("CPU per request / upstream's, c=32", "<= 2x",
        [f"{ratio(res.cpu32, res.cpu32, p):.2f}x" for p in proxies])
    row(f"CPU per request / upstream's, c=32, events {PACE_MS} ms apart", "",
        [f"{ratio(res.paced_cpu, res.paced_cpu, p):.2f}x" for p in proxies])
    row("throughput / direct, c=32", "", [f"{ratio(res.rps, res.rps, p):.2f}" for p in proxies])
    if "naive" in proxies:
        def vs_relay(table: dict[str, list[float]], p: str, added: bool) -> str:
            base = table["direct"] if added else [0.0] * len(table[p])
            mine = [a - b for a, b in zip(table[p], base, strict=True)]
            relay = [a - b for a, b in zip(table["naive"], base, strict=True)]
            return f"{med(mine) / med(relay):.2f}x" if med(relay) > 0 else "-"

        row("added TTFB / the bare relay's, c=1", "<= 1.5x",
            [vs_relay(res.ttfb, p, True) for p in proxies])
        row("CPU per request / the bare relay's, c=1", "<= 1.5x",
            [vs_relay(res.cpu, p, False) for p in proxies])

    return "\n".join([*rows, "", *_notes(res, proxies, body_kb)])


def _notes(res: Results, proxies: list[str], body_kb: float) -> list[str]:
    med = statistics.median
    answer = answer_events()
    return [
        f"- Request: {body_kb:.0f} KB, {TURNS} turns (bench/harness/session.py), streaming. "
        f"Answer: {len(answer)} SSE events, {len(b''.join(answer)) / 1024:.0f} KB, one event per "
        "write (bench/harness/upstream.py). Every answer is checked byte for byte against the "
        "upstream's.",
        f"- Direct: TTFB median {_ms(med(res.ttfb['direct']))} ms (p99 "
        f"{_ms(med(res.ttfb_p99['direct']))}), end of stream {_ms(med(res.total['direct']))} "
        f"ms; upstream CPU {_ms(med(res.upstream_cpu['direct']))} ms per request at c=1, "
        f"{_ms(med(res.cpu32['direct']))} ms at c=32; {med(res.rps['direct']):.0f} requests/s "
        "at c=32.",
        f"- With events {PACE_MS} ms apart (as a model streams them; every event is its own "
        "read and write in the proxy), CPU per request at c=32: "
        + ", ".join(f"{p} {_ms(med(res.paced_cpu[p]))} ms" for p in ["direct", *proxies])
        + " (direct: the upstream's).",
        "- Upstream CPU per proxied request at c=1 (the window sends it the cut body): "
        + ", ".join(f"{p} {_ms(med(res.upstream_cpu[p]))} ms" for p in proxies) + ".",
        "- The load generator shares the 2 cores: its own CPU per request at c=32 is "
        + ", ".join(f"{p} {_ms(med(res.client_cpu32[p]))} ms" for p in ["direct", *proxies])
        + ". Throughput is bounded by client + proxy + upstream CPU together, which is why "
        "the CPU ratio is the steadier figure.",
    ]


def write_results(text: str) -> None:
    write_block(SECTION, BEGIN, END, text)


# --- profile ---------------------------------------------------------------------------------


async def drive(url: str, count: int, concurrency: int) -> None:
    body = bench_session.encode(bench_session.request(TURNS))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        client = Client(session, body, bench_session.headers(TURNS), b"".join(answer_events()))
        await client.batch(url, count, concurrency)


def profile(out: Path, count: int, concurrency: int, keep_turns: int) -> None:
    with tempfile.TemporaryDirectory(prefix="ctxproxy-bench-") as tmp:
        workdir = Path(tmp)
        port = free_port()
        upstream = start("upstream", [*UPSTREAM_CMD, "--port",
                                      str(port)], server_env({}), port, workdir)
        try:
            proxy = start_proxy("profiled", upstream, workdir, keep_turns, profile=out)
            try:
                asyncio.run(drive(proxy.url, count, concurrency))
            finally:
                stop(proxy)  # SIGTERM: the proxy shuts down cleanly and cProfile writes out
        finally:
            stop(upstream)
    stats = pstats.Stats(str(out))
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(40)


# --- main ------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--no-write", action="store_true", help="print, don't touch RESULTS.md")
    parser.add_argument("--profile", type=Path, metavar="FILE",
                        help="cProfile the proxy over --count requests instead, write FILE")
    parser.add_argument("--count", type=int, default=2000, help="requests to profile")
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight")
    parser.add_argument("--keep-turns", type=int, default=5, help="the profiled proxy's window")
    args = parser.parse_args(argv)
    if args.profile:
        profile(args.profile, args.count, args.concurrency, args.keep_turns)
        return 0

    sizes = QUICK if args.quick else Sizes()
    started = time.monotonic()
    about = f"{machine()}. {SHARED}"
    # Timed before and after the run, keeping each row's best: the machine is shared.
    parts_before = components.measure()
    body_kb = len(bench_session.encode(bench_session.request(TURNS))) / 1024
    with tempfile.TemporaryDirectory(prefix="ctxproxy-bench-") as tmp, \
            servers(Path(tmp)) as procs:
        res = asyncio.run(measure(procs, sizes))
        names = [p.name for p in procs[1:]]
    table = report(res, names, body_kb)
    parts = components.table(parts_before, components.measure())
    today = datetime.date.today().isoformat()
    command = "`make bench`" if not args.quick else "`.venv/bin/python -m bench.overhead --quick`"
    text = (f"Measured {today} with {command} on {about} Run time "
            f"{time.monotonic() - started:.0f} s.\n\n{table}\n\n"
            "The proxy's own work on the same request, timed in process (best of 7 runs, so "
            "with warm caches; inside the running proxy it costs about twice this; "
            f"`python -m bench components`):\n\n{parts}")
    print(text)
    if not args.no_write:
        write_results(text)
        print(f"\nwritten to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
