"""Recall's memos (parsed texts, questions, rendered memories, long texts' token counts) give
the bytes a fresh computation gives, whatever was asked before; and each stays bounded."""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from itertools import accumulate
from typing import Any, TypeVar

import hypothesis
import pytest
from cachetools import LRUCache
from hypothesis import strategies as st
from lxml import etree

from ctxproxy.injectors import memory_blocks, tokens
from ctxproxy.memory import snippets
from ctxproxy.memory.model import Memory, MemoryType, Scope
from ctxproxy.memory.snippets import Snippet, line_matches, snippet
from ctxproxy.proxy.memory_wiring import _cost

T = TypeVar("T")
SCOPE = Scope("svc", "team", "agent", "user")
# Words that share letters (port, support, pörtal), change length when lowered (İ), are
# stopwords, digits, or stand next to '_' and '-'.
WORDS = ["port", "support", "pörtal", "PORT", "İstanbul", "5433", "db", "the", "is", "x_port",
         "x-port", "ledger", "retry", "timeout", "user", "tool", "call", "output", "a", "€"]
HEADS = ["User: ", "Assistant: ", "Tool call exec_command: ", "Tool output exec_command: ",
         "Tool output: ", "  ", "", "Tool call "]


@contextmanager
def fresh() -> Iterator[None]:
    """Every memo empty (and the ones in use put back after): what a new process computes."""
    saved = (snippets._texts, snippets._asked_memo, memory_blocks._items, tokens._long,
             snippets._last_asked)
    snippets._last_asked = None
    snippets._texts = LRUCache(snippets.MEMO_BYTES, getsizeof=snippets._text_size)
    snippets._asked_memo = LRUCache(snippets.QUERIES_MEMO)
    memory_blocks._items = LRUCache(memory_blocks.MEMO_BYTES, getsizeof=memory_blocks._item_size)
    tokens._long = LRUCache(tokens.LONG_ENTRIES)
    tokens._memo.cache_clear()
    try:
        yield
    finally:
        (snippets._texts, snippets._asked_memo, memory_blocks._items, tokens._long,
         snippets._last_asked) = saved


def computed_fresh(fn: Callable[[], T]) -> T:
    with fresh():
        return fn()


def line(words: list[str], head: str) -> str:
    return head + " ".join(words)


lines = st.builds(line, st.lists(st.sampled_from(WORDS), max_size=40), st.sampled_from(HEADS))
texts = st.lists(lines, min_size=1, max_size=30).map("\n".join)
# Short questions, and prompts long enough to be read as their questions (over 40 words).
queries = st.one_of(
    st.lists(st.sampled_from(WORDS), max_size=8).map(" ".join),
    st.lists(st.sampled_from([*WORDS, "why?", "ok.", "\n", "where is it?"]), min_size=41,
             max_size=80).map(" ".join),
)


def old_line_words(text: str, wanted: set[str]) -> list[frozenset[str]]:
    """_line_words as it was before the memos (commit 89e323a), the reference."""
    low = text.lower()
    low_lines = low.split("\n")
    out: list[frozenset[str]] = [frozenset()] * len(low_lines)
    starts = list(accumulate((len(line) + 1 for line in low_lines), initial=0))
    found: dict[int, set[str]] = {}
    end = len(low)
    for word in wanted:
        at = low.find(word)
        while at >= 0:
            after = at + len(word)
            alone = at == 0 or not low[at - 1].isalnum()
            if alone and (after == end or not low[after].isalnum()):
                n = bisect_right(starts, at) - 1
                if at - starts[n] >= snippets._label_chars(low_lines[n]):
                    found.setdefault(n, set()).add(word)
                    at = low.find(word, starts[n + 1])
                    continue
            at = low.find(word, at + 1)
    for n, words in found.items():
        out[n] = frozenset(words)
    return out


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(st.lists(st.tuples(texts, queries), min_size=1, max_size=6),
                  st.sampled_from([20, 60, 160]))
