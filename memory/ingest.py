"""Episodic memory: every completed turn of a session, stored once, re-derived every turn.

Runs on the write queue, off the request path; rendering and redaction run in a worker
(``memory.cpu``). Each record is keyed by the session and the turn's content, so Codex's
resent history, a replay or a retry updates the same record; a write that was lost is made
good the next time the session's history comes by. A session's last turn is stored from the
answer the proxy relayed (``MemoryStep.answered``), under the key the next request gives it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Sequence

from cachetools import LRUCache

from ctxproxy.injectors.redact import redact
from ctxproxy.memory.cpu import Offload
from ctxproxy.memory.model import Memory, Scope, Store
from ctxproxy.memory.turns import USER_CHARS, Turn, render

__all__ = ["Ingester", "episodes"]

_SESSIONS = 4096
_KEYS = 262_144  # turn keys known as stored, over all sessions (about 200 bytes each)
_ANSWERS = 4096


def episodes(scope: Scope, session: str, turns: Sequence[Turn], *, now: float) -> list[Memory]:
    """The completed turns as episodic records, secrets redacted."""
    out = []
    for turn in turns:
        if not turn.complete:
            continue
        text, tools = render(turn)
        user = turn.user.strip()
        out.append(
            Memory(
                type="episodic", scope=scope, key=turn.key, text=redact(text),
                session_id=session, turn_index=turn.index, in_window=turn.in_window,
                attrs={"user": redact(user[:USER_CHARS]), "tools": tools,
                       "prompt": turn.prompt_key},
                created_at=now, updated_at=now,
            )
        )
    return out


class Ingester:
    """Writes a session's episodes, skipping those already stored as they are.

    What is stored is known per session in memory and, for turns it has not seen (a restart,
    another replica or worker), asked of the store by key before anything is rendered: a
    long history is rendered and redacted once, not again after every restart.
    """

    def __init__(
        self,
        store: Store,
        on_new: Callable[[Scope], None] = lambda s: None,
        *,
        offload: Offload = asyncio.to_thread,
        on_written: Callable[[Sequence[Memory]], None] = lambda memories: None,
    ) -> None:
        self._store = store
        self._on_new = on_new
        self._on_written = on_written  # the records as stored (embedding, memory.indexer)
        self._offload = offload
        # (scope, session) -> {turn key: in_window as stored}, and how many keys in all: a
        # session that falls out is looked up in the store again, by key, when next written.
        self._known: OrderedDict[tuple[Scope, str], dict[str, bool]] = OrderedDict()
        self._keys = 0
        # (scope, session, prompt key) -> (key, memory id) of a turn stored from its answer
        self._answered: LRUCache[tuple[Scope, str, str], tuple[str, str]] = LRUCache(_ANSWERS)

    async def write(
        self, scope: Scope, session: str, turns: Sequence[Turn], *, now: float,
        answer: bool = False,
    ) -> int:
        """Store what is new or changed; returns how many records were written.

        ``answer``: ``turns`` is a turn completed by the answer the proxy relayed. When the
        client later resends that turn otherwise (it edited the answer, or dropped the ids
        the key is made of), the resent turn replaces that record instead of joining it."""
        where = (scope, session)
        known = self._known.get(where, {})
        # Only turns not yet stored as they are get rendered and redacted: the rest of a long
        # session costs a dictionary lookup, or once per process a lookup in the store.
        todo = [t for t in turns if t.complete and known.get(t.key) is not t.in_window]
        # A turn its answer just completed is in no store yet (its key is its content's, and
        # no request has resent it): written as it is, with no read first. Stored twice (a
        # retry), the upsert keeps one record.
        unseen = [] if answer else [t.key for t in todo if t.key not in known]
        stored = await self._store.stored(scope, "episodic", unseen) if unseen else {}
        before = {**known, **stored}
        # A turn stored already has its content in its key: one that left the window gets
        # its flag set, not a render, a redaction and its whole row again.
        moved = {t.key: t.in_window for t in todo
                 if t.key in before and before[t.key] is not t.in_window}
        todo = [t for t in todo if t.key not in before]
        changed = await self._offload(episodes, scope, session, todo, now=now) if todo else []
        if moved:
            await self._store.set_in_window(scope, "episodic", moved)
        if changed:
            stored_now = await self._store.upsert(changed)
            self._on_written(stored_now)
            await self._supersede(scope, session, stored_now, answer)
        if changed or stored or moved:
            self._remember(where, {**before, **moved, **{m.key: m.in_window for m in changed}})
        if changed:
            self._on_new(scope)
        return len(changed) + len(moved)

    async def _supersede(
        self, scope: Scope, session: str, written: Sequence[Memory], answer: bool
    ) -> None:
        """A turn stored from its answer and then written otherwise (the client resent it
        with other items, or the turn went on after an answer: a tool loop) is deleted."""
        for memory in written:
            where = (scope, session, str(memory.attrs.get("prompt")))
            earlier = self._answered.pop(where, None)
            if earlier is not None and earlier[0] != memory.key:
                await self._store.delete([earlier[1]])
            if answer:
                self._answered[where] = (memory.key, memory.memory_id)

    def _remember(self, where: tuple[Scope, str], known: dict[str, bool]) -> None:
        self._keys += len(known) - len(self._known.pop(where, {}))
        self._known[where] = known
        while len(self._known) > 1 and (len(self._known) > _SESSIONS or self._keys > _KEYS):
            _, gone = self._known.popitem(last=False)
            self._keys -= len(gone)
