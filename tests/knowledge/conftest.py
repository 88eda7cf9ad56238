"""Knowledge tests are about the core's assets: the proxy's own chat-memory asset is left out
of their blocks unless a test asks for it (tests/knowledge/test_chat_memory.py does)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ProxyFactory, without_chat_memory
from tests.knowledge.wikis import add_wiki, write_wiki


@pytest.fixture
def start_proxy(start_proxy: ProxyFactory) -> ProxyFactory:
    return without_chat_memory(start_proxy)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"  # the one start_proxy uses


@pytest.fixture
def wiki_id(tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """A wiki of tests.knowledge.wikis.PAGES in the catalogue start_proxy serves."""
    return add_wiki(capsys, data_dir, write_wiki(tmp_path / "docs"))
