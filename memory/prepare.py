"""Preparing a user turn's memory, once per turn: split the history into turns, derive
working memory, read the standing selection and recall, render the blocks (see
``memory.step``). Every request of the turn waits on the same preparation.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Awaitable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from cachetools import LRUCache
from prometheus_client import Counter, Histogram

from ctxproxy.config import Settings
from ctxproxy.injectors import memory_blocks
from ctxproxy.memory import lanes
from ctxproxy.memory import turns as turns_
from ctxproxy.memory.cpu import Offload, placed, sized, small_history
from ctxproxy.memory.health import Health
from ctxproxy.memory.ingest import Ingester
from ctxproxy.memory.keep import Keep
from ctxproxy.memory.model import Memory, Scope, StoreError
from ctxproxy.memory.place import (
    Pinned,
    Placer,
    Prepared,
    Shown,
    TurnKey,
    developer_message,
    forwarded_turns,
)
from ctxproxy.memory.queue import WriteQueue
from ctxproxy.memory.recall import Candidate, Found, Recaller, Standing, standing_of
from ctxproxy.memory.snippets import lines_of
from ctxproxy.memory.working import Working, in_view
from ctxproxy.request import Exchange, digest

__all__ = ["STANDING_CACHED", "TURNS_CACHED", "Preparing", "TurnPreparer", "drop", "texts"]

TURNS_CACHED = 4096
STANDING_CACHED = 4096


class Preparing:
    """A user turn's preparation (its task), and the requests waiting for it: each woken
    from the task's last step, a turn of the event loop sooner than through the task's own
    callbacks (asyncio.wait), and a turn of a busy loop takes every other ready callback's
    time. ``answered``: one of its requests was answered with a success (its writes begin)."""

    __slots__ = ("_waiting", "answered", "task")

    def __init__(
        self, work: Coroutine[Any, Any, Prepared], reads: tuple[asyncio.Future[Any] | None, ...]
    ) -> None:
        """``work`` in a task; ``reads``: the ones it started with, which it drops as it ends."""
        self._waiting: list[asyncio.Future[None]] = []
        self.answered = False
        self.task = asyncio.create_task(self._run(work))
        self.task.add_done_callback(lambda _: self._ended(work, reads))

    async def _run(self, work: Coroutine[Any, Any, Prepared]) -> Prepared:
        try:
            return await work
        finally:
            self._wake_all()

    def _ended(
        self, work: Coroutine[Any, Any, Prepared], reads: tuple[asyncio.Future[Any] | None, ...]
    ) -> None:
        # A task cancelled before its first step (a shutdown) never started ``work`` (which
        # drops its reads) nor ran _run's finally.
        work.close()
        for read in reads:
            drop(read)
        self._wake_all()

    def _wake_all(self) -> None:
        for waiter in self._waiting:
            _wake(waiter)
        self._waiting.clear()

    async def wait(self, timeout_s: float) -> None:
        """Until the task has ended, or ``timeout_s`` has passed (the task goes on)."""
        if self.task.done():
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiting.append(waiter)
        timer = loop.call_later(timeout_s, _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            # Woken by the timer (or cancelled): the task may go on for long (a store that
            # hangs), and each request of the turn would leave its waiter here until it ends.
            with contextlib.suppress(ValueError):
                self._waiting.remove(waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def drop(task: asyncio.Future[Any] | None) -> None:
    """Cancel ``task`` unless it is done; a failure it ended with counts as seen (the
    store's failure is counted by what awaited it, or by the read that failed first)."""
    if task is None:
        return
    if not task.done():
        task.cancel()
    elif not task.cancelled():
        task.exception()


def texts(
    standing: list[Memory], recalled: list[Memory]
) -> tuple[str, str, tuple[tuple[str, frozenset[str]], ...]]:
    """The standing and recall blocks, and the lines recall shows of each memory."""
    return (
        memory_blocks.render(standing),
        memory_blocks.render(recalled),
        tuple((m.memory_id, lines_of(m.text)) for m in recalled),
    )


class _Begun(NamedTuple):
    """A turn as its preparation began (TurnPreparer._begin): its clocks, what the window
    forwards, and the reads already out."""

    began: float  # time.monotonic()
    now: float  # time.time()
    own: str  # the session whose working memory it has ('' when the client names none)
    forwarded: list[tuple[int, TurnKey]]
    newest: Shown | None  # the turn's recall, when an earlier request made it
    found: asyncio.Future[Found] | None
    pinned: Pinned | None
    reading: asyncio.Future[Standing] | None


@dataclass(frozen=True, slots=True)
class _Split:
    """The history as a turn's preparation reads it (TurnPreparer._split)."""

    turns: list[turns_.Turn]
    window: set[str]  # the prompt keys of the turns the window forwards
    whole: set[str]  # ... of those it forwards whole (no masked outputs)
    kept: list[Shown | None]  # the earlier forwarded turns' recall messages
    prompts: tuple[str, ...]  # the prompts of the turns the window forwards
    deriving: asyncio.Future[list[Memory]] | None  # working memory, derived meanwhile


@dataclass(frozen=True, slots=True)
class Metrics:
    """What the preparation counts (None: not counted)."""

    recall_seconds: Histogram | None = None
    recalled: Counter | None = None
    recall_modes: Counter | None = None  # labelled by mode


class TurnPreparer:
    """Prepares each user turn once and keeps it for the turn's other requests (an LRU by
    turn); see the module docstring."""

    def __init__(
        self, settings: Settings, *, working: Working, ingester: Ingester,
        recaller: Recaller, queue: WriteQueue, health: Health, placer: Placer,
        offload: Offload, metrics: Metrics,
    ) -> None:
        self._settings = settings
        self._budget_s = settings.memory_timeout_ms / 1000
        self._working = working
        self._ingester = ingester
        self._recaller = recaller
        self._queue = queue
        self._health = health
        self._placer = placer
        self._offload = offload
        self._metrics = metrics
        self._turns: LRUCache[tuple[object, ...], Preparing] = LRUCache(TURNS_CACHED)
        # (scope, session) -> (candidates' signature, the standing selection)
        self._standing: LRUCache[
            tuple[Scope, str], tuple[object, tuple[list[Memory], int]]
        ] = LRUCache(STANDING_CACHED)

    def turn(
        self, ex: Exchange, scope: Scope, session: str
    ) -> tuple[Preparing, tuple[object, ...]]:
        """The request's turn, being prepared or done, and its key (noted: a hit or a miss)."""
        key = self._turn_key(scope, session, ex)
        turn = self._turns.get(key)
        ex.notes.memory_cache = "miss" if turn is None else "hit"
        if turn is None:
            # The turn's task, not the request's: a client that hangs up does not cancel it
            # for the other requests of the turn waiting on it. Its reads go out now, in this
            # step of the loop (the task's first step is a turn of the loop later), in a
            # context of their own where the lanes see the turn's marks.
            turn = contextvars.copy_context().run(self._begin, scope, session, ex)
            self._turns[key] = turn
        return turn, key

    def forget(self, key: tuple[object, ...], turn: Preparing | None = None) -> None:
        """Prepare the turn ``key`` again next time (only while it is ``turn``, if given)."""
        if turn is None:
            self._turns.pop(key, None)
        elif self._turns.get(key) is turn:
            del self._turns[key]

    async def close(self) -> None:
        """Cancel the turns still being prepared (shutdown)."""
        tasks = [turn.task for turn in self._turns.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        self._turns.clear()

    def _turn_key(self, scope: Scope, session: str, ex: Exchange) -> tuple[object, ...]:
        if ex.identity.turn_id:
            return (scope, session, ex.identity.turn_id)
        # No turn id: the newest prompt, and how many came before it, name the turn.
        history = ex.history
        return (scope, session, history.turns, digest(history.prompt_text(history.turns - 1)))

    def _begin(self, scope: Scope, session: str, ex: Exchange) -> Preparing:
        """Mark the turn for the lanes, hand its reads to the store, and start its task."""
        # Every hop of this turn (and of the reads it starts) goes before later turns', while
        # its request can still use it.
        began = time.monotonic()
        lanes.turn(began, self._budget_s)
        now = time.time()
        # Working memory is a session's own: a client that names no session (no session id,
        # no prompt_cache_key) gets none, since its stand-in session (its first prompt) is
        # shared by everyone who opens the same way. Its turns are still remembered.
        own = session if ex.identity.session_id else ""
        # What the window did, read now: a request that waits no longer may undo it.
        forwarded = forwarded_turns(ex, scope, session)
        newest = self._placer.shown(forwarded[-1][1]) if forwarded else None
        # This turn's recall reads go out first (they need only its prompt), beside the
        # split, working memory's writes and the standing selection's reads: only the pick
        # needs those. The search is the longest hop of a turn.
        history = ex.history
        found = (None if newest is not None  # this turn recalled already (a retry, ...)
                 else self._recaller.begin(scope, own, history.prompt_text(history.turns - 1),
                                           now))
        # Until the window cuts, the forwarded history starts with the pinned block: what it
        # shows is the standing selection, and nothing needs reading. Else the reads go out
        # now too (the window only filters what they bring).
        pinned = self._placer.pin(scope, session, forwarded[0][1] if forwarded else None)
        reading = self._recaller.read_standing(scope, own, now) if pinned is None else None
        return Preparing(self._prepare(scope, session, ex, _Begun(
            began, now, own, forwarded, newest, found, pinned, reading)),
            (found, reading))

    async def _shared(self, scope: Scope, session: str, begun: _Begun) -> _Begun:
        """``begun`` with what another replica placed for this session (its recall of this
        turn, its pinned block): the reads those make needless are dropped."""
        if self._placer.placement != "split" or not begun.forwarded:
            return begun
        await self._placer.load(scope, session, begun.forwarded)
        newest = begun.newest or self._placer.shown(begun.forwarded[-1][1])
        pinned = begun.pinned or self._placer.pin(scope, session, begun.forwarded[0][1])
        found, reading = begun.found, begun.reading
        if newest is not None and found is not None:
            drop(found)
            found = None
        if pinned is not None and reading is not None:
            drop(reading)
            reading = None
        return begun._replace(newest=newest, found=found, pinned=pinned, reading=reading)

    async def _prepare(self, scope: Scope, session: str, ex: Exchange, begun: _Begun) -> Prepared:
        try:
            begun = await self._shared(scope, session, begun)
            split = await self._split(scope, session, ex, begun)
        except BaseException:
            drop(begun.found)
            drop(begun.reading)
            raise
        try:
            standing, used, recalled, mode = await self._recall(
                scope, begun.own, (begun.found, begun.reading, begun.pinned),
                split, begun.now)
        except StoreError as exc:
            self._health.failed("recall", exc)
            return Prepared(degraded=True, keep=await self._kept(
                scope, session, split, len(ex.raw), begun.now))
        except BaseException:
            drop(split.deriving)
            raise
        finally:
            if self._metrics.recall_seconds is not None:
                # From the turn's first step (_begin), its reads' start.
                self._metrics.recall_seconds.observe(time.monotonic() - begun.began)
        keep = await self._kept(scope, session, split, len(ex.raw), begun.now)
        return await self._prepared(keep, standing, used, recalled, mode, begun)

    async def _split(
        self, scope: Scope, session: str, ex: Exchange, begun: _Begun
    ) -> _Split:
        """The history in turns, what the window forwards of them, and working memory's
        derivation under way (a session's own only)."""
        history, masked = ex.history, ex.masked_turns
        # Splitting digests every item of the history: a long one in a worker, not on the
        # loop (a short one costs less there than the trip to a worker).
        turns = await placed(self._offload, small_history(len(history.items), len(ex.raw)),
                             turns_.split, session, history, ex.first_turn)
        # Memories the model still sees in the window: the turns it shows whole (a turn with
        # masked outputs is not: recall may show the lines masking removed), and the recall
        # messages kept in place.
        deriving = None
        if begun.own:
            # Derived while recall reads; written once a request of the turn is answered.
            deriving = asyncio.ensure_future(self._working.derived(
                scope, session, turns, now=begun.now, compacted=history.compacted))
        return _Split(
            turns,
            window={t.prompt_key for t in turns if t.in_window},
            whole={t.prompt_key for t in turns if t.in_window and t.index not in masked},
            kept=[self._placer.shown(key) for _, key in begun.forwarded[:-1]],
            prompts=tuple(t.user for t in turns if t.in_window),
            deriving=deriving,
        )

    async def _prepared(
        self, keep: Keep, standing: list[Memory], used: int, recalled: list[Memory],
        mode: str | None, begun: _Begun,
    ) -> Prepared:
        """The turn's blocks rendered, and (split) its recall message's bytes decided."""
        if self._metrics.recalled is not None:
            self._metrics.recalled.inc(len(standing) + len(recalled))
        if self._metrics.recall_modes is not None and mode is not None:
            self._metrics.recall_modes.labels(mode).inc()
        standing_text, recall_text, recall_lines = await sized(
            self._offload, sum(len(m.text) for m in (*standing, *recalled)),
            texts, standing, recalled,
        )
        message = developer_message(recall_text) if recall_text else None
        forwarded, newest = begun.forwarded, begun.newest
        recalled_ids = tuple(m.memory_id for m in recalled)
        if newest is not None:  # recalled by an earlier request, maybe on another replica
            recalled_ids = tuple(memory_id for memory_id, _ in newest.lines)
        if forwarded and self._placer.placement == "split":
            first, last = forwarded[0][1], forwarded[-1][1]
            shown = pinned = None
            if newest is None:  # the first to recall for this turn decides its bytes
                newest = shown = Shown(message, recall_lines)
            if begun.pinned is None and self._placer.pin(first[0], first[1], first) is None:
                # The standing block this request puts before its first turn, pinned now (as
                # Placer.apply would) so that the store has it for the session's next request.
                pinned = Pinned(first, developer_message(standing_text) if standing_text
                                else None, tuple(standing), used)
            if shown is not None or pinned is not None:
                await self._placer.share(last, shown, pinned, now=begun.now)
            message = newest.message
        return Prepared(
            keep=keep,
            standing=standing_text,
            chosen=tuple(standing),
            used=used,
            recall=recall_text,
            recalled=len(standing) + len(recalled_ids),
            ids=(*(m.memory_id for m in standing), *recalled_ids),
            message=message,
            mode=mode,
        )

    async def _recall(
        self, scope: Scope, own: str,
        reads: tuple[asyncio.Future[Found] | None, asyncio.Future[Standing] | None,
                     Pinned | None],
        split: _Split, now: float,
    ) -> tuple[list[Memory], int, list[Memory], str | None]:
        """The standing selection, the tokens it takes, what recall picked and how it
        searched (``split``: what the window forwards). Raises StoreError."""
        found, reading, pinned = reads
        whole, kept = split.whole, split.kept
        mode: str | None = None
        recalled: list[Memory] = []
        try:
            if pinned is not None:
                standing, used = list(pinned.chosen), pinned.used
            else:
                assert reading is not None  # read in _begin whenever nothing is pinned
                standing, used = await self._standing_for(scope, own, reading, split, now)
            if found is not None:
                seen: dict[str, set[str]] = {}
                for shown in kept:
                    for memory_id, lines in shown.lines if shown is not None else ():
                        seen.setdefault(memory_id, set()).update(lines)
                gathered = await found
                mode = gathered.mode
                hits = [h.memory for part in (*gathered.searched, *gathered.near) for h in part]
                said = await self._in_view([*hits, *gathered.recent], split)
                recalled = await self._recaller.pick(
                    gathered, window=whole, exclude={m.memory_id for m in standing} | said,
                    shown=seen, budget=self._recaller.budget - used,
                    min_score=self._settings.recall_min_score,
                )
            self._health.ok("recall")
        finally:
            drop(found)
            drop(reading)
        return standing, used, recalled, mode

    async def _kept(
        self, scope: Scope, session: str, split: _Split, size: int, now: float,
    ) -> Keep:
        """What the turn keeps once a request of it is answered: its working memory, and its
        complete turns as episodes (their job keeps the parsed history alive until it runs:
        about the request's bytes; a later request's job that has them all stands for it)."""
        turns = split.turns
        derived = await split.deriving if split.deriving is not None else []
        working = self._working

        def episodes() -> None:
            self._queue.put(lambda: self._ingester.write(scope, session, turns, now=now),
                            size, key=(scope, session),
                            covers=frozenset(t.key for t in turns if t.complete))

        def write() -> asyncio.Future[list[Memory]]:
            return asyncio.ensure_future(self._working_memory(
                working.write(scope, session, derived, now=now)))

        return Keep(episodes, write if derived else None)

    async def _working_memory(self, work: Awaitable[list[Memory]]) -> list[Memory]:
        """``work``'s records; [] when the store failed (counted)."""
        try:
            records = await work
        except StoreError as exc:
            self._health.failed("working memory", exc)
            return []
        self._health.ok("working memory")
        return records

    async def _standing_for(
        self, scope: Scope, session: str, reading: asyncio.Future[Standing],
        split: _Split, now: float,
    ) -> tuple[list[Memory], int]:
        """The standing selection and the tokens it takes, chosen again only when its
        candidates change (a window cut or a new memory), not when the clock moves their
        scores. Working memory the forwarded turns say is in view, not standing."""
        read = await reading
        candidates = standing_of(read, split.window)
        said = await self._in_view([c.memory for c in candidates], split)
        candidates = [c for c in candidates if c.memory.memory_id not in said]
        signature = tuple(sorted((c.memory.memory_id, c.memory.text) for c in candidates))
        where = (scope, session)
        cached = self._standing.get(where)
        if cached is not None and cached[0] == signature:
            return cached[1]
        chosen = await sized(self._offload, sum(len(c.memory.text) for c in candidates),
                             self._choose_standing, candidates, now)
        self._standing[where] = (signature, chosen)
        return chosen

    async def _in_view(self, memories: Sequence[Memory], split: _Split) -> set[str]:
        """The ids of the working memories among ``memories`` that a turn the window
        forwards says: its record now (the history derived again: a constraint restated, the
        task of a prompt in view), or its text word for word (``working.in_view``; a long
        prompt's sentences past those derive reads)."""
        working = [m for m in memories if m.type == "working"]
        if not working:
            return set()
        derived = await split.deriving if split.deriving is not None else []
        restated = {m.key for m in derived if m.attrs.get("prompt") in split.window}
        prompts = split.prompts
        # Reads every forwarded prompt: a long one in a worker, not on the loop.
        said = await sized(self._offload, sum(map(len, prompts)) + sum(
            len(m.text) for m in working), in_view, working, prompts)
        return said | {m.memory_id for m in working if m.key in restated}

    def _choose_standing(
        self, candidates: list[Candidate], now: float
    ) -> tuple[list[Memory], int]:
        chosen = self._recaller.standing(candidates, now)
        return chosen, self._recaller.cost(chosen) if chosen else 0
