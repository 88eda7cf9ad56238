"""Hostile input: every pattern and rule of the memory side stays linear in its input.

Each case runs a pattern (or a function) on 100 KB and on 1 MB of the shape that is worst for
it (or on histories of 5,000 and 50,000 items, on 2,000 and 20,000 memories) and asserts that
ten times the input costs well under a hundred times the work (quadratic growth): the ratio of
the two times, not the time itself, so a slow machine does not fail it, and each the CPU time
of the thread that ran it, so neither do other processes on its cores.
"""

from __future__ import annotations

import gc
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from bench.harness.hostile import SHAPES, repeat
from ctxproxy.injectors import memory_blocks, secret_rules
from ctxproxy.injectors import redact as redact_module
from ctxproxy.injectors.bounds import RECORD_CHARS, clip
from ctxproxy.injectors.redact import MARK, redact, redact_all
from ctxproxy.memory import snippets, working
from ctxproxy.memory.ingest import episodes
from ctxproxy.memory.model import Memory, MemoryType, Scope
from ctxproxy.memory.statements import _CONSTRAINT, _FACT, _RULE, claims, constraints, sentences
from ctxproxy.memory.turns import Turn, answered, last, split
from ctxproxy.memory.words import terms
from ctxproxy.memory.working import derive
from ctxproxy.plumbing.lru import SizedLRU
from ctxproxy.request import History
from tests.fakes import codex

T = TypeVar("T")

SMALL, BIG = 100_000, 1_000_000
GROWTH = 30  # for 10x the input; linear is ~10, quadratic ~100


