"""The full-text search's ranking (memory.ranking), with no database: candidates, counts and
weights are built here as a search would hand them in."""

from __future__ import annotations

import itertools
import math
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import hypothesis
import pytest
from hypothesis import strategies as st

import ctxproxy
from ctxproxy.memory.model import Hit, Memory, Scope
from ctxproxy.memory.ranking import (
    BM25_K1,
    MatchCounts,
    bm25,
    fold,
    idf_of,
    rarest,
    rerank,
    words_like,
)
from ctxproxy.memory.search import BUDGET, MAX_WORDS

SCOPE = Scope("svc")


def mem(key: str, text: str, updated: float = 1.0) -> Memory:
    return Memory(type="episodic", scope=SCOPE, key=key, text=text, memory_id=key,
                  created_at=updated, updated_at=updated)


def keys(hits: Sequence[Hit]) -> list[str]:
    return [h.memory.key for h in hits]


# --- rerank --------------------------------------------------------------------------------------


def test_one_word_said_once_in_a_record_of_average_length_scores_its_idf() -> None:
    # tf 1 and length 1 of the average: the BM25 term is the idf itself (1.0), and the
    # relevance is (words matched + s / (1 + s)) / (words asked + 1).
    [hit] = rerank([(mem("a", "deploy now"), {0})], ["deploy"], [1.0])
    assert hit.relevance == pytest.approx((1 + 0.5) / 2)


def test_a_record_that_says_the_word_twice_ranks_above_one_that_says_it_once() -> None:
    once = mem("once", "deploy the api today", updated=2.0)  # newer: a tie would put it first
    twice = mem("twice", "deploy and deploy it", updated=1.0)
    assert len(once.text) == len(twice.text)
    hits = rerank([(once, {0}), (twice, {0})], ["deploy"], [1.0])
    assert keys(hits) == ["twice", "once"]
    assert hits[0].relevance > hits[1].relevance


def test_forms_of_a_word_count_and_a_match_inside_another_word_does_not() -> None:
    # "rates" and "rated" fold as "rate" does; "pirates" holds "rates" but not where a word
    # starts.
    forms = mem("forms", "rates and rated here")
    inside = mem("inside", "pirates rate it here", updated=2.0)
    assert len(forms.text) == len(inside.text)
    assert keys(rerank([(forms, {0}), (inside, {0})], ["rate"], [1.0])) == ["forms", "inside"]


def test_the_shorter_of_two_records_that_say_the_word_alike_ranks_first() -> None:
    short = mem("short", "deploy script")
    long = mem("long", "deploy script " + "and a long tool output " * 20, updated=2.0)
    hits = rerank([(long, {0}), (short, {0})], ["deploy"], [1.0])
    assert keys(hits) == ["short", "long"]
    assert hits[0].relevance > hits[1].relevance


def test_more_of_the_question_s_words_matched_outranks_any_bm25_score() -> None:
    both = mem("both", "deploy the script", updated=1.0)
    one = mem("one", "zebra " * 10, updated=2.0)
    hits = rerank([(one, {1}), (both, {0, 2})], ["deploy", "zebra", "script"], [0.1, 9.0, 0.1])
    assert keys(hits) == ["both", "one"]


def test_a_match_of_a_rarer_word_ranks_above_a_match_of_a_commoner_one() -> None:
    rare = mem("rare", "zebra in the tent")
    common = mem("common", "the tent is here", updated=2.0)
    hits = rerank([(common, {1}), (rare, {0})], ["zebra", "tent"], [4.0, 0.5])
    assert keys(hits) == ["rare", "common"]


def test_alike_records_rank_by_update_time_then_memory_id_newest_first() -> None:
    a, b, c = mem("a", "deploy", 5.0), mem("b", "deploy", 7.0), mem("c", "deploy", 5.0)
    assert keys(rerank([(a, {0}), (b, {0}), (c, {0})], ["deploy"], [1.0])) == ["b", "c", "a"]


def test_a_word_the_index_matched_counts_once_even_when_its_form_is_not_found() -> None:
    # The index stems with porter ("mice" may match "mouse"); folding is rougher. The index's
    # word still counts, as if said once.
    said = mem("said", "mice ate it")
    missed = mem("missed", "mouse ate i")
    hits = rerank([(said, {0}), (missed, {0})], ["mice"], [2.0])
    assert hits[0].relevance == pytest.approx(hits[1].relevance)
    assert hits[0].relevance > rerank([(said, set())], ["mice"], [2.0])[0].relevance


def test_term_frequency_is_read_from_the_head_of_a_long_record_only() -> None:
    filler = "x" * 2000
    tail = mem("tail", "deploy " + filler + " deploy" * 10, updated=2.0)
    head = mem("head", "deploy deploy deploy " + filler + " " + "y" * 55)
    assert len(head.text) == len(tail.text)
    assert keys(rerank([(tail, {0}), (head, {0})], ["deploy"], [1.0])) == ["head", "tail"]


@hypothesis.given(st.lists(
    st.tuples(st.text("ab ", max_size=40), st.sets(st.integers(0, 2)), st.floats(0, 10)),
    min_size=1, max_size=8))
