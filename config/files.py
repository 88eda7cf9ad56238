"""Files under the data directory hold memories, wikis and keys: readable by their owner only."""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
from pathlib import Path

__all__ = ["WriteLock", "private_file", "secret_key"]

_SIDECARS = ("-wal", "-shm", "-journal")  # SQLite's, made with the database file's mode


def private_file(path: Path) -> None:
    """Make ``path``'s folder (0700 when new) and ``path`` itself mode 0600, creating an
    empty file when missing; an existing file (and SQLite's files beside it) is tightened
    to 0600. Raises OSError."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # An existing file is never opened here: closing any descriptor of a file drops every
    # POSIX lock this process holds on it, SQLite's included, and another process (a
    # worker, a search process) would then take itself for the file's only user: it
    # checkpoints and deletes the WAL under this process's connections.
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o600))
    for each in (path, *(path.with_name(path.name + s) for s in _SIDECARS)):
        try:
            mode = stat.S_IMODE(each.stat().st_mode)
        except FileNotFoundError:
            continue
        if mode & 0o077:
            each.chmod(mode & 0o600)


def secret_key(data_dir: Path, name: str) -> bytes:
    """A random 32-byte secret in ``data_dir/name``: made once (mode 0600), then read by every
    process. Written to a private temporary file and linked into place, so that processes
    starting together agree on one key and none reads a half-written file. Raises OSError,
    ValueError (a file too short to be a key)."""
    path = data_dir / name
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        tmp = data_dir / f".{name}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(32))
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # another process made it first: use theirs
        finally:
            tmp.unlink()
    key = path.read_bytes()
    if len(key) < 16:
        raise ValueError(f"{path} holds fewer than 16 bytes; remove it to make a new key")
    return key


class WriteLock:
    """One writer at a time across the processes sharing an SQLite file (``CTXPROXY_WORKERS``
    of them): an exclusive ``flock`` on ``<file>.lock`` held around each write transaction.
    SQLite's own busy handler waits by sleeping 1, 2, 5, 10 ... 100 ms between tries, so a
    write that finds another under way waited for the next try, not for that write to end;
    the kernel wakes a ``flock`` waiter as the holder lets go. Reads (WAL) never take it."""

    def __init__(self, path: Path) -> None:
        self.path = path.with_name(path.name + ".lock")
        self._fd: int | None = None

    def __enter__(self) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # releases the GIL while it waits

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
