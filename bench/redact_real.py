"""Redaction of the real agent runs' texts: with the RE2 prefilter, and with every rule.

    .venv/bin/python -m bench.redact_real             # into RESULTS.md
    .venv/bin/python -m bench.redact_real --no-write  # print only

Every text a memory record is made of is redacted (injectors/redact.py). One pass of an RE2
set over the text says which rules may match it, and the rest are skipped. The texts are the
task prompts and command outputs of ../shared/trajectories, apart by whether they hold a
non-ASCII character (a zero-width space, a typographic quote: about half of the prompts). Each
is redacted both ways in the same run, alternating for ``--rounds`` rounds, and each way's
best round is reported. The two ways must give the same text; the bench fails if they do not.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import sys
import time
from collections.abc import Sequence
from unittest import mock

from bench.harness.agent_runs import load_tasks
from bench.harness.results import write_block
from ctxproxy.injectors import redact as redact_module

SECTION = "## Redaction of real text"
BEGIN = "<!-- redact-real:begin (written by bench/redact_real.py) -->"
END = "<!-- redact-real:end -->"


def groups() -> dict[str, list[str]]:
    tasks = load_tasks()
    prompts = [t.prompt for t in tasks]
    outputs = [s.output for t in tasks for s in t.steps]
    return {
        "task prompts, non-ASCII": [p for p in prompts if not p.isascii()],
        "task prompts, ASCII": [p for p in prompts if p.isascii()],
        "command outputs, non-ASCII": [o for o in outputs if not o.isascii()],
        "command outputs, ASCII": [o for o in outputs if o.isascii()],
    }


def timed(texts: Sequence[str], every: bool) -> tuple[float, list[str]]:
    """Seconds to redact ``texts`` with the prefilter, or (``every``) with every rule."""
    skip = (mock.patch.object(redact_module, "_may_match", lambda _: redact_module._EVERY)
            if every else contextlib.nullcontext())
    with skip:  # entered once, outside the timing
        began = time.perf_counter()
        out = [redact_module.redact(text) for text in texts]
        return time.perf_counter() - began, out


def measure(rounds: int) -> list[tuple[str, int, int, float, float]]:
    redact_module.redact("warm up: password=x")  # the rule sets compile on first use
    rows = []
    for name, texts in groups().items():
        best = {False: float("inf"), True: float("inf")}
        for _ in range(rounds):
            outputs = []
            for every in (False, True):
                seconds, out = timed(texts, every)
                best[every] = min(best[every], seconds)
                outputs.append(out)
            if outputs[0] != outputs[1]:
                sys.exit(f"{name}: skipping rules changed what redaction gives")
        rows.append((name, len(texts), sum(map(len, texts)) // max(len(texts), 1),
                     1000 * best[False] / len(texts), 1000 * best[True] / len(texts)))
    return rows


def report(rows: Sequence[tuple[str, int, int, float, float]], args: argparse.Namespace) -> str:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"`{' '.join(['.venv/bin/python -m bench.redact_real', *args.argv])}` ({stamp}, Python "
        f"{sys.version.split()[0]}): each text redacted with the prefilter and with every "
        f"rule, {args.rounds} rounds alternating, the best of each; the same output both ways.",
        "",
        "| texts | count | chars (mean) | prefilter ms per text | every rule ms per text "
        "| ratio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {name} | {n:,} | {chars:,} | {fast:.3f} | {slow:.3f} | {fast / slow:.2f} |"
              for name, n, chars, fast, slow in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.redact_real", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print, don't touch RESULTS.md")
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    text = report(measure(args.rounds), args)
    print(text)
    if not args.no_write:
        write_block(SECTION, BEGIN, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
