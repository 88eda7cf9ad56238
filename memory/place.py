"""Where a turn's memory goes in a request: the standing block before the first forwarded
turn, pinned byte for byte until the window cuts, and each turn's recall message before its
prompt, the same bytes on every request while the turn is forwarded (see ``memory.step``).

What went where is kept in this process (bounded LRUs) and in the store (``share``, read back
by ``load`` when a turn is prepared here first), so that any replica or worker puts the same
bytes in a session's next request.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import orjson
from cachetools import LRUCache
from prometheus_client import Counter

from ctxproxy.injectors.instructions import SEPARATOR, append_block
from ctxproxy.memory.keep import Keep
from ctxproxy.memory.model import Memory, Scope, Store, StoreError
from ctxproxy.request import Exchange, Item

__all__ = [
    "PINNED_CACHED", "RECALLS_CACHED", "Pinned", "Placer", "Prepared", "Shown", "TurnKey",
    "developer_message", "forwarded_turns",
]

log = logging.getLogger("ctxproxy.memory")

PINNED_CACHED = 4096  # sessions' pinned standing blocks
RECALLS_CACHED = 16384  # turns' recall messages (a few hundred bytes each)

# (scope, session, the prompt's key, the turn's position in the history)
TurnKey = tuple[Scope, str, str, int]


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


@dataclass(frozen=True, slots=True)
class Shown:
    """A turn's recall message as it was first sent (None: the turn had none), and the lines
    it shows of each memory in it."""

    message: dict[str, Any] | None
    lines: tuple[tuple[str, frozenset[str]], ...] = ()


@dataclass(frozen=True, slots=True)
class Pinned:
    """The standing message a session's forwarded history starts with until the window cuts
    (``first``: the first forwarded turn), and the selection it shows."""

    first: TurnKey
    message: dict[str, Any] | None
    chosen: tuple[Memory, ...]
    used: int


def developer_message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "developer",
            "content": [{"type": "input_text", "text": text}]}


def forwarded_turns(ex: Exchange, scope: Scope, session: str) -> list[tuple[int, TurnKey]]:
    """(position in the forwarded input, key) of each turn the request forwards."""
    keys = ex.history.prompt_keys(session)
    first = ex.first_turn
    return [
        (at, (scope, session, keys[first + n], first + n)) for n, at in enumerate(ex.starts)
    ]


PINNED = "pinned"  # the name of a session's pinned standing block in the store
# A session idle this long loses its placements (its next request on another replica then
# gets no earlier recall messages: correct, just less cached); each process deletes them at
# most once in PRUNE_EVERY_S.
PLACEMENTS_KEPT_S = 7 * 86_400.0
PRUNE_EVERY_S = 3600.0


def shown_name(key: TurnKey) -> str:
    """The name of a turn's recall message in the store (its session's placements)."""
    return f"shown:{key[3]}:{key[2]}"


def _shown_bytes(shown: Shown) -> bytes:
    lines = [[memory_id, sorted(of)] for memory_id, of in shown.lines]
    return orjson.dumps({"message": shown.message, "lines": lines})


def _shown_of(raw: bytes) -> Shown:
    data = orjson.loads(raw)
    return Shown(data["message"],
                 tuple((memory_id, frozenset(of)) for memory_id, of in data["lines"]))


def _pinned_bytes(pinned: Pinned) -> bytes:
    return orjson.dumps({"first": [pinned.first[2], pinned.first[3]], "message": pinned.message,
                         "chosen": [asdict(m) for m in pinned.chosen], "used": pinned.used})


def _pinned_of(raw: bytes, scope: Scope, session: str) -> Pinned:
    data = orjson.loads(raw)
    chosen = tuple(Memory(**{**m, "scope": Scope(**m["scope"])}) for m in data["chosen"])
    prompt, position = data["first"]
    return Pinned((scope, session, prompt, position), data["message"], chosen, data["used"])


class Placer:
    """Puts a turn's memory into each request, and remembers what went where: the recall
    message each turn showed, and each session's pinned standing block (bounded LRUs, and
    with ``store`` the store: a replica that has neither leaves them out, which is correct,
    just less cached)."""

    def __init__(
        self, placement: Literal["split", "instructions"], *,
        forwarded_whole: Counter | None = None, store: Store | None = None,
    ) -> None:
        self.placement = placement
        self._store = store
        self._pruned_at: float | None = None  # when this process last deleted old ones
        self._whole_count = forwarded_whole
        self._shown: LRUCache[TurnKey, Shown] = LRUCache(RECALLS_CACHED)
        self._pinned: LRUCache[tuple[Scope, str], Pinned] = LRUCache(PINNED_CACHED)

    def shown(self, key: TurnKey) -> Shown | None:
        """The recall message the turn ``key`` was first sent with, if this process has it."""
        return self._shown.get(key)

    def remember(self, key: TurnKey, shown: Shown) -> None:
        self._shown[key] = shown

    async def load(self, scope: Scope, session: str, forwarded: list[tuple[int, TurnKey]]
                   ) -> None:
        """Take from the store what this process lacks of the placements the forwarded turns
        had (another replica placed them); the store failing leaves them out (logged)."""
        if self._store is None or not forwarded:
            return
        missing = {shown_name(key): key for _, key in forwarded if key not in self._shown}
        pinned = self._pinned.get((scope, session))
        names = [*missing] + ([PINNED] if pinned is None or pinned.first != forwarded[0][1]
                              else [])
        if not names:
            return
        try:
            found = await self._store.placements(scope, session, names)
        except StoreError as exc:
            log.warning("memory placements could not be read: %s", exc)
            return
        for name, raw in found.items():
            if name == PINNED:
                self._pinned[(scope, session)] = _pinned_of(raw, scope, session)
            else:
                self._shown[missing[name]] = _shown_of(raw)

    async def share(self, key: TurnKey, shown: Shown | None = None,
                    pinned: Pinned | None = None, *, now: float) -> None:
        """Remember a turn's recall message (``shown``) or its session's pinned block
        (``pinned``) here and in the store, for the session's next request wherever it goes;
        the store failing keeps them here only (logged)."""
        scope, session = key[0], key[1]
        if shown is not None:
            self._shown[key] = shown
        if pinned is not None:
            self._pinned[(scope, session)] = pinned
        if self._store is None:
            return
        try:
            if shown is not None:
                await self._store.place(scope, session, shown_name(key), _shown_bytes(shown),
                                        now=now)
            if pinned is not None:
                await self._store.place(scope, session, PINNED, _pinned_bytes(pinned), now=now)
            if self._pruned_at is None or now - self._pruned_at >= PRUNE_EVERY_S:
                self._pruned_at = now
                await self._store.forget_placements(now - PLACEMENTS_KEPT_S)
        except StoreError as exc:
            log.warning("memory placements could not be stored: %s", exc)

    def pin(self, scope: Scope, session: str, first: TurnKey | None) -> Pinned | None:
        """The session's pinned standing block, while ``first`` (the first forwarded turn)
        is still the turn it stands before: the window has not cut since it was pinned."""
        pinned = self._pinned.get((scope, session))
        if pinned is None or first is None or pinned.first != first:
            return None
        return pinned

    def without_memory(self, ex: Exchange, scope: Scope, session: str) -> None:
        """No memory for this request (late, or the store failed). Until the window cuts
        again, this process still has the blocks the session's last request showed: they go
        in as they were (the same bytes: the prompt cache stays warm), without this turn's
        recall. Else nothing would show what the window cut, and the history goes out whole,
        as the client sent it. The turn's memory is still prepared for its next request."""
        ex.notes.memory_degraded = True
        forwarded = forwarded_turns(ex, scope, session)
        pinned = self.pin(scope, session, forwarded[0][1] if forwarded else None)
        if self.placement == "split" and pinned is not None:
            self.apply(ex, Prepared(chosen=pinned.chosen, used=pinned.used), scope, session)
            return
        if ex.uncut():
            ex.notes.memory_whole = True
            if self._whole_count is not None:
                self._whole_count.inc()

    def apply(self, ex: Exchange, prepared: Prepared, scope: Scope, session: str) -> None:
        """Put ``prepared`` into the request: in its instructions, or (split) each block
        before the turn it belongs to."""
        if self.placement == "instructions":
            text = SEPARATOR.join(b for b in (prepared.standing, prepared.recall) if b)
            if text:
                ex.body = append_block(ex.body, text)
                ex.changed = True
            return
        items = ex.items
        forwarded = forwarded_turns(ex, scope, session)
        if items is None or not forwarded:
            return
        messages = self._messages(ex, prepared, scope, session, forwarded)
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

    def _messages(
        self, ex: Exchange, prepared: Prepared, scope: Scope, session: str,
        forwarded: list[tuple[int, TurnKey]],
    ) -> dict[int, list[dict[str, Any]]]:
        """Before each position, the messages that go there: the standing block before the
        first forwarded turn, each turn's recall message before its prompt (the earlier
        turns' from the LRU, the newest turn's from this turn's preparation)."""
        messages: dict[int, list[dict[str, Any]]] = {}
        standing = self._standing_message(scope, session, forwarded[0][1], prepared)
        if standing is not None:
            messages[forwarded[0][0]] = [standing]
            ex.stable_blocks = (*ex.stable_blocks, standing)
        kept = 0
        for at, key in forwarded[:-1]:
            shown = self._shown.get(key)
            if shown is not None and shown.message is not None:
                messages.setdefault(at, []).append(shown.message)
                kept += 1
        ex.notes.recall_kept = kept
        if prepared.message is not None:
            messages.setdefault(forwarded[-1][0], []).append(prepared.message)
        return messages

    def _standing_message(
        self, scope: Scope, session: str, first: TurnKey, prepared: Prepared
    ) -> dict[str, Any] | None:
        """The standing block as a message before the first forwarded turn: pinned, byte for
        byte, until the window cuts (the first forwarded turn changes). A new memory waits for
        the cut, where the prompt cache breaks anyway: in ``instructions``, a block that
        changed re-read the whole prompt after them, the agent's own context included."""
        pinned = self.pin(scope, session, first)
        if pinned is not None:
            return pinned.message
        text = prepared.standing
        message = developer_message(text) if text else None
        self._pinned[(scope, session)] = Pinned(first, message, prepared.chosen, prepared.used)
        return message