def test_snippets_from_the_memos_are_what_a_fresh_process_computes(
    asked: list[tuple[str, str]], max_tokens: int
) -> None:
    # Each text again with each question: the second time every memo is warm.
    for text, query in asked + [(t, q) for t, _ in asked for _, q in asked]:
        got = snippet(text, query, max_tokens)
        assert got == computed_fresh(lambda: snippet(text, query, max_tokens))  # noqa: B023
        assert line_matches(text, query) == computed_fresh(
            lambda: line_matches(text, query))  # noqa: B023
        # A counter of one's own gives the same bytes, memo or not.
        assert snippet(text, query, max_tokens, count=lambda s: tokens.count(s)) == got
        wanted = set(snippets._asked(query).parts[0])
        assert snippets._line_words(text, wanted) == old_line_words(text, wanted)


def test_a_changed_text_is_parsed_anew() -> None:
    text = "User: where is the port?\nTool output: port 5433"
    assert snippet(text, "port", 160).text == text
    changed = text.replace("5433", "6543")
    assert snippet(changed, "port", 160).text == changed
    assert snippet(text + "\n  support", "support port").match == 1.0
    assert snippet(text, "support port").match == 0.5


def mem(kind: MemoryType, text: str, **fields: Any) -> Memory:
    return Memory(type=kind, scope=SCOPE, key=f"k-{kind}", text=text,
                  memory_id="mem_01jd0000000000000000000000", **fields)


def old_render(memories: list[Memory]) -> str:
    """memory_blocks.render as it was before the memos: the whole block built in lxml."""
    blocks = []
    for kind in memory_blocks.BLOCK_ORDER:
        members = [m for m in memories if m.type == kind]
        if not members:
            continue
        block = etree.Element(memory_blocks.TAGS[kind])
        block.set("note", memory_blocks.NOTES[kind])
        block.text = "\n"
        for memory in members:
            el = memory_blocks._element(memory_blocks._attributes(memory), memory.text)
            el.tail = "\n"
            block.append(el)
        blocks.append(str(etree.tostring(block, encoding="unicode")))
    return "\n".join(blocks)


# Text with what XML must escape or cannot carry at all.
block_texts = st.lists(st.sampled_from(["a", "<", ">", "&", '"', "'", "\n", "\x00", "\x1b",
                                        "\ud800", "é", " ", "]]>", "</memory>"]),
                        max_size=30).map("".join)
memories = st.builds(
    mem,
    st.sampled_from(["working", "episodic", "semantic"]),
    block_texts,
    turn_index=st.one_of(st.none(), st.integers(0, 50)),
    created_at=st.floats(0, 2e9),
    attrs=st.fixed_dictionaries({}, optional={"kind": st.one_of(block_texts, st.integers()),
                                              "origin": st.sampled_from(["distilled", "cli",
                                                                         "x"])}),
)


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(st.lists(memories, max_size=8))
def test_rendered_memories_are_what_lxml_writes_whole(shown: list[Memory]) -> None:
    for m in shown:
        got = memory_blocks.item(m)
        assert got == computed_fresh(lambda: memory_blocks.item(m))  # noqa: B023
        assert memory_blocks.item(m) is got  # the second time from the memo
        assert _cost(m) == tokens.count(got) + 1
    assert memory_blocks.render(shown) == old_render(shown)
    assert memory_blocks.render(shown) == computed_fresh(lambda: memory_blocks.render(shown))


@pytest.mark.parametrize("change", [
    {"text": "the port is 6543 now, and the host moved to pg-stg-418"},
    {"created_at": 1_700_000_000.0 + 3 * 86400},  # another day
    {"turn_index": 9},
    {"memory_id": "mem_01jd0000000000000000000001"},
])
def test_a_memory_that_changes_gets_a_fresh_cost(change: dict[str, Any]) -> None:
    before = mem("episodic", "the port is 5433", turn_index=2, created_at=1_700_000_000.0)
    assert _cost(before) == computed_fresh(lambda: _cost(before))
    after = replace(before, **change)
    assert memory_blocks.item(after) != memory_blocks.item(before)
    assert memory_blocks.item(after) == computed_fresh(lambda: memory_blocks.item(after))
    assert _cost(after) == computed_fresh(lambda: _cost(after))
    # The same record changed in place (a store's update), too.
    for name, value in change.items():
        setattr(before, name, value)
    assert memory_blocks.item(before) == memory_blocks.item(after)


