"""Reading a folder the user names for indexing (a wiki, a repository), and nothing beyond it.

The folder's contents are not trusted: a cloned repository may carry a link to ``/etc/passwd``,
to ``/dev/zero`` or to a folder elsewhere, and a FIFO blocks whoever opens it. So a file is read
only when its real path lies inside the folder, is a regular file and fits the size bound;
links to folders are never followed. Each file that is passed over is reported, so the user
sees why it is missing from the index.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import TextIO

__all__ = ["MAX_FILE_BYTES", "Skipped", "Walker", "read_inside"]

# Bigger files are generated, vendored or data: not worth an index, and never held whole.
MAX_FILE_BYTES = 1 << 20

OUT_OF_FOLDER = "a link out of the folder"
INTO_HIDDEN = "a link into a hidden folder or file"
NOT_REGULAR = "not a regular file"
# Opened without following a last link (the path is already resolved: one appearing now is a
# swap) and without blocking (a FIFO swapped in after the check must not hang the command).
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


class Skipped(Exception):
    """A file passed over; the message says why, for the user."""


def _hidden(relative: PurePath) -> bool:
    return any(part.startswith(".") for part in relative.parts)


def _too_big(limit: int) -> Skipped:
    return Skipped(f"larger than {limit / (1 << 20):g} MiB")


def _check(mode: int, size: int, limit: int) -> None:
    if not stat.S_ISREG(mode):
        raise Skipped(NOT_REGULAR)
    if size > limit:
        raise _too_big(limit)


def _real(root: Path, relative: str) -> Path:
    """The real path of ``root/relative``, when it stays inside ``root`` (already resolved)."""
    try:
        real = Path(os.path.realpath(root / relative, strict=True))
    except OSError as exc:
        raise Skipped(f"unreadable ({exc.strerror or exc})") from exc
    if not real.is_relative_to(root):
        raise Skipped(OUT_OF_FOLDER)
    # Hidden paths are never indexed (.git, .env): a link must not bring one in by another name.
    if _hidden(real.relative_to(root)) and not _hidden(PurePath(relative)):
        raise Skipped(INTO_HIDDEN)
    return real


def read_inside(root: Path, relative: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of ``root/relative`` (``root`` resolved), or Skipped saying why not."""
    real = _real(root, relative)
    try:
        found = os.stat(real)
        _check(found.st_mode, found.st_size, limit)  # before opening: a FIFO's open blocks
        fd = os.open(real, _OPEN_FLAGS)
        with os.fdopen(fd, "rb") as file:
            opened = os.fstat(file.fileno())  # what was opened, should the path have changed
            _check(opened.st_mode, opened.st_size, limit)
            data = file.read(limit + 1)  # a file that grew since is still read bounded
    except OSError as exc:
        raise Skipped(f"unreadable ({exc.strerror or exc})") from exc
    if len(data) > limit:
        raise _too_big(limit)
    return data


def _printable(name: str) -> str:
    # A file's name is the folder's author's text: no control character reaches the terminal.
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


class Walker:
    """The files under a resolved ``root`` that ``wanted`` names, hidden ones and folders
    ``skip_dir`` names left out; links to folders are not followed (one out of the folder
    is reported), and each file passed over is reported on ``report`` as one line."""

    def __init__(self, root: Path, report: TextIO | None,
                 skip_dir: Callable[[str], bool] = lambda name: False) -> None:
        self.root = root
        self.stream = report
        self.skip_dir = skip_dir

    def skipped(self, relative: str, why: object) -> None:
        if self.stream is not None:
            self.stream.write(f"skipped {_printable(relative)}: {why}\n")
            self.stream.flush()

    def files(self, wanted: Callable[[str], bool]) -> list[str]:
        """Relative, ``/``-separated paths, sorted."""
        found: list[str] = []
        for folder, dirs, names in os.walk(self.root):
            base = Path(folder).relative_to(self.root)
            dirs[:] = sorted(d for d in dirs if self._descend(base / d))
            found += [(base / n).as_posix() for n in names if wanted(n) and not n.startswith(".")]
        found.sort()
        return found

    def _descend(self, relative: Path) -> bool:
        if relative.name.startswith(".") or self.skip_dir(relative.name):
            return False
        path = self.root / relative
        if path.is_symlink():  # never followed; its target inside the folder is walked anyway
            if not Path(os.path.realpath(path)).is_relative_to(self.root):
                self.skipped(relative.as_posix() + "/", OUT_OF_FOLDER)
            return False
        return True

    def read(self, relative: str, limit: int = MAX_FILE_BYTES) -> bytes | None:
        """The file's bytes, or None (reported) when it is passed over."""
        try:
            return read_inside(self.root, relative, limit)
        except Skipped as why:
            self.skipped(relative, why)
            return None
