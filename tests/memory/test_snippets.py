"""Recall blocks that cost little and stay put: snippets of long turns, relevance-gated recall,
and each turn's recall message kept in place for the provider's prompt cache."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxproxy.injectors import memory_blocks, tokens
from ctxproxy.memory import snippets
from ctxproxy.memory.model import Memory, Scope
from ctxproxy.memory.recall import Candidate, Recaller, Weights
from ctxproxy.memory.snippets import (
    GAP,
    LONG_QUERY_WORDS,
    MAX_QUESTIONS,
    QUESTION_SCAN_CHARS,
    SNIPPET_TOKENS,
    questions,
    snippet,
)
from ctxproxy.memory.store_sqlite import SqliteStore
from ctxproxy.memory.turns import OUTPUT_CHARS, TURN_CHARS, render, split
from ctxproxy.memory.words import terms
from ctxproxy.request import History
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream
from tests.memory.session import Session, developer_memory, post, runtime, user_texts

Item = dict[str, Any]
FACT = "- The staging database host is pg-stg-417.corp.internal."
QUESTION = "What is the staging database host again?"
NOTES_CMD = "cat docs/NOTES.md"


def long_output(fact: str = FACT, lines: int = 200) -> str:
    """A listing of about 9 KB with ``fact`` in its middle."""
    out = [f"-rw-r--r-- 1 dev dev {n * 37} Nov 29 12:{n % 60:02d} cache_router_{n}.py"
           for n in range(lines)]
    out.insert(lines // 2, fact)
    return "\n".join(out) + "\n"


def notes_turn(prompt: str, output: str) -> list[Item]:
    turn = codex.tool_turn(prompt, output=output)
    for item in turn:
        if item.get("type") == "function_call":
            item["arguments"] = json.dumps({"cmd": NOTES_CMD})
    return turn


def rendered(turn: list[Item]) -> str:
    items = [*codex.context_items(), *turn, codex.text("user", "next")]
    return render(split("s", History(items))[0])[0]


# --- rendering and snippets (pure) ---------------------------------------------------------


def test_render_keeps_whole_outputs_each_right_after_its_call() -> None:
    turn = codex.tool_turn("look around", output="first\nsecond line", n_calls=2)
    calls = [i for i in turn if i.get("type") == "function_call"]
    outputs = [i for i in turn if i.get("type") == "function_call_output"]
    calls[1]["arguments"] = json.dumps({"cmd": "ls src"})
    outputs[1]["output"] = "src/a.py\nsrc/b.py"
    text = rendered(turn)
    # Codex sends both calls, then both outputs; the record pairs each output with its call,
    # continuation lines indented so that a line of output can be traced to its command.
    assert text.split("\n")[1:7] == [
        'Tool call exec_command: {"cmd": "ls"}',
        "Tool output exec_command: first",
        "  second line",
        'Tool call exec_command: {"cmd": "ls src"}',
        "Tool output exec_command: src/a.py",
        "  src/b.py",
    ]
    assert long_output().strip() in rendered(notes_turn("read", long_output())).replace(
        "\n  ", "\n")


def test_render_bounds_each_output_and_the_whole_turn() -> None:
    text = rendered(codex.tool_turn("dump it", output="Q" * 40_000))
    assert 15_000 < text.count("Q") < OUTPUT_CHARS
    text = rendered(codex.tool_turn("dump all", output="Q" * 40_000, n_calls=8))
    assert len(text) <= TURN_CHARS and text.count("Q") > 4 * 15_000


def test_snippet_picks_the_fact_line_and_its_command_out_of_a_long_output() -> None:
    text = rendered(notes_turn("Read the notes before you start.", long_output()))
    assert tokens.count(text) > 10 * SNIPPET_TOKENS

    cut = snippet(text, f"{QUESTION} I need it for the deploy.")

    lines = cut.text.split("\n")
    assert lines[0] == "User: Read the notes before you start."
    assert f'Tool call exec_command: {{"cmd": "{NOTES_CMD}"}}' in lines
    assert "  " + FACT in lines
    assert GAP in lines and not any("cache_router" in line for line in lines)
    assert tokens.count(cut.text) <= SNIPPET_TOKENS
    assert cut.match == pytest.approx(3 / 5)  # staging, database, host; not need, deploy


def test_the_same_memory_and_question_give_the_same_snippet() -> None:
    text = rendered(notes_turn("Read the notes.", long_output()))
    assert snippet(text, QUESTION) == snippet(text, QUESTION)


def test_a_short_memory_is_shown_whole() -> None:
    text = "User: Our database is PostgreSQL 15 on port 5433.\nAssistant: Noted."
    cut = snippet(text, "Which port is the database on?")
    assert cut.text == text and cut.match == pytest.approx(2 / 2)


def test_with_no_line_in_common_a_snippet_is_the_turns_first_lines() -> None:
    text = rendered(notes_turn("Read the notes.", long_output()))
    cut = snippet(text, "zebra quokka")
    lines = cut.text.split("\n")
    assert cut.match == 0
    assert lines[:-1] == text.split("\n")[: len(lines) - 1] and lines[-1] == GAP


def test_a_line_found_deep_in_a_long_line_is_cut_around_the_word() -> None:
    text = rendered(notes_turn("Read it.", "x " * 3000 + "staging host is h-1 " + "y " * 3000))
    cut = snippet(text, "staging host")
    assert "staging host is h-1" in cut.text
    assert tokens.count(cut.text) <= SNIPPET_TOKENS


# --- the gate (Recaller against a store) ---------------------------------------------------

SCOPE = Scope("svc")
NOW = 1_800_000_000.0


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    opened = SqliteStore(tmp_path / "memory.sqlite3")
    await opened.open()
    yield opened
    await opened.close()


def episode(key: str, text: str) -> Memory:
    return Memory(type="episodic", scope=SCOPE, key=key, text=text, session_id="old",
                  turn_index=0, created_at=NOW, updated_at=NOW, attrs={"prompt": key})


def recaller(store: SqliteStore) -> Recaller:
    return Recaller(
        store, weights=Weights(), k=5, budget=1200,
        cost=lambda m: tokens.count(memory_blocks.item(m)) + 1,
        overhead=lambda kind: tokens.count(memory_blocks.block_overhead(kind)),
    )


async def recalled(store: SqliteStore, query: str, min_score: float) -> list[str]:
    got = await recaller(store).recall(SCOPE, "now", query, window=(), exclude=(), budget=1200,
                                       now=NOW, min_score=min_score)
    return [m.key for m in got]


async def test_the_gate_keeps_a_memory_whose_line_holds_enough_of_the_question(
    store: SqliteStore,
) -> None:
    # Two of the question's four words on one line...
    await store.upsert([episode("strong", rendered(notes_turn("Read.", long_output())))])
    # ...against the same words scattered over lines that each hold one.
    scattered = "\n".join(["User: tidy the staging area", 'Tool call exec_command: {"cmd": "ls"}',
                           "Tool output exec_command: total 8"] + ["  pad"] * 50
                          + ["  the database was slow"] + ["  pad"] * 50 + ["  host file"])
    await store.upsert([episode("weak", scattered)])
    query = "staging database host address"

    assert await recalled(store, query, 0.5) == ["strong"]  # 3 of 4 words on one line
    assert sorted(await recalled(store, query, 0.0)) == ["strong", "weak"]
    assert await recalled(store, query, 0.8) == []  # no block at all


async def test_a_memory_id_the_user_names_passes_any_gate(store: SqliteStore) -> None:
    (named,) = await store.upsert([episode("named", "User: nothing in common here")])
    assert await recalled(store, f"show me {named.memory_id}", 1.0) == ["named"]


# --- end to end through the proxy ----------------------------------------------------------


async def tool_turn(s: Session, prompt: str, output: str) -> None:
    """A turn whose one command printed ``output``: the prompt, then the output, then the
    answer, as Codex sends them."""
    s.turns += 1
    turn = notes_turn(prompt, output)
    s.items = [*s.items, turn[0]]
    await s.send()
    s.items = [*s.items, *turn[1:-1]]
    await s.send()
    s.items = [*s.items, turn[-1]]


async def test_a_fact_in_the_middle_of_a_tool_output_comes_back_as_a_few_lines(
    upstream: FakeUpstream, start_proxy: ProxyFactory,
) -> None:
    proxy = await start_proxy(keep_turns=2, trim_slack=0)
    s = Session(proxy, upstream)
    await tool_turn(s, "Read the notes before you start.", long_output())
    for n in range(2, 6):
        await s.say(f"turn {n}: please do step {n}")
        await runtime(proxy).queue.join()

    sent = await s.say(f"{QUESTION} I need it for the deploy.")

    assert "Read the notes" not in " ".join(user_texts(sent))  # cut from the window
    position, block = developer_memory(sent)[-1]
    assert sent["input"][position + 1]["content"][0]["text"].startswith(QUESTION)
    assert FACT in block and NOTES_CMD in block
    assert "cache_router" not in block
    assert tokens.count(block) < 300


async def test_a_turns_recall_message_stays_in_place_in_later_requests(
    upstream: FakeUpstream, start_proxy: ProxyFactory,
) -> None:
    # Keep 2 turns, cut in steps of 3: at turns 5 and 8.
    settings = {"keep_turns": 2, "trim_slack": 2, "recall_min_score": 0.0}
    proxy = await start_proxy(**settings)
    s = Session(proxy, upstream)
    await s.say("Our database is PostgreSQL 15 on port 5433.")
    for n in range(2, 5):
        await s.say(f"turn {n}: set up part {n} of the repo")
        await runtime(proxy).queue.join()
    asked = await s.say("Which port does the database listen on?")
    ((position, block),) = developer_memory(asked)
    assert "port 5433" in block
    message = asked["input"][position]
    await runtime(proxy).queue.join()

    later = await s.say("turn 6: now write the migration")
    # The whole earlier request is a prefix of the later one: the provider reads it from its
    # cache; the recall message is there, the same bytes, before its own turn's prompt.
    assert later["input"][: len(asked["input"])] == asked["input"]
    assert later["input"][position] == message
    assert [text for _, text in developer_memory(later)].count(block) == 1

    # Without a turn id (a client that sends none): the turn is found from the history.
    s.items = [*s.items, codex.text("assistant", "Done."), codex.text("user", "turn 7: ship")]
    bare = {k: v for k, v in codex.headers().items() if k != "x-codex-turn-metadata"}
    assert await post(proxy.url, codex.request(s.items), bare) == 200
    assert upstream.last.json["input"][position] == message

    # Another replica (here: on the same store) reads the message from the store and puts
    # it in the same place: the forwarded bytes are the same whichever replica answers.
    other = await start_proxy(**settings)
    assert await post(other.url, codex.request(s.items), bare) == 200
    assert upstream.last.json["input"][position] == message


async def test_a_question_that_matches_nothing_well_gets_no_recall_block(
    upstream: FakeUpstream, start_proxy: ProxyFactory,
) -> None:
    proxy = await start_proxy(keep_turns=1, trim_slack=0, recall_min_score=0.5)
    s = Session(proxy, upstream)
    await s.say("Our database is PostgreSQL 15 on port 5433.")
    for n in range(2, 4):
        await s.say(f"turn {n}: please do step {n}")
        await runtime(proxy).queue.join()

    vague = await s.say("Tidy the migration folder and the database docs, then the README.")
    await runtime(proxy).queue.join()
    sharp = await s.say("Which port is the database on?")

    assert developer_memory(vague) == []  # one word of six: under the gate
    ((_, block),) = developer_memory(sharp)
    assert "PostgreSQL 15 on port 5433" in block


def test_line_words_agree_with_how_terms_splits_words() -> None:
    from ctxproxy.memory.snippets import _line_words
    from ctxproxy.memory.words import terms

    text = "\n".join([
        "the port is 5433", "support ticket", "PORT_X and x-port", "pörtal port", "", "5433port",
    ])
    wanted = set(terms("port 5433 pörtal"))
    expected = [frozenset(set(terms(line.lower(), limit=256)) & wanted)
                for line in text.split("\n")]
    assert _line_words(text, wanted) == expected
    assert expected[1] == frozenset() and expected[2] == {"port"}  # 'support' is not 'port'


def test_a_long_turn_keeps_its_start_and_its_end() -> None:
    turn = codex.tool_turn("dump all", output="Q" * 2_500, n_calls=40)
    last_call = turn[-2]
    last_call["output"] = "diff --git a/src/x.py b/src/x.py\nindex 1a2b3c4..5d6e7f8 100644"
    text = rendered(turn)
    assert len(text) <= TURN_CHARS
    assert text.startswith("User: dump all")
    assert "index 1a2b3c4..5d6e7f8 100644" in text
    assert "characters of this turn left out" in text
    # The tail starts at an entry: the diff's lines still follow the call that printed it.
    tail = text.split("left out …]\n", 1)[1]
    assert tail.startswith(("Tool call", "Tool output", "User", "Assistant"))


def test_a_long_prompts_questions_keep_the_sentence_that_names_their_subject() -> None:
    prompt = ("Before you begin: last week you edited `src/app/__init__.py` for v2.1. Which "
              "checksum did its build print? " + "Then fix the parser as described. " * 20)
    assert questions(prompt) == [
        "Before you begin: last week you edited `src/app/__init__.py` for v2.1. Which "
        "checksum did its build print?"
    ]


@pytest.mark.parametrize("first", [False, True], ids=["deep", "first-line"])
def test_a_matching_line_brings_the_matching_line_after_it(first: bool) -> None:
    """Also where the diff is the output's first line (a Bash tool_result has no header of
    its own): its file line then heads the entry, and the command that printed it comes
    with it."""
    listing = "\n".join(f"src/pkg/mod_{n}.py: ok" for n in range(300))
    diff = "diff --git a/src/app/__init__.py b/src/app/__init__.py\nindex 9f3c2a1..4be07d2 100644"
    output = f"{diff}\n--- a\n+++ b\n{listing}" if first else f"{listing}\n{diff}\n--- a\n+++ b"
    text = rendered(codex.tool_turn("ship it", output=output))
    cut = snippet(text, "Which index line did the git diff of src/app/__init__.py show?")
    lines = cut.text.split("\n")
    at = next(n for n, line in enumerate(lines) if "diff --git" in line)
    assert lines[at + 1].strip() == "index 9f3c2a1..4be07d2 100644"
    if first:
        assert lines[at - 1].startswith("Tool call")


def test_a_question_word_in_an_entry_label_is_not_a_match() -> None:
    # "Tool call", "Tool output" and "User" are the labels render gives entries: a question
    # about a tool matches the turn that talks about one, not every turn that called one.
    text = ("User: list the files\n"
            "Tool call exec_command: ls -la\n"
            "Tool output exec_command: build.log\n"
            "Assistant: the load tool is k6, configured in bench/k6.js")
    cut = snippet(text, "which load tool do we use?", SNIPPET_TOKENS)
    assert cut.match == 2 / 3 and "k6" in cut.text  # load, tool: the answer's line
    assert snippet(text.rsplit("\n", 1)[0], "which tool?", SNIPPET_TOKENS).match == 0.0


def test_a_long_question_finds_the_lines_a_word_at_a_time_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = "\n".join([
        "User: why does parse_config fail on Straße?",
        "Tool call exec_command: grep -n parse config.py",
        "Tool output exec_command: config.py:12: def parse(text): return Config(text)",
        "Tool output exec_command: parse_config parse-config PARSE parsed reparse",
        "tool output straße 2026 x2 İstanbul",
        "Tool output tool: call output user",
    ])
    words = frozenset([*terms("why parse config straße 2026 x2 istanbul text output call user"),
                       *(f"filler{n}" for n in range(20))])
    assert len(words) > snippets.FIND_WORDS
    monkeypatch.setattr(snippets, "FIND_WORDS", 10**6)
    by_find = snippets._words_by_line(snippets._Text(text), words)
    monkeypatch.setattr(snippets, "FIND_WORDS", 16)
    parsed = snippets._Text(text)
    first, by_index = (snippets._words_by_line(parsed, words) for _ in range(2))
    assert parsed.index is not None
    assert by_index == first == by_find
    assert by_index[3] == {"parse", "config"}  # whole words only, after the label


LINES = [
    "User: which port does the staging database listen on?",
    "Tool call exec_command: grep -rn port deploy/",
    "Tool output exec_command: deploy/staging.env: DB_PORT=5433",
    "Assistant: The staging database listens on 5433.",
    "Tool output exec_command: " + "noise " * 300,
]


@pytest.mark.parametrize("query", [
    "which port does staging use?",
    "database",
    "nothing in common here",
    "Set up the release. Which port does the staging database listen on? Then tag it. "
    + " ".join(f"word{n}" for n in range(40)),
])
@pytest.mark.parametrize("shape", [slice(None), slice(0, 4), slice(2, None)])
def test_best_match_is_the_snippets_match(query: str, shape: slice) -> None:
    text = "\n".join(LINES[shape])
    # Fresh objects, then the same ones again: the last pair asked is remembered.
    assert snippets.best_match(text, query) == snippet(text, query).match
    assert snippet(text, query).match == snippets.best_match(text, query)
    assert snippets.best_match(text + "", query + " ") == snippet(text, query + " ").match


def test_a_pick_makes_snippets_only_of_what_it_may_show(monkeypatch: pytest.MonkeyPatch) -> None:
    # The question's words are in one memory's line; nine others hold one word of it each:
    # the gate passes them over on how well they match, and their snippets are never made.
    long = "\n".join(f"Tool output exec_command: line {n} " + "filler " * 30 for n in range(60))
    memories = [Memory(type="episodic", scope=SCOPE, key=f"k{n}", memory_id=f"mem_{n}",
                       text=f"User: step {n}\n{long}\nTool output exec_command: port",
                       created_at=1.0, updated_at=1.0) for n in range(9)]
    answer = Memory(type="episodic", scope=SCOPE, key="answer", memory_id="mem_answer",
                    text=f"User: deploy\n{long}\nTool output exec_command: staging db port 5433",
                    created_at=1.0, updated_at=1.0)
    made: list[str] = []
    real = snippets.snippet

    def counted(text: str, query: str, *args: Any, **kwargs: Any) -> snippets.Snippet:
        made.append(text)
        return real(text, query, *args, **kwargs)

    monkeypatch.setattr("ctxproxy.memory.recall.snippet", counted)
    recaller = Recaller(None, weights=Weights(), k=5, budget=2000,  # type: ignore[arg-type]
                        cost=lambda m: tokens.count(memory_blocks.item(m)) + 1,
                        overhead=lambda kind: 10)
    query = "which staging db port?"
    candidates = [Candidate(m, 1.0 - n / 100) for n, m in enumerate([*memories, answer])]

    chosen = recaller._pick(candidates, query, session="", exclude=set(), shown={},
                            min_score=0.5, budget=2000, now=2.0)

    assert [m.memory_id for m in chosen] == ["mem_answer"]
    assert "staging db port 5433" in chosen[0].text
    assert made == [answer.text]


def _questions_by_character(query: str) -> list[str]:
    """questions() as it was first written, a step per character: the reference."""
    if len(query.split(None, LONG_QUERY_WORDS)) <= LONG_QUERY_WORDS:
        return []
    text = query[:QUESTION_SCAN_CHARS]
    out: list[str] = []
    before = start = 0
    for at, char in enumerate(text):
        end = at + 1 == len(text) or text[at + 1].isspace()
        if char == "\n":
            before = start = at + 1
        elif char in ".!" and end:
            before, start = start, at + 1
        elif char == "?" and end:
            out.append(text[before : at + 1].strip())
            before = start = at + 1
            if len(out) == MAX_QUESTIONS:
                break
    return out


_PIECES = st.sampled_from(["word", "x.y", "a?b", ".", "!", "?", " ", "\n", "\t", "\u2003",
                           "\x1c", "\u00a0", "é", "v2.1", "...", "?!", "\r\n"])


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES, min_size=0, max_size=400))
def test_questions_are_found_as_by_reading_every_character(pieces: list[str]) -> None:
    query = " ".join(["w"] * LONG_QUERY_WORDS) + " " + "".join(pieces)
    assert questions(query) == _questions_by_character(query)


def test_questions_of_a_prompt_past_the_scan_are_found_as_before() -> None:
    query = ("Why? " * 10 + "word " * 50 + "Is it here? " + "a" * QUESTION_SCAN_CHARS + " Or here?")
    assert questions(query) == _questions_by_character(query) == ["Why?", "Why?", "Why?"]
    query = "word " * 1600 + "Which one?"  # the question past the 8,000 characters scanned
    assert questions(query) == _questions_by_character(query) == []


def test_a_transcripts_repeated_stamp_is_shown_once() -> None:
    text = ("User: [2 May, 2024] Ada: I finished the pottery class.\n"
            "  [2 May, 2024] Ben: Congrats! I went sailing.\n"
            "  [3 May, 2024] Ada: The vase is blue.\n"
            "  [ ] a checkbox\n"
            "  [ ] another\n"
            "Assistant: Noted.")
    assert snippet(text, "what did Ben do?").text == (
        "User: [2 May, 2024] Ada: I finished the pottery class.\n"
        "  Ben: Congrats! I went sailing.\n"
        "  [3 May, 2024] Ada: The vase is blue.\n"
        "  [ ] a checkbox\n"
        "  [ ] another\n"
        "Assistant: Noted.")
