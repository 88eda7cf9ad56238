from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from ctxproxy.config import SettingsError, load_settings
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream


async def call(url: str, key: str | None) -> int:
    headers = codex.headers()
    headers.pop("Authorization")
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    async with aiohttp.ClientSession() as s, s.post(
            url + "/v1/responses", json=codex.request(codex.session(1)), headers=headers) as r:
        await r.read()
        return r.status


async def test_unknown_callers_get_401_before_anything_is_forwarded(
        upstream: FakeUpstream, start_proxy: ProxyFactory, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nck-alpha\nck-beta\n")
    proxy = await start_proxy(client_keys=f"@{keys}", upstream_api_key="sk-real")
    assert await call(proxy.url, None) == 401
    assert await call(proxy.url, "ck-wrong") == 401
    assert upstream.received == []
    assert await call(proxy.url, "ck-beta") == 200
    # The client's key is the proxy's business: the upstream gets the configured key.
    assert upstream.last.headers["Authorization"] == "Bearer sk-real"
    async with aiohttp.ClientSession() as s, s.get(proxy.url + "/healthz") as r:
        assert r.status == 200


def test_client_keys_without_an_upstream_key_stop_start_up() -> None:
    with pytest.raises(SettingsError, match="CTXPROXY_UPSTREAM_API_KEY"):
        load_settings(env={"CTXPROXY_CLIENT_KEYS": "ck-alpha"})
