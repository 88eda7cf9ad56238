"""The chat-memory asset's tools: one scope's memory, pulled by the model when it needs it.

Recall pushes a few snippets into every turn; these tools let the model ask instead: ``search``
(the same ranked search recall uses, shown as snippets for the query), ``read`` (one memory
whole) and ``recent`` (the latest episodes of the session or of the scope). Every call names
its scope, and nothing outside that scope is ever read or shown.

Answers are the wire shapes of KERNEL_API.md's ``tools/call`` ``data``; a bad call raises
``ToolError`` with the envelope's code.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from ctxproxy.injectors import memory_blocks
from ctxproxy.memory.cpu import Offload
from ctxproxy.memory.model import Memory, Scope, Store
from ctxproxy.memory.snippets import snippet

__all__ = ["TOOLS", "ChatMemory", "ToolError"]

Body = dict[str, Any]
MAX_QUERY_CHARS = 2000
READ_CHARS = 64_000  # what ``read`` returns of one memory at most
# What a search result shows of one memory: its own size, not recall's (memory.snippets):
# the model asks again or reads a memory whole when a result is not enough.
ASSET_SNIPPET_TOKENS = 160

TOOLS: list[Body] = [
    {"name": "search",
     "description": "Ranked search over your memory of earlier turns and sessions (episodes, "
                    "distilled facts): memory ids, types, when, and the lines that match.",
     "params": {"query": {"type": "string", "required": True},
                "limit": {"type": "integer", "required": False, "default": 5}}},
    {"name": "read",
     "description": "One memory whole, by memory_id (from search or recent, or a recall "
                    "block's id).",
     "params": {"memory_id": {"type": "string", "required": True}}},
    {"name": "recent",
     "description": "The latest recorded turns: this session's (session: true, the default) "
                    "or of all your sessions.",
     "params": {"limit": {"type": "integer", "required": False, "default": 5},
                "session": {"type": "boolean", "required": False, "default": True}}},
]


class ToolError(Exception):
    """A call the asset refuses: ``code`` is the envelope's (400, 404)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _string(params: Mapping[str, Any], key: str) -> str:
    value = params.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ToolError(400, f"params.{key} must be a non-empty string")
    return value


def _integer(params: Mapping[str, Any], key: str, default: int, high: int) -> int:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ToolError(400, f"params.{key} must be an integer from 1 to {high}")
    return value


def _when(memory: Memory) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(memory.created_at))


def _head(memory: Memory) -> Body:
    out: Body = {"memory_id": memory.memory_id, "type": memory.type,
                 "source": memory_blocks.source(memory), "when": _when(memory)}
    if memory.session_id is not None:
        out["session_id"] = memory.session_id
    if memory.turn_index is not None:
        out["turn"] = memory.turn_index + 1
    return out


class ChatMemory:
    """The tools over ``store``, each within the one scope it is called with."""

    def __init__(self, store: Store, *, offload: Offload,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._offload = offload
        self._clock = clock

    async def call(self, scope: Scope, session: str | None, tool: str, params: Body) -> Body:
        """Run ``tool``; raises ToolError on a bad call, StoreError when the store fails."""
        if tool == "search":
            return await self.search(scope, _string(params, "query")[:MAX_QUERY_CHARS],
                                     _integer(params, "limit", 5, 20))
        if tool == "read":
            return await self.read(scope, _string(params, "memory_id"))
        if tool == "recent":
            mine = params.get("session", True)
            if not isinstance(mine, bool):
                raise ToolError(400, "params.session must be true or false")
            return await self.recent(scope, session if mine else None,
                                     _integer(params, "limit", 5, 20))
        names = ", ".join(t["name"] for t in TOOLS)
        raise ToolError(404, f"unknown tool {tool!r}; chat memory has: {names}")

    async def search(self, scope: Scope, query: str, limit: int) -> Body:
        hits = await self._store.search(scope, query, types=["episodic", "semantic"],
                                        limit=limit, now=self._clock())

        def shown() -> list[Body]:
            return [{**_head(h.memory), "snippet": snippet(h.memory.text, query,
                                                           ASSET_SNIPPET_TOKENS * 2).text}
                    for h in hits]

        return {"query": query, "results": await self._offload(shown)}

    async def read(self, scope: Scope, memory_id: str) -> Body:
        memory = await self._store.get(memory_id)
        # get() looks across every scope: another scope's memory is as unknown as none.
        now = self._clock()
        if (memory is None or memory.scope != scope
                or (memory.expires_at is not None and memory.expires_at <= now)):
            raise ToolError(404, f"no memory {memory_id!r} in your scope; search or recent "
                                 "shows the ids")
        text = memory.text
        clipped = len(text) > READ_CHARS
        return {**_head(memory), "text": text[:READ_CHARS], "truncated": clipped}

    async def recent(self, scope: Scope, session: str | None, limit: int) -> Body:
        found = await self._store.list(scope, types=["episodic"], session_id=session,
                                       limit=limit, now=self._clock())

        def shown() -> list[Body]:
            # The newest first; each as its first lines: read shows one whole.
            return [{**_head(m), "snippet": snippet(m.text, "", ASSET_SNIPPET_TOKENS).text}
                    for m in found]

        return {"session_id": session, "results": await self._offload(shown)}
