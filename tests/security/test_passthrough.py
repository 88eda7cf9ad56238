"""The catch-all route under client keys: every forwarded request carries the upstream key all
keys share, so only an agent's routes (and CTXPROXY_PASSTHROUGH's) reach the upstream; the rest
get an OpenAI-shaped 403 and nothing is sent."""

from __future__ import annotations

import json

import aiohttp
import pytest

from ctxproxy.config import load_settings
from ctxproxy.config.settings import SettingsError
from tests.conftest import ProxyFactory
from tests.fakes.server import raw_request
from tests.fakes.upstream import FakeUpstream

ALICE, BOB, OPS = "ck-alice-5c1d", "ck-bob-8e2a", "ck-ops-77f0"
KEYS = f"{ALICE} principal=alice; {BOB} principal=bob; {OPS} principal=ops admin"
# What another principal's key could do at the provider with the shared upstream key.
REFUSED = [
    ("GET", "/v1/files"),
    ("POST", "/v1/files"),
    ("GET", "/v1/files/file-alice/content"),
    ("DELETE", "/v1/responses/resp_alice"),
    ("GET", "/v1/responses/resp_alice"),
    ("GET", "/v1/responses/resp_alice/input_items"),
    ("DELETE", "/v1/models/ft:gpt-4o:alice"),
    ("GET", "/v1/vector_stores"),
    ("GET", "/v1/modelsx"),
    ("GET", "/files"),  # /v1 left out: the same upstream route
]


async def call(url: str, key: str, method: str, path: str) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as http, http.request(
        method, url + path, headers={"Authorization": f"Bearer {key}",
                                     "Content-Type": "application/json"},
        data=b'{"purpose": "assistants"}' if method == "POST" else None,
    ) as r:
        return r.status, await r.json()


@pytest.mark.parametrize("key", [BOB, OPS])
async def test_under_client_keys_only_an_agents_routes_reach_the_upstream(
    start_proxy: ProxyFactory, upstream: FakeUpstream, key: str,
) -> None:
    proxy = await start_proxy(client_keys=KEYS, upstream_api_key="sk-real-upstream")
    for method, path in REFUSED:
        status, answer = await call(proxy.url, key, method, path)
        assert status == 403, (method, path)
        assert answer["error"] == {
            "message": "this route is not forwarded under client keys (CTXPROXY_PASSTHROUGH "
                       "lists the ones that are)",
            "type": "invalid_request_error", "code": "route_not_forwarded", "param": None}
    # Under a forwarded prefix, a dot segment in any encoding is still refused.
    status, _ = await raw_request(proxy.url, "GET /v1/models/%2e%2e/files HTTP/1.1\r\n"
                                  f"Authorization: Bearer {key}")
    assert status == 400
    assert upstream.received == []

    for path in ("/v1/models", "/v1/models/gpt-5", "/models?limit=2"):
        status, _ = await call(proxy.url, key, "GET", path)
        assert status == 200, path
    assert [(r.method, r.path, r.query) for r in upstream.received] == [
        ("GET", "/v1/models", ""), ("GET", "/v1/models/gpt-5", ""),
        ("GET", "/v1/models", "limit=2")]
    assert all(r.headers["Authorization"] == "Bearer sk-real-upstream"
               for r in upstream.received)


async def test_passthrough_setting_forwards_the_routes_it_lists_and_no_others(
    start_proxy: ProxyFactory, upstream: FakeUpstream,
) -> None:
    proxy = await start_proxy(client_keys=KEYS, upstream_api_key="sk-real-upstream",
                              passthrough="GET /v1/files, delete /responses/*, * /v1/batches*")
    listed = [("GET", "/v1/files"), ("DELETE", "/v1/responses/resp_1"),
              ("POST", "/v1/batches"), ("GET", "/v1/batches/b_1"), ("GET", "/v1/models")]
    for method, path in listed:
        status, _ = await call(proxy.url, BOB, method, path)
        assert status == 200, (method, path)
    assert [(r.method, r.path) for r in upstream.received] == listed
    for method, path in [("POST", "/v1/files"), ("GET", "/v1/files/file-1"),
                         ("GET", "/v1/responses/resp_1"), ("DELETE", "/v1/responses")]:
        status, answer = await call(proxy.url, BOB, method, path)
        assert status == 403 and json.dumps(answer).count("route_not_forwarded") == 1
    assert len(upstream.received) == len(listed)


@pytest.mark.parametrize("value", ["files", "GET files", "GET /v1/*/content", "GET /a /b"])
def test_a_bad_passthrough_entry_stops_start_up_naming_the_variable(value: str) -> None:
    with pytest.raises(SettingsError, match="CTXPROXY_PASSTHROUGH"):
        load_settings(env={"CTXPROXY_PASSTHROUGH": f"GET /v1/models, {value}"})
