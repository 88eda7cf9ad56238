"""bench/RESULTS.md: each benchmark owns one marked block and rewrites only that."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "RESULTS.md"


def write_block(section: str, begin: str, end: str, text: str) -> None:
    """Put ``text`` between ``begin`` and ``end``: in place of the last run when the markers
    are there, else at the top of ``section``, else in a new section at the end."""
    block = f"{begin}\n{text}\n{end}"
    current = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    if begin in current and end in current:
        head, rest = current.split(begin, 1)
        updated = head + block + rest.split(end, 1)[1]
    elif section in current:
        head, rest = current.split(section, 1)
        updated = head + section + "\n\n" + block + "\n" + rest
    else:
        updated = current.rstrip("\n") + f"\n\n{section}\n\n{block}\n"
    RESULTS.write_text(updated)
