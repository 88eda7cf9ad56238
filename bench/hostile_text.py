"""Hostile text: the memory side's text processing on 1 MB inputs of their worst shapes.

    python -m bench.hostile_text                    # into RESULTS.md
    python -m bench.hostile_text --no-write         # print only
    python -m bench.hostile_text --before df5f1f0   # also the code of that commit

For each shape of ``tests/memory/test_linear_time.py``: the time of every redaction pattern on
1 MB (``redact`` itself cuts its input to ``RECORD_CHARS`` first, so the patterns are timed
uncut), of ``redact``, and of ``claims`` and ``constraints``; then distillation's ``resolve``
on 2,000 and 4,000 claim groups. With ``--before REV`` the same inputs go through that
commit's ``memory/redact.py`` and ``memory/distill.py`` (loaded from git): where the old code
is quadratic it is timed on smaller inputs, doubling until one run takes over a second, and
the 1 MB figure is extrapolated from the growth it showed.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import subprocess
import sys
import time
import types
from collections.abc import Callable, Sequence

from bench.harness.hostile import SHAPES
from bench.harness.machine import load_average
from bench.harness.results import write_block
from ctxproxy.injectors import redact as redact_module
from ctxproxy.injectors.redact import redact
from ctxproxy.memory.distill import Group, Mention, gather, resolve
from ctxproxy.memory.statements import claims, constraints

SECTION = "## Hostile text"
BEGIN = "<!-- hostile-text:begin (written by bench/hostile_text.py) -->"
END = "<!-- hostile-text:end -->"
MB = 1_000_000
SHOWN = ["one long word", "base64", "a=a=a=", "dashes", "dots", "digits", "spaces",
         "unclosed quotes", "jwt heads", "url schemes", "mysql args", "use use use"]


def seconds(run: Callable[[str], object], text: str) -> float:
    start = time.perf_counter()
    run(text)
    return time.perf_counter() - start


def at_1mb(run: Callable[[str], object], shape: Callable[[int], str], budget: float) -> str:
    """The time on 1 MB, or when a smaller input already takes ``budget`` seconds, an
    extrapolation from doubling sizes (marked ~)."""
    size, last = 1_000, None
    while size < MB:
        took = seconds(run, shape(size))
        if took > budget:
            if last is None:
                return f">{took:.1f} s at {size // 1000} KB"
            growth = math.log2(took / max(last[1], 1e-6))  # exponent per doubling
            estimate = took * (MB / size) ** max(growth, 1.0)
            return f"~{estimate:,.0f} s ({took:.1f} s at {size // 1000} KB)"

        last = (size, took)
        size *= 2
    return f"{seconds(run, shape(MB)) * 1000:,.0f} ms"


def load(rev: str, path: str, name: str) -> types.ModuleType:
    source = subprocess.run(["git", "show", f"{rev}:{path}"], check=True, capture_output=True,
                            text=True).stdout
    module = types.ModuleType(name)
    sys.modules[name] = module  # dataclasses look their module up
    exec(compile(source, f"{rev}:{path}", "exec"), module.__dict__)
    return module


def patterns_run(module: types.ModuleType) -> Callable[[str], object]:
    rules = getattr(module, "_RULES", None)
    if rules is None:  # before the rules were one list: redact() did not cut its input
        return module.redact  # type: ignore[no-any-return]

    def run(text: str) -> None:
        for pattern, replacement in rules:
            pattern.sub(replacement, text)

    return run


def claim_groups(count: int) -> list[Group]:
    mentions = []
    for n in range(count // 4):
        for text in (f"use tool{n}, not node", f"our service{n % 50} is host{n}",
                     f"always run check{n} first", f"never run check{n} first"):
            mentions.append(Mention(claims(text)[0], f"e{n}", "s", 1e9 + n))
    return gather(mentions)


def report(rows: Sequence[tuple[str, ...]], before: str | None, command: str) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_avg = load_average()
    head = ["input", "now"] + ([f"before ({before})"] if before else [])
    lines = [
        f"### Run of {now}", "", f"`{command}`",
        f"on CPython {platform.python_version()}, {os.cpu_count()} CPUs (shared, load "
        f"{load_avg}). One run each.", "",
        "| " + " | ".join(head) + " |", "|" + "---|" * len(head),
        *("| " + " | ".join(row) + " |" for row in rows), "",
        "Redaction patterns: every pattern of `injectors/redact.py` over the whole input (uncut; "
        "before, `redact()` as it was, which did not cut). `redact()` now cuts to "
        "`RECORD_CHARS` (64,000) first, head and tail kept. `~`: extrapolated from doubling "
        "sizes up to the first run over a second, at the growth it showed.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile_text", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="also time this git revision's code")
    parser.add_argument("--budget", type=float, default=1.0,
                        help="seconds after which the old code is extrapolated")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    old_redact = old_distill = None
    if args.before:
        old_redact = load(args.before, "memory/redact.py", "_old_redact")
        old_distill = load(args.before, "memory/distill.py", "_old_distill")

    rows: list[tuple[str, ...]] = []
    new_patterns = patterns_run(redact_module)
    for name in SHOWN:
        shape = SHAPES[name]
        row = [f"redaction patterns, 1 MB {name}", at_1mb(new_patterns, shape, args.budget)]
        if old_redact is not None:
            row.append(at_1mb(patterns_run(old_redact), shape, args.budget))
        rows.append(tuple(row))
        print(*row, sep="  |  ", flush=True)
    for label, run in (("redact()", redact), ("claims()", claims),
                       ("constraints()", constraints)):
        run("warm up")  # compiles its rule sets once per process: not a cost of the input
        for name in ("base64", "use use use"):
            row = [f"{label}, 1 MB {name}", f"{seconds(run, SHAPES[name](MB)) * 1000:,.1f} ms"]
            if old_redact is not None:
                row.append("(as above)" if label == "redact()" else "-")
            rows.append(tuple(row))
            print(*row, sep="  |  ", flush=True)
    for count in (2000, 4000):
        groups = claim_groups(count)
        start = time.perf_counter()
        resolve(groups)
        took = time.perf_counter() - start
        row = [f"resolve(), {len(groups):,} claim groups", f"{took * 1000:,.0f} ms"]
        if old_distill is not None:
            start = time.perf_counter()
            old_distill.resolve(groups)
            row.append(f"{(time.perf_counter() - start) * 1000:,.0f} ms")
        rows.append(tuple(row))
        print(*row, sep="  |  ", flush=True)

    command = "python -m bench.hostile_text" + " ".join(["", *(argv or sys.argv[1:])])
    text = report(rows, args.before, command.strip())
    print(text)
    if not args.no_write:
        write_block(SECTION, BEGIN, END, text)


if __name__ == "__main__":
    main()
