"""Working memory: this session's task and the user's constraints, with a sliding TTL.

Derived from the history once per user turn. New records are written while the request goes
out, before its answer is relayed (so another replica, or the session after a compaction,
has them by the session's next request); known ones only get their TTL pushed back, through
the write queue.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ctxproxy.injectors.bounds import clip
from ctxproxy.injectors.redact import redact, redact_all
from ctxproxy.memory.cpu import Offload, sized
from ctxproxy.memory.model import Memory, Scope, Store
from ctxproxy.memory.queue import WriteQueue
from ctxproxy.memory.statements import constraints
from ctxproxy.memory.turns import Turn
from ctxproxy.plumbing.lru import SizedLRU

__all__ = ["Working", "derive", "in_view"]

TASK_CHARS = 1000
MAX_CONSTRAINTS = 40
CONSTRAINT_CHARS = 300
_SESSIONS = 4096
# Every user turn derives the session's working memory from its whole history again, and
# only the newest prompt is new: what a prompt says (its task text, its constraints) is
# worked out once per prompt. Bounded by an estimate of the bytes held, the prompt (the key)
# included; the lock because derive runs in worker threads.
SAID_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class _Said:
    texts: tuple[tuple[str, str], ...]  # each record's text, and its digest
    size: int  # the bytes this entry holds, its prompt's included


_said: SizedLRU[tuple[str, str], _Said] = SizedLRU(None, SAID_BYTES, size_of=lambda s: s.size)
_said_lock = threading.Lock()


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _task(prompt: str) -> str:
    """The task record's text of a session whose newest prompt is ``prompt``."""
    return _memo("task", prompt, lambda: [_clip(redact(prompt), TASK_CHARS)])[0][0]


def _constraints(prompt: str) -> tuple[tuple[str, str], ...]:
    """The constraint records' texts of ``prompt``, in order, each with its digest."""
    return _memo("constraints", prompt, lambda: [
        _clip(text, CONSTRAINT_CHARS) for text in redact_all(constraints(prompt))])


def _memo(kind: str, prompt: str, make: Callable[[], list[str]]) -> tuple[tuple[str, str], ...]:
    key = (kind, prompt)
    with _said_lock:
        said = _said.get(key)
    if said is None:
        texts = tuple((t, hashlib.sha256(t.lower().encode()).hexdigest()[:24]) for t in make())
        size = sys.getsizeof(prompt) + sum(sys.getsizeof(t) + 100 for t, _ in texts)
        said = _Said(texts, size)
        if size <= SAID_BYTES // 16:  # one huge prompt never empties the memo
            with _said_lock:
                _said.put(key, said)
    return said.texts


def in_view(records: Sequence[Memory], prompts: Sequence[str]) -> set[str]:
    """The ids of the working-memory ``records`` whose text one of ``prompts`` (the turns
    the window forwards) says word for word: the model sees it there, and a block that says
    it again costs its tokens on every request (an agent's instructions, restated in each
    task's prompt). Each prompt is read as derive reads it, its head and tail."""
    said = [" ".join(clip(p).split()).lower() for p in prompts]
    out = set()
    for m in records:
        text = m.text.removesuffix("…").lower()
        if text and any(text in prompt for prompt in said):
            out.add(m.memory_id)
    return out


