"""One forget for the CLI and the dashboard: a memory forgotten at ``/ui`` leaves the
tombstone ``ctxproxy memory forget`` leaves, so the session's next request, which resends the
forgotten turn, does not store it again. (The chat-memory asset has no forget tool: search,
read and recent only.)"""

from __future__ import annotations

import aiohttp
import pytest

from ctxproxy.memory.model import Memory
from tests.conftest import ProxyFactory
from tests.fakes.server import Running
from tests.fakes.upstream import FakeUpstream
from tests.memory.conftest import Backend, backend, pg_url
from tests.memory.session import Session, runtime, settle

__all__ = ["backend", "pg_url"]

SECRET = "zq7vaultcode"
KEY = "ck-alice-4d1e"
WHO = {"x-team-id": "team-a", "x-agent-id": "coder"}


async def episodes_holding(proxy: Running, text: str) -> list[Memory]:
    stored = await runtime(proxy).store.list(None, types=["episodic"], limit=10_000, now=0)
    return [m for m in stored if text in m.text]


@pytest.mark.parametrize("keys", [None, f"{KEY} principal=alice"], ids=["sidecar", "client-key"])
async def test_a_memory_forgotten_at_the_dashboard_is_not_stored_again(
    keys: str | None, backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
) -> None:
    auth = {"Authorization": f"Bearer {KEY}"} if keys else {}
    extra = {"client_keys": keys, "upstream_api_key": "sk-real"} if keys else {}
    settings = {**backend.settings, **extra, "keep_turns": 3, "trim_slack": 0}
    proxy = await start_proxy(**settings)
    s = Session(proxy, upstream, session_id="forget-me", headers={**WHO, **auth})
    await s.say(f"The staging vault code is {SECRET}, remember it.")
    await s.say("turn 2: please do step 2")
    await settle(proxy)
    (episode,) = await episodes_holding(proxy, SECRET)

    async with aiohttp.ClientSession(headers=auth) as http, http.post(
            f"{proxy.url}/ui/memory/{episode.memory_id}/forget") as resp:
        assert resp.status == 200
        assert episode.memory_id in await resp.text()
    assert await episodes_holding(proxy, SECRET) == []

    # The session goes on, in this process and in the next (which has no cache of what is
    # stored and asks the store): every request resends the forgotten turn.
    for n in range(3, 7):
        if n == 5:
            await proxy.close()
            proxy = s.proxy = await start_proxy(**settings)
        await s.say(f"turn {n}: please do step {n}")
        assert SECRET in str(s.items)  # resent by the client (the window cuts it)
    await settle(proxy)
    assert await episodes_holding(proxy, SECRET) == []