def test_relevance_is_in_0_1_and_never_rises_down_the_ranking(
    drawn: list[tuple[str, set[int], float]],
) -> None:
    candidates = [(mem(f"k{n}", "a " + text, updated), matched)
                  for n, (text, matched, updated) in enumerate(drawn)]
    hits = rerank(candidates, ["a", "b", "ab"], [0.3, 1.5, 4.0])
    assert sorted(keys(hits)) == sorted(m.key for m, _ in candidates)
    assert all(0 < h.relevance < 1 for h in hits)
    assert all(x.relevance >= y.relevance for x, y in itertools.pairwise(hits))


# --- the parts ---------------------------------------------------------------------------------


def test_bm25_rises_with_term_frequency_towards_a_bound_and_falls_with_length() -> None:
    terms = [bm25(2.0, tf, 1.0) for tf in range(1, 50)]
    assert terms == sorted(terms) and len(set(terms)) == len(terms)
    assert terms[-1] < 2.0 * (BM25_K1 + 1.0)
    assert bm25(2.0, 1, 1.0) == pytest.approx(2.0)
    assert bm25(2.0, 3, 0.5) > bm25(2.0, 3, 1.0) > bm25(2.0, 3, 4.0)


def test_idf_weighs_a_rarer_word_more() -> None:
    assert idf_of(1000, 1) > idf_of(1000, 10) > idf_of(1000, 900) > 0
    assert idf_of(10, 1) == pytest.approx(math.log(1 + 9.5 / 1.5))


def test_fold_strips_one_suffix_and_keeps_three_letters() -> None:
    assert {fold(w) for w in ["rate", "rates", "rated", "rating"]} == {"rat"}
    assert fold("bus") == "bus" and fold("uses") == "use" and fold("deploy") == "deploy"


def test_rarest_drops_words_no_memory_holds_and_counts_common_ones_again_higher() -> None:
    low = BUDGET // MAX_WORDS + 1
    held = {"the": 400, "deploy": 4, "typo": 0, "script": 10}
    calls: list[tuple[list[str], int]] = []

    def count(words: Sequence[str], cap: int) -> list[int]:
        calls.append((list(words), cap))
        return [min(held[w], cap) for w in words]

    assert rarest(count, list(held)) == [(4, "deploy"), (10, "script"), (400, "the")]
    assert calls == [(list(held), low), (["the"], BUDGET + 1)]


def test_rarest_keeps_the_max_words_rarest_and_counts_no_more_when_they_are_enough() -> None:
    held = {f"w{n}": n for n in range(MAX_WORDS + 3, 0, -1)} | {"common": 10_000}
    calls: list[int] = []

    def count(words: Sequence[str], cap: int) -> list[int]:
        calls.append(cap)
        return [min(held[w], cap) for w in words]

    assert rarest(count, list(held)) == [(n, f"w{n}") for n in range(1, MAX_WORDS + 1)]
    assert len(calls) == 1


@hypothesis.given(st.lists(st.sampled_from(
    ["rat", "rates", "pirates", "_rates", "rat_e", "é", "rater", " ", "\n", ".", "-", "9", "ß"]),
    max_size=30).map("".join))
def test_reranking_counts_the_words_a_leading_word_boundary_would(text: str) -> None:
    words = ["rat", "rate"]
    alternatives = "(?:" + "|".join(words) + r")[^\W_]*"
    assert words_like(re.compile(alternatives), text) == re.findall(r"\b" + alternatives, text)


def test_the_ranking_needs_no_database() -> None:
    code = ("import sys, ctxproxy.memory.ranking; "
            "print([m for m in ('sqlite3', 'psycopg') if m in sys.modules])")
    root = Path(ctxproxy.__file__).parent.parent  # where this ctxproxy is imported from
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(root)})
    assert out.stdout.strip() == "[]"


# --- match counts kept between searches ---------------------------------------------------


def test_match_counts_are_kept_for_their_ttl_and_only_what_is_missing_is_counted() -> None:
    counted: list[list[str]] = []

    def count(words: Sequence[str]) -> list[int]:
        counted.append(list(words))
        return [{"deploy": 7, "script": 3, "zanzibar": 0}[w] for w in words]

    counts = MatchCounts(ttl_s=30.0)
    assert counts.counts("s", ["deploy", "zanzibar"], 126, count, now=100.0) == [7, 0]
    assert counts.counts("s", ["deploy", "script", "zanzibar"], 126, count, now=129.0) == [
        7, 3, 0]
    # Kept: deploy; counted again: the new word, and the word that matched nothing.
    assert counted == [["deploy", "zanzibar"], ["script", "zanzibar"]]
    # Another scope, another cap: counts of their own.
    counts.counts("t", ["deploy"], 126, count, now=129.0)
    counts.counts("s", ["deploy"], 1001, count, now=129.0)
    assert counted[2:] == [["deploy"], ["deploy"]]
    # deploy's count (taken at 100) is too old at 130.5, script's (at 129) is not; a clock
    # that went back counts afresh.
    counts.counts("s", ["deploy", "script"], 126, count, now=130.5)
    counts.counts("s", ["script"], 126, count, now=50.0)
    assert counted[4:] == [["deploy"], ["script"]]
