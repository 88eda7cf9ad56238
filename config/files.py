"""Files under the data directory hold memories, wikis and keys: readable by their owner only."""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["private_file"]

_SIDECARS = ("-wal", "-shm", "-journal")  # SQLite's, made with the database file's mode


def private_file(path: Path) -> None:
    """Make ``path``'s folder (0700 when new) and ``path`` itself mode 0600, creating an
    empty file when missing; an existing file (and SQLite's files beside it) is tightened
    to 0600. Raises OSError."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o600)
    os.close(fd)
    for each in (path, *(path.with_name(path.name + s) for s in _SIDECARS)):
        try:
            mode = stat.S_IMODE(each.stat().st_mode)
        except FileNotFoundError:
            continue
        if mode & 0o077:
            each.chmod(mode & 0o600)
