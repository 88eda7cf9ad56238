"""The chat-memory asset: each team and agent's memory as a knowledge asset the model pulls from.

``chat_memory-{team_id}-{agent_id}`` is listed in ``<knowledge_tools>`` beside the core's
assets when memory is on, and its curl lines carry a capability for the caller's own memory
scope (service, team, agent and the user part of the scope): the scope a call reads comes from
the capability, never from the call, so no call reaches another scope's memory. The tools are
``memory.chat_asset``'s, plus ``read`` of a masked tool output by its ``output_id`` (the one
the window's fetch line names) for the session the call comes from.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from ctxproxy.config import Settings
from ctxproxy.knowledge.capability import Grant
from ctxproxy.knowledge.model import Asset, KnowledgeItem
from ctxproxy.knowledge.params import Body, ServiceError
from ctxproxy.memory.chat_asset import TOOLS, ChatMemory, ToolError
from ctxproxy.memory.model import Scope, StoreError
from ctxproxy.memory.step import scope_of
from ctxproxy.proxy.memory_wiring import MEMORY
from ctxproxy.proxy.output_store import scope_of as output_scope
from ctxproxy.proxy.outputs import archive
from ctxproxy.request import Identity

__all__ = ["PREFIX", "ChatMemoryAssets", "knowledge_id"]

PREFIX = "chat_memory-"
NAME = "Chat memory"
SUMMARY = ("Your earlier turns and sessions with this team and agent, tool outputs included, "
           "and what was distilled from them. Tools: search, read, recent.")
LAST = -1  # below any binding's priority (0 and up)
READ_OUTPUT: Body = {"output_id": {"type": "string", "required": False}}


def knowledge_id(team_id: str, agent_id: str) -> str:
    return f"{PREFIX}{team_id}-{agent_id}"


class ChatMemoryAssets:
    """``knowledge.local.LocalAssets`` for the chat-memory asset of each scope."""

    def __init__(self, app: web.Application, settings: Settings) -> None:
        self._app = app
        self._settings = settings
        self._service_url = settings.reachable_url + "/v3"

    def _memory(self) -> ChatMemory:
        runtime = self._app.get(MEMORY)
        if runtime is None:
            raise ServiceError(503, "memory is not open yet; try again shortly")
        return ChatMemory(runtime.store, offload=runtime.pool.run)

    def owns(self, knowledge_id: str) -> bool:
        return knowledge_id.startswith(PREFIX)

    def listed(self, who: Identity) -> Sequence[tuple[Asset, Grant]]:
        s = self._settings
        if not (s.memory_enabled and s.chat_memory_asset and who.team_id):
            return []
        scope = scope_of(s, who)
        asset_id = knowledge_id(scope.team_id, scope.agent_id)
        item = KnowledgeItem(asset_id, "chat-memory", self._service_url, NAME, SUMMARY)
        grant = Grant(scope.service_id, scope.team_id, scope.agent_id, scope.user, asset_id)
        return [(Asset(item, priority=LAST), grant)]  # the core's assets first

    async def tools_list(self, grant: Grant, body: Body) -> Body:
        return {"knowledge_id": grant.knowledge_id, "type": "chat-memory", "name": NAME,
                "summary": SUMMARY, "status": "active", "tools": _tools()}

    async def tools_call(self, grant: Grant, session: str | None, body: Body) -> Body:
        tool = body.get("tool_name")
        params = body.get("params") or {}
        if not isinstance(tool, str) or not isinstance(params, dict):
            raise ServiceError(400, "tool_name must be a string and params an object")
        if tool == "read" and "output_id" in params:
            return await self._output(grant, session, params.get("output_id"))
        scope = Scope(grant.service_id, grant.team_id, grant.agent_id, grant.user)
        try:
            return await self._memory().call(scope, session, tool, params)
        except ToolError as exc:
            raise ServiceError(exc.code, exc.message) from exc
        except StoreError as exc:
            raise ServiceError(503, f"the memory store failed ({type(exc).__name__})") from exc

    async def _output(self, grant: Grant, session: str | None, output_id: object) -> Body:
        """A masked output of the grant's own scope and the caller's session."""
        kept = archive(self._app)
        if not isinstance(output_id, str) or not output_id:
            raise ServiceError(400, "params.output_id must be a non-empty string")
        scope = output_scope(grant.service_id, grant.team_id, grant.agent_id, grant.user)
        text = (await kept.find(output_id, session, scope) if kept is not None and session
                else None)
        if text is None:
            raise ServiceError(404, f"no output {output_id!r} for this session here; rerun "
                                    "the command that printed it")
        return {"output_id": output_id, "text": text}


def _tools() -> list[Body]:
    tools = [dict(t) for t in TOOLS]
    for tool in tools:
        if tool["name"] == "read":
            tool["description"] = (str(tool["description"]) + " Or a tool output the window "
                                   "shortened, whole, by the output_id its fetch line names.")
            tool["params"] = {"memory_id": {"type": "string", "required": False},
                              **READ_OUTPUT}
    return tools
