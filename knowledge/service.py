"""The embedded core and its knowledge service: KERNEL_API.md's calls over the catalogue.

``EmbeddedCore`` takes and returns the wire shapes (``data`` of the envelope) and raises
``ServiceError`` with the envelope's non-zero code; the HTTP routes and the in-process
``LocalCore`` (what discovery uses, without a self-HTTP call) both sit on it.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ctxproxy.knowledge.capability import Grant
from ctxproxy.knowledge.client import MAX_IDS, CoreError, parse_bindings, parse_items
from ctxproxy.knowledge.code_tools import CODE_TOOLS, call_code_tool
from ctxproxy.knowledge.model import BoundAsset, KnowledgeItem
from ctxproxy.knowledge.params import Body, ServiceError
from ctxproxy.knowledge.params import integer as _integer
from ctxproxy.knowledge.params import string as _string
from ctxproxy.knowledge.store import Catalogue
from ctxproxy.request import user_digest

__all__ = ["WIKI_TOOLS", "EmbeddedCore", "LocalCore", "ServiceError"]

T = TypeVar("T")
# The catalogue's type -> KERNEL_API.md's asset_type of a binding.
ASSET_TYPES = {"wiki": "llm_wiki", "code-graph": "code_graph"}

WIKI_TOOLS: list[Body] = [
    {"name": "get_info", "description": "The wiki's name, summary and page count.",
     "params": {}},
    {"name": "search",
     "description": "Ranked full-text search over the pages: page ids, titles and snippets.",
     "params": {"query": {"type": "string", "required": True},
                "limit": {"type": "integer", "required": False, "default": 5}}},
    {"name": "list_pages", "description": "Page ids and titles, in id order.",
     "params": {"offset": {"type": "integer", "required": False, "default": 0},
                "limit": {"type": "integer", "required": False, "default": 100}}},
    {"name": "read_page", "description": "One page's whole Markdown text.",
     "params": {"page_id": {"type": "string", "required": True}}},
]


class EmbeddedCore:
    """The core's discovery calls and the assets' tools, answered from the catalogue."""

    def __init__(self, catalogue: Catalogue, service_url: str) -> None:
        self.catalogue = catalogue
        self.service_url = service_url  # what the model can reach, with /v3

    # --- discovery -----------------------------------------------------------------------------

    def list_knowledge(self, service_id: str, body: Body) -> Body:
        team_id = _string(body, "team_id")
        ids = body.get("knowledge_ids")
        if ids is not None and (
            not isinstance(ids, list)
            or len(ids) > MAX_IDS
            or not all(isinstance(i, str) for i in ids)
        ):
            raise ServiceError(400, f"knowledge_ids must be a list of at most {MAX_IDS} strings")
        pagination = body.get("pagination") or {}
        if not isinstance(pagination, dict):
            raise ServiceError(400, "pagination must be an object")
        limit = _integer(pagination, "limit", 200, 1, 200)
        rows = self.catalogue.knowledge(service_id, team_id, ids, limit)
        return {"items": [self._item(row) for row in rows]}

    def _item(self, row: Body) -> Body:
        return {
            "knowledge_id": row["knowledge_id"], "type": row["type"],
            "service_url": self.service_url, "name": row["name"], "summary": row["summary"],
            "team_id": row["team_id"], "user_id": None, "repo_url": row["repo_url"],
            "branch": row["branch"], "repo_slug": row["repo_slug"],
            "created_at": row["created_at"], "updated_at": row["updated_at"],
        }

    def agent_assets(self, service_id: str, user_key: str | None, body: Body) -> Body:
        if not user_key:
            raise ServiceError(400, "the x-tdai-user-key header is required")
        agent_id = _string(body, "agent_id")
        rows = self.catalogue.bindings(service_id, agent_id, user_digest(user_key))
        return {"items": [
            {"asset_id": r["knowledge_id"], "asset_type": ASSET_TYPES[r["type"]],
             "name": r["name"],
             "description": r["summary"], "status": "active", "visibility": "private",
             "injection_mode": "tool", "priority": r["priority"], "created_at": r["created_at"]}
            for r in rows
        ]}

    def authorise(self, service_id: str, grant: Grant, body: Body) -> None:
        """Raise ServiceError (403) unless ``grant`` covers the asset ``body`` names: the
        asset is its team's, and bound to its agent and user when the grant names them (the
        same rule discovery lists assets by)."""
        knowledge_id = _string(body, "knowledge_id")
        if grant.service_id != service_id or grant.knowledge_id != knowledge_id:
            raise ServiceError(403, "the capability token is for another asset or service")
        rows = self.catalogue.knowledge(service_id, ids=[knowledge_id])
        if not rows:
            raise ServiceError(404, f"unknown knowledge_id {knowledge_id!r}")
        if rows[0]["team_id"] != grant.team_id:
            raise ServiceError(403, f"{knowledge_id!r} is not this team's")
        if grant.agent_id and grant.user:
            bound = self.catalogue.bindings(service_id, grant.agent_id, grant.user)
            if not any(b["knowledge_id"] == knowledge_id for b in bound):
                raise ServiceError(403, f"{knowledge_id!r} is not bound to this agent and user")

    # --- the knowledge service (wikis here, code graphs in code_tools) ----------------------------

    def _asset(self, service_id: str, body: Body) -> Body:
        knowledge_id = _string(body, "knowledge_id")
        rows = self.catalogue.knowledge(service_id, ids=[knowledge_id])
        if not rows:
            raise ServiceError(404, f"unknown knowledge_id {knowledge_id!r}")
        return rows[0]

    def tools_list(self, service_id: str, body: Body) -> Body:
        row = self._asset(service_id, body)
        tools = CODE_TOOLS if row["type"] == "code-graph" else WIKI_TOOLS
        return {"knowledge_id": row["knowledge_id"], "type": row["type"], "name": row["name"],
                "summary": row["summary"], "status": "active", "tools": tools}

    def tools_call(self, service_id: str, body: Body) -> Body:
        row = self._asset(service_id, body)
        tool = _string(body, "tool_name")
        params = body.get("params") or {}
        if not isinstance(params, dict):
            raise ServiceError(400, "params must be an object")
        if row["type"] == "code-graph":
            return call_code_tool(self.catalogue, row, tool, params)
        tools: dict[str, Callable[[Body, Body], Body]] = {
            "get_info": self._get_info, "search": self._search,
            "list_pages": self._list_pages, "read_page": self._read_page,
        }
        handler = tools.get(tool)
        if handler is None:
            raise ServiceError(404, f"unknown tool {tool!r}; this wiki has: {', '.join(tools)}")
        return handler(row, params)

    def _get_info(self, row: Body, params: Body) -> Body:
        keys = ("knowledge_id", "type", "name", "summary", "page_count", "created_at",
                "updated_at")
        return {key: row[key] for key in keys}

    def _search(self, row: Body, params: Body) -> Body:
        query = _string(params, "query")
        limit = _integer(params, "limit", 5, 1, 50)
        # Words only: the model's text must never be read as FTS5 query syntax.
        terms = re.findall(r"\w+", query)[:32]
        hits = self.catalogue.search(row["knowledge_id"], terms, limit)
        return {"query": query, "results": [
            {"page_id": h["page_id"], "title": h["title"], "snippet": h["snippet"]}
            for h in hits
        ]}

    def _list_pages(self, row: Body, params: Body) -> Body:
        offset = _integer(params, "offset", 0, 0, 1_000_000)
        limit = _integer(params, "limit", 100, 1, 500)
        pages = self.catalogue.pages(row["knowledge_id"], offset, limit)
        return {"total": row["page_count"], "offset": offset, "pages": pages}

    def _read_page(self, row: Body, params: Body) -> Body:
        page_id = _string(params, "page_id")
        page = self.catalogue.page(row["knowledge_id"], page_id)
        if page is None:
            raise ServiceError(
                404, f"no page {page_id!r} in {row['knowledge_id']}; list_pages shows the ids"
            )
        return {"page_id": page["page_id"], "title": page["title"], "content": page["body"]}


class LocalCore:
    """The ``Core`` protocol answered in-process by the embedded core, off the event loop."""

    def __init__(self, core: EmbeddedCore, service_id: str) -> None:
        self.core = core
        self.service_id = service_id

    async def _run(self, call: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.to_thread(fn, self.service_id, *args)
        except (ServiceError, sqlite3.Error) as exc:
            raise CoreError(call, f"{type(exc).__name__}: {exc}") from exc

    async def list_knowledge(self, team_id: str) -> list[KnowledgeItem]:
        body = {"team_id": team_id, "pagination": {"limit": 200}}
        data = await self._run("list_knowledge", self.core.list_knowledge, body)
        return parse_items("list_knowledge", data)

    async def list_knowledge_by_ids(
        self, team_id: str, ids: Sequence[str]
    ) -> list[KnowledgeItem]:
        body = {"team_id": team_id, "knowledge_ids": list(ids[:MAX_IDS])}
        data = await self._run("list_knowledge_by_ids", self.core.list_knowledge, body)
        return parse_items("list_knowledge_by_ids", data)

    async def list_agent_knowledge_ids(self, agent_id: str, user_key: str) -> list[BoundAsset]:
        body = {"agent_id": agent_id, "apply_visibility_filter": True, "touch_usage": False}
        call = "list_agent_knowledge_ids"
        data = await self._run(call, self.core.agent_assets, user_key, body)
        return parse_bindings(call, data)