def _seconds(run: Callable[[T], object], shape: Callable[[int], T], size: int,
             repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        given = shape(size)
        # The cycle collector runs as allocations pile up, now and then a pass over every
        # live object: a big run's many objects (a tuple per line, a dict per item) set off
        # passes the small run does not, in steps rather than in proportion (line_matches
        # spent 25 times as long in it on a million empty lines as on 100,000). Timed without
        # it, the ratio is the function's own work; reference counting frees what it drops.
        gc.disable()
        try:
            start = time.thread_time()
            run(given)
            best = min(best, time.thread_time() - start)
        finally:
            gc.enable()
    return best


def assert_linear(run: Callable[[T], object], shape: Callable[[int], T],
                  sizes: tuple[int, int] = (SMALL, BIG)) -> None:
    # Best of three: a run's caches can be cold. Measured once more when over the bound, both
    # sizes again: a machine that slowed during one run (another tenant, a frequency step)
    # fails neither twice, a quadratic function both (its ratio is ~100 against 30).
    for _ in range(2):
        small_s = _seconds(run, shape, sizes[0], 3)
        big_s = _seconds(run, shape, sizes[1], 3)
        # A few ms of slack for timer noise on the small run of a fast pattern.
        if big_s < GROWTH * small_s + 0.01:
            return
    raise AssertionError(f"10x the input took {big_s / small_s:.0f}x: {small_s=}, {big_s=}")


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_redaction_patterns_are_linear(shape: Callable[[int], str]) -> None:
    def run(text: str) -> None:
        for pattern, replacement in redact_module._RULES:
            pattern.sub(replacement, text)

    assert_linear(run, shape)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_the_maintained_rules_are_linear(shape: Callable[[int], str]) -> None:
    assert_linear(secret_rules.spans, shape)


@pytest.mark.parametrize("pattern", [_CONSTRAINT, _FACT, _RULE],
                         ids=["constraint", "fact", "rule"])
@pytest.mark.parametrize("shape", ["use use use", "our our our", "one long word", "spaces"])
def test_statement_patterns_are_linear(pattern: re.Pattern[str], shape: str) -> None:
    assert_linear(lambda text: list(pattern.finditer(text)), SHAPES[shape])


@pytest.mark.parametrize("shape", ["one long word", "fences", "dots", "spaces", "use use use"])
@pytest.mark.parametrize("function", [sentences, constraints, claims], ids=lambda f: f.__name__)
def test_statement_functions_are_bounded(function: Callable[[str], object], shape: str) -> None:
    assert_linear(function, SHAPES[shape])


@pytest.mark.parametrize("shape", ["one long word", "a.a.a.", "spaces", "digits"])
def test_terms_are_linear(shape: str) -> None:
    assert_linear(lambda text: terms(text, limit=10**9), SHAPES[shape])


@pytest.mark.parametrize("shape", ["base64", "a=a=a=", "unclosed quotes"])
def test_redact_is_bounded(shape: str) -> None:
    assert_linear(redact, SHAPES[shape])
    assert len(redact(SHAPES[shape](BIG))) <= RECORD_CHARS + 2 * len(MARK)


@pytest.mark.parametrize(("shape", "secret"), [
    ("base64", True), ("a=a=a=", False), ("a=a=a=", True), ("said", False),
    ("mysql args", False), ("mysql args", True),
])
def test_redacting_many_texts_together_is_linear(shape: str, secret: bool) -> None:
    # The text in pieces each under the per-record cap, after a secret or not. Whether the
    # sets find something in them decides the way (asked together, or each piece on its own):
    # both sizes must go the same way for their times to compare. Random base64 goes one way
    # at 100 KB and the other at 1 MB, so it comes after a secret, which sends both sizes the
    # longer way.
    first = ["OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwxyz0123456789ABCD"] if secret else []

    def pieces(text: str) -> list[str]:
        return [*first, *(text[at : at + RECORD_CHARS] for at in range(0, len(text), RECORD_CHARS))]

    def finds(text: str) -> bool:
        return redact_module._found_together(pieces(text))

    assert finds(SHAPES[shape](SMALL)) == finds(SHAPES[shape](BIG))
    assert_linear(lambda text: redact_all(pieces(text)), SHAPES[shape])


@pytest.mark.parametrize("shape", ["dots", "spaces", "a.a.a."])
def test_sentence_ends_are_found_in_linear_time(shape: str) -> None:
    assert_linear(lambda text: list(snippets._SENTENCE_END.finditer(text)), SHAPES[shape])


# Recall's snippets. Each run is of a text and a question recall has not seen: its memos
# would keep a 100 KB text's lines between runs (and a question's words), not a 1 MB one's.
def _forget() -> None:
    snippets._texts.clear()
    snippets._asked_memo.clear()
    snippets._last_asked = snippets._last_best = None
    memory_blocks._items.clear()


def _unseen(shape: Callable[[int], str]) -> Callable[[int], str]:
    def build(size: int) -> str:
        _forget()
        return shape(size)

    return build


# Memories of the shapes that make snippets work per line, per occurrence or per character.
MEMORIES: dict[str, Callable[[int], str]] = {
    "short lines": lambda n: repeat("  error 42\n", n),  # every line answers
    "tool calls": lambda n: repeat(
        "Tool call exec_command: grep error\nTool output exec_command: build log\n"
        "  error 42 in step\n", n),
    "one huge line": lambda n: repeat("error 42 ", n),
    "one long word": SHAPES["one long word"],  # 'aaa' found at every place, never a word
    "long lines of long words": lambda n: repeat(("error" * 20 + " ") * 100 + "42\n", n),
    "distinct words": lambda n: "".join(f"  w{k} error\n" for k in range(n // 8))[:n],
    "empty lines": lambda n: "\n" * n,
}
QUESTION = "Where does the build print error 42 aaa?"
# A task's prompt: read as its questions (over forty words), and with more words than are
# looked for one at a time (snippets.FIND_WORDS).
PROMPT = (
    "The nightly build of the ledger service fails on the runner since the upgrade of its"
    " database driver, the retry queue, the config loader and the metrics exporter; the logs"
    " mention timeouts, sockets, certificates, workers, caches, ports and a w7 flag. Where"
    " does the build print error 42 aaa? Which step prints it? What fixed it last time?"
)


# What each function does per line, per occurrence of a word and per character: the
# question's words found on every line of many short ones (and with their calls), in one
# huge line, at every character of one long word (never as a whole word), in long lines.
# A long prompt is matched by its questions, each a pass of its own.
SNIPPET_CASES = [
    ("short lines", QUESTION), ("tool calls", QUESTION), ("tool calls", PROMPT),
    ("one huge line", QUESTION), ("one huge line", PROMPT), ("long lines of long words", QUESTION),
    ("long lines of long words", PROMPT),
]


def _query_id(value: str) -> str:
    return {QUESTION: "question", PROMPT: "prompt"}.get(value, value)


# ``snippet`` runs what ``best_match`` does (``_best``), then picks and cuts the lines.
@pytest.mark.parametrize(("memory", "query"), SNIPPET_CASES, ids=_query_id)
@pytest.mark.parametrize("function", [snippets.snippet, snippets.line_matches],
                         ids=lambda f: f.__name__)
def test_snippets_are_linear(function: Callable[[str, str], object], memory: str,
                             query: str) -> None:
    assert_linear(lambda text: function(text, query), _unseen(MEMORIES[memory]))


def test_a_word_found_at_every_character_is_linear() -> None:
    assert_linear(lambda text: snippets.snippet(text, QUESTION), _unseen(MEMORIES["one long word"]))


@pytest.mark.parametrize("memory", ["distinct words", "short lines", "one long word",
                                    "long lines of long words"])
def test_a_text_is_indexed_in_linear_time(memory: str) -> None:
    wanted = frozenset(terms(PROMPT))
    assert len(wanted) > snippets.FIND_WORDS

    def run(text: str) -> None:
        parsed = snippets._Text(text)
        parsed.asked_long = True  # asked a long question before: this one builds the index
        snippets._words_by_line(parsed, wanted)
        assert parsed.index is not None

    assert_linear(run, MEMORIES[memory])


# Prompts: their words (``terms``), their questions, and the digest their memo is keyed by.
PROMPTS: dict[str, Callable[[int], str]] = {
    "one long word": SHAPES["one long word"],
    "spaces": SHAPES["spaces"],
    "dots": SHAPES["dots"],
    "stopwords": lambda n: repeat("the ", n),  # terms reads them all
    "questions": lambda n: repeat("why? ", n),
    "lines": lambda n: repeat("ok\n", n),
}


@pytest.mark.parametrize("shape", PROMPTS.values(), ids=PROMPTS.keys())
def test_a_prompt_is_read_in_linear_time(shape: Callable[[int], str]) -> None:
    assert_linear(snippets._asked, _unseen(shape))


@pytest.mark.parametrize("memory", ["empty lines", "short lines", "one huge line"])
def test_the_lines_of_a_snippet_are_linear(memory: str) -> None:
    assert_linear(snippets.lines_of, MEMORIES[memory])


# The memory blocks: one memory's text (escaped, stripped of what XML cannot carry), and
# blocks of many memories.
SCOPE = Scope("svc")
MEMORY_TEXTS: dict[str, Callable[[int], str]] = {
    "markup": lambda n: repeat("</memory><a href='x'>&amp;</a>\n", n),
    "not XML": lambda n: repeat("\x00\x1b\ufffe a", n),
    "short lines": MEMORIES["short lines"],
}


def _memory(text: str, type_: MemoryType = "episodic") -> Memory:
    return Memory(type=type_, scope=SCOPE, key=text[:40], text=text, turn_index=2,
                  created_at=1_800_000_000.0)


@pytest.mark.parametrize("shape", MEMORY_TEXTS.values(), ids=MEMORY_TEXTS.keys())
def test_a_memory_is_rendered_in_linear_time(shape: Callable[[int], str]) -> None:
    def unseen(size: int) -> Memory:
        _forget()  # the memo of rendered memories would keep a 100 KB one, not a 1 MB one
        return _memory(shape(size))

    assert_linear(memory_blocks.item, unseen)


ITEMS = (5_000, 50_000)  # the items of a history
MANY_MEMORIES = (2_000, 20_000)  # recall shows tens; a pick may price hundreds


def _once(shape: Callable[[int], T]) -> Callable[[int], T]:
    """``shape``, built once for each size: a run changes nothing of what it is given, and
    building fifty thousand items three times would cost more than the runs."""
    built: dict[int, T] = {}

    def build(size: int) -> T:
        if size not in built:
            built[size] = shape(size)
        return built[size]

    return build


def _memories(count: int) -> list[Memory]:
    types: tuple[MemoryType, ...] = ("working", "episodic", "semantic")
    return [_memory(f"User: step {k} of the build", types[k % 3]) for k in range(count)]


def test_many_memories_are_rendered_in_linear_time() -> None:
    memories = _once(_memories)

    def unseen(size: int) -> list[Memory]:
        _forget()
        return memories(size)

    assert_linear(memory_blocks.render, unseen, MANY_MEMORIES)


# Turn splitting: histories of the shapes Codex sends, at their extremes.
Item = dict[str, Any]


def _reasoning(n: int) -> Item:
    return {"type": "reasoning", "id": f"rs_{n}", "summary": [],
            "encrypted_content": "gAAAA_test"}


def _call(n: int) -> Item:
    return {"type": "function_call", "name": "exec_command", "call_id": f"call_{n}",
            "arguments": '{"cmd": "ls"}', "status": "completed"}


def _output(n: int) -> Item:
    return {"type": "function_call_output", "call_id": f"call_{n}", "output": "ok\n"}


def _one_turn(count: int) -> list[Item]:
    """A prompt, one tool loop (reasoning, a call, its output, again), the next prompt."""
    loop = [item for k in range(count // 3) for item in (_reasoning(k), _call(k), _output(k))]
    return [codex.text("user", "fix the build"), *loop[: count - 2], codex.text("user", "ok")]


def _parallel_calls(count: int) -> list[Item]:
    """A prompt, every call, every output (Codex's parallel calls), the next prompt."""
    calls = range((count - 2) // 2)
    return [codex.text("user", "fix the build"), *map(_call, calls), *map(_output, calls),
            codex.text("user", "ok")]


def _prompts(count: int) -> list[Item]:
    """Every item a turn of its own, each prompt stating a constraint of its own."""
    return [codex.text("user", f"Step {k}: never push to branch b{k}.") for k in range(count)]


def _tool_turns(count: int) -> list[Item]:
    """Turns of five items: a prompt, reasoning, a call, its output, the answer."""
    return [item for k in range(count // 5) for item in (
        codex.text("user", f"step {k}: run ls"), _reasoning(k), _call(k), _output(k),
        codex.text("assistant", f"done {k}"))]


HISTORIES: dict[str, Callable[[int], list[Item]]] = {
    "one turn": _one_turn,
    "parallel calls": _parallel_calls,
    "every item a turn": _prompts,
    "tool turns": _tool_turns,
}


@pytest.mark.parametrize("shape", HISTORIES.values(), ids=HISTORIES.keys())
def test_a_history_is_parsed_and_cut_in_linear_time(shape: Callable[[int], list[Item]]) -> None:
    def run(items: list[Item]) -> None:
        history = History(items)
        history.keep_from(history.turns // 2)

    assert_linear(run, _once(shape), ITEMS)


@pytest.mark.parametrize("shape", HISTORIES.values(), ids=HISTORIES.keys())
def test_a_history_is_split_into_turns_in_linear_time(
    shape: Callable[[int], list[Item]],
) -> None:
    assert_linear(lambda items: split("s", History(items)), _once(shape), ITEMS)


def _split(shape: str) -> Callable[[int], list[Turn]]:
    return _once(lambda n: split("s", History(HISTORIES[shape](n))))


# Episodes render each complete turn (the long ones whole, then cut).
@pytest.mark.parametrize("shape", ["one turn", "parallel calls", "tool turns"])
def test_episodes_are_made_of_turns_in_linear_time(shape: str) -> None:
    assert_linear(lambda turns: episodes(SCOPE, "s", turns, now=0.0), _split(shape), ITEMS)


# Working memory reads what each prompt said from its memo, as every turn after a session's
# first does (only the newest prompt is new; test_statement_functions_are_bounded times
# reading one): what grows with the turns is the records, one per constraint stated.
@pytest.mark.parametrize("shape", ["every item a turn", "tool turns"])
def test_working_memory_is_made_of_turns_in_linear_time(
    shape: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A memo of its own that holds every prompt: one that dropped some would read those
    # anew on each run of the big history only.
    monkeypatch.setattr(working, "_said", SizedLRU(None, 4 * working.SAID_BYTES,
                                                   size_of=lambda s: s.size))

    def derived(turns: list[Turn]) -> list[Memory]:
        return derive(SCOPE, "s", turns, now=0.0, ttl_s=60.0)

    def said(size: int) -> list[Turn]:
        turns = split("s", History(HISTORIES[shape](size)))
        derived(turns)
        return turns

    assert_linear(derived, _once(said), ITEMS)


@pytest.mark.parametrize("shape", ["one turn", "parallel calls", "every item a turn"])
def test_the_last_turn_is_answered_in_linear_time(shape: str) -> None:
    answer = [codex.text("assistant", "Done.")]

    def run(items: list[Item]) -> None:
        turn = last("s", History(items))
        assert turn is not None
        assert answered("s", turn, answer) is not None

    # Without the next prompt: the one long turn is the last, before its answer.
    assert_linear(run, _once(lambda n: HISTORIES[shape](n)[:-1]), ITEMS)


def test_clip_keeps_head_and_tail() -> None:
    text = "head " + "x" * 200_000 + " tail"
    out = clip(text)
    assert len(out) == RECORD_CHARS
    assert out.startswith("head ") and out.endswith(" tail")
    assert "200010 characters" in out
    assert clip("short") == "short"


def test_redact_drops_a_secret_the_cut_splits() -> None:
    key = "sk-proj-" + "A1b2C3d4" * 4
    text = "x " * (RECORD_CHARS // 2 * 3 // 4 - 12) + key + " y" * RECORD_CHARS
    out = redact(text)
    assert not any(key[i : i + 8] in out for i in range(len(key) - 8))


def test_redact_drops_a_private_key_whose_begin_line_was_cut() -> None:
    body = "\n".join(["MIIEowIBAAKCAQEA" * 4] * 3000)
    text = f"-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----\nthanks"
    out = redact(text)
    assert "MIIEowIBAAKCAQEA" not in out
    assert out.endswith("thanks")
