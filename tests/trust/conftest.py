"""The trust tests run against every store backend, with the memory tests' fixtures. They are
about the core's assets: the proxy's own chat-memory asset is left out of their blocks (its own
isolation is in tests/knowledge/test_chat_memory.py)."""

from __future__ import annotations

import pytest

from tests.conftest import ProxyFactory, without_chat_memory
from tests.memory.conftest import backend, pg_url, store

__all__ = ["backend", "pg_url", "store"]


@pytest.fixture
def start_proxy(start_proxy: ProxyFactory) -> ProxyFactory:
    return without_chat_memory(start_proxy)
