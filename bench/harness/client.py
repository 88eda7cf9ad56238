"""The client side of the latency benches: one request timed to its first byte and its end,
or a batch of them with some in flight."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp


@dataclass
class Client:
    """Sends the benchmark request and checks every answer byte for byte."""

    session: aiohttp.ClientSession
    body: bytes
    headers: dict[str, str]
    expected: bytes

    async def one(self, url: str) -> tuple[float, float]:
        """(time to the first body byte, time to the end of the stream), in seconds."""
        start = time.perf_counter()
        first = 0.0
        received = bytearray()
        async with self.session.post(url, data=self.body, headers=self.headers) as resp:
            async for chunk in resp.content.iter_any():
                if not first:
                    first = time.perf_counter()
                received += chunk
            status = resp.status
        end = time.perf_counter()
        if status != 200 or received != self.expected:
            raise RuntimeError(f"{url}: status {status}, {len(received)} bytes: not the answer")
        return first - start, end - start

    async def batch(self, url: str, count: int, concurrency: int) -> float:
        """Send ``count`` requests with ``concurrency`` in flight; the wall time."""
        left = iter(range(count))

        async def worker() -> None:
            for _ in left:
                await self.one(url)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - start


def p99(values: Sequence[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]
