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
import math
import time
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from ctxproxy.memory import lanes
from ctxproxy.memory.cpu import Offload
from ctxproxy.memory.health import Health
from ctxproxy.memory.model import Memory, Scope, Store, StoreError
from ctxproxy.memory.statements import NEAR, Claim, ClaimKind, claims

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
    ordered = sorted(mentions, key=lambda m: (m.at, m.episode))
    index = _Index(m.claim for m in ordered)
    groups: list[Group] = []
    for mention in ordered:
        n = next((n for n in index.like(mention.claim) if groups[n].first.same(mention.claim)),
                 None)
        if n is not None:
            groups[n].mentions.append(mention)
        else:
            index.add(len(groups), mention.claim)
            groups.append(Group(mention.claim, [mention]))
    return groups


def resolve(groups: Sequence[Group]) -> list[Group]:
    """The groups left once every contradiction is settled for the newer claim.

    A group is beaten by any group it conflicts with that was seen later (or as late and
    comes first): so it stays only if no such group exists. The groups are indexed in that
    order, newest first, and each looks only at the rivals the index gives it, up to its own
    place: near-linear in the number of groups, not pairwise.
    """
    order = sorted(range(len(groups)), key=lambda n: (-groups[n].last_seen, n))
    claims_ = [groups[n].claim for n in order]
    index = _Index(claims_)
    for place, claim in enumerate(claims_):
        index.add(place, claim)
    beaten: set[int] = set()
    for place, claim in enumerate(claims_):
        for rival in index.rivals(claim):
            if rival >= place:
                break
            if claim.conflicts(claims_[rival]):
                beaten.add(order[place])
                break
    return [g for n, g in enumerate(groups) if n not in beaten]


class _Index:
    """Which claims may be the same as, or conflict with, a given claim, without comparing it
    with every other: ``Claim.same`` and ``Claim.conflicts`` only hold between claims that
    share a key here, and the caller checks the candidates with them.

    Preferences are keyed by what they prefer and avoid; facts by their subject; rules by
    the words of their action. Two word sets with a Jaccard overlap of at least ``NEAR`` share
    a word among the first ``len - ceil(NEAR * len) + 1`` of each, in one fixed order of the
    words (rarest first, so that the lists behind them stay short): the prefix filter of
    set-similarity joins. Ids are the caller's and are added in increasing order.
    """

    def __init__(self, claims_: Iterable[Claim]) -> None:
        self._freq: Counter[str] = Counter()
        for claim in claims_:
            self._freq.update(_words(claim))
        self._same: defaultdict[tuple[object, ...], list[int]] = defaultdict(list)
        self._facts: defaultdict[str, list[int]] = defaultdict(list)
        self._rules: defaultdict[str | None, list[int]] = defaultdict(list)
        self._prefers: defaultdict[str, list[int]] = defaultdict(list)
        self._avoids: defaultdict[str, list[int]] = defaultdict(list)

    def add(self, n: int, claim: Claim) -> None:
        for key in self._same_keys(claim):
            self._same[key].append(n)
        if claim.kind == "prefer":
            for item in claim.prefer:
                self._prefers[item].append(n)
            for item in claim.avoid:
                self._avoids[item].append(n)
        elif claim.kind == "fact":
            self._facts[claim.subject].append(n)
        else:
            for word in self._prefix(claim):
                self._rules[word].append(n)

    def like(self, claim: Claim) -> list[int]:
        """The ids that may be ``same`` as ``claim``, in increasing order."""
        return _merged(self._same.get(key, []) for key in self._same_keys(claim))

    def rivals(self, claim: Claim) -> Sequence[int]:
        """The ids that may conflict with ``claim``, in increasing order."""
        if claim.kind == "fact":
            return self._facts.get(claim.subject, [])
        if claim.kind == "rule":
            return _merged(self._rules.get(word, []) for word in self._prefix(claim))
        return _merged(
            [self._avoids.get(item, []) for item in claim.prefer]
            + [self._prefers.get(item, []) for item in claim.avoid]
        )

    def _same_keys(self, claim: Claim) -> list[tuple[object, ...]]:
        if claim.kind == "prefer":
            return [("prefer", claim.prefer)] if claim.prefer else [("avoid", claim.avoid)]
        about = claim.subject if claim.kind == "fact" else claim.value
        return [(claim.kind, about, word) for word in self._prefix(claim)]

    def _prefix(self, claim: Claim) -> list[str | None]:
        words = _words(claim)
        if not words:
            return [None]  # an empty set is near only to another empty set
        keep = len(words) - math.ceil(NEAR * len(words) - 1e-9) + 1
        return list(sorted(words, key=lambda w: (self._freq[w], w))[:keep])


