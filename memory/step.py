"""The memory pipeline step: remember the session, recall once per user turn, inject blocks.

Per user turn (the first request of it): split the history into turns, derive working memory,
recall. What the turn's requests brought is kept (working memory, episodes) only once one of
them is answered with a success: a request the upstream refuses (a key it does not know, a
rate limit, its failure) or that never reaches it leaves memory as it was. Working memory is
then written before that answer is relayed.
The result is cached for the turn, so every request of its tool loop gets the same bytes and
costs a dictionary lookup. Any store failure, or memory not ready within the budget, leaves
the request without this turn's memory: it gets the blocks the session's last request showed
while the window has not cut since, else the window's cut is undone (nothing would show what
it cut); it is counted, logged once, and never fails the request.

A turn's recall message stays where it was put (before the turn's prompt) for as long as the
turn is in the forwarded window: later requests re-insert the same bytes, so the forwarded
history only grows between window cuts and the provider's prompt cache keeps all of it. The
messages are kept per turn (a key derived from the history: the prompt's digest and position)
in a bounded LRU; a replica without them leaves them out, which is correct, just less cached.
The standing block (working and semantic memory) goes before the first forwarded turn and is
pinned there until the window cuts, so it never breaks the cache on its own. Until then it is
not chosen again: a turn reads no standing memory, and recall leaves out what the pinned block
shows (a memory made since is not in it, and recall may show it).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from cachetools import LRUCache
from prometheus_client import Counter, Histogram

from ctxproxy.config import Settings
from ctxproxy.injectors import memory_blocks
from ctxproxy.injectors.instructions import SEPARATOR, append_block
from ctxproxy.memory import lanes
from ctxproxy.memory import turns as turns_
from ctxproxy.memory.cpu import Offload, placed, sized, small_history
from ctxproxy.memory.health import Health
from ctxproxy.memory.ingest import Ingester
from ctxproxy.memory.keep import Keep
from ctxproxy.memory.model import Memory, Scope, StoreError
from ctxproxy.memory.queue import WriteQueue
from ctxproxy.memory.recall import Candidate, Found, Recaller, Standing, standing_of
from ctxproxy.memory.snippets import lines_of
from ctxproxy.memory.working import Working
from ctxproxy.request import Answer, End, Exchange, Hold, Identity, Item, Slot, digest

__all__ = ["MemoryStep", "Prepared", "scope_of"]

log = logging.getLogger("ctxproxy.memory")

TURNS_CACHED = 4096
STANDING_CACHED = 4096
RECALLS_CACHED = 16384  # turns' recall messages (a few hundred bytes each)
AWAITING = 1024  # requests in flight whose answer may complete their turn (one turn each)
AWAITING_BYTES = 256 * 1024 * 1024  # and their request bytes, at most

# (scope, session, the prompt's key, the turn's position in the history)
TurnKey = tuple[Scope, str, str, int]


def scope_of(settings: Settings, identity: Identity) -> Scope:
    """Whose memory a request reads and writes."""
    return Scope(
        settings.service_id, identity.team_id or "", identity.agent_id or "", identity.owner
    )


@dataclass(frozen=True, slots=True)
class Prepared:
    """What one user turn gets: the same for every request of the turn."""

    standing: str = ""  # the slow blocks (working, semantic)
    chosen: tuple[Memory, ...] = ()  # the standing selection, and the tokens it takes
    used: int = 0
    recall: str = ""  # this turn's recall
    recalled: int = 0
    ids: tuple[str, ...] = ()  # the memories shown, standing then recalled
    degraded: bool = False
    message: dict[str, Any] | None = field(default=None, compare=False)  # recall, as an item
    mode: str | None = None  # how recall searched (memory.recall.Mode)
    # The turn's writes, begun once one of its requests is answered with a success.
    keep: Keep | None = field(default=None, compare=False)


class _Turn:
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
            _drop(read)
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


class _Begun(NamedTuple):
    """A turn as its preparation began (MemoryStep._begin): its clocks, what the window
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
class Shown:
    """A turn's recall message as it was first sent (None: the turn had none), and the lines
    it shows of each memory in it."""

    message: dict[str, Any] | None
    lines: tuple[tuple[str, frozenset[str]], ...] = ()


def _developer_message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "developer",
            "content": [{"type": "input_text", "text": text}]}


