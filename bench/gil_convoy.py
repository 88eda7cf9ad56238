"""What a worker thread's CPU work costs the event loop's system calls (the GIL's convoy).

    python -m bench.gil_convoy [--seconds 0.4] [--rounds 5] [--no-write]

The event loop gives the GIL up at every system call (a socket's send or recv, select) and
must take it back after. While another thread of the process runs Python, the loop waits for
it: up to the switch interval (``sys.getswitchinterval()``, 5 ms) for pure Python, and for the
whole call when the other thread is inside a C call that keeps the GIL (Python's ``re``,
orjson). C calls that let it go (re2, tiktoken, SQLite, hashlib on large data) cost the loop
nothing, but the thread that makes them pays: each takes the GIL back after, and beside a
thread running Python that is a wait of up to the interval per call (the second table:
redaction, two RE2 calls a text, of a prompt's sentences one by one and together). Here the
main thread stands for the loop: a pipe's write and read, in a loop, while one other thread
runs each kind of work for ``--seconds``, ``--rounds`` times (the kinds and intervals taking
turns: the figures move from run to run with how the kernel places the two threads);
reported, the median round's round trips per second of the main thread and its longest wait
in any round, at the default switch interval and at 0.5 ms.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import orjson
import re2

from bench.harness.machine import machine
from bench.harness.results import write_block
from ctxproxy.injectors import tokens
from ctxproxy.injectors.redact import redact, redact_all

SECTION = "## The event loop beside worker threads"
BEGIN = "<!-- gil-convoy:begin (written by bench/gil_convoy.py) -->"
END = "<!-- gil-convoy:end -->"

TEXT = "def step(x):\n    return x + 1  # the tool's output, line after line\n" * 1200  # 64 KB
BODY = {"input": [{"type": "message", "content": [{"type": "input_text", "text": TEXT[:3000]}]}
                  for _ in range(100)]}  # about 300 KB, as a Codex history
RAW = orjson.dumps(BODY)
_WORDS = re.compile(r"[a-z]+\s*\(")
_WORDS2 = re2.compile(r"[a-z]+\s*\(")


def _handing_over(hand: Callable[[], object] = lambda: time.sleep(0)) -> None:
    """The pure Python sum in ten parts, ``hand`` called after each: ``sleep(0)`` lets the
    GIL go for as long as the kernel takes to wake the thread; ``sched_yield`` lets it go
    too, but the thread takes it back before another can."""
    for _ in range(10):
        sum(i * i for i in range(1_000))
        hand()


def kinds() -> dict[str, Callable[[], object]]:
    """The other thread's work, by what it is."""
    return {
        "nothing (the thread sleeps)": lambda: time.sleep(0.05),
        "pure Python (a sum over 10,000 numbers)": lambda: sum(i * i for i in range(10_000)),
        "the same, with time.sleep(0) after every 1,000": _handing_over,
        "the same, with os.sched_yield() after every 1,000": lambda: _handing_over(os.sched_yield),
        "Python re over 64 KB": lambda: _WORDS.findall(TEXT),
        "re2 over 64 KB": lambda: _WORDS2.findall(TEXT),
        "tiktoken, 64 KB": lambda: tokens.count(TEXT),
        "orjson.loads, 300 KB": lambda: orjson.loads(RAW),
        "orjson.dumps, 300 KB": lambda: orjson.dumps(BODY),
    }


SENTENCES = [f"Always run `make lint` before step {n}; never push to main." for n in range(30)]


