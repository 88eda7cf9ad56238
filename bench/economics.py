"""Context economics: replay long Codex sessions directly and through ctxproxy, and price them.

    python -m bench.economics                          # every strategy, 10/20/40/80 turns
    python -m bench.economics --turns 40 --strategies direct,defaults
    python -m bench.economics --turns 40 --strategy s6:trim_slack=6,recall_min_score=0.4
    python -m bench.economics --cache-rules breakpoint  # priced as gpt-5.6 and later

Sessions are built from the real Codex shapes in ../shared/fixtures/codex (system prompt,
developer and context messages, tools array, headers, turn metadata): tool loops with 1-8 KB
outputs, several requests per user turn, facts planted early and asked about later. A fake
Codex client replays a session request by request, appending what the scripted model answered
and what the tools printed, exactly as Codex does, so every strategy sees the same session.
bench/harness/pricing.py bills each request (tiktoken, by prefix or breakpoint cache rules);
the proxy runs in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import platform
import random
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.economics_sessions import Session, build_session, reasoning
from bench.harness.codex import (
    AUTO_COMPACT_TOKENS,
    AutoCompact,
    Shapes,
    chat_memory_call,
    compaction_input,
    is_compaction_request,
    is_summary,
    load_shapes,
    message_text,
    prompt_starts,
    read_answer,
    run_curl,
    search_command,
)
from bench.harness.machine import load_average, revision
from bench.harness.pricing import (
    BLOCK_TOKENS,
    TOKENIZER,
    Bill,
    PricingUpstream,
    Rules,
    SimClock,
    add_cache_rules_argument,
    cache_rules_note,
    message,
)
from bench.harness.proxy_settings import SIMULATED_TIME, strategy_settings
from bench.harness.results import write_block
from bench.harness.serving import free_port, serving
from ctxproxy.config import load_settings
from ctxproxy.knowledge.store import FILENAME, Catalogue
from ctxproxy.knowledge.wiki import Page
from ctxproxy.proxy.assemble import build_app

Item = dict[str, Any]
PNG = Path(__file__).resolve().parent / "economics.png"
SECTION = "## Context economics"
BEGIN = "<!-- economics-run:begin (written by bench/economics.py) -->"
END = "<!-- economics-run:end -->"

# --- the real shapes -------------------------------------------------------------------------


# --- the scripted model and the fake Codex client --------------------------------------------

_MEMORY_BLOCK = re.compile(r"<(?:working|episodic|semantic)_memory\b")
PULL = "call_pull"  # the call id of the model's search of its chat memory
def _pull_call(line: str, question: str, turn: int) -> Item:
    """An exec_command that runs the block's line with a search for ``question``."""
    cmd = search_command(line, question)
    return {"type": "function_call", "status": "completed", "id": f"fc_t{turn:03d}p",
            "name": "exec_command", "call_id": f"{PULL}_t{turn:03d}",
            "arguments": orjson.dumps({"cmd": cmd, "yield_time_ms": 10000}).decode()}