@dataclass(frozen=True, slots=True)
class Pinned:
    """The standing message a session's forwarded history starts with until the window cuts
    (``first``: the first forwarded turn), and the selection it shows."""

    first: TurnKey
    message: dict[str, Any] | None
    chosen: tuple[Memory, ...]
    used: int


@dataclass(frozen=True, slots=True)
class Held:
    """A request forwarded with its turn's memory: its answer's status decides whether the
    turn keeps what it brought (see MemoryStep.answering)."""

    turn: _Turn
    key: tuple[object, ...]  # the turn's, in MemoryStep._turns


@dataclass(frozen=True, slots=True)
class Awaiting:
    """A request whose answer may complete its last turn (see MemoryStep.completed)."""

    scope: Scope
    session: str
    turn: turns_.Turn  # the request's last turn, before the answer
    size: int  # the request's bytes


@dataclass(slots=True, eq=False)
class _Request:
    """What the memory step knows of one request, on its exchange (MemoryStep's slot)."""

    held: Held | None = None  # until its answer's status is known
    awaiting: Awaiting | None = None  # until it ends, or is let go past the bounds


def _texts(
    standing: list[Memory], recalled: list[Memory]
) -> tuple[str, str, tuple[tuple[str, frozenset[str]], ...]]:
    """The standing and recall blocks, and the lines recall shows of each memory."""
    return (
        memory_blocks.render(standing),
        memory_blocks.render(recalled),
        tuple((m.memory_id, lines_of(m.text)) for m in recalled),
    )


def _drop(task: asyncio.Future[Any] | None) -> None:
    """Cancel ``task`` unless it is done; a failure it ended with counts as seen (the
    store's failure is counted by what awaited it, or by the read that failed first)."""
    if task is None:
        return
    if not task.done():
        task.cancel()
    elif not task.cancelled():
        task.exception()


def _forwarded_turns(
    ex: Exchange, scope: Scope, session: str
) -> list[tuple[int, TurnKey]]:
    """(position in the forwarded input, key) of each turn the request forwards."""
    keys = ex.history.prompt_keys(session)
    first = ex.first_turn
    return [
        (at, (scope, session, keys[first + n], first + n)) for n, at in enumerate(ex.starts)
    ]