def caller_waits(rounds: int) -> list[tuple[str, float, float]]:
    """Redacting SENTENCES one by one and together (``redact_all``), beside a thread that
    runs pure Python: the wall and CPU time of the redacting thread (ms), the mean of
    ``rounds`` rounds (in some the busy thread never takes the GIL while it is let go)."""
    ways: dict[str, Callable[[], object]] = {
        "one by one (redact)": lambda: [redact(t) for t in SENTENCES],
        "together (redact_all)": lambda: redact_all(SENTENCES),
    }
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            sum(i * i for i in range(1_000))

    thread = threading.Thread(target=busy)
    thread.start()
    took: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    try:
        for _ in range(rounds):
            for name, way in ways.items():
                wall, cpu = time.perf_counter(), time.thread_time()
                way()
                took[name].append(((time.perf_counter() - wall) * 1000,
                                   (time.thread_time() - cpu) * 1000))
    finally:
        stop.set()
        thread.join()
    return [(name, statistics.mean(w for w, _ in got), statistics.mean(c for _, c in got))
            for name, got in took.items()]


def convoy(work: Callable[[], object], seconds: float) -> tuple[float, float]:
    """The main thread's pipe round trips per second, and its longest one (ms), while
    another thread runs ``work`` over and over."""
    stop = time.monotonic() + seconds

    def other() -> None:
        while time.monotonic() < stop:
            work()

    thread = threading.Thread(target=other)
    r, w = os.pipe()
    try:
        thread.start()
        trips, worst, last = 0, 0.0, time.perf_counter()
        began = last
        while thread.is_alive():
            os.write(w, b"x")
            os.read(r, 1)
            now = time.perf_counter()
            worst, last, trips = max(worst, now - last), now, trips + 1
        thread.join()
        return trips / (time.perf_counter() - began), worst * 1000
    finally:
        os.close(r)
        os.close(w)


Row = tuple[str, tuple[float, float], tuple[float, float]]


def measure(seconds: float, rounds: int) -> list[Row]:
    """Per kind, at the default interval and at 0.5 ms: the median round's round trips per
    second and the longest round trip of all rounds (ms)."""
    tokens.count("warm the tokenizer")
    default = sys.getswitchinterval()
    runs: dict[tuple[str, float], list[tuple[float, float]]] = {}
    try:
        for _ in range(rounds):
            for name, work in kinds().items():
                for interval in (default, 0.0005):
                    sys.setswitchinterval(interval)
                    runs.setdefault((name, interval), []).append(convoy(work, seconds))
    finally:
        sys.setswitchinterval(default)

    def summary(name: str, interval: float) -> tuple[float, float]:
        got = runs[(name, interval)]
        return statistics.median(r for r, _ in got), max(w for _, w in got)

    return [(name, summary(name, default), summary(name, 0.0005)) for name in kinds()]


def report(rows: Sequence[Row], rounds: int, argv: Sequence[str],
           waits: Sequence[tuple[str, float, float]] = ()) -> str:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = " ".join([".venv/bin/python -m bench.gil_convoy", *argv])
    lines = [
        f"Measured {stamp} with `{command}` on {machine()}.",
        "",
        "The main thread stands for the event loop (a pipe's write and read, each a system call "
        "that gives the GIL up); one other thread runs the work of the row meanwhile. "
        f"Round trips per second: the median of {rounds} rounds; longest: of all rounds.",
        "",
        "| the other thread runs | round trips/s (5 ms interval) | longest ms "
        "| round trips/s (0.5 ms) | longest ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, (rate, worst), (rate2, worst2) in rows:
        lines.append(f"| {name} | {rate:,.0f} | {worst:.1f} | {rate2:,.0f} | {worst2:.1f} |")
    if waits:
        lines += ["", f"The thread that lets the GIL go: {len(SENTENCES)} sentences redacted "
                  "beside a thread running pure Python (5 ms interval; the mean of "
                  f"{rounds * 4} rounds).", "",
                  "| redacted | wall ms | CPU ms |", "|---|---:|---:|"]
        lines += [f"| {name} | {wall:.1f} | {cpu:.2f} |" for name, wall, cpu in waits]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=0.4, help="per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    rows = measure(args.seconds, args.rounds)
    text = report(rows, args.rounds, list(argv if argv is not None else sys.argv[1:]),
                  caller_waits(args.rounds * 4))
    print(text)
    if not args.no_write:
        write_block(SECTION, BEGIN, END, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
