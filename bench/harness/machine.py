"""Facts about a run for its report: the machine it ran on and which code it measured (the
tree is shared and changes while benches run)."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from pathlib import Path

import aiohttp


def revision() -> str:
    """``git describe --always --dirty`` of this checkout ("-dirty": uncommitted changes)."""
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                              text=True, timeout=10, cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() or "unknown"


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as "1.23, 0.98, 0.75"."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> str:
    """Cores, CPU model, kernel, Python and aiohttp, and the load average now."""
    cpu = "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return (f"{os.cpu_count()} cores ({cpu}), Linux {platform.release()}, Python "
            f"{platform.python_version()}, aiohttp {aiohttp.__version__}; load average at the "
            f"start {load_average()}")
