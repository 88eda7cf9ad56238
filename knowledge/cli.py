"""`ctxproxy knowledge ...` commands."""

from __future__ import annotations

import argparse
from typing import Any


def register(commands: Any) -> None:
    """Add the `knowledge` command group to the top-level parser."""
    parser: argparse.ArgumentParser = commands.add_parser("knowledge", help="manage knowledge")
    parser.set_defaults(func=lambda settings, args: parser.print_help())
