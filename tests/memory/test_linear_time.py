"""Hostile text: every pattern and rule of the memory side stays linear in its input.

Each case runs a pattern (or a function) on 100 KB and on 1 MB of the shape that is worst for
it and asserts that ten times the input costs well under a hundred times the work (quadratic
growth): the ratio of the two times, not the time itself, so a slow machine does not fail it,
and each the CPU time of the thread that ran it, so neither do other processes on its cores.
"""

from __future__ import annotations

import base64
import random
import re
import time
from collections.abc import Callable

import pytest

from injectors import redact as redact_module
from injectors import secret_rules
from injectors.bounds import RECORD_CHARS, clip
from injectors.redact import MARK, redact, redact_all
from memory import snippets
from memory.statements import _CONSTRAINT, _FACT, _RULE, _UNSAFE, claims, constraints, sentences
from memory.words import terms

SMALL, BIG = 100_000, 1_000_000
GROWTH = 30  # for 10x the input; linear is ~10, quadratic ~100


def _repeat(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


# Random text is new at each call: RE2 builds its automaton's states as a text needs them
# and keeps them, so a second run over the same random 100 KB finds them built (about five
# times quicker) while a 1 MB run outgrows what it keeps. Timing each run on new text
# compares like with like.
_RANDOM = random.Random(1)


# The shapes that made the old patterns quadratic, and the ones that would make each rule
# here scan a long run from every position of it.
SHAPES: dict[str, Callable[[int], str]] = {
    "one long word": lambda n: "a" * n,
    "base64": lambda n: base64.b64encode(_RANDOM.randbytes(n)).decode()[:n],
    "a=a=a=": lambda n: _repeat("a=", n),
    "dashes": lambda n: "-" * n,
    "dots": lambda n: "." * n,
    "digits": lambda n: "7" * n,
    "spaces": lambda n: " " * n,
    "a.a.a.": lambda n: _repeat("a.", n),
    "name_pass.": lambda n: _repeat("a_pass.", n),
    "secret names glued": lambda n: _repeat("passwordtoken_", n),
    "unclosed quotes": lambda n: _repeat('token="a', n),
    "jwt heads": lambda n: _repeat("eyJaaaaaaaa-", n),
    "url schemes": lambda n: _repeat("a://a:a", n),
    "key headers": lambda n: "-----BEGIN " + _repeat("PRIVATE KEY ", n),
    "mysql args": lambda n: _repeat("mysql a ", n),
    "user flags": lambda n: _repeat(" -u a", n),
    "bearer": lambda n: _repeat("Bearer ", n),
    "said": lambda n: _repeat("password is ", n),
    "use use use": lambda n: _repeat("use a ", n),
    "our our our": lambda n: _repeat("our a ", n),
    "fences": lambda n: _repeat("```a", n),
}


def _seconds(run: Callable[[str], object], shape: Callable[[int], str], size: int,
             repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        text = shape(size)
        start = time.thread_time()
        run(text)
        best = min(best, time.thread_time() - start)
    return best


def assert_linear(run: Callable[[str], object], shape: Callable[[int], str]) -> None:
    # Best of three: a run's caches can be cold.
    small_s = _seconds(run, shape, SMALL, 3)
    big_s = _seconds(run, shape, BIG, 3)
    # A few ms of slack for timer noise on the small run of a fast pattern.
    assert big_s < GROWTH * small_s + 0.01, (small_s, big_s)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_redaction_patterns_are_linear(shape: Callable[[int], str]) -> None:
    def run(text: str) -> None:
        for pattern, replacement in redact_module._RULES:
            pattern.sub(replacement, text)

    assert_linear(run, shape)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_the_maintained_rules_are_linear(shape: Callable[[int], str]) -> None:
    assert_linear(secret_rules.spans, shape)


@pytest.mark.parametrize("pattern", [_CONSTRAINT, _FACT, _RULE, _UNSAFE],
                         ids=["constraint", "fact", "rule", "unsafe"])
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
