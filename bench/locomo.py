"""LoCoMo: does a long conversation's evidence reach the prompt when a later session asks.

    python -m bench locomo --data /tmp/locomo10.json              # conversations 0-4
    python -m bench locomo --data ... --conversations 0 --no-write

LoCoMo (snap-research/LoCoMo, ``data/locomo10.json``, CC BY-NC 4.0: never copied into this
repository) holds ten long two-person conversations, each in dated sessions, with questions
whose evidence names the dialogue turns that answer them. Get it with
``git clone https://github.com/snap-research/LoCoMo`` and pass ``--data
LoCoMo/data/locomo10.json``. Develop on conversations 0-4 (the default); 5-9 are held out.

Each conversation is one user's memory (its own scope) in a fresh proxy with default settings
(embedded SQLite store in a temporary directory) in front of a fake upstream that records
what it received. Its sessions, in their dates' order, are Codex sessions: the session's
dialogue turns packed ``--per-request`` to a user message (default 4, two exchanges, at most
1,800 characters: a stored turn keeps 2,000 of the prompt), one line per dialogue turn as
``[3 March, 2023] Ada: text`` (a shared image as its caption), each answered by the fake
model, so the window cuts and memory stores every turn. Then each question (categories 1-4,
and 5, adversarial: its answer is nowhere in the conversation) is the only prompt of a new
Codex session of the same scope; what it leaves in memory is deleted before the next one.

Per category:

- evidence in prompt: questions with any (all) of their evidence turns' text in the forwarded
  request (a line longer than a recall snippet shows counts by a 150-character stretch);
- recall block: share of questions shown recalled turns (an ``<episodic_memory>`` block),
  and its tokens (median, p90, over those); for category 5 the share is the noise; any
  block: the same counting the standing memory too (working and semantic: distilled facts,
  shown whatever the question);
- store R@5 / R@10: mean share of a question's evidence turns in the first 5 (10) results of
  ``Store.search`` with the question alone (a result is a stored turn of up to
  ``--per-request`` dialogue turns, so this is easier than per-turn figures);
- BM25 R@5 / R@10: an Okapi BM25 anchor over the dialogue turns one by one, and over the same
  packed units the store holds.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from bench.harness.machine import machine, revision
from bench.harness.results import RESULTS, write_block
from bench.harness.serving import serve_plain
from bench.harness.small_codex import context_items, headers, request, text
from bench.locomo_data import (
    BM25,
    Conversation,
    Question,
    Session,
    Turn,
    load,
    one_line,
    parse_picks,
)
from bench.recall import Recorder
from ctxproxy.config import load_settings
from ctxproxy.injectors import tokens
from ctxproxy.injectors.memory_blocks import TAGS
from ctxproxy.memory.model import Scope, Store
from ctxproxy.memory.step import scope_of
from ctxproxy.proxy.app import METRICS
from ctxproxy.proxy.assemble import build_app
from ctxproxy.proxy.memory_wiring import MEMORY, Runtime
from ctxproxy.request import Identity

SECTION = "## LoCoMo (issue 46)"
BEGIN, END = "<!-- locomo:begin (written by bench/locomo.py) -->", "<!-- locomo:end -->"
MEMORY_BLOCK = re.compile("|".join(f"<{tag}[ >].*?</{tag}>" for tag in TAGS.values()), re.S)
SERVICE, TEAM, AGENT = "bench", "locomo-team", "locomo-agent"
# The categories as LoCoMo's evaluation code numbers them.
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop",
              5: "adversarial"}
MESSAGE_CHARS = 1800
STRETCH = 150  # a long line counts as shown by this many consecutive characters of it
ANSWER = "Noted."
KS = (5, 10)


# --- Codex sessions ------------------------------------------------------------------------


def line(turn: Turn, date: str) -> str:
    image = f" [shared an image: {turn.caption}]" if turn.caption else ""
    return f"[{date}] {turn.speaker}: {turn.text}{image}"


def pack(session: Session, per: int) -> list[tuple[str, tuple[Turn, ...]]]:
    """The session's turns as user messages: ``per`` lines each, within MESSAGE_CHARS."""
    out: list[tuple[str, tuple[Turn, ...]]] = []
    lines: list[str] = []
    group: list[Turn] = []
    for turn in session.turns:
        shown = line(turn, session.date)
        if group and (len(group) >= per or len("\n".join([*lines, shown])) > MESSAGE_CHARS):
            out.append(("\n".join(lines), tuple(group)))
            lines, group = [], []
        lines.append(shown)
        group.append(turn)
    if group:
        out.append(("\n".join(lines), tuple(group)))
    return out