def _words(claim: Claim) -> set[str]:
    """The words ``Claim.same`` compares: a fact's value, a rule's action."""
    if claim.kind == "fact":
        return set(claim.value.split())
    if claim.kind == "rule":
        return set(claim.subject.split())
    return set()


def _merged(lists: Iterable[list[int]]) -> list[int]:
    return sorted({n for ids in lists for n in ids})


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
    gone: set[str] = set()
    held = [(m, c) for m in existing if (c := claim_of(m)) is not None]
    claims_ = [g.claim for g in groups]
    index = _Index([*(c for _, c in held), *claims_])
    for n, (_, c) in enumerate(held):
        index.add(n, c)
    for group, claim in zip(groups, claims_, strict=True):
        match = next((held[n][0] for n in index.like(claim) if held[n][1].same(claim)), None)
        rivals = [
            m for m, c in (held[n] for n in index.rivals(claim))
            if m.memory_id not in gone and c.conflicts(claim)
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
        gone.update(superseded)
    return writes, deletes


def _decide(
    scope: Scope, mentions: list[Mention], existing: Sequence[Memory], *, threshold: float,
    now: float,
) -> tuple[list[Memory], list[str]]:
    """What to write and delete for a scope's mentions (pure; run in a worker)."""
    return plan(scope, resolve(gather(mentions)), existing, threshold=threshold, now=now)


def _claims_of(episodes: Sequence[Memory]) -> list[list[Claim]]:
    """Each episode's claims, from its prompt (pure; run in a worker)."""
    out: list[list[Claim]] = []
    for episode in episodes:
        user = episode.attrs.get("user")
        out.append(claims(user) if isinstance(user, str) else [])
    return out


@dataclass(slots=True)
class _ScopeState:
    mentions: dict[str, list[Mention]] = field(default_factory=dict)  # episode id -> mentions
    watermark: float = 0.0
    built_at: float = 0.0


class Distiller:
    """The background distillation task, and ``run_once`` for callers that cannot wait."""

    def __init__(
        self, store: Store, *, threshold: float, interval_s: float, health: Health,
        offload: Offload = asyncio.to_thread,
        on_written: Callable[[Sequence[Memory]], None] = lambda memories: None,
    ) -> None:
        self._store = store
        self._offload = offload
        self._on_written = on_written  # the records as stored (embedding, memory.indexer)
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
        lanes.background()  # no request waits for it
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
        mentions = [m for ms in state.mentions.values() for m in ms]
        existing = await self._store.list(scope, types=["semantic"], limit=1000, now=now)
        # Claim resolution and planning grow with the scope's claims: in a worker.
        writes, deletes = await self._offload(
            _decide, scope, mentions, existing, threshold=self._threshold, now=now
        )
        writes = [w for w in writes if await self._grounded(w, existing)]
        if deletes:
            await self._store.delete(deletes)
        if writes:
            # A forgotten claim (a tombstone) is not written: it is not counted either.
            writes = await self._store.upsert(writes)
            self._on_written(writes)
            if writes:
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
        # Parsing the prompts for claims scans their text: in a worker.
        parsed = await self._offload(_claims_of, episodes)
        for episode, found in zip(episodes, parsed, strict=True):
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
