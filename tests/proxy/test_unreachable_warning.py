"""An upstream that cannot be reached is a warning in the log (once a minute), not only
info-level 502 access lines."""

from __future__ import annotations

import logging

import aiohttp
import pytest

from tests.conftest import ProxyFactory
from tests.fakes.server import free_port


async def test_an_unreachable_upstream_is_logged_as_a_warning_once(
    start_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    proxy = await start_proxy(upstream_url=f"http://127.0.0.1:{free_port()}/v1")
    caplog.set_level(logging.INFO, logger="ctxproxy")
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.post(proxy.url + "/v1/responses", json={"input": []}) as resp:
                assert resp.status == 502
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING
                and "cannot be reached" in r.getMessage()]
    assert len(warnings) == 1
