"""Knowledge tests are about the core's assets: the proxy's own chat-memory asset is left out
of their blocks unless a test asks for it (tests/knowledge/test_chat_memory.py does)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import ProxyFactory
from tests.fakes.server import Running


@pytest.fixture
def start_proxy(start_proxy: ProxyFactory) -> ProxyFactory:
    async def start(**overrides: Any) -> Running:
        overrides.setdefault("chat_memory_asset", False)
        return await start_proxy(**overrides)

    return start