class ScriptedModel:
    """Answers each request from the session script, and checks the asks' facts."""

    def __init__(self, session: Session, pull: bool = False) -> None:
        self.pull = pull  # asked a fact it does not see, it searches the chat-memory asset
        self.turns = {t.prompt: t for t in session.turns}
        self.recalled: dict[int, bool] = {}
        self.turn_of: list[int] = []  # the user turn of each request, in order
        self.blocks: dict[int, int] = {}  # user turn -> tokens of its recall message
        self.compactions = 0

    def __call__(self, body: dict[str, Any], raw: bytes) -> list[Item]:
        items = body.get("input") or []
        starts = prompt_starts(items)
        turn = self.turns.get(message_text(items[starts[-1]])) if starts else None
        if turn is None:  # not a session request (a side call of the proxy): billed, echoed
            self.turn_of.append(0)
            return [message("ok")]
        # Calls done in this turn: the outputs since its prompt, plus what a summary after the
        # prompt says (a compaction in the middle of the turn removed the outputs before it).
        outputs = [i for i in items[starts[-1]:] if i.get("type") == "function_call_output"]
        pulled = any(str(i.get("call_id", "")).startswith(PULL) for i in outputs)
        done = len(outputs) - pulled
        done += sum(int(m[1]) for i in items[starts[-1]:] if is_summary(i)
                    for m in [re.search(r"(\d+) tool calls done", message_text(i))] if m)
        self.turn_of.append(turn.index)
        if is_compaction_request(items):  # the client's compaction: a summary that keeps count
            self.compactions += 1
            return [message(f"SUMMARY: the user is on turn {turn.index} "
                            f"({turn.prompt[:120]}); {done} tool calls done in this turn.")]
        if done == 0 and turn.ask is not None:
            self.recalled[turn.index] = turn.ask.value.encode() in raw
            if self.pull and not pulled and not self.recalled[turn.index]:
                line = chat_memory_call(body.get("instructions") or "")
                if line is not None:
                    return [reasoning(random.Random(turn.index), f"rs_t{turn.index:03d}p"),
                            _pull_call(line, turn.prompt, turn.index)]
        if pulled and done == 0 and turn.ask is not None:  # the search's answer is in view
            self.recalled[turn.index] = turn.ask.value.encode() in raw
        before = items[starts[-1] - 1]
        if done == 0 and before.get("role") == "developer" and _MEMORY_BLOCK.search(
                message_text(before)):
            self.blocks[turn.index] = TOKENIZER.count(message_text(before))
        return turn.responses[min(done, len(turn.responses) - 1)]


async def replay(http: aiohttp.ClientSession, base_url: str, session: Session, shapes: Shapes,
                 clock: SimClock, compact: AutoCompact | None = None) -> list[dict[str, int]]:
    """Play the session as Codex would, auto-compaction included (bench/harness/codex.py); returns
    the usage the client saw per request."""
    r = random.Random(session.thread)
    compact = compact or AutoCompact()
    history = list(shapes.context)
    seen: list[dict[str, int]] = []

    async def send(items: list[Item], turn_id: str, kind: str = "turn") -> list[Item]:
        body, headers = shapes.request(items, session.thread, turn_id, kind)
        async with http.post(base_url + "/responses", data=body, headers=headers) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:300]}")
            output, usage = read_answer(await resp.read())
        clock.now += r.uniform(2, 20)  # the model thinks
        seen.append(usage)
        compact.seen(usage["input"])
        return output

    async def compaction(turn_id: str) -> list[Item]:
        output = await send(compaction_input(history), turn_id, "compaction")
        summary = message_text(next(i for i in output if i.get("type") == "message"))
        return compact.compacted(history, len(shapes.context), summary, TOKENIZER.count,
                                 f"msg_summary_{compact.count}")

    for turn in session.turns:
        clock.now += turn.think_s
        turn_id = f"{session.thread[:-4]}{turn.index:04d}"
        if compact.due:  # before the turn, as Codex does ("pre_turn")
            history = await compaction(turn_id)
        history.append({"type": "message", "id": f"msg_user_t{turn.index:03d}", "role": "user",
                        "content": [{"type": "input_text", "text": turn.prompt}]})
        while True:
            output = await send(history, turn_id)
            history.extend(output)
            calls = [i for i in output if i.get("type") == "function_call"]
            if not calls:
                break
            for call in calls:
                clock.now += r.uniform(0.1, 5)  # the tool runs
                if call["call_id"].startswith(PULL):  # the model searches its memory
                    cmd = orjson.loads(call["arguments"])["cmd"]
                    printed = await run_curl(http, cmd)
                else:
                    printed = turn.outputs[call["call_id"]]
                history.append({"type": "function_call_output", "id": f"fco_{call['call_id']}",
                                "call_id": call["call_id"], "output": printed})
            if compact.due:  # in the middle of the turn ("mid_turn")
                history = await compaction(turn_id)
    return seen


# --- strategies and runs ---------------------------------------------------------------------


@dataclass(frozen=True)
class Strategy:
    name: str
    settings: dict[str, Any] | None  # None: Codex straight to the provider, no proxy
    note: str
    pull: bool = False  # the model pulls planted facts from its chat-memory asset


