"""Real agent runs replayed as Codex sessions (or Claude Code's: ``--protocol messages``),
direct and through ctxproxy, with the client's own auto-compaction; priced by
bench/harness/pricing.py (Anthropic's rules: bench/harness/anthropic_pricing.py).

    python -m bench.trajectories                       # 20 runs of each repository
    python -m bench.trajectories --repos django --all  # every django run
    python -m bench.trajectories --strategies direct,defaults --strategy k3:KEEP_TURNS=3
    python -m bench.trajectories --protocol messages   # as Claude Code sessions
    python -m bench.trajectories --protocol chat       # as Chat Completions sessions

The runs in ../shared/trajectories (mini-swe-agent, one shell command per model call) become
Codex requests: Codex's context messages and the run's system message as a developer message,
the task as a user prompt, each model step as a ``reasoning`` item (its real encrypted content
where the run kept one), an ``exec_command`` call and its output in Codex's exec format, and a
closing answer. A session is one task, or N tasks in a row (one user turn each); later tasks
of a multi-task session also ask for a fact an earlier task's output showed (the blob hashes
of the patch it submitted). Direct and through the proxy, the client compacts as Codex does
(bench/harness/codex.py) when the input tokens the server reported pass 220k. As Claude Code
sessions (bench/harness/claude.py), the same runs are Claude Code's Messages requests with its
cache marks, to /v1/messages, and it compacts as Claude Code does (at 167k). As Chat
Completions sessions (bench/harness/chat.py), they are Codex's requests as Chat messages, to
/v1/chat/completions, priced by --cache-rules, compacted as Codex does.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from bench.harness.agent_runs import TRAJECTORIES, Session, Task, build_session, load_task, repo_of
from bench.harness.anthropic_pricing import TTL_S as ANTHROPIC_TTL_S
from bench.harness.anthropic_pricing import MessagesPricingUpstream, anthropic_note
from bench.harness.chat import ChatShape, chat_note, load_chat_shape
from bench.harness.chat_pricing import ChatPricingUpstream
from bench.harness.claude import AUTO_COMPACT_TOKENS as CLAUDE_COMPACT_TOKENS
from bench.harness.claude import claude_note, load_claude_shape
from bench.harness.codex import Shapes, load_shapes
from bench.harness.machine import load_average, revision
from bench.harness.pricing import (
    TOKENIZER,
    Bill,
    PricingUpstream,
    Rules,
    SimClock,
    add_cache_rules_argument,
    cache_rules_note,
)
from bench.harness.proxy_settings import SIMULATED_TIME, strategy_settings
from bench.harness.replay import CodexShape, Record, ReplayModel, Searches, Shape, replay
from bench.harness.results import write_block
from bench.harness.serving import free_port, serving
from ctxproxy.config import load_settings
from ctxproxy.proxy.assemble import build_app

Item = dict[str, Any]
PNG = Path(__file__).resolve().parent / "trajectories.png"
SECTION = "## Real agent runs"
BEGIN = "<!-- trajectories:begin (written by bench/trajectories.py) -->"
END = "<!-- trajectories:end -->"
PNG_MESSAGES = PNG.with_name("trajectories_messages.png")
BLOCK_MESSAGES = ("## Real agent runs as Claude Code sessions",
                  "<!-- trajectories-messages:begin (written by bench/trajectories.py) -->",
                  "<!-- trajectories-messages:end -->")
PNG_CHAT = PNG.with_name("trajectories_chat.png")
BLOCK_CHAT = ("## Real agent runs as Chat Completions sessions",
              "<!-- trajectories-chat:begin (written by bench/trajectories.py) -->",
              "<!-- trajectories-chat:end -->")
PROTOCOLS = ("responses", "messages", "chat")
CACHED_PRICE = 0.1

# --- strategies and runs ----------------------------------------------------------------------


@dataclass(frozen=True)
class Strategy:
    name: str
    settings: dict[str, Any] | None  # None: straight to the provider
    note: str


def strategy(spec: str) -> Strategy:
    """``name:KEY=VALUE,KEY=VALUE`` -> the proxy's defaults with these settings changed; keys
    are settings names (``trim_slack``) or variables (``KEEP_TURNS``, ``CTXPROXY_KEEP_TURNS``)."""
    name, _, rest = spec.partition(":")
    settings = {**SIMULATED_TIME, **strategy_settings(name, rest)}
    return Strategy(name, settings, rest.replace(",", " ") or "the defaults")


DIRECT = Strategy("direct", None, "Codex straight to the provider")
# The fixed-window strategies of issue 10's first measurement, for comparison with the
# defaults; a preset naming a setting this checkout lacks is skipped with a warning.
PRESETS = {"defaults": "defaults:", "team": "team:TEAM_ID=bench-team",
           "fixed": "fixed:WINDOW_POLICY=fixed",
           "fixed-k2s0": "fixed-k2s0:WINDOW_POLICY=fixed,KEEP_TURNS=2,TRIM_SLACK=0",
           "fixed-k5s0": "fixed-k5s0:WINDOW_POLICY=fixed,KEEP_TURNS=5,TRIM_SLACK=0",
           "fixed-k2at120k": "fixed-k2at120k:WINDOW_POLICY=fixed,KEEP_TURNS=2,"
                             "TRIM_AT_TOKENS=120000"}


@dataclass
class Run:
    strategy: Strategy
    session: Session
    bills: list[Bill]
    records: list[Record]
    compactions: int
    names_seen: int
    names_visible: int
    older_seen: int
    older_visible: int
    asks: dict[int, bool]
    seconds: float
    searches: Searches = field(default_factory=Searches)

    def cost(self, cached_price: float = CACHED_PRICE) -> float:
        return sum(b.cost(cached_price) for b in self.bills)


async def run_one(strategy_: Strategy, session: Session, shapes: Shapes | Shape,
                  data_dir: Path, *, ttl_s: float = 600.0, limit: int = 220_000,
                  rules: Rules = "prefix") -> Run:
    """One session by one strategy; ``shapes``: Codex's or a Chat client's (priced by
    ``rules``), or Claude Code's (priced by Anthropic's rules)."""
    shape = CodexShape(shapes) if isinstance(shapes, Shapes) else shapes
    clock = SimClock()
    model = ReplayModel(session, shape)
    upstream: PricingUpstream | MessagesPricingUpstream
    if isinstance(shape, ChatShape):
        upstream = ChatPricingUpstream(model, clock=clock, ttl_s=ttl_s, tokenizer=TOKENIZER,
                                       rules=rules)
    elif isinstance(shape, CodexShape):
        upstream = PricingUpstream(model, clock=clock, ttl_s=ttl_s, tokenizer=TOKENIZER,
                                   rules=rules)
    else:
        upstream = MessagesPricingUpstream(model, clock=clock, ttl_s=ttl_s, tokenizer=TOKENIZER)
    compact = shape.auto_compact(limit)
    started = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=600)
    searches = Searches()
    async with serving(upstream.app()) as up_url, aiohttp.ClientSession(timeout=timeout) as http:
        if strategy_.settings is None:
            seen = await replay(http, up_url, session, shape, model, clock, compact, searches)
        else:
            port = free_port()  # the knowledge block's curl lines name it
            settings = load_settings(env={}, upstream_url=up_url + "/v1", anthropic_url=up_url,
                                     data_dir=data_dir, log_level="WARNING", port=port,
                                     **strategy_.settings)
            async with serving(build_app(settings, clock=clock), port) as proxy_url:
                seen = await replay(http, proxy_url, session, shape, model, clock, compact,
                                    searches)
    for record, bill in zip(model.records, upstream.bills, strict=True):
        record.input_tokens, record.cached_tokens = bill.input_tokens, bill.cached_tokens
    billed = [{"input": b.input_tokens, "cached": b.cached_tokens,
               **({"written": b.written_tokens} if shape.writes else {})}
              for r, b in zip(model.records, upstream.bills, strict=True) if r.kind != "side"]
    if seen != billed:  # the client must see exactly what it was billed for
        raise RuntimeError(f"{strategy_.name}: usage seen by the client differs from the bill")
    return Run(strategy_, session, upstream.bills, model.records, compact.count,
               model.names_seen, model.names_visible, model.older_seen, model.older_visible,
               model.asks, time.perf_counter() - started, searches)


# --- the report -------------------------------------------------------------------------------


def table(runs: Sequence[Run], written: bool = False) -> str:
    """One row per (repository, session kind, strategy), summed over that group's sessions;
    the costliest session is the highest of its sessions' costs against direct's own;
    ``written``: with the share of the input written to the cache."""
    groups: dict[tuple[str, str, str], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.session.repo, run.session.kind, run.strategy.name), []).append(run)
    direct = {run.session.thread: run.cost() for run in runs if run.strategy.settings is None}
    rows = ["| repository | sessions | strategy | requests | input tokens | cached "
            + ("| written " if written else "")
            + "| cost vs direct | costliest session | cuts (prefix breaks) | client compactions "
            "| largest request | with memory | sufficiency | of it, from earlier tasks "
            "| misses a search finds | earlier-task facts |",
            "|---|---|---|---:|---:|---:|" + ("---:|" if written else "")
            + "---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (repo, kind, name), group in groups.items():
        base = groups.get((repo, kind, DIRECT.name))
        bills = [b for run in group for b in run.bills]
        total, cached = sum(b.input_tokens for b in bills), sum(b.cached_tokens for b in bills)
        ratio = (f"{sum(r.cost() for r in group) / sum(r.cost() for r in base):.3f}x"
                 if base else "-")
        dearest = max((r.cost() / direct[r.session.thread] for r in group
                       if direct.get(r.session.thread)), default=None)
        seen_, visible = sum(r.names_seen for r in group), sum(r.names_visible for r in group)
        older, older_ok = sum(r.older_seen for r in group), sum(r.older_visible for r in group)
        offered = sum(r.searches.offered for r in group)
        found = sum(r.searches.found for r in group)
        asks = [ok for r in group for ok in r.asks.values()]
        rows.append(
            f"| {repo} | {kind} ({len(group)}) | {name} | {len(bills):,} | {total:,} "
            f"| {cached / max(total, 1):.0%} "
            + (f"| {sum(b.written_tokens for b in bills) / max(total, 1):.0%} " if written
               else "")
            + f"| {ratio} "
            f"| {'-' if dearest is None else f'{dearest:.4f}x'} "
            f"| {sum(x.cut for r in group for x in r.records)} "
            f"| {sum(r.compactions for r in group)} | {max(b.input_tokens for b in bills):,} "
            f"| {sum(x.memory for r in group for x in r.records) / len(bills):.0%} "
            f"| {visible / max(seen_, 1):.1%} ({visible:,}/{seen_:,}) "
            f"| {f'{older_ok / older:.0%} ({older_ok}/{older})' if older else '-'} "
            f"| {f'{found}/{offered}' if offered else '-'} "
            f"| {f'{sum(asks)}/{len(asks)}' if asks else '-'} |")
    return "\n".join(rows)


def plot(runs: Sequence[Run], path: Path) -> None:
    """Cost vs direct per session kind, and the forwarded size per request of one long
    session (the sawtooth of the client's compactions, the steps of the proxy's cuts)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    kinds = list(dict.fromkeys(r.session.kind for r in runs))
    names_ = list(dict.fromkeys(r.strategy.name for r in runs))
    fig, (bars, series) = plt.subplots(1, 2, figsize=(13, 4.6))
    width = 0.8 / max(len(names_), 1)
    colour = {name: "dimgray" if name == DIRECT.name else f"C{n}" for n, name in enumerate(names_)}
    for n, name in enumerate(names_):
        ratios = []
        for kind in kinds:
            group = [r for r in runs if r.session.kind == kind and r.strategy.name == name]
            base = [r for r in runs if r.session.kind == kind and r.strategy.settings is None]
            ratios.append(sum(r.cost() for r in group) / sum(r.cost() for r in base)
                          if group and base else 0)
        drawn = bars.bar([k + n * width for k in range(len(kinds))], ratios, width, label=name,
                         color=colour[name])
        bars.bar_label(drawn, fmt="%.2f", fontsize=7)
    bars.axhline(1.0, color="dimgray", ls="--", lw=1)
    bars.set_xticks([k + width * (len(names_) - 1) / 2 for k in range(len(kinds))], kinds)
    writes = any(b.written_tokens for r in runs for b in r.bills)
    bars.set_ylabel("input cost vs direct (cached at 10%"
                    + (", written at 125%)" if writes else ")"))
    bars.set_title("Cost per session kind")
    bars.legend(fontsize=8)
    longest = max(runs, key=lambda r: len(r.session.tasks)).session
    for run in (r for r in runs if r.session is longest):
        style: dict[str, Any] = ({"ls": "--", "lw": 2} if run.strategy.settings is None
                                 else {"lw": 1.2})
        style["color"] = colour[run.strategy.name]
        series.plot([b.input_tokens / 1e3 for b in run.bills], label=run.strategy.name, **style)
    series.set_title(f"One session of {len(longest.tasks)} tasks: each request")
    series.set_xlabel("request")
    series.set_ylabel("forwarded input, k tokens")
    series.grid(alpha=0.3)
    series.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def client_note(protocol: str, limit: int, ttl_s: float) -> str:
    """What a report says of the client shape the runs were replayed in."""
    if protocol == "messages":
        return claude_note(limit, ttl_s)
    if protocol == "chat":
        return chat_note(limit, ttl_s)
    return ("Each model call is one request: reasoning item (encrypted content), "
            "`exec_command` call, its output in Codex's format; the task's end is one more "
            "request with a closing answer. Prices: `bench/harness/pricing.py` (input tokens "
            f"only, cached at 10%, cache TTL {ttl_s:.0f} s of simulated time). Client "
            "auto-compaction as Codex does it (bench/harness/codex.py): when the reported input "
            f"passes {limit:,} tokens, one compaction request (history + compaction prompt, no "
            "tools, so no cached prefix; the proxy forwards it whole), then the context, the "
            "prompts (at most 20k tokens) and the summary (the fake summariser lists the tasks "
            "and the newest 80 names the commands used). ")


