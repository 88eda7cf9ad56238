"""Episodic memory: every completed turn of a session, stored once, re-derived every turn.

Runs on the write queue, off the request path. Each record is keyed by the session and the
turn's content, so Codex's resent history, a replay or a retry updates the same record; a
write that was lost is made good the next time the session's history comes by.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from injectors.redact import redact
from memory.model import Memory, Scope, Store
from memory.turns import USER_CHARS, Turn, render

__all__ = ["Ingester", "episodes"]

_SESSIONS = 4096


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
    """Writes a session's episodes, skipping those already stored as they are."""

    def __init__(self, store: Store, on_new: Callable[[Scope], None] = lambda s: None) -> None:
        self._store = store
        self._on_new = on_new
        # (scope, session) -> {turn key: in_window as stored}
        self._known: OrderedDict[tuple[Scope, str], dict[str, bool]] = OrderedDict()

    async def write(
        self, scope: Scope, session: str, turns: Sequence[Turn], *, now: float
    ) -> int:
        """Store what is new or changed; returns how many records were written."""
        where = (scope, session)
        known = self._known.get(where, {})
        # Only turns not yet stored as they are get rendered and redacted: the rest of a long
        # session costs a dictionary lookup.
        todo = [t for t in turns if t.complete and known.get(t.key) is not t.in_window]
        changed = episodes(scope, session, todo, now=now)
        if not changed:
            return 0
        await self._store.upsert(changed)
        fresh = any(m.key not in known for m in changed)
        self._known[where] = {**known, **{m.key: m.in_window for m in changed}}
        self._known.move_to_end(where)
        while len(self._known) > _SESSIONS:
            self._known.popitem(last=False)
        if fresh:
            self._on_new(scope)
        return len(changed)