# Distillation runs every 5 s of real time; a replayed session lasts a few seconds of real time
# for hours of simulated time, so every run with memory runs it as often as a real session
# would see it run. For the same reason the background work (storing episodes, distilling)
# runs in a thread of the proxy, not its child process: a user's next turn comes minutes after
# an answer, the replay's at once, and the child's hand-offs would race it (a fact of the
# ten-turn session went unrecalled). Neither changes what is forwarded; they are the two
# settings the bench changes for the "defaults" row.
NO_MEMORY = {"memory_enabled": False}
FIXED_NO_MEMORY = {**NO_MEMORY, "window_policy": "fixed"}
STRATEGIES = {s.name: s for s in (
    Strategy("direct", None, "Codex straight to the provider"),
    Strategy("defaults", dict(SIMULATED_TIME), "ctxproxy as installed: load_settings(env={})"),
    Strategy("fixed", {**SIMULATED_TIME, "window_policy": "fixed"},
             "the previous defaults: fixed window, 5 turns, cut in steps of 6"),
    Strategy("window", {**FIXED_NO_MEMORY, "trim_slack": 0, "mask_tool_outputs": False},
             "no memory, fixed window: cut to 5 turns on every turn"),
    Strategy("slack4", {**FIXED_NO_MEMORY, "trim_slack": 4, "mask_tool_outputs": False},
             "no memory, fixed window: 5 turns, cut in steps of 5"),
    Strategy("slack5", {**FIXED_NO_MEMORY, "mask_tool_outputs": False},
             "no memory, fixed window: 5 turns, cut in steps of 6 (first cut at 11 turns)"),
    Strategy("cost-nomem", dict(NO_MEMORY), "the defaults without memory"),
    Strategy("keep2", {**SIMULATED_TIME, "keep_min_turns": 2},
             "the defaults, a cut keeps one older turn"),
    Strategy("nodigest", {**SIMULATED_TIME, "cut_digest_chars": 0},
             "the defaults without the digest of cut turns"),
    Strategy("mem-ungated", {**SIMULATED_TIME, "recall_min_score": 0.0},
             "the defaults, every turn recalls its best matches"),
    Strategy("mem-gate30", {**SIMULATED_TIME, "recall_min_score": 0.3},
             "the defaults with RECALL_MIN_SCORE=0.3"),
    Strategy("mem-nomask", {**SIMULATED_TIME, "mask_tool_outputs": False},
             "the defaults without masking"),
    Strategy("mem-instr", {**SIMULATED_TIME, "memory_placement": "instructions"},
             "the defaults with every memory block in instructions"),
    Strategy("mem-knowledge", {**SIMULATED_TIME, "team_id": "bench-team"},
             "the defaults + a knowledge block of two wikis"),
    Strategy("pull", {**SIMULATED_TIME, "team_id": "bench-team", "recall_k": 0},
             "memory pulled, not pushed: no memory blocks (RECALL_K=0), the chat-memory asset "
             "in the knowledge block; asked a planted fact it does not see, the model runs the "
             "asset's search with the question", pull=True),
)}


@dataclass
class Run:
    strategy: Strategy
    session: Session
    bills: list[Bill]
    turn_of: list[int]
    recalled: dict[int, bool]
    blocks: dict[int, int]  # user turn -> tokens of the recall message put before it
    seconds: float
    front_tokens: int  # tools + context messages: what a warm cache always covers
    compactions: int = 0  # the client's own auto-compactions
    rules: Rules = "prefix"  # the cache rules the bills were priced by

    @property
    def front_misses(self) -> int:
        """Requests after the first whose cache broke inside the static front of the prompt
        (something before it changed, or the cache expired)."""
        warm = self.front_tokens
        if self.rules == "prefix":
            warm = warm // BLOCK_TOKENS * BLOCK_TOKENS  # the cache counts whole blocks
        return sum(b.cached_tokens < warm for b in self.bills[1:])

    def cost(self, cached_price: float) -> float:
        return sum(b.cost(cached_price) for b in self.bills)

    def cumulative(self, cached_price: float) -> list[float]:
        """Cost after each user turn."""
        per_turn = [0.0] * (len(self.session.turns) + 1)
        for bill, turn in zip(self.bills, self.turn_of, strict=True):
            per_turn[turn] += bill.cost(cached_price)
        return list(itertools.accumulate(per_turn))[1:]

    @property
    def recall(self) -> float:
        return sum(self.recalled.values()) / len(self.recalled) if self.recalled else 1.0


