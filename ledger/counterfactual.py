"""What a request would have cost sent directly: the provider's prefix-cache rule applied to
the client's own bodies, by item digests.

A provider with prompt caching bills the longest prefix a prompt shares with a recent prompt
of the same cache key as cached: counted from 1,024 tokens, in 128-token blocks, forgotten
after some minutes unused. The proxy sees every body the client sends, so it can tell what
the client alone would have had cached: each body is split into parts in the provider's
order (instructions, tools, each input item; for Anthropic Messages tools, each system block,
each message, cache marks left out), each part is digested and counted once, and
the chain of digests is matched against the session's earlier chains. A shared part means
shared tokens; a part that differs ends the prefix (a provider could still match a few tokens
into it: the estimate errs towards less cached, a higher direct cost, by less than a part).

It is an estimate: the proxy's tokenizer, not the provider's, and the provider's own cache
may expire sooner or later than ``ttl_s``. The ledger puts it on the upstream's scale (see
``scale``) so that the direct and the proxied cost are measured alike.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = [
    "BLOCK_TOKENS", "MIN_CACHED_TOKENS", "REFRESH_S", "TTL_S", "DirectCache", "Measure", "Nodes",
    "PartCounter", "cacheable", "prompt_parts",
]

BLOCK_TOKENS = 128
MIN_CACHED_TOKENS = 1024
TTL_S = 600.0  # the bench's provider TTL (OpenAI: 5-10 minutes idle, at most an hour)
SESSIONS = 10_000  # sessions whose chains are kept, least recently used out
CHAIN_NODES = 200_000  # chain nodes kept per session: a bound, never reached by real sessions
PARTS = 500_000  # part token counts kept (digest -> tokens)
# A node's time of use is written to the ledger's store when it is new, or when it moved by
# this much since the store last had it: a session's request rewrites only the nodes of its
# new items, not its whole chain; a node read back may look up to this much older.
REFRESH_S = 60.0

Nodes = dict[bytes, float]  # a session's chain nodes, each with when it was last used


def prompt_parts(body: dict[str, Any]) -> list[bytes]:
    """``instructions``, ``tools`` and each input item, serialised the same way every time
    (sorted keys), in the order the provider reads them."""
    return [_serialise(value, text) for value, text in _part_values(body)]


def _part_values(body: dict[str, Any]) -> list[tuple[Any, bool]]:
    """The values ``prompt_parts`` serialises, each with whether it is text (sent as its
    UTF-8) rather than a JSON value (sent as sorted-key JSON)."""
    messages = body.get("messages")
    if isinstance(messages, list) and "input" not in body:
        return _messages_part_values(body, messages)
    values: list[tuple[Any, bool]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        values.append((instructions, True))
    tools = body.get("tools")
    if tools:
        values.append((tools, False))
    items = body.get("input")
    if isinstance(items, str):
        values.append((items, True))
    elif isinstance(items, list):
        values.extend((item, False) for item in items)
    return values


# Anthropic's cache marks: where the client asks for a cache entry, not part of the prompt
# (Claude Code moves its mark to the newest message on every request).
_MARK = "cache_control"


def _messages_part_values(body: dict[str, Any], messages: list[Any]) -> list[tuple[Any, bool]]:
    """An Anthropic Messages body's parts, in the order Anthropic reads a prompt: tools, each
    ``system`` block, each message; blocks without their cache marks, a string content as
    its text block (Claude Code marks its newest message, sent as blocks for the mark)."""
    values: list[tuple[Any, bool]] = []
    tools = body.get("tools")
    if tools:
        values.append((tools, False))
    system = body.get("system")
    if isinstance(system, str) and system:
        values.append((system, True))
    elif isinstance(system, list):
        values.extend((_unmarked(block), False) for block in system)
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):  # the same prompt as its one text block
            message = {**message, "content": [{"type": "text", "text": content}]}
        elif isinstance(content, list) and any(
                isinstance(block, dict) and _MARK in block for block in content):
            message = {**message, "content": [_unmarked(block) for block in content]}
        values.append((message, False))
    return values


def _unmarked(block: Any) -> Any:
    if isinstance(block, dict) and _MARK in block:
        return {k: v for k, v in block.items() if k != _MARK}
    return block


def _serialise(value: Any, text: bool) -> bytes:
    # PartCounter._measure has the same inline: it runs once per part of every request.
    if text:
        encoded: bytes = value.encode()
        return encoded
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


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


# A part's id() -> (whether it is text, its tokens, the part), for one request's two bodies:
# holding the part keeps its id from being reused by a copy made for the other body.
_Seen = dict[int, tuple[bool, int, Any]]


class PartCounter:
    """Counts a body's tokens part by part, remembering each part's count by its digest (a
    session resends the same items on every request: each is counted once)."""

    def __init__(self, count: Callable[[str], int], size: int = PARTS) -> None:
        self._count = count
        self._size = size
        # Least recently used out. An OrderedDict's lookups and moves are C calls: cachetools'
        # LRUCache spends microseconds in Python on each, and a request makes dozens.
        self._memo: OrderedDict[bytes, int] = OrderedDict()

    def measure(self, body: dict[str, Any]) -> Measure:
        return self._measure(body, {})

    def measure_pair(
        self, client: dict[str, Any], forwarded: dict[str, Any] | None
    ) -> tuple[Measure, int]:
        """The client's body measured, and the forwarded body's tokens (None: the client's).

        The proxy forwards most of the client's items as the very objects it parsed: a part
        that is the same object as one of the client's is not serialised and digested again.
        """
        seen: _Seen = {}
        client_measure = self._measure(client, seen)
        if forwarded is None:
            return client_measure, client_measure.tokens
        total = 0
        for value, text in _part_values(forwarded):
            known = seen.get(id(value))
            if known is not None and known[0] is text:
                total += known[1]
            else:
                part = _serialise(value, text)
                total += self._tokens(hashlib.sha256(part).digest()[:16], part)
        return client_measure, total

    def _measure(self, body: dict[str, Any], seen: _Seen) -> Measure:
        chain: list[bytes] = []
        ends: list[int] = []
        link = b""
        total = 0
        # sha256 runs on the CPU's SHA extensions (x86 SHA-NI, ARMv8): on whole bodies about
        # three times as fast as blake2b here. Digests live in this process only.
        sha256 = hashlib.sha256
        dumps, sort_keys = orjson.dumps, orjson.OPT_SORT_KEYS
        for value, text in _part_values(body):
            part = value.encode() if text else dumps(value, option=sort_keys)
            digest = sha256(part).digest()[:16]
            tokens = self._tokens(digest, part)
            # By identity: ``seen`` holds each value, so no id is reused while it is read.
            seen[id(value)] = (text, tokens, value)
            total += tokens
            link = sha256(link + digest).digest()[:16]
            chain.append(link)
            ends.append(total)
        return Measure(tuple(chain), tuple(ends))

    def _tokens(self, digest: bytes, part: bytes) -> int:
        memo = self._memo
        tokens = memo.get(digest)
        if tokens is not None:
            memo.move_to_end(digest)
            return tokens
        tokens = self._count(part.decode("utf-8", "replace"))
        memo[digest] = tokens
        if len(memo) > self._size:
            memo.popitem(last=False)
        return tokens


class DirectCache:
    """The prompt cache the client would have had on its own: per session, each chain node
    it sent with when it was last used. Both levels drop the least recently used first."""

    def __init__(self, ttl_s: float = TTL_S, sessions: int = SESSIONS) -> None:
        self.ttl_s = ttl_s
        self._max_sessions = sessions
        self._sessions: OrderedDict[str, OrderedDict[bytes, float]] = OrderedDict()

    def seed(self, session: str, nodes: Nodes) -> None:
        """Take ``nodes`` as all this cache knows of ``session`` (what the ledger's store
        holds: every replica's requests of it, not only this process's)."""
        self._sessions[session] = OrderedDict(sorted(nodes.items(), key=lambda n: n[1]))
        self._sessions.move_to_end(session)
        if len(self._sessions) > self._max_sessions:
            self._sessions.popitem(last=False)

    def changed(self, session: str, known: Nodes) -> list[tuple[bytes, float]]:
        """The nodes of ``session`` that are not in ``known`` (the store's), or used
        ``REFRESH_S`` or more after it last had them: what the store must be told."""
        nodes = self._sessions.get(session)
        if nodes is None:
            return []
        return [(link, used) for link, used in nodes.items()
                if used - known.get(link, -REFRESH_S) >= REFRESH_S]

    def read_and_store(self, session: str, measure: Measure, now: float) -> int:
        """Tokens this body would have had cached sent directly; then remember its chain."""
        sessions = self._sessions
        nodes = sessions.get(session)
        if nodes is None:
            nodes = sessions[session] = OrderedDict()
            if len(sessions) > self._max_sessions:
                sessions.popitem(last=False)
        else:
            sessions.move_to_end(session)
        shared = 0
        for link, end in zip(measure.chain, measure.ends, strict=True):
            used = nodes.get(link)
            if used is None or now - used > self.ttl_s:
                break
            shared = end
        for link in measure.chain:
            nodes[link] = now
            nodes.move_to_end(link)
            if len(nodes) > CHAIN_NODES:
                nodes.popitem(last=False)
        return cacheable(shared)