def derive(
    scope: Scope, session: str, turns: Sequence[Turn], *, now: float, ttl_s: float,
    compacted: bool = False,
) -> list[Memory]:
    """The session's working memory as records: the task (its newest prompt, unless a
    compaction rewrote the history) and each constraint the user stated.

    The task is the one the session is on now, not the one it opened with: on a day of
    tasks in one session the opening prompt is a finished task, and a block that showed it
    on every request of the later ones paid for it each time (bench/RESULTS.md, issue 44,
    third round). The newest prompt is in the forwarded window, so the record stands only
    where the window does not show it (a session the store holds and this history
    does not)."""

    def record(key: str, text: str, turn: Turn, kind: str) -> Memory:
        return Memory(
            type="working", scope=scope, key=key, text=text, session_id=session,
            turn_index=turn.index, in_window=turn.in_window,
            attrs={"kind": kind, "prompt": turn.prompt_key},
            created_at=now, updated_at=now, expires_at=now + ttl_s,
        )

    out: list[Memory] = []
    if turns and not compacted and turns[-1].user.strip():
        newest = turns[-1]
        out.append(record(f"task:{session}", _task(newest.user), newest, "task"))
    found: dict[str, Memory] = {}
    for turn in turns:
        for text, digest in _constraints(turn.user):
            key = f"constraint:{session}:{digest}"
            found.pop(key, None)  # restated: it moves to the turn that said it last
            found[key] = record(key, text, turn, "constraint")
    out += list(found.values())[-MAX_CONSTRAINTS:]
    return out


class Working:
    """Writes working memory, remembering per session what is stored and since when."""

    def __init__(
        self, store: Store, queue: WriteQueue, ttl_s: float, *, offload: Offload = asyncio.to_thread
    ) -> None:
        self._store = store
        self._offload = offload
        self._queue = queue
        self._ttl_s = ttl_s
        # (scope, session) -> ({key: text} as stored, when they were last written)
        self._known: OrderedDict[tuple[Scope, str], tuple[dict[str, str], float]] = (
            OrderedDict()
        )

    def knows(self, scope: Scope, session: str) -> bool:
        """Whether this process wrote the session's working memory before (and still
        remembers what it wrote)."""
        return (scope, session) in self._known

    async def update(
        self, scope: Scope, session: str, turns: Sequence[Turn], *, now: float,
        compacted: bool = False,
    ) -> list[Memory]:
        """Store the session's working memory; returns the records. Raises StoreError."""
        records = await self.derived(scope, session, turns, now=now, compacted=compacted)
        await self.write(scope, session, records, now=now)
        return records

    async def derived(
        self, scope: Scope, session: str, turns: Sequence[Turn], *, now: float,
        compacted: bool = False,
    ) -> list[Memory]:
        """The session's working memory records (``derive``), not stored yet."""
        # Redaction and statement extraction scan every prompt: long ones in a worker, not on
        # the loop.
        return await sized(
            self._offload, sum(len(t.user) for t in turns),
            derive, scope, session, turns, now=now, ttl_s=self._ttl_s, compacted=compacted,
        )

    async def write(
        self, scope: Scope, session: str, records: list[Memory], *, now: float
    ) -> list[Memory]:
        """Store ``derived`` records: now when something is new, else through the write
        queue (only their TTL moves). Returns what the store holds of them once written now
        (a forgotten one it refuses; one stored before keeps its id), else []. Raises
        StoreError."""
        if not records:
            return []
        where = (scope, session)
        known, written_at = self._known.get(where, ({}, 0.0))
        texts = {m.key: m.text for m in records}
        # Written now when something is new, or when the last write may have expired
        # (a session back after a pause): recall reads these records in a moment.
        if any(known.get(k) != t for k, t in texts.items()) or now - written_at > self._ttl_s / 2:
            stored = await self._store.upsert(records)
            self._remember(where, texts, now)
            return stored
        size = sum(len(t) for t in texts.values())
        self._queue.put(lambda: self._refresh(where, records, texts, now), size, key=where)
        return []

    async def _refresh(
        self, where: tuple[Scope, str], records: list[Memory], texts: dict[str, str], now: float
    ) -> None:
        """Push the sliding TTL back (on the write queue)."""
        await self._store.upsert(records)
        self._remember(where, texts, now)

    def _remember(self, where: tuple[Scope, str], texts: dict[str, str], now: float) -> None:
        self._known[where] = (texts, now)
        self._known.move_to_end(where)
        while len(self._known) > _SESSIONS:
            self._known.popitem(last=False)