def seed_knowledge(data_dir: Path, team_id: str) -> None:
    """Two team wikis in the embedded core's catalogue, so that the knowledge block is real."""
    catalogue = Catalogue.open(data_dir / FILENAME)
    try:
        for name, summary in (("Design docs", "How the backend is built and why"),
                              ("Runbooks", "Deploys, rollbacks and on-call procedures")):
            page = Page("index", name, f"# {name}\n\n{summary}.\n")
            catalogue.sync_wiki("default", team_id, name, summary, f"/wikis/{name}", [page])
    finally:
        catalogue.close()


async def run_one(strategy: Strategy, session: Session, shapes: Shapes, ttl_s: float,
                  data_dir: Path, limit: int = AUTO_COMPACT_TOKENS,
                  rules: Rules = "prefix") -> Run:
    """One session through one strategy, priced by ``rules`` (``shapes`` from
    ``load_shapes(rules=rules)``, so that the requests name a model priced that way)."""
    clock = SimClock()
    model = ScriptedModel(session, pull=strategy.pull)
    upstream = PricingUpstream(model, clock=clock, ttl_s=ttl_s, tokenizer=TOKENIZER, rules=rules)
    started = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=300)
    async with serving(upstream.app()) as up_url, aiohttp.ClientSession(timeout=timeout) as http:
        if strategy.settings is None:
            seen = await replay(http, up_url + "/v1", session, shapes, clock,
                                AutoCompact(limit=limit))
        else:
            if strategy.settings.get("team_id") and not strategy.pull:
                seed_knowledge(data_dir, strategy.settings["team_id"])
            port = free_port()  # the block's curl lines name it
            settings = load_settings(env={}, upstream_url=up_url + "/v1", data_dir=data_dir,
                                     log_level="WARNING", port=port, **strategy.settings)
            async with serving(build_app(settings, clock=clock), port) as proxy_url:
                seen = await replay(http, proxy_url + "/v1", session, shapes, clock,
                                    AutoCompact(limit=limit))
    billed = [{"input": b.input_tokens, "cached": b.cached_tokens}
              for b, turn in zip(upstream.bills, model.turn_of, strict=True) if turn]
    if seen != billed:  # the client must see exactly what it was billed for
        raise RuntimeError(f"{strategy.name}: usage seen by the client differs from the bill")
    # The static front of every request: the tools and Codex's context messages.
    front = len(TOKENIZER.prompt({"tools": shapes.body.get("tools"), "input": shapes.context}))
    return Run(strategy, session, upstream.bills, model.turn_of, model.recalled, model.blocks,
               time.perf_counter() - started, front, model.compactions, rules)


# --- the report ------------------------------------------------------------------------------


