"""Distillation: durable preferences and project facts, from what users said across turns.

A background task owned by the app. New episodes mark their scope; within
``distill_interval_s`` the distiller reads the scope's episodes, extracts claims from the
user's words (``memory.statements``: rules, no model), groups near-duplicates, scores each
group by frequency, recency and consistency across sessions, and keeps those at or over
``semantic_threshold`` as semantic memory. A newer claim that contradicts an older one
supersedes it: one record, not two.

The pure part (``gather``, ``resolve``, ``plan``) is a function of the episodes and the
semantic records, so every replica distils the same result and writing it is idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from memory.health import Health
from memory.model import Memory, Scope, Store, StoreError
from memory.statements import Claim, ClaimKind, claims

__all__ = ["Distiller", "Group", "Mention", "gather", "plan", "resolve", "score"]

log = logging.getLogger("ctxproxy.memory")

DAY = 86400.0
HALF_LIFE_S = 60 * DAY  # a claim nobody repeats fades
LOOKBACK_S = 365 * DAY
MAX_EPISODES = 5000
REBUILD_S = 600.0  # re-read a scope's episodes whole now and then (forgotten ones drop out)
SCORE_STEP = 0.05  # a score change smaller than this is not worth a write
_SCOPES = 1024


@dataclass(frozen=True, slots=True)
class Mention:
    """A claim as one episode stated it."""

    claim: Claim
    episode: str  # memory id of the episode
    session: str
    at: float


@dataclass(slots=True)
class Group:
    """Mentions of one claim in different words."""

    first: Claim
    mentions: list[Mention] = field(default_factory=list)

    @property
    def claim(self) -> Claim:
        """The first mention's claim; a preference avoids whatever any mention avoided."""
        if self.first.kind != "prefer":
            return self.first
        avoid = frozenset().union(*(m.claim.avoid for m in self.mentions)) | self.first.avoid
        return replace(self.first, avoid=avoid - self.first.prefer)

    @property
    def episodes(self) -> set[str]:
        return {m.episode for m in self.mentions}

    @property
    def sessions(self) -> set[str]:
        return {m.session for m in self.mentions}

    @property
    def last_seen(self) -> float:
        return max(m.at for m in self.mentions)

    @property
    def text(self) -> str:
        return self.first.text


def score(mentions: int, sessions: int, last_seen: float, now: float) -> float:
    """How settled a claim is, in [0, 1).

    Saying it again counts (frequency), saying it in another session counts more
    (consistency across sessions), and it fades when nobody repeats it (recency; the first
    day is free). One mention scores 0.56, the same claim in two sessions 0.80.
    """
    frequency = 1 - 0.5**mentions
    spread = 1 - 0.4**sessions
    idle = max(0.0, now - last_seen - DAY)
    recency = 0.5 ** (idle / HALF_LIFE_S)
    return round(float((0.4 * frequency + 0.6 * spread) * recency), 4)


def gather(mentions: Iterable[Mention]) -> list[Group]:
    """Group near-duplicate mentions, oldest first."""
    groups: list[Group] = []
    for mention in sorted(mentions, key=lambda m: (m.at, m.episode)):
        for group in groups:
            if group.first.same(mention.claim):
                group.mentions.append(mention)
                break
        else:
            groups.append(Group(mention.claim, [mention]))
    return groups


def resolve(groups: Sequence[Group]) -> list[Group]:
    """The groups left once every contradiction is settled for the newer claim."""
    beaten: set[int] = set()
    for i, a in enumerate(groups):
        for j in range(i + 1, len(groups)):
            b = groups[j]
            if a.claim.conflicts(b.claim):
                beaten.add(i if a.last_seen < b.last_seen else j)
    return [g for n, g in enumerate(groups) if n not in beaten]


def claim_of(memory: Memory) -> Claim | None:
    """The claim a semantic record holds: from its attrs, else read from its text (a memory
    a user added by hand)."""
    a = memory.attrs
    kind = a.get("kind")
    if kind in ("prefer", "fact", "rule"):
        kind_: ClaimKind = kind
        return Claim(
            kind_, str(a.get("subject", "")), str(a.get("value", "")),
            frozenset(a.get("prefer", [])), frozenset(a.get("avoid", [])), memory.text,
        )
    found = claims(memory.text)
    return found[0] if found else None


def _seen(memory: Memory) -> float:
    value = memory.attrs.get("last_seen")
    return float(value) if isinstance(value, int | float) else memory.updated_at