def user_key(conv: Conversation) -> str:
    """Each conversation is one user's memory."""
    return f"locomo-{conv.sample_id}"


def user_headers(conv: Conversation, session_id: str, turn_id: str) -> dict[str, str]:
    return headers(session_id, turn_id, **{"x-team-id": TEAM, "x-agent-id": AGENT,
                                           "x-tdai-user-key": user_key(conv)})


def session_requests(conv: Conversation, session: Session, per: int
                     ) -> Iterator[tuple[dict[str, Any], dict[str, str], list[str]]]:
    """Each request of one LoCoMo session as a Codex session: the history so far (every
    earlier message answered), then the next packed message; and the messages it sends."""
    session_id = f"locomo-{conv.sample_id}-s{session.number}"
    done: list[dict[str, Any]] = []
    sent: list[str] = []
    for n, (message, _) in enumerate(pack(session, per)):
        body = request([*context_items(), *done, text("user", message)], session_id)
        sent.append(message)
        yield body, user_headers(conv, session_id, f"{session_id}-t{n}"), sent
        done += [text("user", message), text("assistant", ANSWER)]


# --- scoring -------------------------------------------------------------------------------


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def forwarded(body: bytes) -> tuple[str, str, str]:
    """Every string of the forwarded request (whitespace folded as in the turns' lines), the
    memory blocks in it (what the memory step added: the client sends none), and of those
    the recalled turns (``<episodic_memory>``: the standing memory, working and semantic, is
    shown whatever the question)."""
    parsed = orjson.loads(body)
    texts = list(strings([parsed.get("instructions"), parsed.get("input")]))
    blocks = [b for t in texts for b in MEMORY_BLOCK.findall(t)]
    recall = [b for b in blocks if b.startswith(f"<{TAGS['episodic']}")]
    return one_line("\n".join(texts)), "\n".join(blocks), "\n".join(recall)


def shown(turn_text: str, haystack: str) -> bool:
    """The turn's text is in ``haystack``, or for a line longer than a snippet shows whole
    (LINE_CHARS, memory/snippets.py), STRETCH consecutive characters of it are."""
    if turn_text in haystack:
        return True
    if len(turn_text) <= 200:
        return False
    return any(turn_text[at:at + STRETCH] in haystack
               for at in range(0, len(turn_text) - STRETCH + 1, 25))


def recall_at(evidence: Sequence[str], ranked: Sequence[set[str]], k: int) -> float:
    """The share of ``evidence`` ids among the first ``k`` results (each a set of ids)."""
    found = set().union(*ranked[:k]) if ranked else set()
    return sum(e in found for e in evidence) / len(evidence)


@dataclass
class Asked:
    """One question's measurements."""

    category: int
    evidence: int  # resolvable evidence turns
    any_shown: bool = False
    all_shown: bool = False
    block_tokens: int = 0  # what the memory step added; 0: nothing
    recall_tokens: int = 0  # of it, the recall message (the rest: standing memory)
    store: dict[int, float] = field(default_factory=dict)  # k -> R@k
    bm25_turns: dict[int, float] = field(default_factory=dict)
    bm25_units: dict[int, float] = field(default_factory=dict)


# --- the replay ----------------------------------------------------------------------------


async def post(client: aiohttp.ClientSession, url: str, body: dict[str, Any],
               head: dict[str, str]) -> None:
    async with client.post(url + "/v1/responses", data=orjson.dumps(body), headers=head) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"proxy answered {resp.status}")


async def settle(runtime: Runtime) -> None:
    """Let the memory writes under way land, as time between sessions would."""
    await runtime.queue.join()
    if runtime.indexer is not None:
        await runtime.indexer.drain()


