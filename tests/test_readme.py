"""The docs a newcomer reads: a short README with the two set-up commands, docs/settings.md
as scripts/settings_doc.py writes it from the settings, and no relative link to nowhere."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from ctxproxy.config import describe_settings

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SETTINGS_DOC = ROOT / "docs" / "settings.md"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250
# [text](target) and ![alt](target); the target up to a space (a title may follow) or ")".
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?[^)]*\)")


def settings_doc_module() -> ModuleType:
    """scripts/settings_doc.py, loaded by its path (scripts/ is not a package)."""
    script = ROOT / "scripts" / "settings_doc.py"
    spec = importlib.util.spec_from_file_location("settings_doc", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_settings_doc_is_what_the_script_writes() -> None:
    assert SETTINGS_DOC.read_text() == settings_doc_module().document(), (
        "docs/settings.md is stale: run .venv/bin/python scripts/settings_doc.py")


def test_settings_doc_lists_every_setting_with_its_default() -> None:
    text = SETTINGS_DOC.read_text()
    for name, default, _ in describe_settings():
        assert f"| `{name}` | `{default.replace('|', chr(92) + '|')}` |" in text, name


def test_readme_is_short() -> None:
    assert len(README.splitlines()) <= README_MAX_LINES


def test_readme_gives_the_two_set_up_commands() -> None:
    assert "make run" in README and "make test" in README


def test_readme_says_where_the_cli_lives() -> None:
    assert ".venv/bin/ctxproxy" in README


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # code blocks hold no links
    return LINK.findall(text)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_point_to_files_without_anchors(doc: Path) -> None:
    relative = [t for t in links(doc) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]
    for target in relative:
        assert "#" not in target, f"{target}: an anchor breaks silently when a heading changes"
        assert (doc.parent / target).exists(), f"{target}: no such file"


def test_the_docs_link_each_other() -> None:
    assert DOCS[1:], "docs/*.md is missing"
    for doc in DOCS[1:]:
        assert f"({doc.relative_to(ROOT).as_posix()})" in README, doc.name
