"""What one hostile request costs everyone else: another session's time to first byte while
ctxproxy (its defaults: window, knowledge, memory) takes a hostile body.

    python -m bench.hostile_load            # writes its block into bench/RESULTS.md
    python -m bench.hostile_load --no-write

The upstream (bench/harness/upstream.py) and ctxproxy run as their own processes on loopback. For
each hostile body of tests/test_hostile.py: first a bystander session sends small requests one
after another for a baseline; then the hostile request goes out and, from that moment until
two seconds after its answer (the memory side works on in the background), the bystander
keeps sending one small request every 25 ms. Reported: the bystander's time to first byte
over the baseline median (p50 and the worst), and the hostile request's own status.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import io
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from bench.harness import small_codex as codex
from bench.harness.hostile import CASES
from bench.harness.machine import load_average
from bench.harness.processes import UPSTREAM_CMD, server_env, start, start_proxy, stop
from bench.harness.results import write_block
from bench.harness.serving import free_port

SECTION = "## Hostile input, seen from another session"
BEGIN = "<!-- hostile-load:begin (written by bench/hostile_load.py) -->"
END = "<!-- hostile-load:end -->"
PACE_S = 0.025
AFTER_S = 2.0


async def ttfb(http: aiohttp.ClientSession, url: str, body: bytes, session: str) -> float:
    start_ = time.perf_counter()
    headers = codex.headers(session_id=session, turn_id=f"{session}-t")
    async with http.post(url, data=body, headers=headers) as r:
        await r.content.readany()
        first = time.perf_counter() - start_
        await r.read()
        if r.status != 200:
            raise RuntimeError(f"bystander got {r.status}")
    return first


async def measure(url: str, hostile: bytes, small: bytes) -> tuple[float, list[float], int, float]:
    """(baseline median, the bystander's TTFBs meanwhile, hostile status, hostile seconds)."""
    async with aiohttp.ClientSession() as http:
        base = [await ttfb(http, url, small, "bystander") for _ in range(20)]
        done = asyncio.Event()
        status = 0
        took = 0.0

        async def send_hostile() -> None:
            nonlocal status, took
            start_ = time.perf_counter()
            headers = codex.headers(session_id="hostile", turn_id="hostile-t")
            async with http.post(url, data=io.BytesIO(hostile), headers=headers) as r:
                await r.read()
                status = r.status
            took = time.perf_counter() - start_
            done.set()

        task = asyncio.create_task(send_hostile())
        seen: list[float] = []
        until: float | None = None
        while until is None or time.perf_counter() < until:
            seen.append(await ttfb(http, url, small, "bystander"))
            await asyncio.sleep(PACE_S)
            if done.is_set() and until is None:
                until = time.perf_counter() + AFTER_S
        await task
    return statistics.median(base), seen, status, took


def report(rows: list[tuple[str, float, list[float], int, float]], argv: Sequence[str]) -> str:
    lines = [
        f"Measured {datetime.date.today()} with "
        f"`{' '.join(['python -m bench.hostile_load', *argv])}` on {os.cpu_count()} cores "
        "(shared), Python "
        f"{platform.python_version()}; load average at the end "
        f"{load_average()}. Goal (issue 11): each adds at most "
        "50 ms to another session's time to first byte.",
        "",
        "| hostile body | its answer | its time (s) | bystander requests | added TTFB p50 (ms) "
        "| added TTFB worst (ms) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, base, seen, status, took in rows:
        added = [s - base for s in seen]
        lines.append(f"| {name} | {status} | {took:.2f} | {len(seen)} | "
                     f"{statistics.median(added) * 1000:.1f} | {max(added) * 1000:.1f} |")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> str:
    small = json.dumps(codex.request(codex.session(3))).encode()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        port = free_port()
        upstream = start("upstream", [*UPSTREAM_CMD, "--port", str(port)],
                         server_env({}), port, workdir)
        proxy = start_proxy("defaults", upstream, workdir, defaults=True)
        try:
            for name, make in CASES.items():
                if args.only and args.only not in name:
                    continue
                base, seen, status, took = await measure(proxy.url, make(), small)
                rows.append((name, base, seen, status, took))
                print(f"  {name}: {status} in {took:.2f}s, bystander +"
                      f"{(max(seen) - base) * 1000:.0f} ms worst", flush=True)
        finally:
            stop(proxy)
            stop(upstream)
    return report(rows, args.argv)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="run the cases whose name holds this")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    args.argv = [a for a in (argv or []) if a != "--no-write"]
    text = asyncio.run(main_async(args))
    print(text)
    if not args.no_write:
        write_block(SECTION, BEGIN, END, text)


if __name__ == "__main__":
    main()
