"""The ledger's CPU per request: the old measure (both bodies parsed again from their bytes,
every part of each serialised and digested, caches in cachetools) against the current one
(the bodies the proxy parsed, the parts the forwarded body shares with the client's counted
once), in the same run, on the same requests.

    python -m bench.ledger_cpu [--scripts 16] [--turns 12] [--rounds 5] [--no-write]

The requests are bench/load.py's (its Codex threads, context and tools), sent through an
in-process ctxproxy with the load's settings (memory on, the load's wiki bound to every agent)
in front of the load's upstream; what the ledger was handed for each is kept, then measured
by each path in arrival order, in a fresh state (each part tokenised once, as in the proxy),
and again with its token memo warm (no tokeniser: the rest of the work). Alternating rounds;
the best round of each is reported. Every path must give the same rows.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
from aiohttp import web

from bench.harness import ledger_reference as reference
from bench.harness import session as bench_session
from bench.harness.load_client import Script, Thread
from bench.harness.machine import revision
from bench.harness.results import write_block
from bench.harness.serving import free_port, serve
from bench.harness.upstream import create_app as upstream_app
from bench.load import SCRIPTS, knowledge
from ctxproxy.config import load_settings
from ctxproxy.injectors import tokens
from ctxproxy.ledger.counterfactual import PartCounter
from ctxproxy.ledger.measure import Measurer, Pending
from ctxproxy.ledger.model import Record
from ctxproxy.proxy import ledger_wiring
from ctxproxy.proxy.app import Access, Sent
from ctxproxy.proxy.assemble import build_app

SECTION = "## Ledger CPU"
BEGIN = "<!-- ledger-cpu:begin (written by bench/ledger_cpu.py) -->"
END = "<!-- ledger-cpu:end -->"

Pair = tuple[Pending, Pending]  # what the recorder is handed now, and the same as before
Measure = Callable[[Pair], Record]


async def capture(scripts: int, turns: int, workdir: Path) -> list[tuple[Pending, Pending]]:
    """What the ledger is handed for each of the load's requests, in order: as now (the parsed
    bodies), and as before (the bytes)."""
    data_dir = workdir / "data"
    knowledge(workdir, data_dir)
    upstream = await serve(upstream_app())
    settings = load_settings(env={}, upstream_url=upstream.url + "/v1", data_dir=data_dir,
                             port=free_port(), memory_enabled=True, stats_process=False)
    proxy = await serve(build_app(settings), port=settings.port)
    handed: list[tuple[Pending, Pending]] = []
    pending = ledger_wiring.pending

    def keep(app: web.Application, sent: Sent, info: Access, status: int, *,
             bodies: bool = True) -> Pending:
        now = pending(app, sent, info, status, bodies=bodies)
        forwarded = None if sent.forwarded is sent.raw else sent.forwarded
        handed.append((now, replace(now, raw=sent.raw, forwarded=forwarded, bodies=None)))
        return now

    ledger_wiring.pending = keep
    try:
        rng = random.Random(3)
        context, tools = bench_session.context_items(random.Random(3)), bench_session.tools()
        async with aiohttp.ClientSession() as http:
            for seed in range(scripts):
                thread = Thread(Script.make(seed, turns), seed, context, tools, 0.0, rng=rng,
                                answers="fixed")  # its RESULTS block was made so
                for body, headers in thread.requests():
                    async with http.post(proxy.url + "/v1/responses", data=body,
                                         headers=headers) as resp:
                        await resp.read()
                        assert resp.status == 200, resp.status
    finally:
        ledger_wiring.pending = pending
        await proxy.close()
        await upstream.close()
    return handed


def paths() -> dict[str, Callable[[], Measure]]:
    """Each path, made fresh (empty caches), measuring one (now, before) pair."""
    def current() -> Measure:
        measure = Measurer(PartCounter(tokens.count)).measure
        return lambda pair: measure(pair[0])

    def from_bytes() -> Measure:
        measure = Measurer(PartCounter(tokens.count)).measure
        return lambda pair: measure(pair[1])

    def old() -> Measure:
        measure = reference.Reference(tokens.count).measure
        return lambda pair: measure(pair[1])

    return {"old": old, "current, bytes parsed again": from_bytes, "current": current}


def timed(measure: Measure, handed: Sequence[Pair]) -> tuple[float, list[Record]]:
    started = time.perf_counter()
    records = [measure(pair) for pair in handed]
    return time.perf_counter() - started, records


def run(handed: Sequence[Pair], rounds: int) -> dict[str, tuple[float, float]]:
    """Per path: the best round's µs per request, fresh and with the memo warm."""
    best: dict[str, list[float]] = {name: [float("inf")] * 2 for name in paths()}
    expected: list[Record] | None = None
    for _ in range(rounds):
        for name, make in paths().items():
            cold, records = timed(make(), handed)
            # Warm: the same requests again, on the state a first pass left.
            measure = make()
            timed(measure, handed)
            warm, _ = timed(measure, handed)
            expected = expected or records
            if records != expected:
                raise AssertionError(f"{name} gives other rows than the old measure")
            best[name] = [min(best[name][0], cold), min(best[name][1], warm)]
    n = len(handed)
    return {name: (cold / n * 1e6, warm / n * 1e6) for name, (cold, warm) in best.items()}


def report(results: dict[str, tuple[float, float]], handed: Sequence[Pair],
           command: str) -> str:
    raw_kb = sum(len(before.raw) for _, before in handed) / len(handed) / 1024
    changed = sum(before.forwarded is not None for _, before in handed)
    old_cold, old_warm = results["old"]
    lines = [
        f"`{command}` ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {revision()}, "
        f"{platform.python_version()}, tokenizer {tokens.encoding_name()}, load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)",
        "",
        f"{len(handed)} requests of bench/load.py's threads through the proxy (memory and "
        f"knowledge on), client bodies {raw_kb:.0f} KiB on average, {changed} forwarded "
        "changed. µs of ledger work per request, best of the rounds; the same rows on every "
        "path.",
        "",
        "| path | fresh (each part tokenised once) | memo warm (no tokeniser) |",
        "|---|---:|---:|",
    ]
    for name, (cold, warm) in results.items():
        lines.append(f"| {name} | {cold:.0f} ({cold / old_cold:.2f}x) | "
                     f"{warm:.0f} ({warm / old_warm:.2f}x) |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scripts", type=int, default=SCRIPTS)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        handed = [pair for pair in asyncio.run(capture(args.scripts, args.turns, Path(tmp)))
                  if pair[0].parsed]
    tokens.count("warm up")  # loads the encoding outside the rounds
    results = run(handed, args.rounds)
    command = " ".join(["python -m bench.ledger_cpu",
                        *(argv if argv is not None else sys.argv[1:])])
    text = report(results, handed, command)
    print(text)
    if not args.no_write:
        write_block(SECTION, BEGIN, END, text)


if __name__ == "__main__":
    main()
