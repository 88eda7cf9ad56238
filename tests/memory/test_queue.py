"""The bounded write queue owned by the app."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ctxproxy.memory.health import Health
from ctxproxy.memory.model import StoreError
from ctxproxy.memory.queue import Job, WriteQueue


def queue(size: int = 10) -> tuple[WriteQueue, list[int], list[int]]:
    failures: list[int] = []
    depths: list[int] = []
    q = WriteQueue(size, Health(lambda: failures.append(1)), depths.append, retry_s=0)
    return q, failures, depths


async def test_jobs_run_in_order_off_the_callers_path() -> None:
    q, _, depths = queue()
    done: list[int] = []

    async def job(n: int) -> None:
        done.append(n)

    for n in range(3):
        assert q.put(lambda n=n: job(n))  # type: ignore[misc]
    assert done == []  # nothing runs before the worker does
    q.start()
    await q.join()
    assert done == [0, 1, 2]
    assert depths[-1] == 0
    await q.close()


async def test_a_full_queue_drops_the_write_and_counts_it() -> None:
    q, failures, _ = queue(size=2)

    async def job() -> None:
        return None

    assert q.put(job) and q.put(job)
    assert not q.put(job)
    assert q.dropped == 1 and failures == [1]


async def test_failed_writes_are_counted_and_later_ones_still_run() -> None:
    q, failures, _ = queue()
    done: list[str] = []

    async def broken() -> None:
        raise StoreError("disk full")

    async def buggy() -> None:
        raise KeyError("oops")

    async def fine() -> None:
        done.append("fine")

    for job in (broken, buggy, fine):
        q.put(job)
    q.start()
    await q.join()
    # The store failure is retried once, then dropped: counted both times.
    assert done == ["fine"] and failures == [1, 1]
    await q.close()


async def test_close_drains_what_is_queued() -> None:
    q, _, _ = queue()
    done: list[int] = []
    gate = asyncio.Event()

    async def slow() -> None:
        await gate.wait()
        done.append(1)

    async def quick() -> None:
        done.append(2)

    q.put(slow)
    q.put(quick)
    q.start()
    closing = asyncio.create_task(q.close())
    await asyncio.sleep(0)
    gate.set()
    await closing
    assert done == [1, 2]


async def test_jobs_of_other_sessions_run_beside_a_slow_one_and_a_sessions_jobs_in_order() -> None:
    q = WriteQueue(10, Health(), retry_s=0, concurrency=2)
    gate = asyncio.Event()
    started: list[str] = []

    async def job(name: str, wait: bool = False) -> None:
        started.append(name)
        if wait:
            await gate.wait()
        started.append(name + " done")

    q.put(lambda: job("a1", wait=True), key="a")
    q.put(lambda: job("a2"), key="a")  # waits for a1: the same session
    q.put(lambda: job("b1"), key="b")  # does not
    q.start()
    for _ in range(20):
        await asyncio.sleep(0)
    assert started == ["a1", "b1", "b1 done"]
    gate.set()
    await q.join()
    assert started[3:] == ["a1 done", "a2", "a2 done"]
    await q.close()


async def test_no_more_jobs_run_at_once_than_the_concurrency() -> None:
    q = WriteQueue(10, Health(), retry_s=0, concurrency=2)
    gate = asyncio.Event()
    running: list[str] = []

    async def job(name: str) -> None:
        running.append(name)
        await gate.wait()

    for name in "abc":
        q.put(lambda name=name: job(name), key=name)  # type: ignore[misc]
    q.start()
    for _ in range(20):
        await asyncio.sleep(0)
    assert running == ["a", "b"]
    gate.set()
    await q.join()
    assert running == ["a", "b", "c"]
    await q.close()


async def test_close_gives_up_on_jobs_still_running_after_its_timeout() -> None:
    q = WriteQueue(10, Health(), retry_s=0)
    never = asyncio.Event()
    q.put(never.wait, key="a")
    q.start()
    await asyncio.sleep(0)
    await asyncio.wait_for(q.close(timeout_s=0.05), 5)  # returns: the job is cancelled


def _recorder(done: list[str]) -> tuple[asyncio.Event, Callable[..., Job]]:
    gate = asyncio.Event()

    def job(name: str, *, wait: bool = False) -> Job:
        async def run() -> None:
            if wait:
                await gate.wait()
            done.append(name)
        return run

    return gate, job


async def test_a_later_job_that_covers_the_queued_ones_supersedes_them() -> None:
    q, failures, depths = queue(size=3)
    done: list[str] = []
    gate, job = _recorder(done)
    q.start()
    # A session's first write is under way; three more of its requests' writes queue
    # behind it, each covering the turns of the one before.
    assert q.put(job("running", wait=True), 10, key="s", covers=frozenset({"t1"}))
    await asyncio.sleep(0)
    assert q.put(job("a"), 20, key="s", covers=frozenset({"t1", "t2"}))
    assert q.put(job("b"), 30, key="s", covers=frozenset({"t1", "t2", "t3"}))
    # The queue is full (3 jobs), yet the next covering write takes the place of the two it
    # supersedes rather than being refused.
    assert q.put(job("c"), 40, key="s", covers=frozenset({"t1", "t2", "t3", "t4"}))
    gate.set()
    await q.join()
    assert done == ["running", "c"]  # the one under way was not stopped
    assert q.superseded == 2 and q.dropped == 0 and failures == []
    assert q.bytes == 0 and depths[-1] == 0
    await q.close()


async def test_a_job_is_superseded_only_by_one_that_covers_all_of_it() -> None:
    q, _, _ = queue()
    done: list[str] = []
    gate, job = _recorder(done)
    q.start()
    q.put(job("running", wait=True), key="s", covers=frozenset())
    await asyncio.sleep(0)
    # After a compaction the history no longer holds t1: the earlier write still must run.
    q.put(job("before"), key="s", covers=frozenset({"t1", "t2"}))
    q.put(job("after"), key="s", covers=frozenset({"summary", "t2", "t3"}))
    # Another session's write, and a write of this one that covers nothing (an answer's, a
    # TTL refresh): neither supersedes nor is superseded.
    q.put(job("other"), key="o", covers=frozenset({"t1", "t2", "t3", "summary"}))
    q.put(job("refresh"), key="s")
    q.put(job("last"), key="s", covers=frozenset({"summary", "t2", "t3", "t4"}))
    gate.set()
    await q.join()
    assert sorted(done) == ["before", "last", "other", "refresh", "running"]
    assert done.index("before") < done.index("refresh") < done.index("last")
    assert q.superseded == 1  # "after", by "last"
    await q.close()


async def test_a_refused_covering_job_supersedes_nothing() -> None:
    failures: list[int] = []
    q = WriteQueue(10, Health(lambda: failures.append(1)), max_bytes=100, retry_s=0)
    done: list[str] = []
    gate, job = _recorder(done)
    q.start()
    q.put(job("running", wait=True), 10, key="s")
    await asyncio.sleep(0)
    q.put(job("queued"), 20, key="s", covers=frozenset({"t1"}))
    # Over the byte budget even without the job it would supersede: refused, and that job
    # still runs.
    assert not q.put(job("new"), 95, key="s", covers=frozenset({"t1", "t2"}))
    gate.set()
    await q.join()
    assert done == ["running", "queued"] and q.dropped == 1 and q.superseded == 0
    await q.close()