def table(runs: Sequence[Run]) -> str:
    """One row per (session length, strategy), summed over the seeds."""
    groups: dict[tuple[int, str], list[Run]] = {}
    for run in runs:
        groups.setdefault((len(run.session.turns), run.strategy.name), []).append(run)
    direct = {n: g for (n, name), g in groups.items() if g[0].strategy.settings is None}
    # Under prefix rules nothing is billed as written: the column would be all 0%.
    writes = any(run.rules == "breakpoint" for run in runs)
    rows = ["| turns | strategy | requests | input tokens | cached "
            + ("| written " if writes else "")
            + "| cost @10% | cost @25% "
            "| largest request | client compactions | front re-reads | recall blocks "
            "| fact recall | from user / tool | costliest session @10% |",
            "|---:|---|---:|---:|---:|" + ("---:|" if writes else "")
            + "---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (turns, name), group in groups.items():
        bills = [b for run in group for b in run.bills]
        total = sum(b.input_tokens for b in bills)
        cached = sum(b.cached_tokens for b in bills)
        written = f"| {sum(b.written_tokens for b in bills) / total:.0%} " if writes else ""
        base = direct.get(turns)
        rel = [
            f"{sum(r.cost(p) for r in group) / sum(r.cost(p) for r in base):.2f}x" if base
            else "-" for p in (0.1, 0.25)
        ]
        hits = sum(sum(r.recalled.values()) for r in group)
        asks = sum(len(r.recalled) for r in group)
        by_source = " / ".join(
            f"{sum(r.recalled[f.asked] for r in group for f in r.session.facts if f.source == src)}"
            f"/{sum(1 for r in group for f in r.session.facts if f.source == src)}"
            for src in ("user", "tool")
        )
        # The rule is per session: a length's sum can hide one that costs more than direct.
        alone = {r.session.seed: r.cost(0.1) for r in base or ()}
        worst = max((r.cost(0.1) / alone[r.session.seed] for r in group
                     if alone.get(r.session.seed)), default=None)
        blocks = [n for r in group for n in r.blocks.values()]
        rows.append(
            f"| {turns} | {name} | {len(bills)} | {total:,} | {cached / total:.0%} {written}"
            f"| {rel[0]} "
            f"| {rel[1]} | {max(b.input_tokens for b in bills):,} "
            f"| {sum(r.compactions for r in group)} | {sum(r.front_misses for r in group)} "
            f"| {len(blocks)}/{turns * len(group)}, {sum(blocks) // max(len(blocks), 1)} tok "
            f"| {hits}/{asks} ({hits / max(asks, 1):.0%}) | {by_source} "
            f"| {'-' if worst is None else f'{worst:.4f}x'} |"
        )
    return "\n".join(rows)


def plot(runs: Sequence[Run], path: Path) -> None:
    """Cumulative input cost per user turn, one panel per session length."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    lengths = sorted({len(r.session.turns) for r in runs})
    cols = min(2, len(lengths))
    rows = -(-len(lengths) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.2 * rows), squeeze=False)
    for ax, n in zip(axes.flat, lengths, strict=False):
        for run in (r for r in runs if len(r.session.turns) == n):
            direct, defaults = run.strategy.settings is None, run.strategy.name == "defaults"
            style: dict[str, Any] = (
                {"color": "dimgray", "ls": "--", "lw": 2.2} if direct
                else {"color": "black", "lw": 2.6} if defaults else {"lw": 1.2, "alpha": 0.8})
            ax.plot(range(1, n + 1), [c / 1e3 for c in run.cumulative(0.1)],
                    label=run.strategy.name, **style)
        ax.set_title(f"{n} user turns")
        ax.set_xlabel("user turn")
        ax.set_ylabel("cumulative input cost, k tokens\n(cached tokens at 10%)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(lengths):]:
        ax.set_visible(False)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Input cost of a Codex session: direct vs ctxproxy strategies")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_strategy(spec: str) -> Strategy:
    """``name:key=value,key=value`` -> a proxy strategy: the defaults with these settings
    changed. Keys are settings names (``trim_slack``) or their variables (``TRIM_SLACK``,
    ``CTXPROXY_TRIM_SLACK``); values are JSON, else strings."""
    name, _, rest = spec.partition(":")
    return Strategy(name, {**SIMULATED_TIME, **strategy_settings(name, rest)}, rest)


async def main_async(args: argparse.Namespace) -> list[Run]:
    shapes = load_shapes(rules=args.cache_rules)
    strategies = [STRATEGIES[n] if n in STRATEGIES else parse_strategy(n)
                  for n in args.strategies.split(",") if n]
    strategies += [parse_strategy(spec) for spec in args.strategy]
    runs = []
    with tempfile.TemporaryDirectory(prefix="ctxproxy-econ-") as tmp:
        for turns in (int(t) for t in args.turns.split(",")):
            for seed in range(args.seed, args.seed + args.seeds):
                session = build_session(turns, seed)
                for strategy in strategies:
                    data_dir = Path(tmp) / f"{strategy.name}-{turns}-{seed}"
                    run = await run_one(strategy, session, shapes, args.ttl, data_dir,
                                        args.limit, args.cache_rules)
                    print(f"  {turns:3d} turns  seed {seed}  {strategy.name:10s} "
                          f"{len(run.bills):4d} requests {run.seconds:6.1f}s", file=sys.stderr)
                    runs.append(run)
    return runs


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", default="10,20,40,80", help="session lengths, in user turns")
    parser.add_argument("--strategies", default=",".join(STRATEGIES),
                        help=f"comma-separated, of: {', '.join(STRATEGIES)}")
    parser.add_argument("--strategy", action="append", default=[], metavar="NAME:K=V,K=V",
                        help="an extra proxy strategy: the defaults with these settings, e.g. "
                        "s6:trim_slack=6,recall_min_score=0.4 (repeatable)")
    parser.add_argument("--ttl", type=float, default=600.0, help="provider cache idle TTL, s")
    add_cache_rules_argument(parser)
    parser.add_argument("--seed", type=int, default=1, help="first session seed")
    parser.add_argument("--seeds", type=int, default=2, help="sessions per length")
    parser.add_argument("--plot", type=Path, default=None,
                        help=f"PNG of cumulative cost (default {PNG.name} beside this file, "
                             "unless --no-write)")
    parser.add_argument("--limit", type=int, default=AUTO_COMPACT_TOKENS,
                        help="the client's auto-compaction limit, reported input tokens")
    parser.add_argument("--no-write", action="store_true", help="don't touch bench/RESULTS.md")
    args = parser.parse_args(argv)
    if args.plot is None and not args.no_write:
        args.plot = PNG  # the figure RESULTS.md shows goes with its table
    logging.basicConfig(level=logging.WARNING)
    started = time.perf_counter()
    runs = asyncio.run(main_async(args))
    seconds = time.perf_counter() - started
    command = "python -m bench.economics" + "".join(
        f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv))
    text = report(runs, args, seconds, command)
    print(text)
    if args.plot is not None:
        plot([r for r in runs if r.session.seed == args.seed], args.plot)
        print(f"\nplot: {args.plot} (seed {args.seed})", file=sys.stderr)
    if not args.no_write:
        write_block(SECTION, BEGIN, END, text)
    print(f"{seconds:.0f} s", file=sys.stderr)


def report(runs: Sequence[Run], args: argparse.Namespace, seconds: float, command: str) -> str:
    """The RESULTS.md block: how it was measured, then the table."""
    load = load_average()
    strategies = "; ".join(dict.fromkeys(
        f"`{r.strategy.name}`: {r.strategy.note}" for r in runs))
    return "\n".join([
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC at `{revision()}` with `{command}` "
        f"({args.seeds} "
        f"seeds per length, cache TTL {args.ttl:.0f} s) on {os.cpu_count()} shared cores, "
        f"Python {platform.python_version()}; load average at the end {load}; run time "
        f"{seconds:.0f} s."
        + (f" Plot: `bench/{args.plot.name}` (seed {args.seed}, cumulative input cost per "
           "user turn, cached tokens at 10%)." if args.plot is not None else ""),
        "",
        "Sessions: the real Codex 0.169.0 request shape (`03_resume_7turns`), 0-4 "
        "`exec_command` calls a turn with 1-8 KB outputs, one request per model step; facts "
        "planted in the first third (by the user or in a tool output), asked in the second "
        "half. Costs are input tokens only, relative to direct at the same length and seeds. "
        "The client compacts as Codex does (bench/harness/codex.py), direct and through the proxy: "
        f"when the input tokens the server reported pass {args.limit:,}, one compaction "
        "request (whole history + compaction prompt, no tools; priced like any request), "
        "then the context, the prompts (at most 20k tokens) and the summary; through the "
        "proxy the server reports the forwarded size. *front re-reads*: requests whose cache "
        "broke inside the tools + context messages (a compaction request, with no tools, is "
        "one). *costliest session*: the highest cost @10% against direct of one seed's "
        "session, to four places (the rule is per session; the row sums the seeds). "
        + cache_rules_note(args.cache_rules),
        "",
        f"Strategies: {strategies}.",
        "",
        table(runs),
    ])


if __name__ == "__main__":
    main()
