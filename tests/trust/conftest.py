"""The trust tests run against every store backend, with the memory tests' fixtures. They are
about the core's assets: the proxy's own chat-memory asset is left out of their blocks (its own
isolation is in tests/knowledge/test_chat_memory.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import ProxyFactory
from tests.fakes.server import Running
from tests.memory.conftest import backend, pg_url, store

__all__ = ["backend", "pg_url", "store"]


@pytest.fixture
def start_proxy(start_proxy: ProxyFactory) -> ProxyFactory:
    async def start(**overrides: Any) -> Running:
        overrides.setdefault("chat_memory_asset", False)
        return await start_proxy(**overrides)

    return start
