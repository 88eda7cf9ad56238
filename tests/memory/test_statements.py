"""The deterministic rules that read constraints and claims out of user statements."""

from __future__ import annotations

import pytest

from ctxproxy.memory.statements import Claim, claims, constraints, sentences


def identities(text: str) -> list[str]:
    return [c.identity for c in claims(text)]


@pytest.mark.parametrize(
    ("text", "prefer", "avoid"),
    [
        ("Use Python, not Node, for the scripts.", {"python"}, {"node"}),
        ("Please use pnpm instead of npm.", {"pnpm"}, {"npm"}),
        ("We prefer tabs over spaces", {"tabs"}, {"spaces"}),
        ("use ruff rather than flake8", {"ruff"}, {"flake8"}),
        ("Let's use Node for this one.", {"node"}, set()),
        ("Stick with the postgres driver.", {"postgres driver"}, set()),
    ],
)
def test_preferences_name_what_to_use_and_what_not(
    text: str, prefer: set[str], avoid: set[str]
) -> None:
    found = claims(text)
    assert len(found) == 1
    assert found[0].kind == "prefer"
    assert (set(found[0].prefer), set(found[0].avoid)) == (prefer, avoid)
    assert found[0].text == text


@pytest.mark.parametrize("text", ["Don't use jQuery.", "never use jquery", "Avoid jQuery."])
def test_negated_use_is_an_avoidance(text: str) -> None:
    assert identities(text) == ["avoid:jquery"]


def test_project_fact_has_a_subject_and_a_value() -> None:
    (fact,) = claims("Our database is PostgreSQL 15 on port 5433.")
    assert (fact.kind, fact.subject) == ("fact", "database")
    assert fact.value == "postgresql 15 on port 5433"


def test_rules_carry_their_polarity() -> None:
    assert identities("Always run the tests before committing.") == ["rule:+run tests committing"]
    assert identities("Never push to main!") == ["rule:-push main"]


@pytest.mark.parametrize(
    "text",
    ["What database do we use?", "should we use Node here", "Is our database PostgreSQL?"],
)
def test_questions_state_nothing(text: str) -> None:
    assert claims(text) == []
    assert constraints(text) == []


def test_code_blocks_are_not_statements() -> None:
    text = "Fix this:\n```\n# always use node\nuse Node, not Python\n```\nThanks."
    assert claims(text) == []


def test_constraints_are_the_sentences_that_say_how_to_work() -> None:
    text = (
        "Refactor the parser. Always keep the public API stable. Use Python, not Node. "
        "Don't touch the migrations. The tests are in tests/."
    )
    assert constraints(text) == [
        "Always keep the public API stable.",
        "Use Python, not Node.",
        "Don't touch the migrations.",
    ]


def test_sentences_split_on_punctuation_and_lines_and_drop_bullets() -> None:
    assert sentences("One. Two!\n- three\n4) four; five") == [
        "One.", "Two!", "three", "four;", "five",
    ]


def test_near_duplicates_are_the_same_claim() -> None:
    a = claims("Use Python, not Node.")[0]
    b = claims("please use python instead of node for scripts")[0]
    c = claims("use python")[0]
    assert a.same(b) and a.same(c)
    assert a.identity == b.identity == c.identity


def test_preference_for_what_an_older_one_avoided_conflicts_with_it() -> None:
    old = claims("Use Python, not Node.")[0]
    new = claims("Use Node.")[0]
    assert new.conflicts(old) and old.conflicts(new)
    assert not new.conflicts(claims("Use tabs.")[0])


def test_facts_about_one_subject_with_other_values_conflict() -> None:
    pg = Claim("fact", "database", "postgresql 15 on port 5433")
    mysql = Claim("fact", "database", "mysql 8")
    cache = Claim("fact", "cache", "redis")
    assert pg.conflicts(mysql)
    assert not pg.conflicts(cache)
    assert pg.same(Claim("fact", "database", "postgresql 15 on port 5433"))


def test_opposite_rules_conflict() -> None:
    always, never = claims("Always push to main.")[0], claims("Never push to main.")[0]
    assert always.conflicts(never)
    assert not always.same(never)
