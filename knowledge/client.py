"""Knowledge discovery: the core's three calls, the selection rule, and the cache in front.

The calls raise ``CoreError``; ``Discovery.assets`` is what the request path uses, and it never
raises: a failure is one warning naming the call and the reason, and an empty result that is
remembered for the negative TTL, so a dead core costs one timeout per TTL, not one per request.

A remote core's answers are kept for the TTL: a change made there shows within it. The
embedded core's catalogue says when it changed (``generation``): every answer is dropped at
once then, so a ``ctxproxy knowledge`` command shows on the proxy's next request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import httpx
import orjson
from prometheus_client import Counter

from ctxproxy.config.logs import fields
from ctxproxy.knowledge.cache import TtlCache
from ctxproxy.knowledge.model import (
    DEFAULT_PRIORITY,
    Asset,
    BoundAsset,
    KnowledgeItem,
    MalformedItem,
    parse_binding,
    parse_item,
)
from ctxproxy.request import user_digest

__all__ = ["MAX_IDS", "Core", "CoreError", "Discovery", "HttpCore"]

log = logging.getLogger("ctxproxy.knowledge")

MAX_IDS = 200  # KERNEL_API.md: listKnowledgeByIds takes at most 200 ids
MAX_ANSWER_BYTES = 8 * 1024 * 1024
T = TypeVar("T")


class CoreError(Exception):
    """A core call failed; ``call`` names it and ``reason`` says why (never a secret)."""

    def __init__(self, call: str, reason: str) -> None:
        super().__init__(f"{call}: {reason}")
        self.call = call
        self.reason = reason


class Core(Protocol):
    """The three discovery calls of KERNEL_API.md (remote over HTTP, or the embedded core)."""

    async def list_knowledge(self, team_id: str) -> list[KnowledgeItem]: ...

    async def list_knowledge_by_ids(
        self, team_id: str, ids: Sequence[str]
    ) -> list[KnowledgeItem]: ...

    async def list_agent_knowledge_ids(self, agent_id: str, user_key: str) -> list[BoundAsset]: ...


def parse_items(call: str, data: Any) -> list[KnowledgeItem]:
    """``data.items`` as KnowledgeItems; one malformed item fails the whole answer."""
    items = data.get("items") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise CoreError(call, "data.items is not a list")
    try:
        return [parse_item(raw) for raw in items]
    except MalformedItem as exc:
        raise CoreError(call, f"malformed item: {exc}") from exc


def parse_bindings(call: str, data: Any) -> list[BoundAsset]:
    items = data.get("items") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise CoreError(call, "data.items is not a list")
    try:
        parsed = [parse_binding(raw) for raw in items]
    except MalformedItem as exc:
        raise CoreError(call, f"malformed item: {exc}") from exc
    return [b for b in parsed if b is not None]


class HttpCore:
    """A core over HTTP: one httpx client for the process, closed with ``aclose``."""

    def __init__(
        self,
        base_url: str,
        *,
        service_id: str,
        token: str | None,
        timeout_s: float,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"content-type": "application/json", "x-tdai-service-id": service_id}
        if token:
            headers["authorization"] = f"Bearer {token}"
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            transport=transport,
            follow_redirects=False,
        )
        self._timeout_ms = round(timeout_s * 1000)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def list_knowledge(self, team_id: str) -> list[KnowledgeItem]:
        call = "list_knowledge"
        body = {"team_id": team_id, "pagination": {"limit": 200}}
        return parse_items(call, await self._post(call, "/v3/knowledge/list", body))

    async def list_knowledge_by_ids(
        self, team_id: str, ids: Sequence[str]
    ) -> list[KnowledgeItem]:
        call = "list_knowledge_by_ids"
        body = {"team_id": team_id, "knowledge_ids": list(ids[:MAX_IDS])}
        return parse_items(call, await self._post(call, "/v3/knowledge/list", body))

    async def list_agent_knowledge_ids(self, agent_id: str, user_key: str) -> list[BoundAsset]:
        call = "list_agent_knowledge_ids"
        body = {"agent_id": agent_id, "apply_visibility_filter": True, "touch_usage": False}
        path = "/v3/meta/agent-fixed-asset/list-with-detail"
        data = await self._post(call, path, body, {"x-tdai-user-key": user_key})
        return parse_bindings(call, data)

    async def _post(
        self, call: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> Any:
        """POST and unwrap the envelope: its ``data`` when ``code == 0``, else CoreError."""
        try:
            async with self._client.stream(
                "POST", path, content=orjson.dumps(body), headers=headers
            ) as response:
                if not response.is_success:
                    raise CoreError(call, f"HTTP {response.status_code}")
                raw = await _read_capped(call, response)
        except httpx.TimeoutException as exc:
            raise CoreError(call, f"no answer within {self._timeout_ms} ms") from exc
        except httpx.HTTPError as exc:
            raise CoreError(call, f"{type(exc).__name__}: {exc}") from exc
        try:
            envelope = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise CoreError(call, "answer is not JSON") from exc
        if not isinstance(envelope, dict) or not isinstance(envelope.get("code"), int):
            raise CoreError(call, "answer is not a {code, message} envelope")
        if envelope["code"] != 0:
            message = str(envelope.get("message", ""))[:200]
            raise CoreError(call, f"code {envelope['code']}: {message}")
        return envelope.get("data")


async def _read_capped(call: str, response: httpx.Response) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise CoreError(call, f"answer is over {MAX_ANSWER_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


@dataclass(frozen=True, slots=True)
class Found:
    assets: tuple[Asset, ...]
    failed: bool = False


CacheKey = tuple[str, str, str | None, str, int]  # service, team, agent, key digest, generation
ASSET_OVERHEAD = 200  # bytes an asset takes beside its text: the objects holding it


def _size(found: Found) -> int:
    """About the bytes ``found`` holds: its assets' texts and their objects."""
    return sum(
        ASSET_OVERHEAD + len(a.item.knowledge_id) + len(a.item.type) + len(a.item.service_url)
        + len(a.item.name) + len(a.item.summary or "") + len(a.item.repo_slug or "")
        for a in found.assets
    ) + ASSET_OVERHEAD


