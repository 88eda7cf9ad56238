"""What memory does as a request is answered: keep what its turn brought once the upstream
says yes, store the turn its answer completes, and let go of a request that ends without
either (see ``memory.step``). What it knows of each request is kept on the exchange.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass

from ctxproxy.memory import turns as turns_
from ctxproxy.memory.cpu import Offload, placed, small_history
from ctxproxy.memory.ingest import Ingester
from ctxproxy.memory.model import Memory, Scope
from ctxproxy.memory.prepare import Preparing, TurnPreparer
from ctxproxy.memory.queue import WriteQueue
from ctxproxy.request import Answer, End, Exchange, Hold, Slot

__all__ = ["AWAITING", "AWAITING_BYTES", "Answers", "Awaiting"]

log = logging.getLogger("ctxproxy.memory")

AWAITING = 1024  # requests in flight whose answer may complete their turn (one turn each)
AWAITING_BYTES = 256 * 1024 * 1024  # and their request bytes, at most


@dataclass(frozen=True, slots=True)
class Held:
    """A request forwarded with its turn's memory: its answer's status decides whether the
    turn keeps what it brought (see Answers.answering)."""

    turn: Preparing
    key: tuple[object, ...]  # the turn's, in TurnPreparer


@dataclass(frozen=True, slots=True)
class Awaiting:
    """A request whose answer may complete its last turn (see Answers.completed)."""

    scope: Scope
    session: str
    turn: turns_.Turn  # the request's last turn, before the answer
    size: int  # the request's bytes


@dataclass(slots=True, eq=False)
class _Request:
    """What memory knows of one request, on its exchange."""

    held: Held | None = None  # until its answer's status is known
    awaiting: Awaiting | None = None  # until it ends, or is let go past the bounds


class Answers:
    """Memory's part once a request has gone upstream: its answering, completed and ended
    phases, and the working-memory writes under way."""

    def __init__(
        self, preparer: TurnPreparer, *, ingester: Ingester, queue: WriteQueue,
        budget_s: float, offload: Offload,
    ) -> None:
        self._preparer = preparer
        self._ingester = ingester
        self._queue = queue
        self._budget_s = budget_s
        self._offload = offload
        self._slot = Slot(_Request)
        # The requests whose answer may complete their newest turn (see ``completed``), oldest
        # first, with their bytes: each holds its turn on its exchange until it ends, and past
        # either bound the oldest is let go (its turn is stored when the session resends it).
        self._awaiting: OrderedDict[_Request, int] = OrderedDict()
        self._awaiting_bytes = 0
        self._writes: set[asyncio.Future[list[Memory]]] = set()

    @property
    def awaiting(self) -> tuple[int, int]:
        """Requests whose answer may still complete their turn, and their request bytes."""
        return len(self._awaiting), self._awaiting_bytes

    def forwarding(self, ex: Exchange, waiting: Awaiting | None) -> None:
        """``ex`` goes upstream; ``waiting``: the turn its answer may complete."""
        if waiting is not None:
            self._await(self._slot.of(ex), waiting)

    def hold(self, ex: Exchange, turn: Preparing, key: tuple[object, ...]) -> None:
        """``ex`` goes upstream with ``turn``'s memory: its answer decides what the turn keeps."""
        self._slot.of(ex).held = Held(turn, key)

    def answering(self, ex: Exchange, status: int) -> Hold | None:
        """The upstream answered ``ex`` with ``status`` (what the relay tells before it
        relays the answer). A success: its turn keeps what it brought, and what the relay
        awaits before the answer's end (the completed event) so that the session's next
        request (in any replica, after a compaction too) follows the working-memory write:
        it ends within the budget, from now. The answer's first bytes do not wait: the write
        goes on while the model answers.
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

    async def close(self) -> None:
        """Let the working-memory writes under way end (shutdown)."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

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

    def _refused(self, held: Held) -> None:
        """A request of ``held``'s turn ended without a success. Unless another request of
        the turn had one, the turn is prepared again next time: its writes are let go with
        it (a retry of the turn brings them again)."""
        if not held.turn.answered:
            self._preparer.forget(held.key, held.turn)

    def _answered(self, turn: Preparing) -> asyncio.Future[list[Memory]] | None:
        """A request of ``turn`` was answered with a success: the turn's writes begin, now or
        as its preparation ends. The working-memory write, once begun."""
        if not turn.answered:
            turn.answered = True
            if not turn.task.done():
                turn.task.add_done_callback(lambda _: self._begin_writes(turn))
                return None
        return self._begin_writes(turn)

    def _begin_writes(self, turn: Preparing) -> asyncio.Future[list[Memory]] | None:
        task = turn.task
        if not task.done() or task.cancelled() or task.exception() is not None:
            return None
        keep = task.result().keep
        if keep is None:
            return None
        if (writing := keep.begin()) is not None:  # None once begun
            self._keep(writing)
        return keep.writing

    def _keep(self, write: asyncio.Future[list[Memory]]) -> None:
        """Hold on to ``write`` until it ends (a task nothing references may be collected)."""
        self._writes.add(write)
        write.add_done_callback(self._written)

    def _written(self, write: asyncio.Future[list[Memory]]) -> None:
        self._writes.discard(write)
        if not write.cancelled() and (exc := write.exception()) is not None:
            # A store failure is counted by _working_memory: anything else is a bug.
            log.error("writing working memory failed", exc_info=exc)