def plan(
    scope: Scope, groups: Sequence[Group], existing: Sequence[Memory], *, threshold: float,
    now: float,
) -> tuple[list[Memory], list[str]]:
    """What to write and what to delete so that the scope's semantic memory matches
    ``groups`` (already resolved)."""
    writes: list[Memory] = []
    deletes: list[str] = []
    held = [(m, claim_of(m)) for m in existing]
    for group in groups:
        claim = group.claim
        match = next((m for m, c in held if c is not None and c.same(claim)), None)
        rivals = [
            m for m, c in held
            if c is not None and m.memory_id not in deletes and c.conflicts(claim)
        ]
        if any(_seen(m) >= group.last_seen for m in rivals):
            continue  # a newer record (one a user added, say) says otherwise
        beaten = rivals
        value = score(len(group.episodes), len(group.sessions), group.last_seen, now)
        if beaten:
            # A correction of a kept fact is as settled as the fact it corrects.
            value = max(value, threshold)
        if match is None and value < threshold:
            continue
        superseded = [m.memory_id for m in beaten]
        sources = sorted(set(match.sources if match else []) | group.episodes | set(superseded))
        attrs = {
            "kind": claim.kind, "subject": claim.subject, "value": claim.value,
            "prefer": sorted(claim.prefer), "avoid": sorted(claim.avoid),
            "score": value, "mentions": len(group.episodes), "sessions": len(group.sessions),
            "last_seen": group.last_seen, "origin": "distilled",
        }
        if match is not None:
            attrs = {**match.attrs, **attrs}
            if superseded:
                attrs["supersedes"] = sorted({*match.attrs.get("supersedes", []), *superseded})
            same_score = abs(float(match.attrs.get("score", 0.0)) - value) < SCORE_STEP
            if set(match.sources) == set(sources) and same_score and not superseded:
                continue
            writes.append(Memory(
                type="semantic", scope=scope, key=match.key, text=match.text,
                memory_id=match.memory_id, sources=sources, attrs=attrs,
                created_at=match.created_at, updated_at=now,
            ))
        else:
            if superseded:
                attrs["supersedes"] = superseded
            digest = hashlib.sha256(claim.identity.encode()).hexdigest()[:32]
            writes.append(Memory(
                type="semantic", scope=scope, key=f"claim:{digest}", text=group.text,
                sources=sources, attrs=attrs, created_at=now, updated_at=now,
            ))
        deletes += superseded
    return writes, deletes


@dataclass(slots=True)
class _ScopeState:
    mentions: dict[str, list[Mention]] = field(default_factory=dict)  # episode id -> mentions
    watermark: float = 0.0
    built_at: float = 0.0


class Distiller:
    """The background distillation task, and ``run_once`` for callers that cannot wait."""

    def __init__(
        self, store: Store, *, threshold: float, interval_s: float, health: Health
    ) -> None:
        self._store = store
        self._threshold = threshold
        self._interval_s = interval_s
        self._health = health
        self._dirty: set[Scope] = set()
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._scopes: OrderedDict[Scope, _ScopeState] = OrderedDict()

    def notify(self, scope: Scope) -> None:
        """New episodes arrived in ``scope``."""
        self._dirty.add(scope)
        self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="ctxproxy-distiller")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            try:
                await self.run_once()
            except Exception:
                # A bug in one run must not end distillation for the app's lifetime.
                log.exception("distillation failed")
            # At most one run per interval; what arrives meanwhile waits for the next.
            await asyncio.sleep(self._interval_s)

    async def run_once(self, now: float | None = None) -> int:
        """Distil every scope with new episodes; returns how many records were written."""
        async with self._lock:
            self._wake.clear()
            scopes, self._dirty = self._dirty, set()
            written = 0
            for scope in scopes:
                try:
                    written += await self.distill(scope, time.time() if now is None else now)
                    self._health.ok("distillation")
                except StoreError as exc:
                    self._dirty.add(scope)  # try again on the next run
                    self._health.failed("distillation", exc)
            return written

    async def distill(self, scope: Scope, now: float) -> int:
        """One scope: read its new episodes, then write what changed. Raises StoreError."""
        state = await self._read(scope, now)
        groups = resolve(gather(m for ms in state.mentions.values() for m in ms))
        existing = await self._store.list(scope, types=["semantic"], limit=1000, now=now)
        writes, deletes = plan(scope, groups, existing, threshold=self._threshold, now=now)
        writes = [w for w in writes if await self._grounded(w, existing)]
        if deletes:
            await self._store.delete(deletes)
        if writes:
            await self._store.upsert(writes)
            log.info("distilled %d semantic memories", len(writes))
        return len(writes)

    async def _grounded(self, write: Memory, existing: Sequence[Memory]) -> bool:
        """A new record needs an episode that still exists (one forgotten meanwhile, in
        another process, must not come back through this one's cache)."""
        if any(m.memory_id == write.memory_id for m in existing):
            return True
        for source in write.sources[-10:]:
            if await self._store.get(source) is not None:
                return True
        return False

    async def _read(self, scope: Scope, now: float) -> _ScopeState:
        state = self._scopes.get(scope)
        if state is None or now - state.built_at > REBUILD_S:
            state = _ScopeState(built_at=now)
            since = now - LOOKBACK_S
        else:
            since = state.watermark - 1.0  # writes of the same second may land in any order
        episodes = await self._store.list(
            scope, types=["episodic"], since=since, limit=MAX_EPISODES, now=now
        )
        for episode in episodes:
            user = episode.attrs.get("user")
            found = claims(user) if isinstance(user, str) else []
            if found:
                session = episode.session_id or ""
                state.mentions[episode.memory_id] = [
                    Mention(c, episode.memory_id, session, episode.created_at) for c in found
                ]
            state.watermark = max(state.watermark, episode.updated_at)
        self._scopes[scope] = state
        self._scopes.move_to_end(scope)
        while len(self._scopes) > _SCOPES:
            self._scopes.popitem(last=False)
        return state