async def search_ids(store: Store, scope: Scope, question: str, texts: dict[str, str],
                     limit: int) -> list[set[str]]:
    """The dialogue ids each of the store's first ``limit`` results holds whole."""
    hits = await store.search(scope, question, limit=limit)
    stored = [one_line(hit.memory.text) for hit in hits]
    return [{dia for dia, said in texts.items() if said in text} for text in stored]


@dataclass
class Replayed:
    """One conversation's questions, and how often the window cut its sessions' requests."""

    asked: list[Asked]
    requests: int = 0
    cut: int = 0  # requests forwarded without some earlier message of their session


async def replay(conv: Conversation, args: argparse.Namespace, client: aiohttp.ClientSession,
                 url: str, recorder: Recorder, runtime: Runtime) -> Replayed:
    """The conversation's sessions, then each question in a session of its own."""
    done = Replayed([])
    for session in conv.sessions:
        for body, head, sent in session_requests(conv, session, args.per_request):
            await post(client, url, body, head)
            kept = set(strings(orjson.loads(recorder.bodies[-1]).get("input")))
            done.requests += 1
            done.cut += any(message not in kept for message in sent)
        await settle(runtime)
    scope = scope_of(args.settings, Identity(TEAM, AGENT, user_key(conv), session_id=None))
    index = Index(conv, args.per_request)
    for n, q in enumerate(conv.questions):
        if q.category not in CATEGORIES:
            continue
        session_id = f"locomo-{conv.sample_id}-q{n}"
        await post(client, url, request([*context_items(), text("user", q.text)], session_id),
                   user_headers(conv, session_id, f"{session_id}-t0"))
        seen, added, recalled = forwarded(recorder.bodies[-1])
        asked = await score(q, seen, added, index, runtime.store, scope)
        asked.recall_tokens = tokens.count(recalled) if recalled else 0
        done.asked.append(asked)
        # The question's own turn is no memory of the conversation: gone before the next.
        await settle(runtime)
        mine = await runtime.store.list(scope, session_id=session_id, limit=1000)
        if mine:
            await runtime.store.delete([m.memory_id for m in mine])
    return done


class Index:
    """A conversation's turns by id, and BM25 over them one by one and packed."""

    def __init__(self, conv: Conversation, per: int) -> None:
        turns = conv.turns()
        self.texts = {dia: t.text for dia, t in turns.items()}
        self.ids = list(turns)
        self.units = [group for s in conv.sessions for _, group in pack(s, per)]
        self.by_turn = BM25([line(t, "") for t in turns.values()])
        self.by_unit = BM25(["\n".join(line(t, "") for t in g) for g in self.units])


async def score(q: Question, seen: str, added: str, index: Index, store: Store,
                scope: Scope) -> Asked:
    evidence = [e for e in q.evidence if e in index.texts]
    a = Asked(q.category, len(evidence), block_tokens=tokens.count(added) if added else 0)
    if not evidence:
        return a
    hit = [shown(index.texts[e], seen) for e in evidence]
    a.any_shown, a.all_shown = any(hit), all(hit)
    ranked = await search_ids(store, scope, q.text, index.texts, max(KS))
    by_turn = [{index.ids[i]} for i in index.by_turn.top(q.text, max(KS))]
    by_unit = [{t.dia_id for t in index.units[i]} for i in index.by_unit.top(q.text, max(KS))]
    for k in KS:
        a.store[k] = recall_at(evidence, ranked, k)
        a.bm25_turns[k] = recall_at(evidence, by_turn, k)
        a.bm25_units[k] = recall_at(evidence, by_unit, k)
    return a


