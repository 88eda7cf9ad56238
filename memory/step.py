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
in a bounded LRU and in the store, which a replica that prepares the session's turn first
reads: any replica puts the same bytes in.
The standing block (working and semantic memory) goes before the first forwarded turn and is
pinned there until the window cuts, so it never breaks the cache on its own. Until then it is
not chosen again: a turn reads no standing memory, and recall leaves out what the pinned block
shows (a memory made since is not in it, and recall may show it).
"""

from __future__ import annotations

import asyncio

from prometheus_client import Counter, Histogram

from ctxproxy.config import Settings
from ctxproxy.memory import turns as turns_
from ctxproxy.memory.answer import Answers, Awaiting
from ctxproxy.memory.cpu import Offload
from ctxproxy.memory.health import Health
from ctxproxy.memory.ingest import Ingester
from ctxproxy.memory.model import Scope, Store
from ctxproxy.memory.place import Placer, Prepared
from ctxproxy.memory.prepare import Metrics, TurnPreparer
from ctxproxy.memory.prepare import texts as _texts  # bench/recall_pick.py times it here
from ctxproxy.memory.queue import WriteQueue
from ctxproxy.memory.recall import Recaller
from ctxproxy.memory.working import Working
from ctxproxy.request import Answer, End, Exchange, Hold, Identity

__all__ = ["MemoryStep", "Prepared", "_texts", "scope_of"]


def scope_of(settings: Settings, identity: Identity) -> Scope:
    """Whose memory a request reads and writes."""
    return Scope(
        settings.service_id, identity.team_id or "", identity.agent_id or "", identity.owner
    )


class MemoryStep:
    """Typed memory for each request, in its phases (see the module docstring): before the
    upstream call, prepare the turn (``memory.prepare``) and place its blocks
    (``memory.place``); as it is answered, keep what the turn brought and store the turn the
    answer completes (``memory.answer``)."""

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
        placements: Store | None = None,
    ) -> None:
        self._settings = settings
        self._budget_s = settings.memory_timeout_ms / 1000
        self._health = health
        # With ``placements`` (the store), what went where is shared with every replica.
        self._placer = Placer(settings.memory_placement, forwarded_whole=forwarded_whole,
                              store=placements)
        self._preparer = TurnPreparer(
            settings, working=working, ingester=ingester, recaller=recaller, queue=queue,
            health=health, placer=self._placer, offload=offload,
            metrics=Metrics(recall_seconds, recalled, recall_modes),
        )
        self._answers = Answers(self._preparer, ingester=ingester, queue=queue,
                                budget_s=self._budget_s, offload=offload)

    async def __call__(self, ex: Exchange) -> None:
        if ex.items is None or not ex.history.turns or ex.history_is_foreign:
            return
        session = turns_.session_key(ex.identity.session_id, ex.history)
        if session is None:
            return
        scope = scope_of(self._settings, ex.identity)
        pending = turns_.last(session, ex.history, ex.first_turn)
        self._answers.forwarding(
            ex, Awaiting(scope, session, pending, len(ex.raw)) if pending is not None else None)
        turn, key = self._preparer.turn(ex, scope, session)
        self._answers.hold(ex, turn, key)
        task = turn.task
        # A slow store (a database going down, a lock held) costs this request at most the
        # budget; the turn's work goes on and later requests of the turn get its result.
        await turn.wait(self._budget_s)
        if not task.done():
            self._health.failed("memory in time", TimeoutError("store too slow"))
            self._placer.without_memory(ex, scope, session)
            return
        try:
            # The turn's later requests find it done: its result now, with no trip through
            # the loop.
            prepared = task.result()
        except Exception:
            self._preparer.forget(key)  # a bug, not a store failure: try again next time
            raise
        self._health.ok("memory in time")
        if prepared.degraded:
            self._placer.without_memory(ex, scope, session)
            return
        ex.notes.memory_recalled = prepared.recalled
        if prepared.mode is not None:
            ex.notes.recall_mode = prepared.mode
        if prepared.ids:
            ex.notes.memory_ids = prepared.ids
        self._placer.apply(ex, prepared, scope, session)

    def answering(self, ex: Exchange, status: int) -> Hold | None:
        return self._answers.answering(ex, status)

    def completed(self, ex: Exchange, answer: Answer) -> None:
        self._answers.completed(ex, answer)

    def ended(self, end: End) -> None:
        self._answers.ended(end)

    @property
    def awaiting(self) -> tuple[int, int]:
        """Requests whose answer may still complete their turn, and their request bytes."""
        return self._answers.awaiting

    async def close(self) -> None:
        """Let the working-memory writes under way end, and cancel the turns still being
        prepared (shutdown)."""
        await self._answers.close()
        await self._preparer.close()
