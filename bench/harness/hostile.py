"""Hostile inputs for the benches, as the tests make them: whole request bodies
(``tests/test_hostile.py``'s ``CASES``) and texts of the shapes worst for the memory side's
patterns (``tests/memory/test_linear_time.py``'s ``SHAPES``). Copies: bench/ does not import
tests/, and each set must stay the same as the tests' for the figures to mean the same."""

from __future__ import annotations

import base64
import json
import os
import random
from collections.abc import Callable
from typing import Any

from bench.harness import small_codex as codex

Item = dict[str, Any]
MB = 1024 * 1024


def with_output(output: str) -> list[Item]:
    return [*codex.context_items(), *codex.tool_turn("run it", output=output),
            *codex.tool_turn("and again", output=output), codex.text("user", "what now?")]


def long_word() -> bytes:
    return json.dumps(codex.request(
        [*codex.context_items(), codex.text("user", "q" * MB)])).encode()


def base64_output() -> bytes:
    blob = base64.b64encode(os.urandom(3 * MB // 4)).decode()
    return json.dumps(codex.request(with_output(blob))).encode()


def use_x_not_y(turns: int = 2000) -> bytes:
    items = codex.context_items()
    for n in range(turns):
        items += codex.text_turn(f"Use lib{n} not lib{n + 1}. Always run check{n}. "
                                 f"Our db{n} is postgres{n}.")
    return json.dumps(codex.request([*items, codex.text("user", "go")])).encode()


def many_items(count: int = 50_000) -> bytes:
    items = [*codex.context_items(), codex.text("user", "start")]
    items += [{"type": "reasoning", "summary": [], "encrypted_content": f"e{n}"}
              for n in range(count)]
    return json.dumps(codex.request([*items, codex.text("user", "end")])).encode()


def huge_numbers() -> bytes:
    body = json.dumps(codex.request(codex.session(8), max_output_tokens="@@"))
    return body.replace('"@@"', str(2**80)).encode()


def deep_nesting() -> bytes:
    body = json.dumps(codex.request(codex.session(8), metadata="@@"))
    return body.replace('"@@"', "[" * 5000 + "]" * 5000).encode()


def invalid_utf8() -> bytes:
    return json.dumps(codex.request(codex.session(6))).encode().replace(b"step 3", b"step \xff\xfe")


def surrogates() -> bytes:
    lone = "\\ud800 \\udfff"
    items = with_output("@@out")
    items[-1] = codex.text("user", "@@user")
    call = next(i for i in items if i.get("type") == "function_call")
    call["arguments"] = "@@args"
    reasoning = next(i for i in items if i.get("type") == "reasoning")
    reasoning["summary"] = [{"type": "summary_text", "text": "@@summary"}]
    body = json.dumps(codex.request(items))
    for mark in ("@@out", "@@user", "@@args", "@@summary"):
        body = body.replace(mark, f"{mark[2:]} {lone}")
    return body.encode()


CASES: dict[str, Callable[[], bytes]] = {
    "a 1 MB single word": long_word,
    "a 1 MB base64 tool output": base64_output,
    "2,000 turns of 'use X not Y'": use_x_not_y,
    "50k input items": many_items,
    "integers beyond 64 bits": huge_numbers,
    "5,000 levels of nesting": deep_nesting,
    "invalid UTF-8": invalid_utf8,
    "lone surrogates in every text field": surrogates,
}


def repeat(unit: str, size: int) -> str:
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
    "a=a=a=": lambda n: repeat("a=", n),
    "dashes": lambda n: "-" * n,
    "dots": lambda n: "." * n,
    "digits": lambda n: "7" * n,
    "spaces": lambda n: " " * n,
    "a.a.a.": lambda n: repeat("a.", n),
    "name_pass.": lambda n: repeat("a_pass.", n),
    "secret names glued": lambda n: repeat("passwordtoken_", n),
    "unclosed quotes": lambda n: repeat('token="a', n),
    "jwt heads": lambda n: repeat("eyJaaaaaaaa-", n),
    "capability heads": lambda n: repeat("cap1.aaaaaaaa", n),
    "url schemes": lambda n: repeat("a://a:a", n),
    "key headers": lambda n: "-----BEGIN " + repeat("PRIVATE KEY ", n),
    "mysql args": lambda n: repeat("mysql a ", n),
    "user flags": lambda n: repeat(" -u a", n),
    "bearer": lambda n: repeat("Bearer ", n),
    "said": lambda n: repeat("password is ", n),
    "use use use": lambda n: repeat("use a ", n),
    "our our our": lambda n: repeat("our a ", n),
    "fences": lambda n: repeat("```a", n),
}
