"""Typed memory: the records and the store interface every backend implements.

The store is deliberately small: it keeps records and finds them; what goes in (ingest,
distillation) and what comes out (recall, scoring) lives beside it, written once for every
backend.
"""

from __future__ import annotations

import builtins
import os
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ctxproxy.request import user_digest

if TYPE_CHECKING:
    import numpy as np

    from ctxproxy.memory.vectors import VectorRow

MemoryType = Literal["working", "episodic", "semantic"]
MEMORY_TYPES: tuple[MemoryType, ...] = ("working", "episodic", "semantic")

_B32 = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case


def new_memory_id(now: float | None = None) -> str:
    """``mem_`` + 26 chars: 48-bit millisecond time then 80 random bits (a ULID), so ids are
    globally unique and sort by creation time."""
    ms = int((time.time() if now is None else now) * 1000)
    value = (ms << 80) | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_B32[value & 31])
        value >>= 5
    return "mem_" + "".join(reversed(chars))


# The user part of a scope: a one-way digest of the user key, never the key itself.
user_ref = user_digest


@dataclass(frozen=True, slots=True)
class Scope:
    """Whose memory this is. Recall never crosses scopes: all four parts must match."""

    service_id: str
    team_id: str = ""
    agent_id: str = ""
    user: str = ""  # user_ref(user_key)


@dataclass(slots=True)
class Memory:
    """One memory record.

    ``key`` makes writes idempotent: (scope, type, key) is unique, so storing the same turn
    twice updates one record. ``sources`` are the memory ids a record was merged or distilled
    from. ``attrs`` is free-form JSON (e.g. a semantic fact's subject and score).
    """

    type: MemoryType
    scope: Scope
    key: str
    text: str
    memory_id: str = field(default_factory=new_memory_id)
    session_id: str | None = None
    turn_index: int | None = None
    in_window: bool = False
    sources: list[str] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    expires_at: float | None = None  # working memory's sliding TTL; None: never


@dataclass(frozen=True, slots=True)
class Hit:
    """A search result: the memory and its relevance (higher is better, > 0). A hit of the
    vector search also has the cosine ``similarity`` of its best chunk and that chunk's
    character ``span`` in the text."""

    memory: Memory
    relevance: float
    similarity: float | None = None
    span: tuple[int, int] | None = None


class StoreError(Exception):
    """The store failed (down, locked, corrupt). Callers degrade; they never fail a request."""


class Store(Protocol):
    """What every backend (SQLite, PostgreSQL) provides. All methods raise StoreError only."""

    async def open(self) -> None:
        """Connect and run pending schema migrations."""

    async def close(self) -> None: ...

    async def upsert(self, memories: Sequence[Memory]) -> list[Memory]:
        """Insert or update by (scope, type, key); an existing record keeps its memory_id and
        created_at. Returns the stored records."""

    # get, search and list may hand back a future with the read already under way (the
    # SQLite store's): a turn's recall reads go out in the step that asks for them.
    def get(self, memory_id: str) -> Awaitable[Memory | None]: ...

    async def delete(self, memory_ids: Sequence[str]) -> int:
        """Delete these records; returns how many were deleted."""

    async def forget(self, memory_ids: Sequence[str], *, now: float | None = None) -> int:
        """Delete these records and leave a tombstone for each (scope, type, key): no write
        of that key lands again, from any process. Returns how many were deleted."""

    def search(
        self,
        scope: Scope,
        query: str,
        *,
        types: Sequence[MemoryType] = MEMORY_TYPES,
        limit: int = 20,
        now: float | None = None,
    ) -> Awaitable[list[Hit]]:
        """Ranked full-text search within one scope, skipping expired records."""

    def list(
        self,
        scope: Scope | None = None,
        *,
        types: Sequence[MemoryType] = MEMORY_TYPES,
        session_id: str | None = None,
        since: float | None = None,
        limit: int = 100,
        now: float | None = None,
    ) -> Awaitable[list[Memory]]:
        """Records newest first (by updated_at), filtered; ``scope=None`` lists every scope
        (the CLI's view). Expired records are skipped."""

    async def stored(
        self, scope: Scope, kind: MemoryType, keys: Sequence[str]
    ) -> dict[str, bool]:
        """Which of ``keys`` (of this scope and ``kind``) are stored: each one's ``in_window`` as
        stored. Expired records count: it answers whether a write would change anything."""

    async def set_in_window(
        self, scope: Scope, kind: MemoryType, flags: Mapping[str, bool]
    ) -> int:
        """Set ``in_window`` of the records of this scope and ``kind`` whose keys ``flags``
        names (a turn that left the forwarded window, nothing else of it changed); returns how
        many records there were."""

    async def placements(
        self, scope: Scope, session: str, names: Sequence[str]
    ) -> dict[str, bytes]:
        """The stored placements of ``session`` (what memory put where in its requests:
        memory.place) among ``names``, by name."""

    async def place(self, scope: Scope, session: str, name: str, value: bytes, *,
                    now: float) -> None:
        """Store one placement of ``session``, replacing any of that name."""

    async def forget_placements(self, before: float) -> int:
        """Delete the placements last stored before ``before``; how many went."""

    # --- vectors (hybrid recall; see memory.vectors) ---------------------------------------

    async def put_vectors(self, rows: Sequence[VectorRow]) -> None:
        """Replace the vectors of each memory in ``rows`` under its model with its rows (none
        for a memory that is gone). A memory whose text changes loses its vectors."""

    async def cached_vectors(self, model: str, digests: Sequence[str]) -> dict[str, bytes]:
        """The stored vectors of these chunk digests under ``model``, by digest."""

    async def unembedded(
        self, model: str, *, after: str = "", limit: int = 100
    ) -> builtins.list[Memory]:
        """Episodic and semantic memories with no vector under ``model``, by memory_id
        above ``after`` (a cursor: resumable), at most ``limit``."""

    async def count_unembedded(self, model: str) -> int: ...

    async def vector_spans(
        self, model: str, *, after: str = "", limit: int = 100
    ) -> builtins.list[tuple[Memory, builtins.list[tuple[int, int]]]]:
        """Episodic and semantic memories by memory_id above ``after`` (a cursor), at most
        ``limit``, each with the spans of its vectors under ``model`` in chunk order (none:
        not embedded): what reindex compares with today's chunking."""

    async def count_embeddable(self) -> int:
        """How many episodic and semantic memories there are (what ``vector_spans`` walks)."""

    async def vector_search(
        self,
        scope: Scope,
        vector: np.ndarray,
        model: str,
        *,
        types: Sequence[MemoryType] = MEMORY_TYPES,
        limit: int = 20,
        now: float | None = None,
    ) -> builtins.list[Hit]:
        """The memories of ``scope`` nearest ``vector`` (a unit vector of ``model``), best
        first, each with its best chunk's similarity and span; expired ones skipped."""
