"""memory.aio.joined: gather's meaning, a turn of the loop sooner."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from ctxproxy.memory.aio import done, joined
from ctxproxy.memory.model import StoreError


async def test_the_results_come_in_the_reads_order_whatever_order_they_end_in() -> None:
    loop = asyncio.get_running_loop()
    first, second = loop.create_future(), loop.create_future()

    async def third() -> str:
        return "c"

    out = joined([first, second, third(), done("d")], lambda reads: "".join(reads))
    second.set_result("b")
    first.set_result("a")
    assert await out == "abcd"


async def test_it_ends_in_the_turn_of_the_loop_where_its_last_read_ends() -> None:
    last: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    out = joined([last], sum)
    last.set_result(1)
    await asyncio.sleep(0)  # the read's callbacks run: the join is set
    assert out.done()
    assert out.result() == 1


async def test_the_first_failure_ends_it_and_a_later_one_is_seen(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.get_running_loop()
    first, second = loop.create_future(), loop.create_future()
    out = joined([first, second], list)
    first.set_exception(StoreError("locked"))
    with pytest.raises(StoreError, match="locked"):
        await out
    second.set_exception(StoreError("gone too"))
    await asyncio.sleep(0)
    del first, second
    gc.collect()
    await asyncio.sleep(0)
    assert "never retrieved" not in caplog.text


async def test_cancelling_it_cancels_its_reads() -> None:
    read: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    out = joined([read], list)
    out.cancel()
    await asyncio.sleep(0)
    assert read.cancelled()


async def test_a_cancelled_read_cancels_it() -> None:
    read: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    out = joined([read, done(1)], list)
    read.cancel()
    await asyncio.sleep(0)
    assert out.cancelled()


async def test_nothing_to_read_is_ready_at_once() -> None:
    assert joined([], len).result() == 0