def report(runs: Sequence[Run], tasks: Sequence[Task], args: argparse.Namespace,
           seconds: float, command: str) -> str:
    steps = sorted(len(t.steps) for t in tasks)
    kinds = ", ".join(dict.fromkeys(f"{r.session.kind}" for r in runs))
    counts: dict[str, int] = {}
    for t in tasks:
        counts[repo_of(t.name)] = counts.get(repo_of(t.name), 0) + 1
    repos = ", ".join(f"{n} of {repo}" for repo, n in counts.items())
    protocol = getattr(args, "protocol", "responses")
    messages = protocol == "messages"
    client = {"messages": "Claude Code", "chat": "Chat Completions"}.get(protocol, "Codex")
    strategies = "; ".join(dict.fromkeys(
        f"`{r.strategy.name}`: {r.strategy.note.replace('Codex', client)}" for r in runs))
    load = load_average()
    return "\n".join([
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC at `{revision()}` with `{command}` on "
        f"{os.cpu_count()} "
        f"cores (shared), Python {platform.python_version()}; load average at the end {load}; "
        f"run time {seconds:.0f} s."
        + (f" Plot: `bench/{args.plot.name}`." if args.plot is not None else ""),
        "",
        f"Runs: {len(tasks)} of ../shared/trajectories ({repos}; "
        f"{'all' if args.all else 'held out' if args.held_out else 'a subset'}; "
        f"model calls per run: median {steps[len(steps) // 2]}, max {steps[-1]}), replayed as "
        f"{client} sessions of {kinds} of one repository (the number of sessions in brackets); "
        + ("each session with a store of its own. " if args.scope == "session" else
           "one user: the sessions of a repository and kind share one store and memory scope, "
           "in order. ")
        + client_note(protocol, args.limit, args.ttl)
        + "*cuts*: requests whose forwarded prompt did not extend the previous one "
        "although the client's did (the client's own compactions are not counted). "
        "*sufficiency*: of the "
        "names (paths, identifiers) in each next command that had appeared earlier in the "
        "session (outside the context and the current task's prompt), the share present "
        "anywhere in the forwarded request (memory blocks count); *of it, from earlier tasks*: "
        "the names seen only in earlier tasks, not yet in this one. *with memory*: requests that "
        "carried a memory block (`..._memory>`). *earlier-task facts*: later "
        "tasks ask for the blob hashes of an earlier task's submitted patch; reached = the "
        "value was in the forwarded request that asked. *costliest session*: the highest "
        "cost against direct's of one session. *misses a search finds*: of the names not in "
        "view while the knowledge block offered the chat-memory search, those a search for "
        "the name (the model's first move) brings back.",
        "",
        anthropic_note() if messages else cache_rules_note(getattr(args, "cache_rules",
                                                                     "prefix"))
        + (" A Chat message has no place for a breakpoint mark: the client and the proxy "
           "place none." if protocol == "chat" else ""),
        "",
        f"Strategies: {strategies}.",
        "",
        table(runs, written=messages),
    ])


