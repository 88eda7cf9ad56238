"""Which code a benchmark measured: the tree is shared and changes while benches run."""

from __future__ import annotations

import subprocess
from pathlib import Path


def revision() -> str:
    """``git describe --always --dirty`` of this checkout ("-dirty": uncommitted changes)."""
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                              text=True, timeout=10, cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() or "unknown"
