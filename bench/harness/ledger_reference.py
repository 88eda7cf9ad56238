"""The ledger's measure as it was before it stopped parsing twice (commit 89e323a), kept
word for word as the reference the faster one must agree with, number for number.

It parses both bodies from their bytes, serialises and digests every part of each, and keeps
its caches in cachetools' LRUCache. Only tests import it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import orjson
from cachetools import LRUCache

from ctxproxy.ledger.counterfactual import Measure, cacheable
from ctxproxy.ledger.measure import Pending
from ctxproxy.ledger.model import Record

TTL_S = 600.0
SESSIONS = 10_000
CHAIN_NODES = 200_000
PARTS = 500_000


def prompt_parts(body: dict[str, Any]) -> list[bytes]:
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


class PartCounter:
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
    def __init__(self, ttl_s: float = TTL_S, sessions: int = SESSIONS,
                 chain_nodes: int = CHAIN_NODES) -> None:
        self.ttl_s = ttl_s
        self._chain_nodes = chain_nodes
        self._sessions: LRUCache[str, LRUCache[bytes, float]] = LRUCache(sessions)

    def read_and_store(self, session: str, measure: Measure, now: float) -> int:
        nodes = self._sessions.get(session)
        if nodes is None:
            nodes = self._sessions[session] = LRUCache(self._chain_nodes)
        shared = 0
        for link, end in zip(measure.chain, measure.ends, strict=True):
            used = nodes.get(link)
            if used is None or now - used > self.ttl_s:
                break
            shared = end
        for link in measure.chain:
            nodes[link] = now
        return cacheable(shared)


class Reference:
    """The old ``Recorder.measure``, from the Pending's bytes alone."""

    def __init__(self, count: Callable[[str], int], direct: DirectCache | None = None) -> None:
        self._counter = PartCounter(count)
        self._direct = direct or DirectCache()

    def measure(self, pending: Pending) -> Record:
        record = pending.record
        if not pending.parsed:
            return record
        client = self._counter.measure(orjson.loads(pending.raw))
        forwarded = (
            client if pending.forwarded is None
            else self._counter.measure(orjson.loads(pending.forwarded))
        )
        shared = 0
        if record.status < 400:
            shared = self._direct.read_and_store(record.session_id, client, record.at)
        record = replace(record, client_tokens=client.tokens,
                         forwarded_tokens=forwarded.tokens)
        if record.input_tokens is None:
            return record
        scale = record.input_tokens / forwarded.tokens if forwarded.tokens else 1.0
        return replace(
            record,
            direct_input=round(client.tokens * scale),
            direct_cached=cacheable(round(shared * scale)) if scale != 1.0 else shared,
        )
