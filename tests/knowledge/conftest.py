"""Knowledge tests are about the core's assets: the proxy's own chat-memory asset is left out
of their blocks unless a test asks for it (tests/knowledge/test_chat_memory.py does)."""

from __future__ import annotations

import pytest

from tests.conftest import ProxyFactory, without_chat_memory


@pytest.fixture
def start_proxy(start_proxy: ProxyFactory) -> ProxyFactory:
    return without_chat_memory(start_proxy)