async def run(args: argparse.Namespace, data_dir: Path) -> list[tuple[Conversation, Replayed]]:
    recorder = Recorder()
    upstream, upstream_url = await serve_plain(recorder.app())
    values: dict[str, Any] = {"data_dir": data_dir, "service_id": SERVICE,
                              "upstream_url": upstream_url + "/v1"}
    values.update(args.set)
    if args.embeddings_url:
        values["embeddings_url"] = args.embeddings_url
        values["embeddings_timeout_ms"] = args.embeddings_timeout_ms
        # The memory step's own budget must cover that wait, or the turn goes without memory.
        values["memory_timeout_ms"] = max(1000, args.embeddings_timeout_ms + 1000)
    args.settings = load_settings(env={}, **values)
    app = build_app(args.settings)
    proxy, proxy_url = await serve_plain(app)
    out = []
    try:
        async with aiohttp.ClientSession() as client:
            for conv in args.loaded:
                began = time.perf_counter()
                done = await replay(conv, args, client, proxy_url, recorder, app[MEMORY])
                print(f"conversation {conv.index} ({conv.sample_id}): {len(conv.sessions)} "
                      f"sessions, {len(done.asked)} questions, "
                      f"{time.perf_counter() - began:.0f} s", flush=True)
                out.append((conv, done))
        args.degraded = degraded(app)
        args.modes = modes(app)
    finally:
        await proxy.cleanup()
        await upstream.cleanup()
    return out


def degraded(app: web.Application) -> int:
    """Memory-side failures counted (memory.health: every failure of any part, a store too
    slow for a turn or an embedding call, not turns left without memory)."""
    return int(sum(s.value for m in app[METRICS].degraded.collect() for s in m.samples
                   if s.name.endswith("_total") and s.labels.get("source") == "memory"))


def modes(app: web.Application) -> dict[str, int]:
    """How each turn's recall searched (hybrid, lexical, lexical-degraded): counted."""
    return {s.labels.get("mode", "?"): int(s.value)
            for m in app[METRICS].recall_modes.collect() for s in m.samples
            if s.name.endswith("_total") and s.value}


# --- the report ----------------------------------------------------------------------------


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%} ({part}/{whole})" if whole else "-"


def _q(values: Sequence[int], p: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]}"


def _mean(rows: Sequence[Asked], attr: str, k: int) -> str:
    scored = [getattr(a, attr)[k] for a in rows if a.evidence]
    return f"{statistics.mean(scored):.0%}" if scored else "-"


def row(name: str, rows: Sequence[Asked], adversarial: bool = False) -> str:
    scored = [a for a in rows if a.evidence]
    blocks = [a.block_tokens for a in rows if a.block_tokens]
    cells = [name, str(len(rows))]
    if adversarial:
        cells += ["-", "-"]
    else:
        cells += [_share(sum(a.any_shown for a in scored), len(scored)),
                  _share(sum(a.all_shown for a in scored), len(scored))]
    recalls = [a.recall_tokens for a in rows if a.recall_tokens]
    cells += [_share(len(recalls), len(rows)), f"{_q(recalls, 0.5)} / {_q(recalls, 0.9)}",
              _share(len(blocks), len(rows)), f"{_q(blocks, 0.5)} / {_q(blocks, 0.9)}"]
    for attr in ("store", "bm25_turns", "bm25_units"):
        cells.append(" / ".join(_mean(scored, attr, k) for k in KS) if not adversarial else "-")
    return "| " + " | ".join(cells) + " |"


