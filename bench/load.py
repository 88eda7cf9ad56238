"""Load: concurrent streaming Codex sessions through ctxproxy, memory and knowledge on.

    .venv/bin/python -m bench.load                     # 200 sessions, 60 s; writes RESULTS.md
    .venv/bin/python -m bench.load --quick --no-write  # 40 sessions, 10 s; prints only
    .venv/bin/python -m bench.load --workers 2         # CTXPROXY_WORKERS=2: its own block
    .venv/bin/python -m bench.load --shape agent       # real agent runs (../shared): own block

Processes on loopback: the fake upstream (bench/harness/upstream.py, its 70 SSE events ``--pace-ms``
apart, as a model streams tokens; each answer's pace varies by up to ``--jitter``, as answers
take more or less time, so that sessions started together do not stay in step), ctxproxy
(``python -m ctxproxy.proxy serve``: SQLite memory in a temporary data dir, a wiki added with the
knowledge CLI and bound to every agent), and this client. Each of ``--sessions`` virtual users
(over connections of its own, as each Codex process has) runs Codex threads back to back:
every turn sends the history so far plus the new prompt, then, for each round of tool calls,
a tool-loop request with the calls and their outputs under the same turn id; after
``--turns`` turns a new thread starts. The upstream answers each request with the thread
script's own next items (its reasoning and tool calls, or the turn's final answer), and the
client sends them back as they came, as Codex does (``--answers fixed``: one canned answer to
every request and at most one tool-loop request a turn, the bench before 2026-12-01's third
session, under which the proxy stored each turn two or three times). So the window cuts
(from turn 6 on), every finished turn is ingested, recall runs on every new turn and the
knowledge block goes into every request.

The same load first goes straight to the upstream (the baseline), then through a bare aiohttp
relay (bench/harness/naive.py: what any Python relay adds on these cores, for reference), then
through the proxy: a warm-up (its own row: every session new to the proxy, as after a restart) from
which the same sessions go on into the measured run. Reported: errors (a status other than
200, a stream that is cut or not the upstream's bytes, a timeout; must be 0), requests per
second, time to first byte and to the end of the stream both ways and their difference (the
latency the proxy adds), the proxy's peak RSS (VmHWM) and CPU, and from its /metrics what the
window, memory and knowledge did. With ``--workers N`` (N > 1) RSS and CPU are summed over the
supervisor and its workers, and /metrics adds up every worker's registry.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from bench.harness.load_client import (
    AGENTS,
    ANSWER_EVENTS,
    TEAM,
    Run,
    Script,
    answer_stream,
    answer_streams,
    drive,
)
from bench.harness.machine import machine
from bench.harness.pg_cpu import backend_cpu, since
from bench.harness.processes import (
    NAIVE_CMD,
    UPSTREAM_CMD,
    Proc,
    cpu_since,
    proxy_cmd,
    server_env,
    start,
    stop,
    tree,
    tree_cpu_s,
    vm_kib,
)
from bench.harness.results import RESULTS, write_block
from bench.harness.serving import free_port
from bench.harness.store_size import Sizes, measure_sizes, size_notes
from bench.recall import backend

SECTION = "## Load"
BEGIN, END = "<!-- load:begin (written by bench/load.py) -->", "<!-- load:end -->"
SCRIPTS = 16  # distinct thread scripts; every thread gets its own session id
RELAY_WARMUP_S = 2.0  # the bare relay's own warm-up (its connections), not counted
WINDOW_S = 10.0  # the measured run's p99 reported by parts this long (the restart's after-effect)
# chat: the bench's own turns (a few tool rounds at most, every other request a new turn);
# agent: the real agent runs of ../shared/trajectories, a task a turn and a request per
# command (median 35 a task): where a coding agent spends its requests.
SHAPES = ("chat", "agent")
TURNS = {"chat": 12, "agent": 3}  # per thread, unless --turns
Item = dict[str, Any]


# --- the processes ---------------------------------------------------------------------------

PAGES = {
    "ledger/settle.md": "# Settlement\n\nThe settle step is idempotent per refund key; retries "
    "look the key up inside the posting transaction.\n",
    "ops/deploy.md": "# Deploying\n\nHelm charts from main; roll back with helm rollback.\n",
    "api/limits.md": "# Rate limits\n\nEach tenant gets 1200 requests per minute.\n",
}


def knowledge(workdir: Path, data_dir: Path) -> str:
    """Add a wiki for the team with the knowledge CLI and bind it to every agent."""
    docs = workdir / "docs"
    for name, text in PAGES.items():
        (docs / name).parent.mkdir(parents=True, exist_ok=True)
        (docs / name).write_text(text)
    env = server_env({"CTXPROXY_DATA_DIR": str(data_dir)})

    def cli(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "ctxproxy.proxy", "knowledge", *args], env=env,
                              check=True, capture_output=True, text=True)
        return done.stdout

    wiki = cli("add-wiki", "--team", TEAM, "--name", "Ledger docs", "--summary",
               "Design notes of the ledger service", str(docs)).split()[0]
    for agent in AGENTS:
        cli("bind", wiki, "--agent", agent, "--user-key", f"key-{agent}")
    return wiki


def start_proxy(upstream: Proc, workdir: Path, data_dir: Path, profile: Path | None,
                workers: int = 1, settings: Sequence[str] = ()) -> Proc:
    port = free_port()
    env = server_env({
        "CTXPROXY_PORT": str(port),
        "CTXPROXY_UPSTREAM_URL": f"http://127.0.0.1:{upstream.port}/v1",
        "CTXPROXY_DATA_DIR": str(data_dir),
        "CTXPROXY_MEMORY_ENABLED": "true",
        "CTXPROXY_WORKERS": str(workers),
        **{f"CTXPROXY_{name.upper()}": value
           for name, _, value in (s.partition("=") for s in settings)},
    })
    proc = start("proxy", proxy_cmd(profile), env, port, workdir)
    # /healthz answers once one worker listens; the supervisor logs this once all do.
    deadline = time.monotonic() + 60
    while "ctxproxy listening" not in proc.log.read_text(errors="replace"):
        if time.monotonic() > deadline or proc.popen.poll() is not None:
            stop(proc)
            raise RuntimeError(f"proxy workers did not all come up:\n{proc.log.read_text()}")
        time.sleep(0.05)  # start-up polling only; nothing is measured here
    return proc


def scrape(proc: Proc) -> dict[str, float]:
    """The proxy's metrics, summed over labels except the ones named in the key."""
    with urllib.request.urlopen(f"http://127.0.0.1:{proc.port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = collections.defaultdict(float)
    for line in text.splitlines():
        match = re.match(r"^(ctxproxy_\w+)(\{[^}]*\})? (\S+)$", line)
        if not match:
            continue
        name, labels, value = match.groups()
        out[name] += float(value)
        for label in re.findall(r'(?:result|reason|source|status|le)="([^"]*)"', labels or ""):
            out[f"{name}[{label}]"] += float(value)
    return dict(out)


# --- the run -----------------------------------------------------------------------------------


@dataclass
class Outcome:
    direct: Run
    warm: Run  # the proxy's warm-up: every session new to it, arriving within one answer
    proxied: Run
    rss_peak_kib: int
    rss_end_kib: int
    proxy_cpu_s: float
    metrics: dict[str, float]
    sizes: Sizes | None  # what the run left in the store, measured before it is dropped
    wiki: str
    degraded: list[str]  # the memory parts that failed at least once
    log_tail: str
    relay: Run  # the same load through the bare aiohttp relay
    relay_cpu_s: float
    # The proxy's hold of each measured request before it went upstream (the access log's
    # prepare_ms), by its memory cache: "miss" a new user turn, "hit" a later request of it.
    prepare_ms: dict[str, list[float]] = field(default_factory=dict)
    # The buckets the event loop's lag's p50 and p99 fall in over the measured run.
    loop_lag: tuple[str, str] | None = None
    # CPU seconds of PostgreSQL's backends serving the proxies over the measured run.
    pg_cpu_s: float | None = None


async def measure(args: argparse.Namespace, workdir: Path) -> Outcome:
    data_dir = workdir / "data"
    kind = "postgres" if args.pg_url else "sqlite"
    async with backend(kind, args.pg_url, data_dir) as values:
        store_url = values.get("store_url")
        settings = [*args.set, *([f"store_url={store_url}"] if store_url else [])]
        outcome = await _measure(args, workdir, data_dir, settings)
        return replace(outcome, sizes=await measure_sizes(data_dir, store_url))


async def _measure(args: argparse.Namespace, workdir: Path, data_dir: Path,
                   settings: Sequence[str]) -> Outcome:
    scripts = [Script.make(seed, args.turns, args.shape) for seed in range(SCRIPTS)]
    wiki = knowledge(workdir, data_dir)
    port = free_port()
    for key in answer_streams(scripts):  # the client's expected bytes, before anything is timed
        answer_stream(key)
    upstream = start("upstream", [*UPSTREAM_CMD, "--port", str(port),
                                  "--scripts", str(SCRIPTS), "--turns", str(args.turns),
                                  "--shape", args.shape],
                     server_env({}), port, workdir)
    proxies: list[Proc] = []
    try:
        print(f"direct: {args.sessions} sessions for {args.direct_seconds:.0f} s ...", flush=True)
        _, direct = await drive(upstream.url, args.sessions, args.direct_seconds, scripts,
                                args.pace_ms, seed=1, jitter=args.jitter,
                                answers=args.answers, first_byte_ms=args.first_byte_ms)
        relay, relay_cpu = await bare_relay(args, upstream, workdir, scripts)
        for _ in range(args.replicas):
            proxies.append(start_proxy(upstream, workdir, data_dir, args.profile,
                                       args.workers, settings))
        cpu_at: list[list[dict[int, float]]] = []
        log_at: list[list[int]] = []
        metrics_at: list[dict[str, float]] = []
        pg_at: list[dict[int, float]] = []
        def measuring() -> None:
            cpu_at.append([tree_cpu_s(p.popen.pid) for p in proxies])
            pg_at.append(pg_backends(args, proxies))
            log_at.append([p.log.stat().st_size for p in proxies])
            metrics_at.append(scrape_all(proxies))
            print(f"proxy: {args.sessions} sessions for {args.seconds:.0f} s ...", flush=True)

        print(f"proxy: warm-up {args.warmup_seconds:.0f} s ...", flush=True)
        warm, proxied = await drive([p.url for p in proxies], args.sessions, args.seconds,
                                    scripts, args.pace_ms, seed=3, jitter=args.jitter,
                                    warmup=args.warmup_seconds,
                                    measuring=measuring, answers=args.answers,
                                    first_byte_ms=args.first_byte_ms)
        cpu = sum(cpu_since(p.popen.pid, at) for p, at in zip(proxies, cpu_at[0], strict=True))
        pg_cpu = since(pg_at[0], pg_backends(args, proxies)) if args.pg_url else None
        metrics = scrape_all(proxies)
        lag = _lag(metrics, metrics_at[0] if metrics_at else {})
        pids = [pid for p in proxies for pid in tree(p.popen.pid)]
        peak = sum(vm_kib(pid, "VmHWM") for pid in pids)
        end = sum(vm_kib(pid, "VmRSS") for pid in pids)
    finally:
        for proxy in proxies:
            stop(proxy)  # SIGTERM: open streams finish, queued memory writes are flushed
        stop(upstream)
    logs = [p.log.read_text(errors="replace") for p in proxies]
    # The memory side logs the first failure of each part (and its recovery).
    degraded = sorted({m.group(1) for log in logs
                       for m in re.finditer(r"memory degraded: (.*?) failed", log)})
    offsets = log_at[0] if log_at else [0] * len(proxies)
    return Outcome(direct, warm, proxied, peak, end, cpu, metrics, None, wiki, degraded,
                   logs[0][-3000:] if logs else "", relay, relay_cpu,
                   prepared(proxies, offsets), lag, pg_cpu)


def pg_backends(args: argparse.Namespace, proxies: Sequence[Proc]) -> dict[int, float]:
    """CPU seconds so far of the PostgreSQL backends serving the proxies' processes."""
    pids = [pid for p in proxies for pid in tree(p.popen.pid)]
    return backend_cpu(args.pg_url, pids) if args.pg_url else {}


def scrape_all(proxies: Sequence[Proc]) -> dict[str, float]:
    """Every replica's metrics added up."""
    out: dict[str, float] = collections.defaultdict(float)
    for proxy in proxies:
        for name, value in scrape(proxy).items():
            out[name] += value
    return dict(out)


def prepared(proxies: Sequence[Proc], offsets: Sequence[int]) -> dict[str, list[float]]:
    """The access logs' prepare_ms from ``offsets`` on, by memory cache (miss, hit) and of
    every request ("all"), and their ttfb_ms ("upstream": from going upstream to the first
    byte back)."""
    out: dict[str, list[float]] = collections.defaultdict(list)
    for proxy, offset in zip(proxies, offsets, strict=True):
        with proxy.log.open("rb") as f:
            f.seek(offset)
            for line in f:
                if b'"prepare_ms"' not in line:
                    continue
                with contextlib.suppress(orjson.JSONDecodeError):
                    entry = orjson.loads(line)
                    out[str(entry.get("memory_cache", "none"))].append(
                        float(entry["prepare_ms"]))
                    out["all"].append(float(entry["prepare_ms"]))
                    if entry.get("ttfb_ms") is not None:
                        out["upstream"].append(float(entry["ttfb_ms"]))
    return out


async def bare_relay(args: argparse.Namespace, upstream: Proc, workdir: Path,
                     scripts: Sequence[Script]) -> tuple[Run, float]:
    """The same load through the least an aiohttp proxy can do (bench/harness/naive.py, one
    process): what any Python relay adds on these cores, and its CPU."""
    port = free_port()
    naive = start("naive", [*NAIVE_CMD, "--port", str(port),
                            "--upstream", upstream.url.rsplit("/", 1)[0]],
                  server_env({}), port, workdir)
    try:
        cpu_at: list[dict[int, float]] = []
        print(f"bare relay: {args.sessions} sessions for {args.direct_seconds:.0f} s ...",
              flush=True)
        _, run = await drive(naive.url, args.sessions, args.direct_seconds, scripts,
                             args.pace_ms, seed=2, jitter=args.jitter, warmup=RELAY_WARMUP_S,
                             measuring=lambda: cpu_at.append(tree_cpu_s(naive.popen.pid)),
                             answers=args.answers, first_byte_ms=args.first_byte_ms)
        return run, cpu_since(naive.popen.pid, cpu_at[0])
    finally:
        stop(naive)


def _lag(m: dict[str, float], before: dict[str, float]) -> tuple[str, str] | None:
    """The buckets the event loop's lag's p50 and p99 fall in, from the scraped histogram:
    its samples in ``m`` less those already in ``before``."""
    name = "ctxproxy_event_loop_lag_seconds_bucket"
    buckets = sorted((float(k[len(name) + 1:-1]), v - before.get(k, 0.0)) for k, v in m.items()
                     if k.startswith(name + "["))
    if not buckets or not buckets[-1][1]:
        return None
    total = buckets[-1][1]

    def under(q: float) -> str:
        bound = next(le for le, n in buckets if n >= q * total)
        return "+Inf" if bound == float("inf") else f"{bound * 1000:g} ms"

    return under(.5), under(.99)


def _q(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) in milliseconds."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def by_window(run: Run, seconds: float) -> list[list[float]]:
    """The run's times to first byte by when their requests began: ``seconds`` each."""
    last = max(run.started, default=run.began)  # none begins after the run's end
    windows: list[list[float]] = [[] for _ in range(int((last - run.began) // seconds) + 1)]
    for at, ttfb in zip(run.started, run.ttfb, strict=True):
        windows[min(int((at - run.began) // seconds), len(windows) - 1)].append(ttfb)
    return windows


def report(o: Outcome, args: argparse.Namespace, seconds: float) -> str:
    """The RESULTS block: what ran, the latency table, then notes."""
    return "\n".join([*_setup(args, seconds), "", *_table(o), "", *_notes(o, args)])


def _setup(args: argparse.Namespace, seconds: float) -> list[str]:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = " ".join([".venv/bin/python -m bench.load", *args.argv])
    return [
        f"Measured {stamp} with `{command}` on {machine()}. Run "
        f"time {seconds:.0f} s.",
        "",
        f"{args.sessions} concurrent streaming sessions ("
        + (f"Codex threads of {args.turns} real agent runs of ../shared/trajectories in a row, "
           "a user turn each (its task); a request per model call (after the prompt, then after "
           "each command's output: median 35 a task), each answered with the run's next step, "
           "which the next request sends back"
           if args.shape == "agent" else
           f"Codex threads of {args.turns} turns, a request per turn and one per round of tool "
           "calls, each answered with the script's next items, which the next request sends "
           "back" if args.answers == "script" else
           f"Codex threads of {args.turns} turns, "
           "a request per turn plus one tool-loop request when the turn used tools, each "
           "answered with one canned answer")
        + f"; window 5 turns; {len(AGENTS)} agents of one team, the team's wiki bound to "
        f"each); the fake upstream streams {ANSWER_EVENTS} events {args.pace_ms:g} ms apart"
        + (f" (each answer's pace times 1 +- up to {args.jitter:g})" if args.jitter else "")
        + (f", its first {args.first_byte_ms:g} ms after the request" if args.first_byte_ms
           else "")
        + ("; PostgreSQL memory store; " if args.pg_url else "; SQLite memory store; ")
        + ("ctxproxy as one process (`python -m ctxproxy.proxy serve`)" if args.workers == 1 else
           f"ctxproxy as {args.workers} worker processes on one port under a supervisor "
           f"(`CTXPROXY_WORKERS={args.workers} python -m ctxproxy.proxy serve`)")
        + (f", {args.replicas} such replicas on one store, each request of a session sent to "
           "the next replica in turn (a load balancer without affinity)."
           if args.replicas > 1 else "."),
        f"The sessions go on from a {args.warmup_seconds:g} s warm-up, which is not counted in "
        "the rows but its own (every session new to the proxy, all arriving within one answer's "
        "time: as after a restart).",
    ]


def _table(o: Outcome) -> list[str]:
    d, p, r0 = o.direct, o.proxied, o.relay
    lines = [
        "| | requests | errors | requests/s | TTFB p50 ms | TTFB p99 ms | stream p50 ms "
        "| stream p99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = (("direct (baseline)", d), ("through the bare aiohttp relay", r0),
            ("through ctxproxy", p), ("*warm-up through ctxproxy*", o.warm))
    for name, r in rows:
        lines.append(
            f"| {name} | {r.ok + sum(r.errors.values()):,} | {sum(r.errors.values())} "
            f"| {r.ok / r.seconds:.0f} | {_q(r.ttfb, .5):.1f} | {_q(r.ttfb, .99):.1f} "
            f"| {_q(r.total, .5):.0f} | {_q(r.total, .99):.0f} |"
        )
    lines += [
        f"| added by the bare relay | | | | {_q(r0.ttfb, .5) - _q(d.ttfb, .5):.1f} "
        f"| {_q(r0.ttfb, .99) - _q(d.ttfb, .99):.1f} "
        f"| {_q(r0.total, .5) - _q(d.total, .5):.0f} "
        f"| {_q(r0.total, .99) - _q(d.total, .99):.0f} |",
        f"| **added by ctxproxy** | | | | **{_q(p.ttfb, .5) - _q(d.ttfb, .5):.1f}** "
        f"| **{_q(p.ttfb, .99) - _q(d.ttfb, .99):.1f}** "
        f"| {_q(p.total, .5) - _q(d.total, .5):.0f} | {_q(p.total, .99) - _q(d.total, .99):.0f} |",
    ]
    return lines


def _notes(o: Outcome, args: argparse.Namespace) -> list[str]:
    d, p, r0 = o.direct, o.proxied, o.relay
    errors = sum(p.errors.values())
    windows = by_window(p, WINDOW_S)
    return [
        f"- Errors through the proxy: **{errors}**"
        + (f" ({dict(p.errors)})" if errors else "") + f"; direct: {sum(d.errors.values())}; "
        f"the bare relay: {sum(r0.errors.values())}.",
        f"- Proxy peak RSS (VmHWM"
        f"{', summed over its processes' if args.workers > 1 or args.replicas > 1 else ''}): "
        f"**{o.rss_peak_kib / 1024:.0f} MiB** (VmRSS at the end "
        f"{o.rss_end_kib / 1024:.0f} MiB); proxy CPU {o.proxy_cpu_s:.1f} s over the "
        f"{p.seconds:.0f} s run ({o.proxy_cpu_s / p.seconds:.0%} of one core, "
        f"{1000 * o.proxy_cpu_s / max(p.ok, 1):.1f} ms per request); the bare relay's "
        f"{1000 * o.relay_cpu_s / max(r0.ok, 1):.1f} ms per request"
        + ("." if o.pg_cpu_s is None else f"; PostgreSQL's backends serving the proxies "
           f"{o.pg_cpu_s:.1f} s ({1000 * o.pg_cpu_s / max(p.ok, 1):.1f} ms per request)."),
        f"- The measured run by when its requests began, {WINDOW_S:g} s at a time (the first "
        "right after the warm-up): added TTFB p99 " + ", ".join(
            f"{_q(w, .99) - _q(d.ttfb, .99):.0f}" for w in windows) + " ms (the direct run's "
        "p99 the baseline of each; requests " + ", ".join(f"{len(w):,}" for w in windows)
        + ").",
        "- How long the proxy held a request before forwarding it (the access log's "
        "prepare_ms, measured run): " + "; ".join(
            f"{name} {len(v):,}, p50 {_q(v, .5) / 1000:.1f} ms, p99 {_q(v, .99) / 1000:.1f} ms"
            for name, key in (("new user turns", "miss"), ("their later requests", "hit"))
            if (v := o.prepare_ms.get(key))) + ".",
        *([f"- Where a request's time to first byte went (the access log, measured run; p50 / "
           f"p99, each quantile of its own): held before forwarding "
           f"{_q(held, .5) / 1000:.1f} / {_q(held, .99) / 1000:.1f} ms, then the upstream's "
           f"first byte {_q(up, .5) / 1000:.1f} / {_q(up, .99) / 1000:.1f} ms after it went "
           f"(the upstream seen directly: {_q(d.ttfb, .5):.1f} / {_q(d.ttfb, .99):.1f} ms); "
           "the rest of what the client saw is its own and the connection's."]
          if (held := o.prepare_ms.get("all")) and (up := o.prepare_ms.get("upstream"))
          else []),
        _from_metrics(o, args),
        *(size_notes(o.sizes) if o.sizes else []),
        *([f"- The event loop's lag (/metrics, measured run, every worker's samples): "
           f"p50 under {lag[0]}, p99 under {lag[1]}."] if (lag := o.loop_lag) else []),
        "- Added latency is the difference of the quantiles of two runs of the same load "
        "(straight to the upstream, then through the proxy), so it includes the CPU the "
        "proxy takes from the client and the upstream on the same two cores.",
        f"- The {os.cpu_count()} cores are shared: this client, the fake upstream, the proxy"
        + (f"'s {args.workers} workers" if args.workers > 1 else "") + " and other people's "
        "jobs on the machine (load average in the first line) all run on them; more workers "
        "than free cores only add contention.",
    ]


def _from_metrics(o: Outcome, args: argparse.Namespace) -> str:
    m = o.metrics
    recalls = m.get("ctxproxy_memory_recall_seconds_count", 0.0)
    recall_ms = 1000 * m.get("ctxproxy_memory_recall_seconds_sum", 0.0) / max(recalls, 1.0)
    return (
        "- From the proxy's /metrics (warm-up included"
        + (f"; its {args.workers} workers added up" if args.workers > 1 else "")
        + (f"; its {args.replicas} replicas added up" if args.replicas > 1 else "")
        + "): turns cut "
        f"{m.get('ctxproxy_turns_cut_total', 0):,.0f}; memory recalls "
        f"{recalls:,.0f} (mean {recall_ms:.1f} ms), memories injected "
        f"{m.get('ctxproxy_memory_recalled_total', 0):,.0f}; knowledge cache hits "
        f"{m.get('ctxproxy_knowledge_cache_total[hit]', 0):,.0f}, misses "
        f"{m.get('ctxproxy_knowledge_cache_total[miss]', 0):,.0f}; fail-open "
        f"{m.get('ctxproxy_fail_open_total', 0):,.0f}; degraded "
        f"{m.get('ctxproxy_degraded_total', 0):,.0f}"
        + (f" ({', '.join(o.degraded)})" if o.degraded else "")
        + f", of which forwarded uncut (nothing cut lost) "
        f"{m.get('ctxproxy_memory_forwarded_whole_total', 0):,.0f}"
        + "; memory writes refused or failed: " + ", ".join(
            f"{m.get(f'ctxproxy_ingest_queue_dropped_total[{r}]', 0):,.0f} {r}"
            for r in ("jobs", "bytes", "failed"))
        + f" (superseded by a later one of the session: "
        f"{m.get('ctxproxy_ingest_queue_superseded_total', 0):,.0f})"
        + "; ledger rows dropped: " + ", ".join(
            f"{m.get(f'ctxproxy_ledger_dropped_total[{r}]', 0):,.0f} {r}"
            for r in ("full", "failed"))
        + "; connections closed by the header timeout: "
        f"{m.get('ctxproxy_connections_closed_total[header_timeout]', 0):,.0f}"
        + f". Episodes stored after shutdown: {o.sizes.turns if o.sizes else 0:,}."
    )


def write_results(text: str, workers: int = 1, postgres: bool = False,
                  shape: str = "chat", replicas: int = 1) -> None:
    if workers == 1 and not postgres and shape == "chat" and replicas == 1:
        write_block(SECTION, BEGIN, END, text)
        return
    name = ("load" + ("-agent" if shape == "agent" else "") + ("-pg" if postgres else "")
            + (f"-workers-{workers}" if workers > 1 else "")
            + (f"-replicas-{replicas}" if replicas > 1 else ""))
    write_block(SECTION, f"<!-- {name}:begin (written by bench/load.py) -->",
                f"<!-- {name}:end -->", text)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=200, help="concurrent sessions")
    parser.add_argument("--seconds", type=float, default=60.0, help="through the proxy")
    parser.add_argument("--direct-seconds", type=float, default=30.0, help="the baseline")
    parser.add_argument("--warmup-seconds", type=float, default=10.0,
                        help="through the proxy, before measuring (the same sessions go on)")
    parser.add_argument("--shape", choices=SHAPES, default="chat",
                        help="chat: the bench's own turns, every other request a new turn; "
                             "agent: the real agent runs of ../shared/trajectories, a task a "
                             "turn and a request per command")
    parser.add_argument("--turns", type=int,
                        help="turns per thread (default 12; with --shape agent 3 tasks)")
    parser.add_argument("--pace-ms", type=float, default=40.0,
                        help="between the upstream's events (70 per answer)")
    parser.add_argument("--first-byte-ms", type=float, default=0.0,
                        help="the upstream's time before its first event (a model's time to "
                             "first token; 0: at once)")
    parser.add_argument("--jitter", type=float, default=0.5,
                        help="each answer's pace is --pace-ms times 1 +- up to this (0: every "
                             "answer takes as long, and sessions that start together stay "
                             "in step)")
    parser.add_argument("--answers", choices=("script", "fixed"), default="script",
                        help="script: the upstream answers each request with the thread "
                             "script's next items (tool calls, then the final answer), which "
                             "the client sends back, a request per tool round, as Codex does; "
                             "fixed: one canned answer to every request, two requests a turn "
                             "at most (the bench before 2026-12-01's third session)")
    parser.add_argument("--workers", type=int, default=1,
                        help="CTXPROXY_WORKERS of the proxy (its own block in RESULTS.md)")
    parser.add_argument("--replicas", type=int, default=1,
                        help="ctxproxy processes on one store and data directory, each "
                             "request of a session sent to the next in turn, as a load balancer "
                             "without affinity (its own block in RESULTS.md)")
    parser.add_argument("--postgres", action="store_true",
                        help="a PostgreSQL memory store (a fresh schema of the database at "
                             "$CTXPROXY_TEST_PG_URL; its own block in RESULTS.md), not SQLite")
    parser.add_argument("--quick", action="store_true", help="40 sessions, 10 s")
    parser.add_argument("--no-write", action="store_true", help="print, don't touch RESULTS.md")
    parser.add_argument("--profile", type=Path, help="cProfile the proxy into this file")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting of the proxy (CTXPROXY_NAME), for experiments; "
                             "implies --no-write")
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    args.pg_url = os.environ.get("CTXPROXY_TEST_PG_URL") if args.postgres else None
    if args.turns is None:
        args.turns = TURNS[args.shape]
    if args.postgres and not args.pg_url:
        parser.error("--postgres needs CTXPROXY_TEST_PG_URL (`. scripts/services.sh` sets it)")
    if args.profile is not None or args.set:
        args.no_write = True  # a profiled proxy is slower: its figures are not the product's
    if args.replicas < 1:
        parser.error("--replicas must be at least 1")
    if args.quick:
        args.sessions, args.seconds, args.direct_seconds, args.warmup_seconds = 40, 10, 5, 2
    return args


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ctxproxy-load-") as tmp:
        outcome = await measure(args, Path(tmp))
    text = report(outcome, args, time.monotonic() - began)
    print(text)
    errors = sum(outcome.proxied.errors.values())
    if errors:
        print("\nfirst errors:\n  " + "\n  ".join(outcome.proxied.first_errors))
        print("\nproxy log (tail):\n" + outcome.log_tail)
    if not args.no_write:
        write_results(text, args.workers, postgres=bool(args.pg_url), shape=args.shape,
                      replicas=args.replicas)
        print(f"\nwritten to {RESULTS}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
