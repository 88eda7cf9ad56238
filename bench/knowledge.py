"""What knowledge discovery adds to the time to first byte.

    .venv/bin/python -m bench.knowledge            # writes its section of bench/RESULTS.md
    .venv/bin/python -m bench.knowledge --quick --no-write

The fake upstream (bench/harness/upstream.py) and two ctxproxy processes run on loopback; this
process is the client. The same 30-turn Codex request (bench/harness/session.py) goes three
ways, interleaved request by request:

- *window alone*: proxy A, no team header, so the knowledge step has nothing to do;
- *discovery, warm cache*: proxy A with ``x-team-id``; the embedded core lists one wiki and
  the ``<knowledge_tools>`` block is appended (the cache was filled during warm-up);
- *dead core*: proxy B, whose ``CORE_URL`` accepts connections and never answers; the first
  request waits ``CORE_TIMEOUT_MS`` (reported on its own), the rest hit the negative cache.

Afterwards the proxies' /metrics must show the cache hits, so the figures are what they claim.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from bench.harness import session as bench_session
from bench.harness.client import Client, p99
from bench.harness.machine import machine
from bench.harness.processes import UPSTREAM_CMD, Proc, proxy_cmd, server_env, start, stop
from bench.harness.results import RESULTS, write_block
from bench.harness.serving import free_port
from bench.harness.upstream import answer_events

SECTION = "## Knowledge discovery"
BEGIN, END = "<!-- knowledge:begin (written by bench/knowledge.py) -->", "<!-- knowledge:end -->"
TURNS = 30
TEAM = "team-bench"
TIMEOUT_MS = 1500  # the default CORE_TIMEOUT_MS
NEGATIVE_TTL_S = 3600  # longer than the run: only the first dead-core request waits

PAGES = {
    "auth.md": "# Authentication\n\nAccess tokens rotate hourly; refresh tokens last 30 days.\n",
    "ledger/settle.md": "# Settlement\n\nThe settle step is idempotent per refund key.\n",
    "ops/deploy.md": "# Deploying\n\nHelm charts from main; rollbacks with helm rollback.\n",
}


def start_proxy(name: str, upstream: Proc, workdir: Path, extra: dict[str, str]) -> Proc:
    port = free_port()
    env = server_env({
        "CTXPROXY_PORT": str(port),
        "CTXPROXY_UPSTREAM_URL": f"http://127.0.0.1:{upstream.port}/v1",
        "CTXPROXY_MEMORY_ENABLED": "false",
        "CTXPROXY_DATA_DIR": str(workdir / f"{name}-data"),
        **extra,
    })
    return start(name, proxy_cmd(), env, port, workdir)


def add_wiki(workdir: Path, data_dir: Path) -> str:
    docs = workdir / "docs"
    for name, text in PAGES.items():
        (docs / name).parent.mkdir(parents=True, exist_ok=True)
        (docs / name).write_text(text)
    env = server_env({"CTXPROXY_DATA_DIR": str(data_dir)})
    out = subprocess.run(
        [sys.executable, "-m", "ctxproxy.proxy", "knowledge", "add-wiki", "--team", TEAM, "--name",
         "Ledger docs", "--summary", "Design notes of the ledger service", str(docs)],
        env=env, check=True, capture_output=True, text=True,
    )
    return out.stdout.strip()


async def black_hole() -> tuple[asyncio.Server, int]:
    """A core that accepts connections and never answers."""
    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the proxy gives up and closes
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1])


def metric(proc: Proc, name: str, label: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{proc.port}/metrics", timeout=5) as r:
        text = r.read().decode()
    match = re.search(rf'^{name}{{result="{label}"}} (\S+)$', text, re.M)
    return float(match[1]) if match else 0.0


async def measure(proxy: Proc, dead: Proc, requests: int) -> tuple[dict[str, list[float]], float]:
    body = bench_session.encode(bench_session.request(TURNS))
    plain = bench_session.headers(TURNS)
    team = {**plain, "x-team-id": TEAM}
    targets = [("window alone", proxy.url, plain), ("discovery, warm cache", proxy.url, team),
               ("dead core, after the first timeout", dead.url, team)]
    ttfb: dict[str, list[float]] = {name: [] for name, _, _ in targets}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        client = Client(session, body, plain, b"".join(answer_events()))
        client.headers = team
        first_timeout, _ = await client.one(dead.url)  # pays CORE_TIMEOUT_MS once
        for _ in range(20):  # warm up connections, caches and code paths
            for _, url, headers in targets:
                client.headers = headers
                await client.one(url)
        for i in range(requests):
            for name, url, headers in targets[i % 3:] + targets[: i % 3]:
                client.headers = headers
                first, _ = await client.one(url)
                ttfb[name].append(first)
    return ttfb, first_timeout


def report(ttfb: dict[str, list[float]], first_timeout: float, requests: int) -> str:
    def ms(seconds: float) -> str:
        return f"{seconds * 1000:.2f}"

    base = ttfb["window alone"]
    rows = ["| | TTFB median (ms) | TTFB p99 (ms) | added, median (ms) | added, p99 (ms) |",
            "|---|---|---|---|---|"]
    for name, values in ttfb.items():
        added_med = statistics.median(values) - statistics.median(base)
        added_p99 = p99(values) - p99(base)
        rows.append(f"| {name} | {ms(statistics.median(values))} | {ms(p99(values))} | "
                    f"{'—' if values is base else ms(added_med)} | "
                    f"{'—' if values is base else ms(added_p99)} |")
    notes = [
        f"- {requests} requests per row, interleaved (rotating order), concurrency 1, the same "
        f"{len(bench_session.encode(bench_session.request(TURNS))) // 1024} KB, "
        f"{TURNS}-turn request; "
        "the window cuts it to 5 turns in every row.",
        f"- The first request to the dead core waited {ms(first_timeout)} ms "
        f"(CORE_TIMEOUT_MS={TIMEOUT_MS}); with the default KNOWLEDGE_NEGATIVE_TTL_S=30 one "
        "request per 30 s per (team, agent, user key) pays that again. This run set it to "
        f"{NEGATIVE_TTL_S} s so that every later request measures the negative-cache path.",
        "- Checked from the proxies' /metrics after the run: every discovery request was a "
        "cache hit (or negative hit), so no row includes a core call.",
    ]
    return "\n".join([*rows, "", *notes])


def write_results(text: str) -> None:
    write_block(SECTION, BEGIN, END, text)


async def run(workdir: Path, requests: int) -> tuple[dict[str, list[float]], float]:
    hole, hole_port = await black_hole()
    procs: list[Proc] = []
    try:
        port = free_port()
        upstream = start("upstream", [*UPSTREAM_CMD, "--port",
                                      str(port)], server_env({}), port, workdir)
        procs.append(upstream)
        add_wiki(workdir, workdir / "embedded-data")
        proxy = start_proxy("embedded", upstream, workdir, {})
        procs.append(proxy)
        dead = start_proxy("dead", upstream, workdir, {
            "CTXPROXY_CORE_URL": f"http://127.0.0.1:{hole_port}",
            "CTXPROXY_CORE_TIMEOUT_MS": str(TIMEOUT_MS),
            "CTXPROXY_KNOWLEDGE_NEGATIVE_TTL_S": str(NEGATIVE_TTL_S),
        })
        procs.append(dead)
        ttfb, first = await measure(proxy, dead, requests)
        hits = metric(proxy, "ctxproxy_knowledge_cache_total", "hit")
        negative = metric(dead, "ctxproxy_knowledge_cache_total", "negative_hit")
        if hits < requests or negative < requests:
            raise RuntimeError(f"expected cache hits, got {hits} and negative {negative}")
        return ttfb, first
    finally:
        for proc in reversed(procs):
            stop(proc)
        hole.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--no-write", action="store_true", help="print, don't touch RESULTS.md")
    parser.add_argument("--requests", type=int, default=300, help="requests per row")
    args = parser.parse_args(argv)
    requests = 40 if args.quick else args.requests
    # The shared machine description, without overhead.py's note about its own rounds.
    about = f"{machine()}. The machine is shared with other jobs."
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ctxproxy-bench-") as tmp:
        ttfb, first = asyncio.run(run(Path(tmp), requests))
    today = datetime.date.today().isoformat()
    command = f".venv/bin/python -m bench.knowledge{' --quick' if args.quick else ''}"
    text = (f"Measured {today} with `{command}` on {about} Run time "
            f"{time.monotonic() - started:.0f} s.\n\n{report(ttfb, first, requests)}")
    print(text)
    if not args.no_write:
        write_results(text)
        print(f"\nwritten to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
