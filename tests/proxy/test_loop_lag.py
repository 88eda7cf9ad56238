"""The event loop's scheduling delay is exported, and the GIL is handed over sooner."""

from __future__ import annotations

import asyncio
import sys

import aiohttp

from ctxproxy.proxy.local import SWITCH_INTERVAL_S
from tests.conftest import ProxyFactory


async def test_event_loop_lag_is_a_histogram_in_metrics(start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy()
    await asyncio.sleep(0.35)  # a few samples, 100 ms apart
    async with aiohttp.ClientSession() as s, s.get(proxy.url + "/metrics") as r:
        text = await r.text()
    count = next(line for line in text.splitlines()
                 if line.startswith("ctxproxy_event_loop_lag_seconds_count"))
    assert float(count.split()[-1]) >= 2
    assert 'ctxproxy_event_loop_lag_seconds_bucket{le="0.01"}' in text


async def test_the_gil_switch_interval_is_short_while_the_proxy_serves(
    start_proxy: ProxyFactory,
) -> None:
    before = sys.getswitchinterval()
    proxy = await start_proxy()
    serving = sys.getswitchinterval()
    await proxy.close()

    assert serving == min(before, SWITCH_INTERVAL_S) < 0.005  # CPython's default: 5 ms
    assert sys.getswitchinterval() == before
