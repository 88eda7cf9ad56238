"""Indexing a repository folder as a code graph: which files, what changed, parsing, writing.

Run by ``ctxproxy knowledge add-code`` (a CLI command, so never on the server's loop). Files
are compared by content digest with what the catalogue holds: only new and changed files are
parsed, and only they and deleted files are written. Large batches are parsed in a process
pool, one worker per core.
"""

from __future__ import annotations

import configparser
import hashlib
import multiprocessing
import os
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TextIO

from ctxproxy.knowledge.code_parse import ParsedFile, language_of, parse
from ctxproxy.knowledge.code_store import IndexedFile, Repo, stored_digests, sync_code
from ctxproxy.knowledge.folder import Skipped, Walker, read_inside
from ctxproxy.knowledge.model import repo_slug
from ctxproxy.knowledge.store import Catalogue, SyncResult

__all__ = ["index_repository", "read_repo"]

# Bumped when the parser's output changes, so that a re-run re-indexes every file.
PARSER_VERSION = b"code-graph/1\0"
MAX_GIT_BYTES = 1 << 16  # .git/config and HEAD: a checkout's are a few hundred bytes
# Folders of dependencies and build output, never the repository's own code.
SKIP_DIRS = frozenset({
    "node_modules", "__pycache__", "target", "dist", "build", "vendor", "venv",
    "site-packages",
})
POOL_THRESHOLD = 500  # below this many files to parse, a pool's start-up costs more
CHUNK = 64


def read_repo(root: Path) -> Repo:
    """The origin URL, its slug and the branch from ``root/.git``; without a remote the slug
    is the folder's name, so the block can still tell the model which repository it is."""
    url = None
    config = configparser.ConfigParser(strict=False, interpolation=None)
    try:
        config.read_string(_git_text(root, "config"))
        url = config.get('remote "origin"', "url", fallback=None)
    except configparser.Error:
        pass  # an odd checkout: the folder's name is enough
    head = _git_text(root, "HEAD").strip()
    branch = head[len("ref: refs/heads/"):] if head.startswith("ref: refs/heads/") else None
    slug = (repo_slug(url) if url else None) or root.name
    return Repo(url=url, slug=slug, branch=branch)


def _git_text(root: Path, name: str) -> str:
    """A file of ``root/.git`` as text, read like the sources; empty when it is not there."""
    try:
        return read_inside(root, f".git/{name}", MAX_GIT_BYTES).decode()
    except (Skipped, UnicodeDecodeError):
        return ""


def _digest(data: bytes) -> str:
    return hashlib.sha256(PARSER_VERSION + data).hexdigest()


def _parse_one(job: tuple[bytes, str]) -> ParsedFile:
    return parse(*job)


def _parse_all(jobs: Sequence[tuple[bytes, str]]) -> Iterator[ParsedFile]:
    if len(jobs) < POOL_THRESHOLD or (os.cpu_count() or 1) < 2:
        yield from map(_parse_one, jobs)
        return
    # spawn, not fork: the CLI may hold threads (and SQLite) that fork would copy.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=os.cpu_count(), mp_context=context) as pool:
        yield from pool.map(_parse_one, jobs, chunksize=CHUNK)


class Progress:
    """One line on ``stream``, rewritten in place at most five times a second."""

    def __init__(self, stream: TextIO | None, label: str, total: int) -> None:
        self.stream = stream
        self.label = label
        self.total = total
        self.started = time.monotonic()
        self._shown = 0.0

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if self.stream is None or (now - self._shown < 0.2 and done < self.total):
            return
        self._shown = now
        rate = done / max(now - self.started, 1e-6)
        self.stream.write(f"\r{self.label} {done}/{self.total} files ({rate:.0f} files/s)")
        if done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


def index_repository(
    catalogue: Catalogue, service_id: str, team_id: str, name: str, summary: str | None,
    root: Path, progress: TextIO | None = None,
) -> tuple[SyncResult, int]:
    """Index ``root`` (re-run: sync it); the result and the number of files parsed."""
    root = root.resolve()
    source = str(root)
    folder = Walker(root, progress, skip_dir=SKIP_DIRS.__contains__)
    paths = folder.files(lambda name: language_of(name) is not None)
    known = stored_digests(catalogue, service_id, team_id, source)
    present: list[str] = []
    jobs: list[tuple[str, str, bytes, str]] = []  # (path, digest, bytes, language)
    for path in paths:
        data = folder.read(path)
        if data is None:
            continue  # passed over (a link out, not a file, too big, gone): treated as deleted
        present.append(path)
        digest = _digest(data)
        if known.get(path) != digest:
            language = language_of(path)
            assert language is not None  # source_files kept only known languages
            jobs.append((path, digest, data, language))
    changed: list[IndexedFile] = []
    if jobs:
        parsing = Progress(progress, "parsing", len(jobs))
        parsed = _parse_all([(data, language) for _, _, data, language in jobs])
        for done, ((path, digest, data, _), tree) in enumerate(zip(jobs, parsed, strict=True), 1):
            text = data.decode("utf-8", errors="replace")
            changed.append(IndexedFile(path, digest, text, tree))
            parsing(done)
    writing = Progress(progress, "writing", len(changed)) if changed else None
    result = sync_code(catalogue, service_id, team_id, name, summary, source, read_repo(root),
                       present, changed, writing)
    return result, len(changed)
