"""A memory that a recall message still in the window shows is not shown again with other
lines, unless the question's words pick those lines over the ones shown.

With embeddings on, a long memory has many chunks, and one of them is often near whatever
the next question is: without this, the same turn came back turn after turn, a different
chunk each time (bench.economics, noise that costs tokens).
"""

from __future__ import annotations

import json
import random
from typing import Any

from ctxproxy.injectors import memory_blocks, tokens
from ctxproxy.memory.model import Memory, Scope, Store
from ctxproxy.memory.recall import Recaller, Weights
from ctxproxy.memory.snippets import lines_of
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream
from tests.memory.session import Session, developer_memory, runtime

# Words both the fake embedder and the full-text search skip: filler that is near nothing and
# matches nothing, so each fact's chunk is that fact alone, in meaning and in words.
_SKIPPED = "a an the of to in on at for and or is are was were be it its that this".split()
SHIP = "- Let's ship every second Tuesday."
INVOICES = "- Invoices are rounded to whole cents."
TOKEN = "- The deploy token is held in DEPLOY_TOKEN_OSPREY."


def notes() -> str:
    """A long output: the three facts far apart, each in a chunk of its own."""
    rng = random.Random(13)
    lines = ["- " + " ".join(rng.choices(_SKIPPED, k=30)) for _ in range(60)]
    lines[10], lines[30], lines[50] = SHIP, INVOICES, TOKEN
    return "\n".join(lines) + "\n"


async def read_notes(s: Session) -> None:
    """The first turn: one command prints the notes."""
    s.turns += 1
    turn = codex.tool_turn("Read the notes before you start.", output=notes())
    for item in turn:
        if item.get("type") == "function_call":
            item["arguments"] = json.dumps({"cmd": "cat docs/NOTES.md"})
    s.items = [*s.items, turn[0]]
    await s.send()
    s.items = [*s.items, *turn[1:]]


def newest_recall(sent: dict[str, Any]) -> str:
    """The recall message this request's own turn got ('' when none)."""
    found = developer_memory(sent)
    if not found or found[-1][0] != len(sent["input"]) - 2:
        return ""
    return found[-1][1]


async def test_a_memory_the_window_shows_comes_back_only_for_lines_the_words_pick(
    upstream: FakeUpstream, start_proxy: ProxyFactory,
) -> None:
    proxy = await start_proxy(
        window_policy="fixed", keep_turns=5, trim_slack=0,
        embeddings_url=upstream.url + "/v1",  # type: ignore[attr-defined]
        embeddings_model="fake-embedder", embeddings_min_similarity=0.2,
    )
    s = Session(proxy, upstream)
    await read_notes(s)
    for n in range(6):  # the window cuts the notes' turn
        await s.say(f"turn {n}: please do step {n}")
    await runtime(proxy).queue.join()
    indexer = runtime(proxy).indexer
    assert indexer is not None
    await indexer.drain()

    first = await s.say("What did we agree on for the release train?")
    assert SHIP in newest_recall(first)  # by meaning: the turn is in view now
    await runtime(proxy).queue.join()

    # Near another chunk of the same turn by meaning alone: not shown again.
    again = await s.say("How should bills handle precision?")
    assert INVOICES not in json.dumps(again)
    assert newest_recall(again) == ""

    # The question's words pick a line of it that is not in view: shown, with that line.
    words = await s.say("Which variable holds the deploy token?")
    assert "DEPLOY_TOKEN_OSPREY" in newest_recall(words)
    assert SHIP in json.dumps(words)  # the first recall message is still in place


# --- the rule for the question's words, on the recaller ----------------------------------------

SCOPE = Scope("svc")
NOW = 1_800_000_000.0
HOST = "  - The staging database host is pg-stg-417.corp.internal."
QUEUE = "  - The staging queue runs beside it."
LISTING = "Tool output exec_command: " + "\n".join(
    [f"-rw-r--r-- 1 dev dev {n} Nov 29 notes_{n}.md" for n in range(40)] + [HOST, QUEUE])


async def recalled_again(store: Store, question: str, shown: frozenset[str]) -> str:
    """What recall shows of the notes turn for ``question`` while ``shown`` is in view."""
    (notes_turn,) = await store.upsert([Memory(
        type="episodic", scope=SCOPE, key="notes", session_id="old", turn_index=0,
        text=f"User: Read the notes.\n{LISTING}", created_at=NOW, updated_at=NOW)])
    recaller = Recaller(
        store, weights=Weights(), k=5, budget=1200,
        cost=lambda m: tokens.count(memory_blocks.item(m)) + 1,
        overhead=lambda kind: tokens.count(memory_blocks.block_overhead(kind)),
    )
    got = await recaller.recall(SCOPE, "now", question, window=(), exclude=(), budget=1200,
                                now=NOW, min_score=0.25, shown={notes_turn.memory_id: shown})
    return "\n".join(m.text for m in got)


async def test_lines_that_match_no_better_than_those_in_view_do_not_bring_a_memory_back(
    store: Store,
) -> None:
    in_view = lines_of(f"User: Read the notes.\n{HOST}")
    # Two of four words on the host line in view, two on the queue line: no better.
    assert await recalled_again(store, "Which staging database serves the queue?",
                                in_view) == ""
    # Three on the queue line: better than what is in view.
    assert QUEUE in await recalled_again(store, "Does the staging queue run beside it?",
                                         in_view)
