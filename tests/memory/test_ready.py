"""/readyz fails while the memory store cannot be reached, so a load balancer sends the
turns to a replica whose memory works; the replica still relays what reaches it."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.conftest import ProxyFactory
from tests.fakes.upstream import FakeUpstream
from tests.memory.conftest import Backend
from tests.memory.session import Session


async def _ready(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.get(url + "/readyz") as r:
        return r.status, await r.json()


async def test_ready_while_the_store_answers(backend: Backend,
                                             start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy(**backend.settings)
    assert await _ready(proxy.url) == (200, {"ready": True})


async def test_not_ready_while_the_store_is_unreachable_yet_turns_still_relay(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(**backend.broken_settings)

    assert await _ready(proxy.url) == (503, {"ready": False, "failing": ["memory store"]})
    s = Session(proxy, upstream)
    await s.say("Where do the migrations live?")
    assert len(upstream.received) == 1


async def test_ready_without_memory_asks_no_store(backend: Backend,
                                                  start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy(**backend.broken_settings, memory_enabled=False)
    assert await _ready(proxy.url) == (200, {"ready": True})
