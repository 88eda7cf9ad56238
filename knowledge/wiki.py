"""Reading a folder of Markdown files as wiki pages."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

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


def read_pages(root: Path) -> list[Page]:
    """Every ``*.md`` under ``root``, recursively, skipping hidden folders (``.git``)."""
    pages = []
    for path in sorted(root.rglob("*.md")):
        relative = path.relative_to(root)
        if any(part.startswith(".") for part in relative.parts) or not path.is_file():
            continue
        body = path.read_text(encoding="utf-8", errors="replace")
        page_id = relative.with_suffix("").as_posix()
        pages.append(Page(page_id, _title(body, path.stem), body))
    return pages