# --- main -------------------------------------------------------------------------------------


def select(paths: Sequence[Path], all_: bool, count: int, held_out: bool = False) -> list[Path]:
    """A spread of each repository's runs by name (every k-th, ``count`` of each), or all of
    them; ``held_out``: the runs the spread leaves out (to check that a default chosen on the
    spread holds elsewhere)."""
    by_repo: dict[str, list[Path]] = {}
    for p in paths:
        by_repo.setdefault(repo_of(p.name), []).append(p)
    chosen: list[Path] = []
    for group in by_repo.values():
        if all_ or count >= len(group):
            chosen += group
            continue
        stride = len(group) / count
        spread = [group[int(i * stride)] for i in range(count)]
        chosen += [p for p in group if p not in spread] if held_out else spread
    return chosen


def sessions_of(tasks: Sequence[Task], kinds: Sequence[int]) -> list[Session]:
    """Sessions of ``n`` tasks in a row of one repository, for each ``n`` of ``kinds``."""
    by_repo: dict[str, list[Task]] = {}
    for task in tasks:
        by_repo.setdefault(repo_of(task.name), []).append(task)
    out = []
    for group in by_repo.values():
        for n in kinds:
            for start in range(0, len(group) - n + 1, n):
                out.append(build_session(group[start : start + n]))
    return out


