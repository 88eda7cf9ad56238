"""Rewrite the settings table in README.md from config.Settings (run after adding a setting)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ctxproxy.config import describe_settings

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- settings:begin -->", "<!-- settings:end -->"


def cell(text: str) -> str:
    """``text`` in a table cell: a pipe escaped (GitHub reads it so in code spans too)."""
    return text.replace("|", "\\|")


def table() -> str:
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    rows += [f"| `{name}` | `{cell(default)}` | {cell(text)} |"
             for name, default, text in describe_settings()]
    return "\n".join(rows)


def main() -> int:
    readme = ROOT / "README.md"
    text = readme.read_text()
    block = f"{START}\n{table()}\n{END}"
    if START in text:
        text = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    else:
        text = text.replace("SETTINGS_TABLE", block)
    readme.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
