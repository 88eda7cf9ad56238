"""Reading a folder of Markdown files as wiki pages."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TextIO

from ctxproxy.knowledge.folder import Walker

__all__ = ["Page", "read_pages"]


@dataclass(frozen=True, slots=True)
class Page:
    """One page: its id is the file's path under the folder, without ``.md``."""

    page_id: str
    title: str
    body: str

    @property
    def digest(self) -> str:
        return hashlib.sha256(f"{self.title}\0{self.body}".encode()).hexdigest()


def _title(body: str, fallback: str) -> str:
    for line in body.splitlines():
        if line.startswith("# "):
            return line[2:].strip() or fallback
    return fallback


def read_pages(root: Path, report: TextIO | None = None) -> list[Page]:
    """Every ``*.md`` under ``root`` (resolved), recursively, skipping hidden folders (``.git``);
    each file passed over (a link out of the folder, not a file, too big) is a line on
    ``report``."""
    folder = Walker(root, report)
    pages = []
    for relative in folder.files(lambda name: name.endswith(".md")):
        data = folder.read(relative)
        if data is None:
            continue
        # Newlines as a text-mode read gives them, so a page's digest is what it was.
        body = data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
        path = PurePosixPath(relative)
        pages.append(Page(path.with_suffix("").as_posix(), _title(body, path.stem), body))
    return pages
