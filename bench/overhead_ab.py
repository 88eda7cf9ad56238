"""Two ctxproxy builds, or one with and without a setting, side by side against the bare
relay: CPU per request and time to first byte at c=1, round by round in one run.

    python -m bench overhead_ab --base /tmp/base       # a checkout (git archive REV | tar -x)
    python -m bench overhead_ab --set STATS_ENABLED=false   # this tree, a setting off
    python -m bench overhead_ab --base /tmp/base --rounds 10 --requests 100
    python -m bench overhead_ab --variant nostats:STATS_ENABLED=false --variant fwd=/tmp/fwd

The fake upstream, the bare relay (bench/harness/naive.py) and two proxies with their defaults
(window, knowledge, memory, as bench/overhead.py's first column) run as their own processes;
``a`` is ``--base`` (else this tree), ``b`` this tree with ``--set``. Each round sends
``--requests`` requests at c=1 to each target in turn (the order rotates), reading each
process's CPU time around its batch, then 60 requests to each interleaved one by one for the
time to first byte. ``--variant NAME[=DIR][:SETTING=VALUE,...]`` adds builds to the same
rounds (DIR: a checkout, else this tree), each read against the relay. On a shared machine
one run's absolute figures move by tens of percent; the ratio of the two builds within each
round is the figure to read.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from bench.harness import session as bench_session
from bench.harness.client import Client
from bench.harness.processes import NAIVE_CMD, ROOT, UPSTREAM_CMD, Proc, server_env, start, stop
from bench.harness.serving import free_port
from bench.harness.upstream import answer_events

TURNS = 30
TTFB_REQUESTS = 60


def _proxy(name: str, upstream: Proc, workdir: Path, root: Path,
           extra: dict[str, str]) -> Proc:
    port = free_port()
    env = server_env({
        "CTXPROXY_PORT": str(port),
        "CTXPROXY_UPSTREAM_URL": f"http://127.0.0.1:{upstream.port}/v1",
        "CTXPROXY_DATA_DIR": str(workdir / f"{name}-data"),
        "CTXPROXY_TEAM_ID": "bench-team",
        **extra,
    })
    # The build under test first on the path: it, not this tree, is what ``ctxproxy`` names.
    env["PYTHONPATH"] = os.pathsep.join([str(root), env["PYTHONPATH"]])
    return start(name, [sys.executable, "-m", "ctxproxy.proxy", "serve"], env, port, workdir)


async def _measure(targets: list[Proc], rounds: int, requests: int
                   ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per target, the CPU seconds per request and the median TTFB of each round."""
    body = bench_session.encode(bench_session.request(TURNS))
    cpu: dict[str, list[float]] = {t.name: [] for t in targets}
    ttfb: dict[str, list[float]] = {t.name: [] for t in targets}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        client = Client(session, body, bench_session.headers(TURNS),
                        b"".join(answer_events()))
        for target in targets:  # warm connections, caches and code paths
            await client.batch(target.url, 200, 4)
        for r in range(rounds):
            order = targets[r % len(targets):] + targets[: r % len(targets)]
            for target in order:
                before = target.cpu_s()
                await client.batch(target.url, requests, 1)
                cpu[target.name].append((target.cpu_s() - before) / requests)
            firsts: dict[str, list[float]] = {t.name: [] for t in targets}
            for _ in range(TTFB_REQUESTS):
                for target in order:
                    first, _end = await client.one(target.url)
                    firsts[target.name].append(first)
            for name, values in firsts.items():
                ttfb[name].append(statistics.median(values))
    return cpu, ttfb


def report(cpu: dict[str, list[float]], ttfb: dict[str, list[float]], about: str) -> str:
    med = statistics.median

    def per_round(table: dict[str, list[float]], a: str, b: str) -> float:
        return med([x / y for x, y in zip(table[a], table[b], strict=True)])

    lines = [about, "", "| | CPU per request (ms) | / the relay's | TTFB, median (ms) |",
             "|---|---|---|---|"]
    for name in cpu:
        lines.append(f"| {name} | {med(cpu[name]) * 1000:.3f} | "
                     f"{per_round(cpu, name, 'relay'):.2f}x | {med(ttfb[name]) * 1000:.3f} |")
    lines += ["", f"b / a, the median of the rounds' ratios: CPU per request "
              f"{per_round(cpu, 'b', 'a'):.3f}, TTFB {per_round(ttfb, 'b', 'a'):.3f} "
              f"({len(cpu['a'])} rounds)."]
    return "\n".join(lines)


def _settings(pairs: list[str]) -> dict[str, str]:
    """NAME=VALUE pairs as the environment's CTXPROXY_ settings."""
    extra = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        extra["CTXPROXY_" + key.upper().removeprefix("CTXPROXY_")] = value
    return extra


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, help="the checkout build a runs (else this tree)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for build b (CTXPROXY_ may be left out)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=100, help="per target and round")
    parser.add_argument("--variant", action="append", default=[],
                        metavar="NAME[=DIR][:SETTING=VALUE,...]",
                        help="one more build in the same rounds (DIR: else this tree)")
    args = parser.parse_args(argv)
    extra = _settings(args.set)
    variants = []
    for spec in args.variant:
        head, _, pairs = spec.partition(":")
        name, _, where = head.partition("=")
        variants.append((name, Path(where).resolve() if where else ROOT,
                         _settings(pairs.split(",") if pairs else [])))
    base = (args.base or ROOT).resolve()
    with tempfile.TemporaryDirectory(prefix="ctxproxy-bench-") as tmp:
        workdir = Path(tmp)
        port = free_port()
        upstream = start("upstream", [*UPSTREAM_CMD, "--port", str(port)], server_env({}),
                         port, workdir)
        procs: list[Proc] = []
        try:
            relay_port = free_port()
            procs.append(start("relay", [*NAIVE_CMD, "--port", str(relay_port), "--upstream",
                                         upstream.url.rsplit("/", 1)[0]],
                               server_env({}), relay_port, workdir))
            procs.append(_proxy("a", upstream, workdir, base, {}))
            procs.append(_proxy("b", upstream, workdir, ROOT, extra))
            for name, root, settings in variants:
                procs.append(_proxy(name, upstream, workdir, root, settings))
            cpu, ttfb = asyncio.run(_measure(procs, args.rounds, args.requests))
        finally:
            for proc in reversed(procs):
                stop(proc)
            stop(upstream)
    about = (f"a: {base}; b: {ROOT}" + (f" with {', '.join(args.set)}" if args.set else "")
             + f"; {args.requests} requests a round at c=1.")
    print(report(cpu, ttfb, about))
    return 0


if __name__ == "__main__":
    sys.exit(main())