async def main_async(args: argparse.Namespace, tasks: Sequence[Task]) -> list[Run]:
    shapes: Shapes | Shape = (
        load_claude_shape() if args.protocol == "messages"
        else load_chat_shape(rules=args.cache_rules) if args.protocol == "chat"
        else load_shapes(rules=args.cache_rules))
    strategies = [DIRECT] if "direct" in args.strategies.split(",") else []
    for spec in [PRESETS[n] for n in args.strategies.split(",") if n in PRESETS] + args.strategy:
        try:
            strategies.append(strategy(spec))
        except ValueError as exc:
            print(f"  skipped: {exc}", file=sys.stderr)
    runs = []
    with tempfile.TemporaryDirectory(prefix="ctxproxy-traj-") as tmp:
        for session in sessions_of(tasks, [int(k) for k in args.sessions.split(",")]):
            for s in strategies:
                # One user: the sessions of a repository and kind share one store and scope,
                # in order, so later sessions may recall earlier ones (--scope session: each
                # session alone).
                where = (session.thread if args.scope == "session"
                         else f"{session.repo}-{len(session.tasks)}")
                data_dir = Path(tmp) / f"{s.name}-{where}"
                run = await run_one(s, session, shapes, data_dir, ttl_s=args.ttl,
                                    limit=args.limit, rules=args.cache_rules)
                print(f"  {session.repo:12s} {session.kind:9s} {s.name:9s} "
                      f"{len(run.bills):4d} requests {run.compactions} compactions "
                      f"{run.seconds:6.1f}s", file=sys.stderr)
                runs.append(run)
    return runs


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The options, with the defaults of the client shape ``--protocol`` names."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=TRAJECTORIES, help="trajectory folder")
    parser.add_argument("--all", action="store_true", help="every run, not a subset")
    parser.add_argument("--repos", default=None,
                        help="comma-separated repositories (django, matplotlib, "
                             "scikit-learn); default: every one in --runs")
    parser.add_argument("--count", type=int, default=20,
                        help="runs of each repository in the subset")
    parser.add_argument("--scope", choices=("user", "session"), default="user",
                        help="user: a repository's sessions of one kind share one store and "
                             "scope, in order; session: each session its own")
    parser.add_argument("--held-out", action="store_true",
                        help="the runs the subset leaves out, instead of the subset")
    parser.add_argument("--sessions", default="1,10", help="tasks per session, comma-separated")
    parser.add_argument("--strategies", default="direct,defaults",
                        help=f"comma-separated, of: direct, {', '.join(PRESETS)}")
    parser.add_argument("--strategy", action="append", default=[], metavar="NAME:K=V,K=V",
                        help="an extra proxy strategy: the defaults with these settings")
    parser.add_argument("--protocol", choices=PROTOCOLS, default="responses",
                        help="responses: Codex's requests, priced by --cache-rules; messages: "
                             "Claude Code's, priced by Anthropic's cache marks; chat: Codex's "
                             "as Chat Completions, priced by --cache-rules (each its own block "
                             "in RESULTS.md)")
    add_cache_rules_argument(parser)
    parser.add_argument("--ttl", type=float, default=None,
                        help=f"provider cache idle TTL, s (default 600; {ANTHROPIC_TTL_S:.0f} "
                             "for messages)")
    parser.add_argument("--limit", type=int, default=None,
                        help="the client's auto-compaction limit, reported input tokens "
                             f"(default Codex's 220,000; Claude Code's {CLAUDE_COMPACT_TOKENS:,}"
                             " for messages)")
    parser.add_argument("--plot", type=Path, default=None,
                        help=f"PNG of the results (default {PNG.name} beside this file, "
                             "unless --no-write)")
    parser.add_argument("--no-write", action="store_true", help="don't touch bench/RESULTS.md")
    args = parser.parse_args(argv)
    messages = args.protocol == "messages"
    if args.ttl is None:
        args.ttl = ANTHROPIC_TTL_S if messages else 600.0
    if args.limit is None:
        args.limit = CLAUDE_COMPACT_TOKENS if messages else 220_000
    if args.plot is None and not args.no_write:
        # the figure goes with its table
        args.plot = {"messages": PNG_MESSAGES, "chat": PNG_CHAT}.get(args.protocol, PNG)
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if not args.runs.is_dir():
        sys.exit(f"no trajectories at {args.runs} (the shared folder is not here)")
    logging.basicConfig(level=logging.WARNING)
    paths = sorted(args.runs.glob("*.traj.json"))
    if args.repos:
        wanted = set(args.repos.split(","))
        paths = [p for p in paths if repo_of(p.name) in wanted]
    paths = select(paths, args.all, args.count, args.held_out)
    tasks = [load_task(p) for p in paths]
    started = time.perf_counter()
    runs = asyncio.run(main_async(args, tasks))
    seconds = time.perf_counter() - started
    command = "python -m bench.trajectories" + "".join(
        f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv))
    text = report(runs, tasks, args, seconds, command)
    print(text)
    if args.plot is not None:
        plot(runs, args.plot)
    if not args.no_write:
        write_block(*{"messages": BLOCK_MESSAGES, "chat": BLOCK_CHAT}.get(
            args.protocol, (SECTION, BEGIN, END)), text)
    print(f"\nplot: {args.plot or 'none'}  {seconds:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