def test_what_a_memory_is_shown_as_depends_on_its_kind_and_origin() -> None:
    working = mem("working", "keep the API stable", attrs={"kind": "task"})
    assert 'kind="task"' in memory_blocks.item(working)
    working.attrs["kind"] = "constraint"
    assert 'kind="constraint"' in memory_blocks.item(working)
    fact = mem("semantic", "prefers uv", attrs={"origin": "cli"})
    assert 'source="operator"' in memory_blocks.item(fact)
    fact.attrs["origin"] = "distilled"
    assert 'source="distilled from user statements"' in memory_blocks.item(fact)


def test_long_texts_are_counted_once_and_anew_when_they_change() -> None:
    text = "ledger retry timeout " * 200  # over MEMO_CHARS: the digest memo
    assert len(text) > tokens.MEMO_CHARS
    assert tokens.count(text) == computed_fresh(lambda: tokens.count(text))
    assert tokens.text_key(text) in tokens._long
    changed = text[:-1] + "s"
    assert tokens.count(changed) == computed_fresh(lambda: tokens.count(changed))
    assert tokens.count(text + "\ud800") == computed_fresh(lambda: tokens.count(text + "\ud800"))
    assert tokens.text_key("a\ud800") != tokens.text_key("a\udc00")


def test_the_memos_stay_within_their_bounds() -> None:
    with fresh():
        for n in range(3000):
            snippet(f"User: ticket {n}\n" + "x" * 20_000, f"ticket {n}")
            memory_blocks.item(mem("episodic", f"turn {n} " + "y" * 20_000))
            tokens.count(f"{n} " + "z" * 2000)
        assert snippets._texts.currsize <= snippets.MEMO_BYTES
        assert memory_blocks._items.currsize <= memory_blocks.MEMO_BYTES
        assert len(tokens._long) <= tokens.LONG_ENTRIES
        assert len(snippets._asked_memo) <= snippets.QUERIES_MEMO
        # A parsed text remembers a few words' lines, none of them long.
        text = "User: q\n" + " ".join(f"w{n}" for n in range(300)) + " " + "x" * 100
        short = snippets.FIND_WORDS
        for n in range(0, 300, short):
            asked = " ".join(f"w{m}" for m in range(n, min(n + short, 300)))
            assert snippet(text, asked).match == 1.0
        assert snippet(text, "x" * 100).match == 1.0
        parsed = snippets._parse(text)
        assert len(parsed._words) == snippets.WORDS_PER_TEXT and "x" * 100 not in parsed._words
        # A long question reads every word's lines, worked out once: the memo counts them.
        snippets._texts.clear()
        parsed = snippets._parse(text)
        before = snippets._texts.currsize
        assert parsed.index is None
        assert snippet(text, " ".join(f"w{m}" for m in range(50))).match == 1.0
        assert parsed.index is None  # the first long question finds its words
        assert snippet(text, " ".join(f"w{m}" for m in range(50, 100))).match == 1.0
        assert parsed.index is not None and len(parsed.index) == 302
        assert snippets._texts.currsize == before + snippets.INDEX_WORD_BYTES * 302
        for n in range(3000):
            snippet(f"User: ticket {n}\n" + " ".join(f"x{m}" for m in range(2000)),
                    " ".join(f"ticket {n} x{m}" for m in range(20)))
        assert snippets._texts.currsize <= snippets.MEMO_BYTES
        # A text too big for a sixteenth of the memo is parsed, never kept.
        huge = "User: q\n" + "w " * (snippets.MEMO_BYTES // 32)
        assert snippet(huge, "w").match == 1.0
        assert huge not in snippets._texts


def test_worker_threads_share_the_memos_and_get_what_one_thread_gets() -> None:
    asked = [(f"User: where is {w}?\n" + "\n".join(f"  {w} line {n} port" for n in range(80)),
              f"{w} port {n}") for n, w in enumerate(WORDS)]
    expected = computed_fresh(lambda: [snippet(t, q) for t, q in asked])
    got: list[list[Snippet]] = []

    def work() -> None:
        got.append([snippet(t, q) for t, q in asked])

    with fresh():
        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert got == [expected] * 4
