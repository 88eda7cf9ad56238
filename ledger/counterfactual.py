"""What a request would have cost sent directly: the provider's prefix-cache rule applied to
the client's own bodies, by item digests.

A provider with prompt caching bills the longest prefix a prompt shares with a recent prompt
of the same cache key as cached: counted from 1,024 tokens, in 128-token blocks, forgotten
after some minutes unused. The proxy sees every body the client sends, so it can tell what
the client alone would have had cached: each body is split into parts in the provider's
order (instructions, tools, each input item), each part is digested and counted once, and
the chain of digests is matched against the session's earlier chains. A shared part means
shared tokens; a part that differs ends the prefix (a provider could still match a few tokens
into it: the estimate errs towards less cached, a higher direct cost, by less than a part).

It is an estimate: the proxy's tokenizer, not the provider's, and the provider's own cache
may expire sooner or later than ``ttl_s``. The ledger puts it on the upstream's scale (see
``scale``) so that the direct and the proxied cost are measured alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from cachetools import LRUCache

__all__ = [
    "BLOCK_TOKENS", "MIN_CACHED_TOKENS", "DirectCache", "Measure", "PartCounter", "cacheable",
    "prompt_parts",
]

BLOCK_TOKENS = 128
MIN_CACHED_TOKENS = 1024
TTL_S = 600.0  # the bench's provider TTL (OpenAI: 5-10 minutes idle, at most an hour)
SESSIONS = 10_000  # sessions whose chains are kept, least recently used out
CHAIN_NODES = 200_000  # chain nodes kept per session: a bound, never reached by real sessions
PARTS = 500_000  # part token counts kept (digest -> tokens)


def prompt_parts(body: dict[str, Any]) -> list[bytes]:
    """``instructions``, ``tools`` and each input item, serialised the same way every time
    (sorted keys), in the order the provider reads them."""
    parts: list[bytes] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        parts.append(instructions.encode())
    tools = body.get("tools")
    if tools:
        parts.append(orjson.dumps(tools, option=orjson.OPT_SORT_KEYS))
    items = body.get("input")
    if isinstance(items, str):
        parts.append(items.encode())
    elif isinstance(items, list):
        parts.extend(orjson.dumps(item, option=orjson.OPT_SORT_KEYS) for item in items)
    return parts


def cacheable(shared_tokens: int) -> int:
    """Tokens a provider bills as cached for a shared prefix of ``shared_tokens``."""
    cached = shared_tokens // BLOCK_TOKENS * BLOCK_TOKENS
    return cached if cached >= MIN_CACHED_TOKENS else 0


@dataclass(frozen=True, slots=True)
class Measure:
    """One body, measured: its chain of part digests and the tokens up to each part."""

    chain: tuple[bytes, ...]  # chain[i] digests parts 0..i
    ends: tuple[int, ...]  # ends[i]: tokens in parts 0..i

    @property
    def tokens(self) -> int:
        return self.ends[-1] if self.ends else 0


class PartCounter:
    """Counts a body's tokens part by part, remembering each part's count by its digest (a
    session resends the same items on every request: each is counted once)."""

    def __init__(self, count: Callable[[str], int], size: int = PARTS) -> None:
        self._count = count
        self._memo: LRUCache[bytes, int] = LRUCache(size)

    def measure(self, body: dict[str, Any]) -> Measure:
        chain: list[bytes] = []
        ends: list[int] = []
        link = b""
        total = 0
        for part in prompt_parts(body):
            digest = hashlib.blake2b(part, digest_size=16).digest()
            tokens = self._memo.get(digest)
            if tokens is None:
                tokens = self._count(part.decode("utf-8", "replace"))
                self._memo[digest] = tokens
            total += tokens
            link = hashlib.blake2b(link + digest, digest_size=16).digest()
            chain.append(link)
            ends.append(total)
        return Measure(tuple(chain), tuple(ends))


class DirectCache:
    """The prompt cache the client would have had on its own: per session, each chain node
    it sent with when it was last used."""

    def __init__(self, ttl_s: float = TTL_S, sessions: int = SESSIONS) -> None:
        self.ttl_s = ttl_s
        self._sessions: LRUCache[str, LRUCache[bytes, float]] = LRUCache(sessions)

    def read_and_store(self, session: str, measure: Measure, now: float) -> int:
        """Tokens this body would have had cached sent directly; then remember its chain."""
        nodes = self._sessions.get(session)
        if nodes is None:
            nodes = self._sessions[session] = LRUCache(CHAIN_NODES)
        shared = 0
        for link, end in zip(measure.chain, measure.ends, strict=True):
            used = nodes.get(link)
            if used is None or now - used > self.ttl_s:
                break
            shared = end
        for link in measure.chain:
            nodes[link] = now
        return cacheable(shared)