class Discovery:
    """Which assets a (team, agent, user key) may use, cached per that key and service id.

    ``generation``, when given, is a cheap count (it runs on the event loop, on every lookup)
    that changes whenever the core's answers may have: a change drops every cached answer,
    the failures' too. Without it (a remote core) an answer lives for its TTL."""

    def __init__(
        self,
        core: Core,
        *,
        service_id: str,
        timeout_s: float,
        ttl_s: float,
        negative_ttl_s: float,
        lookups: Counter | None = None,
        failures: Counter | None = None,
        generation: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = core
        self.service_id = service_id
        self.timeout_s = timeout_s
        self.ttl_s = ttl_s
        self.negative_ttl_s = negative_ttl_s
        self._lookups = lookups  # labelled by result: hit, miss, shared, negative_hit
        self._failures = failures
        self._cache: TtlCache[CacheKey, Found] = TtlCache(size_of=_size, clock=clock)
        self._generation = generation
        self._seen = generation() if generation is not None else 0

    async def assets(
        self, team_id: str | None, agent_id: str | None = None, user_key: str | None = None
    ) -> tuple[Asset, ...]:
        """The assets to list, best first; empty when there are none or discovery failed."""
        if not team_id:
            return ()
        if not (agent_id and user_key):
            agent_id = user_key = None  # the team-wide path: one cache entry per team
        seen = self._current()
        # The cache holds a digest, not the user key itself. The generation is in the key so
        # that a load begun before a change, and ending after it, is never served after it.
        key: CacheKey = (self.service_id, team_id, agent_id, user_digest(user_key), seen)

        async def load() -> tuple[Found, float]:
            return await self._load(team_id, agent_id, user_key)

        found, how = await self._cache.get(key, load)
        if self._lookups is not None:
            label = "negative_hit" if how == "hit" and found.failed else how
            self._lookups.labels(label).inc()
        return found.assets

    def _current(self) -> int:
        """The generation now; a new one drops every cached answer."""
        if self._generation is None:
            return 0
        now = self._generation()
        if now != self._seen:
            self._seen = now
            self._cache.clear()
        return now

    async def close(self) -> None:
        await self._cache.close()

    async def _load(
        self, team_id: str, agent_id: str | None, user_key: str | None
    ) -> tuple[Found, float]:
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        try:
            assets = await self._select(team_id, agent_id, user_key, deadline)
        except CoreError as exc:
            log.warning(
                "knowledge discovery failed, no block this time",
                extra=fields(call=exc.call, reason=exc.reason, team_id=team_id),
            )
            if self._failures is not None:
                self._failures.inc()
            return Found((), failed=True), self.negative_ttl_s
        return Found(assets), self.ttl_s

    async def _select(
        self, team_id: str, agent_id: str | None, user_key: str | None, deadline: float
    ) -> tuple[Asset, ...]:
        """KERNEL_API.md's rule: the agent's bound assets when agent and key are known."""
        if agent_id is None or user_key is None:
            items = await self._bounded(
                "list_knowledge", self.core.list_knowledge(team_id), deadline
            )
            return _canonical(Asset(item) for item in items)
        bound = await self._bounded(
            "list_agent_knowledge_ids",
            self.core.list_agent_knowledge_ids(agent_id, user_key),
            deadline,
        )
        priorities: dict[str, int] = {}
        for binding in bound:  # the core sends the highest priority first: keep the first
            priorities.setdefault(binding.knowledge_id, binding.priority)
        if not priorities:
            return ()
        ids = list(priorities)[:MAX_IDS]
        items = await self._bounded(
            "list_knowledge_by_ids", self.core.list_knowledge_by_ids(team_id, ids), deadline
        )
        return _canonical(
            Asset(item, priorities.get(item.knowledge_id, DEFAULT_PRIORITY))
            for item in items
            if item.knowledge_id in priorities
        )

    async def _bounded(self, call: str, aw: Awaitable[T], deadline: float) -> T:
        # One deadline for the whole lookup: the agent path's two calls share the timeout.
        try:
            async with asyncio.timeout_at(deadline):
                return await aw
        except TimeoutError as exc:
            ms = round(self.timeout_s * 1000)
            raise CoreError(call, f"no answer within {ms} ms") from exc


def _canonical(assets: Any) -> tuple[Asset, ...]:
    """Deduplicated by id and sorted by priority then id: the same assets, the same block."""
    unique: dict[str, Asset] = {}
    for asset in assets:
        unique.setdefault(asset.item.knowledge_id, asset)
    return tuple(sorted(unique.values(), key=lambda a: a.sort_key))
