"""The lanes serve the oldest user turn first, episode writes after a turn's own."""

from __future__ import annotations

import asyncio
import fcntl
import math
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from ctxproxy.memory import lanes
from ctxproxy.memory.lanes import Lane
from ctxproxy.memory.store_sqlite import SqliteStore
from tests.memory.test_sqlite_store import SCOPE, mem


async def _in_task(mark: object, lane: Lane, fn: object) -> asyncio.Future[object]:
    """Hand ``fn`` to ``lane`` from a task of its own, marked as ``mark`` says."""

    async def hand_in() -> object:
        if mark == "background":
            lanes.background()
        elif isinstance(mark, float):
            lanes.turn(mark)
        elif isinstance(mark, tuple):
            lanes.turn(*mark)
        return await asyncio.get_running_loop().run_in_executor(lane, fn)

    task = asyncio.ensure_future(hand_in())
    await asyncio.sleep(0)  # submitted now, in this order
    return task


def _blocked(lane: Lane) -> threading.Event:
    """Keep the lane's one thread busy until the event is set."""
    release = threading.Event()
    started = threading.Event()

    def hold() -> None:
        started.set()
        release.wait(10)

    lane.submit(hold)
    assert started.wait(5)
    return release


async def test_the_oldest_turns_work_goes_first_whatever_order_it_came_in() -> None:
    lane = Lane(1, "test-lane")
    release = _blocked(lane)
    done: list[str] = []
    began = time.monotonic()
    tasks = [await _in_task(began - age, lane, lambda name=name: done.append(name))
             for name, age in [("newest", 0.0), ("oldest", 3.0), ("middle", 1.0)]]
    release.set()
    await asyncio.gather(*tasks)
    assert done == ["oldest", "middle", "newest"]
    lane.shutdown()


async def test_a_turn_past_its_budget_goes_behind_the_turns_still_in_time() -> None:
    """Its request went without it: oldest first would make the younger turns late too."""
    lane = Lane(1, "test-lane")
    release = _blocked(lane)
    done: list[str] = []
    now = time.monotonic()
    tasks = [
        # Began 3 s ago with a budget of 1 s: late since 2 s ago.
        await _in_task((now - 3.0, 1.0), lane, lambda: done.append("late")),
        await _in_task((now - 0.2, 1.0), lane, lambda: done.append("in time")),
        await _in_task((now - 1.5, math.inf), lane, lambda: done.append("no budget")),
        await _in_task("background", lane, lambda: done.append("episode")),
    ]
    release.set()
    await asyncio.gather(*tasks)
    # Due when the lane found it late: after every turn that began before that, and still
    # before the background work handed in with it.
    assert done == ["no budget", "in time", "late", "episode"]
    lane.shutdown()


async def test_a_late_turns_work_runs_at_once_when_nothing_else_waits() -> None:
    lane = Lane(1, "test-lane")
    release = _blocked(lane)
    now = time.monotonic()
    task = await _in_task((now - 10.0, 1.0), lane, lambda: "ran")
    release.set()
    assert await asyncio.wait_for(task, 5) == "ran"
    lane.shutdown()


async def test_unmarked_work_is_first_come_first_served() -> None:
    lane = Lane(1, "test-lane")
    release = _blocked(lane)
    done: list[int] = []
    tasks = [await _in_task(None, lane, lambda n=n: done.append(n)) for n in range(5)]
    release.set()
    await asyncio.gather(*tasks)
    assert done == [0, 1, 2, 3, 4]
    lane.shutdown()


async def test_background_work_waits_for_turns_but_not_for_ever() -> None:
    lane = Lane(1, "test-lane")
    release = _blocked(lane)
    done: list[str] = []
    now = time.monotonic()
    tasks = [
        await _in_task("background", lane, lambda: done.append("episode")),
        # A turn that began just now goes before the episode write handed in with it ...
        await _in_task(now, lane, lambda: done.append("turn")),
        # ... one that comes BACKGROUND_DELAY_S after it goes after it.
        await _in_task(now + lanes.BACKGROUND_DELAY_S + 1.0, lane,
                       lambda: done.append("later turn")),
    ]
    release.set()
    await asyncio.gather(*tasks)
    assert done == ["turn", "episode", "later turn"]
    lane.shutdown()


async def test_a_failure_reaches_whoever_awaits_it_and_the_lane_goes_on() -> None:
    lane = Lane(2, "test-lane")
    loop = asyncio.get_running_loop()

    def boom() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await loop.run_in_executor(lane, boom)
    assert await loop.run_in_executor(lane, lambda: 41 + 1) == 42
    lane.shutdown()


def test_shutdown_cancels_what_has_not_started_and_refuses_more() -> None:
    lane = Lane(1, "test-lane")
    release = _blocked(lane)
    pending = lane.submit(lambda: "never")
    closing = threading.Thread(target=lane.shutdown, kwargs={"cancel_futures": True})
    closing.start()
    release.set()
    closing.join(5)
    assert not closing.is_alive() and pending.cancelled()
    with pytest.raises(RuntimeError):
        lane.submit(lambda: None)


def test_shutdown_waits_for_queued_work_without_cancel() -> None:
    lane = Lane(1, "test-lane")
    release = _blocked(lane)
    queued = lane.submit(lambda: "ran")
    release.set()
    lane.shutdown(wait=True)
    assert queued.result(0) == "ran"


async def test_a_turns_write_goes_before_episode_writes_queued_ahead_of_it(
    tmp_path: Path,
) -> None:
    """The store's one writer thread: a turn's own write (working memory, which the request
    waits for) is not held up by the episode writes already waiting for it."""
    path = tmp_path / "memory.sqlite3"
    store = SqliteStore(path)
    await store.open()
    other = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(other, fcntl.LOCK_EX)  # another worker mid-write: the writer thread waits
    landed: list[str] = []

    async def write(key: str, mark: str) -> None:
        if mark == "background":
            lanes.background()
        else:
            lanes.turn(time.monotonic())
        await store.upsert([mem(key, f"text of {key}")])
        landed.append(key)

    try:
        writes = [asyncio.ensure_future(write(f"episode-{n}", "background")) for n in range(4)]
        await asyncio.sleep(0.2)  # the first is on the writer thread, the rest wait
        writes.append(asyncio.ensure_future(write("working", "turn")))
        await asyncio.sleep(0.2)
    finally:
        fcntl.flock(other, fcntl.LOCK_UN)
        os.close(other)
    await asyncio.gather(*writes)
    assert landed == ["episode-0", "working", "episode-1", "episode-2", "episode-3"]
    assert len(await store.list(SCOPE)) == 5
    await store.close()


async def test_closing_work_goes_after_everything_handed_in_before_it() -> None:
    """A store closes its connection after the writes still queued, whatever they are due."""
    lane = Lane(1, "test-lane")
    release = _blocked(lane)
    done: list[str] = []
    tasks = [await _in_task("background", lane, lambda: done.append("episode")),
             await _in_task(None, lane, lambda: done.append("read"))]
    closing = lane.submit_last(lambda: done.append("close"))
    release.set()
    await asyncio.gather(*tasks, asyncio.wrap_future(closing))
    assert done == ["read", "episode", "close"]
    lane.shutdown()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="names in /proc are Linux's")
def test_a_lanes_threads_show_their_names_to_top_and_ps() -> None:
    def own_name() -> str:
        return Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()

    lane = Lane(2, "ctxproxy-sqlite-search")
    try:
        names = {lane.submit(own_name).result(timeout=5) for _ in range(20)}
    finally:
        lane.shutdown()
    assert names <= {"sqlite-search_0", "sqlite-search_1"} and names, names
