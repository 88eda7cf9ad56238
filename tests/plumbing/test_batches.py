"""The bounded batch writer: what it refuses, what it writes, and in what batches."""

from __future__ import annotations

import asyncio
import logging

import pytest

from ctxproxy.plumbing.batches import BatchWriter


async def test_rows_from_a_thread_and_the_loop_are_written_in_bounded_batches() -> None:
    written: list[list[str]] = []

    async def write(batch: list[str]) -> None:
        written.append(batch)

    rows = BatchWriter(write, name="t", size_of=len, max_rows=100, max_bytes=10_000,
                       batch_rows=3, batch_bytes=5)
    rows.start()
    assert rows.put("aa")
    assert await asyncio.to_thread(rows.put, "bb")
    assert all(rows.put(x) for x in ("cc", "d", "e", "f", "g"))
    await rows.join()
    await rows.close()
    assert [r for batch in written for r in batch] == ["aa", "bb", "cc", "d", "e", "f", "g"]
    # At most 3 rows a batch, and a batch stops once it holds 5 bytes.
    assert all(len(b) <= 3 and sum(map(len, b[:-1])) < 5 for b in written)
    assert rows.bytes == 0


async def test_a_full_queue_refuses_but_an_empty_one_takes_a_large_row() -> None:
    gate = asyncio.Event()
    written: list[str] = []

    async def write(batch: list[str]) -> None:
        await gate.wait()
        written.extend(batch)

    rows = BatchWriter(write, name="t", size_of=len, max_rows=2, max_bytes=10, batch_rows=1)
    assert rows.put("x" * 50)  # larger than the budget, but the queue is empty
    assert not rows.put("y")  # over the bytes
    rows.start()
    await asyncio.sleep(0.01)  # the large row is being written: its bytes still count,
    assert rows.bytes == 50  # but a queue with nothing waiting takes a row
    assert rows.put("y") and not rows.put("z")
    gate.set()
    await rows.join()
    assert rows.put("a") and rows.put("b") and not rows.put("c")  # over the rows
    await rows.close()
    assert written == ["x" * 50, "y", "a", "b"]


async def test_a_failing_batch_is_counted_and_the_next_one_still_goes(
        caplog: pytest.LogCaptureFixture) -> None:
    written: list[str] = []
    failed: list[int] = []

    async def write(batch: list[str]) -> None:
        if "bad" in batch:
            raise ValueError("a bug")
        written.extend(batch)

    rows = BatchWriter(write, name="t", size_of=len, max_rows=10, max_bytes=100,
                       batch_rows=2, on_failed=failed.append)
    rows.start()
    with caplog.at_level(logging.ERROR):
        for row in ("ok", "bad", "later"):
            rows.put(row)
        await rows.join()
    await rows.close()
    assert failed == [2] and written == ["later"]
    assert "writing a batch failed" in caplog.text
