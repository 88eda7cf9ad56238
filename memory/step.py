"""The memory pipeline step: remember the session, recall once per user turn, inject blocks.

Per user turn (the first request of it): split the history into turns, write working memory
(before forwarding), queue the episodes, recall. The result is cached for the turn, so every
request of its tool loop gets the same bytes and costs a dictionary lookup. Any store failure
leaves the request without memory blocks; it is counted, logged once, and never fails it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from config import Settings
from injectors import memory_blocks
from injectors.instructions import SEPARATOR, append_block
from memory import turns as turns_
from memory.health import Health
from memory.ingest import Ingester
from memory.model import Memory, Scope, StoreError, user_ref
from memory.queue import WriteQueue
from memory.recall import Recaller
from memory.working import Working
from proxy.metrics import Metrics
from proxy.pipeline import untouchable
from proxy.request import Exchange, Identity, Item
from proxy.window import is_turn_start, message_text

__all__ = ["MemoryStep", "Prepared", "scope_of"]

TURNS_CACHED = 4096
STANDING_CACHED = 4096


def scope_of(settings: Settings, identity: Identity) -> Scope:
    """Whose memory a request reads and writes."""
    return Scope(
        settings.service_id, identity.team_id or "", identity.agent_id or "",
        user_ref(identity.user_key),
    )


@dataclass(frozen=True, slots=True)
class Prepared:
    """What one user turn gets: the same for every request of the turn."""

    standing: str = ""  # the slow blocks (working, semantic)
    recall: str = ""  # this turn's recall
    recalled: int = 0
    degraded: bool = False
    message: dict[str, Any] | None = field(default=None, compare=False)  # recall, as an item


def _developer_message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "developer",
            "content": [{"type": "input_text", "text": text}]}


def _newest_turn(items: Sequence[Item]) -> int | None:
    for i in range(len(items) - 1, -1, -1):
        item = items[i]
        if isinstance(item, dict) and is_turn_start(item):
            return i
    return None


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
        metrics: Metrics,
    ) -> None:
        self._settings = settings
        self._placement: Literal["split", "instructions"] = settings.memory_placement
        self._working = working
        self._ingester = ingester
        self._recaller = recaller
        self._queue = queue
        self._health = health
        self._metrics = metrics
        self._turns: OrderedDict[tuple[object, ...], asyncio.Task[Prepared]] = OrderedDict()
        # (scope, session) -> (candidates' signature, the standing selection)
        self._standing: OrderedDict[tuple[Scope, str], tuple[object, list[Memory]]] = (
            OrderedDict()
        )

    async def __call__(self, ex: Exchange) -> None:
        if ex.items is None or not ex.history or untouchable(ex):
            return
        session = turns_.session_key(ex.identity.session_id, ex.history)
        if session is None:
            return
        scope = scope_of(self._settings, ex.identity)
        key = self._turn_key(scope, session, ex)
        task = self._turns.get(key)
        ex.notes["memory_cache"] = "miss" if task is None else "hit"
        if task is None:
            # The turn's task, not the request's: a client that hangs up does not cancel it
            # for the other requests of the turn waiting on it.
            task = asyncio.create_task(self._prepare(scope, session, ex))
            self._turns[key] = task
            while len(self._turns) > TURNS_CACHED:
                self._turns.popitem(last=False)
        try:
            prepared = await asyncio.shield(task)
        except Exception:
            self._turns.pop(key, None)  # a bug, not a store failure: try again next time
            raise
        if prepared.degraded:
            ex.notes["memory_degraded"] = True
        ex.notes["memory_recalled"] = prepared.recalled
        self._apply(ex, prepared)

    async def close(self) -> None:
        """Cancel turns still being prepared (shutdown)."""
        for task in self._turns.values():
            task.cancel()
        for task in self._turns.values():
            with contextlib.suppress(BaseException):
                await task
        self._turns.clear()

    # --- once per user turn ----------------------------------------------------------------

    def _turn_key(self, scope: Scope, session: str, ex: Exchange) -> tuple[object, ...]:
        if ex.identity.turn_id:
            return (scope, session, ex.identity.turn_id)
        # No turn id: the newest prompt, and how many came before it, name the turn.
        items = ex.history
        newest = _newest_turn(items)
        text = message_text(items[newest]) if newest is not None else ""
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        return (scope, session, ex.turns_in, digest)

    async def _prepare(self, scope: Scope, session: str, ex: Exchange) -> Prepared:
        start = time.perf_counter()
        now = time.time()
        turns = turns_.split(session, ex.history, ex.cut)
        if not turns:
            return Prepared()
        try:
            await self._working.update(
                scope, session, turns, now=now, compacted=turns_.compacted(ex.history)
            )
            self._health.ok("working memory")
        except StoreError as exc:
            self._health.failed("working memory", exc)
        self._queue.put(lambda: self._ingester.write(scope, session, turns, now=now))
        window = {t.prompt_key for t in turns if t.in_window}
        try:
            standing = await self._standing_for(scope, session, window, now)
            used = self._recaller.cost(standing) if standing else 0
            recalled = await self._recaller.recall(
                scope, session, turns[-1].user, window=window,
                exclude={m.memory_id for m in standing},
                budget=self._recaller.budget - used, now=now,
            )
            self._health.ok("recall")
        except StoreError as exc:
            self._health.failed("recall", exc)
            return Prepared(degraded=True)
        finally:
            self._metrics.recall_seconds.observe(time.perf_counter() - start)
        self._metrics.recall_hits.inc(len(standing) + len(recalled))
        standing_text = memory_blocks.render(standing)
        recall_text = memory_blocks.render(recalled)
        return Prepared(
            standing=standing_text,
            recall=recall_text,
            recalled=len(standing) + len(recalled),
            message=_developer_message(recall_text) if recall_text else None,
        )

    async def _standing_for(
        self, scope: Scope, session: str, window: set[str], now: float
    ) -> list[Memory]:
        """The standing selection, chosen again only when its candidates change (a window cut
        or a new memory), not when the clock moves their scores."""
        candidates = await self._recaller.standing_candidates(scope, session, window, now)
        signature = tuple(sorted((c.memory.memory_id, c.memory.text) for c in candidates))
        where = (scope, session)
        cached = self._standing.get(where)
        if cached is not None and cached[0] == signature:
            self._standing.move_to_end(where)
            return cached[1]
        chosen = self._recaller.standing(candidates, now)
        self._standing[where] = (signature, chosen)
        while len(self._standing) > STANDING_CACHED:
            self._standing.popitem(last=False)
        return chosen

    # --- every request ---------------------------------------------------------------------

    def _apply(self, ex: Exchange, prepared: Prepared) -> None:
        if self._placement == "instructions":
            text = SEPARATOR.join(b for b in (prepared.standing, prepared.recall) if b)
            if text:
                ex.body = append_block(ex.body, text)
                ex.changed = True
            return
        if prepared.standing:
            ex.body = append_block(ex.body, prepared.standing)
            ex.changed = True
        items = ex.items
        if prepared.message is not None and items is not None:
            newest = _newest_turn(items)
            if newest is not None:
                ex.body = {**ex.body, "input": [*items[:newest], prepared.message,
                                                *items[newest:]]}
                ex.changed = True