def report(results: Sequence[tuple[Conversation, Replayed]], args: argparse.Namespace,
           seconds: float) -> str:
    every = [a for _, done in results for a in done.asked]
    requests = sum(done.requests for _, done in results)
    cut = sum(done.cut for _, done in results)
    picks = ",".join(str(c.index) for c, _ in results)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"### Run of {stamp}",
        "",
        f"`python -m bench locomo {' '.join(args.argv)}` at `{revision()}` on {machine()}; "
        f"{seconds / 60:.1f} minutes. Conversations {picks} "
        f"({sum(len(c.sessions) for c, _ in results)} sessions, "
        f"{sum(len(c.turns()) for c, _ in results)} dialogue turns, {len(every)} questions); "
        f"{args.per_request} dialogue turns per request ({requests} requests, {cut} of them "
        f"forwarded with earlier messages of their session cut; memory-side failures counted "
        f"{args.degraded} times: a slow store, or embedding calls that failed); recall "
        f"{'hybrid (' + args.embeddings_url + ')' if args.embeddings_url else 'lexical'}, "
        f"{_settings(args)}{_timeout(args)}; recall searched "
        f"{', '.join(f'{k} {v} times' for k, v in sorted(args.modes.items())) or '-'}; "
        f"tokens: {tokens.encoding_name()}.",
        "",
        "| category | questions | evidence in prompt: any | all | recall block shown "
        "| recall tokens median / p90 | any block shown | any block tokens median / p90 "
        "| store search R@5 / R@10 | BM25 turns R@5 / R@10 | BM25 packed R@5 / R@10 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cat, name in CATEGORIES.items():
        lines.append(row(f"{cat} {name}", [a for a in every if a.category == cat], cat == 5))
    lines.append(row("1-4", [a for a in every if a.category != 5]))
    unscored = sum(1 for a in every if a.category != 5 and not a.evidence)
    lines += ["", f"Evidence columns score questions 1-4 whose evidence ids name a turn of the "
              f"conversation ({unscored} do not). Each question is the only prompt of a new "
              "Codex session: what reaches the prompt is the memory step's doing. Recall block: "
              "the recalled turns (`<episodic_memory>`); any block: those or the standing "
              "memory (distilled semantic facts, shown whatever the question: what the "
              "distiller found by then varies from run to run); tokens over the questions "
              "that got one. Store search: "
              "`Store.search(scope, question, limit=10)` alone; a result holds up to "
              f"{args.per_request} dialogue turns (BM25 packed: the same units, BM25 turns: "
              "one dialogue turn each). Memories stored in the same second tie on time, so "
              "the store's order among equals, and with it a few points of these figures, "
              "changes from run to run. Issue 46's targets (lexical): evidence in prompt 1-4 "
              ">= 70%, adversarial recall block <= 30%, recall block median <= 600 tokens."]
    return "\n".join(lines)


def _settings(args: argparse.Namespace) -> str:
    if not args.set:
        return "default settings"
    return "default settings but " + ", ".join(f"{k}={v}" for k, v in args.set.items())


def _timeout(args: argparse.Namespace) -> str:
    if not args.embeddings_url or args.embeddings_timeout_ms == 300:
        return ""
    return (f" but a question's embedding waited for up to {args.embeddings_timeout_ms} ms "
            f"(and memory for {args.embeddings_timeout_ms + 1000} ms)")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench locomo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("/tmp/locomo10.json"),
                        help="LoCoMo's data/locomo10.json")
    parser.add_argument("--conversations", default="0-4",
                        help="which conversations, e.g. 0-4 or 0,2 (5-9 are held out)")
    parser.add_argument("--per-request", type=int, default=4,
                        help="dialogue turns packed into one user message")
    parser.add_argument("--embeddings-url", help="an OpenAI-compatible /v1 base URL for hybrid "
                        "recall (e.g. ../shared/tools/embed_server.py); unset: lexical")
    parser.add_argument("--embeddings-timeout-ms", type=int, default=300,
                        help="how long a question waits for its embedding (the setting's "
                        "default 300; a CPU model on a loaded machine may need more, else the "
                        "turn recalls lexically and counts as degraded)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting other than its default (Settings' field name, e.g. "
                        "memory_tokens=700); repeatable")
    parser.add_argument("--no-write", action="store_true", help="print, don't touch RESULTS.md")
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    args.picks = parse_picks(args.conversations)
    try:
        args.set = dict(item.split("=", 1) for item in args.set)
    except ValueError:
        parser.error("--set takes NAME=VALUE")
    if args.per_request < 1:
        parser.error("--per-request must be at least 1")
    return args


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.data.is_file():
        print(f"bench.locomo: no LoCoMo data at {args.data}. Get it with\n"
              "  git clone https://github.com/snap-research/LoCoMo\n"
              "and pass --data LoCoMo/data/locomo10.json (CC BY-NC 4.0: do not commit it).",
              file=sys.stderr)
        return 2
    args.loaded = load(args.data, args.picks)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ctxproxy-locomo-") as tmp:
        results = await run(args, Path(tmp))
    text_ = report(results, args, time.perf_counter() - began)
    print(text_)
    if not args.no_write:
        write_block(SECTION, BEGIN, END, text_)
        print(f"\nwritten to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