class MemoryStep:
    """Typed memory for each request; see the module docstring."""

    name = "memory"

    def __init__(
        self,
        settings: Settings,
        *,
        working: Working,
        ingester: Ingester,
        recaller: Recaller,
        queue: WriteQueue,
        health: Health,
        recall_seconds: Histogram | None = None,
        recalled: Counter | None = None,
        offload: Offload = asyncio.to_thread,
        recall_modes: Counter | None = None,
        forwarded_whole: Counter | None = None,
    ) -> None:
        self._settings = settings
        self._budget_s = settings.memory_timeout_ms / 1000
        self._placement: Literal["split", "instructions"] = settings.memory_placement
        self._working = working
        self._ingester = ingester
        self._recaller = recaller
        self._queue = queue
        self._health = health
        self._recall_seconds = recall_seconds
        self._recalled = recalled
        self._recall_modes = recall_modes  # labelled by mode
        self._whole_count = forwarded_whole
        self._offload = offload
        self._slot = Slot(_Request)
        # The requests whose answer may complete their newest turn (see ``completed``), oldest
        # first, with their bytes: each holds its turn on its exchange until it ends, and past
        # either bound the oldest is let go (its turn is stored when the session resends it).
        self._awaiting: OrderedDict[_Request, int] = OrderedDict()
        self._awaiting_bytes = 0
        self._turns: LRUCache[tuple[object, ...], _Turn] = LRUCache(
            TURNS_CACHED
        )
        # (scope, session) -> (candidates' signature, the standing selection)
        self._standing: LRUCache[
            tuple[Scope, str], tuple[object, tuple[list[Memory], int]]
        ] = LRUCache(STANDING_CACHED)
        self._shown: LRUCache[TurnKey, Shown] = LRUCache(RECALLS_CACHED)
        self._pinned: LRUCache[tuple[Scope, str], Pinned] = LRUCache(STANDING_CACHED)
        # The working-memory writes until they end.
        self._writes: set[asyncio.Future[list[Memory]]] = set()

    async def __call__(self, ex: Exchange) -> None:
        if ex.items is None or not ex.history.turns or ex.history_is_foreign:
            return
        session = turns_.session_key(ex.identity.session_id, ex.history)
        if session is None:
            return
        scope = scope_of(self._settings, ex.identity)
        pending = turns_.last(session, ex.history, ex.first_turn)
        request = self._slot.of(ex)
        if pending is not None:
            self._await(request, Awaiting(scope, session, pending, len(ex.raw)))
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
        request.held = Held(turn, key)
        task = turn.task
        # A slow store (a database going down, a lock held) costs this request at most the
        # budget; the turn's work goes on and later requests of the turn get its result.
        await turn.wait(self._budget_s)
        if not task.done():
            self._health.failed("memory in time", TimeoutError("store too slow"))
            self._without_memory(ex, scope, session)
            return
        try:
            # The turn's later requests find it done: its result now, with no trip through
            # the loop.
            prepared = task.result()
        except Exception:
            self._turns.pop(key, None)  # a bug, not a store failure: try again next time
            raise
        self._health.ok("memory in time")
        if prepared.degraded:
            self._without_memory(ex, scope, session)
            return
        ex.notes.memory_recalled = prepared.recalled
        if prepared.mode is not None:
            ex.notes.recall_mode = prepared.mode
        if prepared.ids:
            ex.notes.memory_ids = prepared.ids
        self._apply(ex, prepared, scope, session)

    def _without_memory(self, ex: Exchange, scope: Scope, session: str) -> None:
        """No memory for this request (late, or the store failed). Until the window cuts
        again, this process still has the blocks the session's last request showed: they go
        in as they were (the same bytes: the prompt cache stays warm), without this turn's
        recall. Else nothing would show what the window cut, and the history goes out whole,
        as the client sent it. The turn's memory is still prepared for its next request."""
        ex.notes.memory_degraded = True
        forwarded = _forwarded_turns(ex, scope, session)
        pinned = self._pin(scope, session, forwarded[0][1] if forwarded else None)
        if self._placement == "split" and pinned is not None:
            self._apply(ex, Prepared(chosen=pinned.chosen, used=pinned.used), scope, session)
            return
        if ex.uncut():
            ex.notes.memory_whole = True
            if self._whole_count is not None:
                self._whole_count.inc()

    def completed(self, ex: Exchange, answer: Answer) -> None:
        """The answer relayed for ``ex`` (its ``response.completed`` output items, about
        ``answer.size`` bytes): when it ends the user turn, the turn is stored now, on the
        write queue, under the key it gets when the next request resends it."""
        request = self._slot.get(ex)
        waiting = self._unawait(request) if request is not None else None
        output, size = answer.output, answer.size
        if waiting is None or not turns_.is_final(output):
            return
        scope, session, pending, now = waiting.scope, waiting.session, waiting.turn, time.time()
        small = small_history(len(pending.items) + len(output), waiting.size + size)

        async def store() -> None:
            turn = await placed(self._offload, small, turns_.answered, session, pending, output)
            if turn is not None:
                await self._ingester.write(scope, session, [turn], now=now, answer=True)

        self._queue.put(store, size, key=(scope, session))

    def ended(self, end: End) -> None:
        """The request is over (answered, refused by the upstream, broken, or its client
        gone): nothing of it is kept for its answer, and a request that never had a status
        (the upstream unreachable, its client gone) keeps nothing of what it brought."""
        request = self._slot.get(end.exchange) if end.exchange is not None else None
        if request is None:
            return
        self._unawait(request)
        held, request.held = request.held, None
        if held is not None:
            self._refused(held)

    @property
    def awaiting(self) -> tuple[int, int]:
        """Requests whose answer may still complete their turn, and their request bytes."""
        return len(self._awaiting), self._awaiting_bytes

    def _await(self, request: _Request, waiting: Awaiting) -> None:
        self._unawait(request)  # a step run twice on one exchange: counted once
        # The oldest go first past either bound: their turns are stored when resent.
        while self._awaiting and (len(self._awaiting) >= AWAITING
                                  or self._awaiting_bytes + waiting.size > AWAITING_BYTES):
            oldest, size = self._awaiting.popitem(last=False)
            oldest.awaiting = None
            self._awaiting_bytes -= size
        if waiting.size <= AWAITING_BYTES:
            request.awaiting = waiting
            self._awaiting[request] = waiting.size
            self._awaiting_bytes += waiting.size

    def _unawait(self, request: _Request) -> Awaiting | None:
        waiting, request.awaiting = request.awaiting, None
        if waiting is not None:
            del self._awaiting[request]
            self._awaiting_bytes -= waiting.size
        return waiting

    def answering(self, ex: Exchange, status: int) -> Hold | None:
        """The upstream answered ``ex`` with ``status`` (what the relay tells before it
        relays the answer). A success: its turn keeps what
        it brought, and what the relay awaits before the answer's end (the completed event)
        so that the session's next request (in any replica, after a compaction too) follows
        the working-memory write: it ends within the budget, from now. The answer's first
        bytes do not wait: the write goes on while the model answers.
        Else nothing of the request is kept: a refused request (a browser's, with a history
        of its own making, say) never writes memory."""
        request = self._slot.get(ex)
        held = request.held if request is not None else None
        if request is None or held is None:
            return None
        request.held = None
        if not 200 <= status < 300:
            self._unawait(request)
            self._refused(held)
            return None
        writing = self._answered(held.turn)
        if writing is None or writing.done():
            return None
        deadline = time.monotonic() + self._budget_s

        def written() -> Awaitable[object]:
            # Past the budget the answer goes on without it; a failed write is counted (or
            # logged, _written) where it failed. (asyncio.wait: the write's end reaches the
            # answer a turn of the loop sooner than through wait_for(shield(...)).)
            return asyncio.wait((writing,), timeout=max(0.0, deadline - time.monotonic()))

        return written

    def _refused(self, held: Held) -> None:
        """A request of ``held``'s turn ended without a success. Unless another request of
        the turn had one, the turn is prepared again next time: its writes are let go with
        it (a retry of the turn brings them again)."""
        if not held.turn.answered and self._turns.get(held.key) is held.turn:
            del self._turns[held.key]

    def _answered(self, turn: _Turn) -> asyncio.Future[list[Memory]] | None:
        """A request of ``turn`` was answered with a success: the turn's writes begin, now or
        as its preparation ends. The working-memory write, once begun."""
        if not turn.answered:
            turn.answered = True
            if not turn.task.done():
                turn.task.add_done_callback(lambda _: self._begin_writes(turn))
                return None
        return self._begin_writes(turn)

    def _begin_writes(self, turn: _Turn) -> asyncio.Future[list[Memory]] | None:
        task = turn.task
        if not task.done() or task.cancelled() or task.exception() is not None:
            return None
        keep = task.result().keep
        if keep is None:
            return None
        if (writing := keep.begin()) is not None:  # None once begun
            self._keep(writing)
        return keep.writing

    async def close(self) -> None:
        """Cancel turns still being prepared and let the working-memory writes under way end
        (shutdown)."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
        tasks = [turn.task for turn in self._turns.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        self._turns.clear()

    # --- once per user turn ----------------------------------------------------------------

    def _turn_key(self, scope: Scope, session: str, ex: Exchange) -> tuple[object, ...]:
        if ex.identity.turn_id:
            return (scope, session, ex.identity.turn_id)
        # No turn id: the newest prompt, and how many came before it, name the turn.
        history = ex.history
        return (scope, session, history.turns, digest(history.prompt_text(history.turns - 1)))

    def _begin(self, scope: Scope, session: str, ex: Exchange) -> _Turn:
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
        forwarded = _forwarded_turns(ex, scope, session)
        newest = self._shown.get(forwarded[-1][1]) if forwarded else None
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
        pinned = self._pin(scope, session, forwarded[0][1] if forwarded else None)
        reading = self._recaller.read_standing(scope, own, now) if pinned is None else None
        return _Turn(self._prepare(scope, session, ex, _Begun(
            began, now, own, forwarded, newest, found, pinned, reading)),
            (found, reading))

    async def _prepare(self, scope: Scope, session: str, ex: Exchange, begun: _Begun) -> Prepared:
        began, now, own, forwarded, newest, found, pinned, reading = begun
        first, masked = ex.first_turn, ex.masked_turns
        history = ex.history
        deriving: asyncio.Future[list[Memory]] | None = None
        try:
            # Splitting digests every item of the history: a long one in a worker, not on
            # the loop (a short one costs less there than the trip to a worker).
            turns = await placed(self._offload, small_history(len(history.items), len(ex.raw)),
                                 turns_.split, session, history, first)
            window = {t.prompt_key for t in turns if t.in_window}
            kept = [self._shown.get(key) for _, key in forwarded[:-1]]
            # Memories the model still sees in the window: the turns it shows whole (a turn
            # with masked outputs is not: recall may show the lines masking removed), and the
            # recall messages kept in place.
            whole = {t.prompt_key for t in turns
                     if t.in_window and t.index not in masked}
            if own:
                # Derived while recall reads; written once a request of the turn is answered.
                deriving = asyncio.ensure_future(self._working.derived(
                    scope, session, turns, now=now, compacted=history.compacted))
        except BaseException:
            _drop(found)
            _drop(reading)
            raise
        try:
            standing, used, recalled, mode = await self._recall(
                scope, own, (found, reading, pinned), (window, whole, kept), now)
        except StoreError as exc:
            self._health.failed("recall", exc)
            return Prepared(degraded=True, keep=await self._kept(
                scope, session, turns, deriving, len(ex.raw), now))
        except BaseException:
            _drop(deriving)
            raise
        finally:
            if self._recall_seconds is not None:
                # From the turn's first step (_begin), its reads' start.
                self._recall_seconds.observe(time.monotonic() - began)
        keep = await self._kept(scope, session, turns, deriving, len(ex.raw), now)
        if self._recalled is not None:
            self._recalled.inc(len(standing) + len(recalled))
        if self._recall_modes is not None and mode is not None:
            self._recall_modes.labels(mode).inc()
        standing_text, recall_text, recall_lines = await sized(
            self._offload, sum(len(m.text) for m in (*standing, *recalled)),
            _texts, standing, recalled,
        )
        message = _developer_message(recall_text) if recall_text else None
        if forwarded and self._placement == "split":
            if newest is None:  # the first to recall for this turn decides its bytes
                newest = Shown(message, recall_lines)
                self._remember(forwarded[-1][1], newest)
            message = newest.message
        return Prepared(
            keep=keep,
            standing=standing_text,
            chosen=tuple(standing),
            used=used,
            recall=recall_text,
            recalled=len(standing) + len(recalled),
            ids=tuple(m.memory_id for m in (*standing, *recalled)),
            message=message,
            mode=mode,
        )

    async def _recall(
        self, scope: Scope, own: str,
        reads: tuple[asyncio.Future[Found] | None, asyncio.Future[Standing] | None,
                     Pinned | None],
        seen_in: tuple[set[str], set[str], list[Shown | None]], now: float,
    ) -> tuple[list[Memory], int, list[Memory], str | None]:
        """The standing selection, the tokens it takes, what recall picked and how it
        searched. Raises StoreError."""
        found, reading, pinned = reads
        window, whole, kept = seen_in
        mode: str | None = None
        recalled: list[Memory] = []
        try:
            if pinned is not None:
                standing, used = list(pinned.chosen), pinned.used
            else:
                assert reading is not None  # read in _begin whenever nothing is pinned
                standing, used = await self._standing_for(scope, own, reading, window, now)
            if found is not None:
                seen: dict[str, set[str]] = {}
                for shown in kept:
                    for memory_id, lines in shown.lines if shown is not None else ():
                        seen.setdefault(memory_id, set()).update(lines)
                gathered = await found
                mode = gathered.mode
                recalled = await self._recaller.pick(
                    gathered, window=whole, exclude={m.memory_id for m in standing},
                    shown=seen, budget=self._recaller.budget - used,
                    min_score=self._settings.recall_min_score,
                )
            self._health.ok("recall")
        finally:
            _drop(found)
            _drop(reading)
        return standing, used, recalled, mode

    async def _kept(
        self, scope: Scope, session: str, turns: list[turns_.Turn],
        deriving: asyncio.Future[list[Memory]] | None, size: int, now: float,
    ) -> Keep:
        """What the turn keeps once a request of it is answered: its working memory, and its
        complete turns as episodes (their job keeps the parsed history alive until it runs:
        about the request's bytes; a later request's job that has them all stands for it)."""
        derived = await deriving if deriving is not None else []
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

    def _keep(self, write: asyncio.Future[list[Memory]]) -> None:
        """Hold on to ``write`` until it ends (a task nothing references may be collected)."""
        self._writes.add(write)
        write.add_done_callback(self._written)

    def _written(self, write: asyncio.Future[list[Memory]]) -> None:
        self._writes.discard(write)
        if not write.cancelled() and (exc := write.exception()) is not None:
            # A store failure is counted by _working_memory: anything else is a bug.
            log.error("writing working memory failed", exc_info=exc)

    def _pin(self, scope: Scope, session: str, first: TurnKey | None) -> Pinned | None:
        """The session's pinned standing block, while ``first`` (the first forwarded turn)
        is still the turn it stands before: the window has not cut since it was pinned."""
        pinned = self._pinned.get((scope, session))
        if pinned is None or first is None or pinned.first != first:
            return None
        return pinned

    def _remember(self, key: TurnKey, shown: Shown) -> None:
        self._shown[key] = shown

    async def _standing_for(
        self, scope: Scope, session: str, reading: asyncio.Future[Standing],
        window: set[str], now: float,
    ) -> tuple[list[Memory], int]:
        """The standing selection and the tokens it takes, chosen again only when its
        candidates change (a window cut or a new memory), not when the clock moves their
        scores."""
        read = await reading
        candidates = standing_of(read, window)
        signature = tuple(sorted((c.memory.memory_id, c.memory.text) for c in candidates))
        where = (scope, session)
        cached = self._standing.get(where)
        if cached is not None and cached[0] == signature:
            return cached[1]
        chosen = await sized(self._offload, sum(len(c.memory.text) for c in candidates),
                             self._choose_standing, candidates, now)
        self._standing[where] = (signature, chosen)
        return chosen

    def _choose_standing(
        self, candidates: list[Candidate], now: float
    ) -> tuple[list[Memory], int]:
        chosen = self._recaller.standing(candidates, now)
        return chosen, self._recaller.cost(chosen) if chosen else 0

    # --- every request ---------------------------------------------------------------------

    def _apply(self, ex: Exchange, prepared: Prepared, scope: Scope, session: str) -> None:
        if self._placement == "instructions":
            text = SEPARATOR.join(b for b in (prepared.standing, prepared.recall) if b)
            if text:
                ex.body = append_block(ex.body, text)
                ex.changed = True
            return
        items = ex.items
        forwarded = _forwarded_turns(ex, scope, session)
        if items is None or not forwarded:
            return
        # Before each position, the messages that go there: the standing block before the
        # first forwarded turn, each turn's recall message before its prompt (the earlier
        # turns' from the LRU, the newest turn's from this turn's preparation).
        messages: dict[int, list[dict[str, Any]]] = {}
        standing = self._standing_message(scope, session, forwarded[0][1], prepared)
        if standing is not None:
            messages[forwarded[0][0]] = [standing]
            ex.stable_block = standing
        kept = 0
        for at, key in forwarded[:-1]:
            shown = self._shown.get(key)
            if shown is not None and shown.message is not None:
                messages.setdefault(at, []).append(shown.message)
                kept += 1
        ex.notes.recall_kept = kept
        if prepared.message is not None:
            messages.setdefault(forwarded[-1][0], []).append(prepared.message)
        if not messages:
            return
        out: list[Item] = []
        for at, item in enumerate(items):
            out.extend(messages.get(at, ()))
            out.append(item)
        # The messages stand right before their turns' prompts: the prompts move down.
        before = [at for at, inserted in sorted(messages.items()) for _ in inserted]
        ex.starts = [at + bisect_right(before, at) for at in ex.starts]
        ex.body = {**ex.body, "input": out}
        ex.changed = True

    def _standing_message(
        self, scope: Scope, session: str, first: TurnKey, prepared: Prepared
    ) -> dict[str, Any] | None:
        """The standing block as a message before the first forwarded turn: pinned, byte for
        byte, until the window cuts (the first forwarded turn changes). A new memory waits for
        the cut, where the prompt cache breaks anyway: in ``instructions``, a block that
        changed re-read the whole prompt after them, the agent's own context included."""
        pinned = self._pin(scope, session, first)
        if pinned is not None:
            return pinned.message
        text = prepared.standing
        message = _developer_message(text) if text else None
        self._pinned[(scope, session)] = Pinned(first, message, prepared.chosen, prepared.used)
        return message
