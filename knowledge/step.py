"""The knowledge pipeline step: discover the caller's assets and append the block."""

from __future__ import annotations

from injectors.instructions import append_block
from injectors.knowledge_block import render
from knowledge.client import Discovery
from request import Exchange

__all__ = ["KnowledgeStep"]


class KnowledgeStep:
    """Appends ``<knowledge_tools>`` to ``instructions``; no team or no assets: no change.

    Discovery never raises (a failure is an empty result, logged and counted there), so this
    step leaves the request exactly as the window made it whenever there is nothing to add.
    """

    name = "knowledge"

    def __init__(self, discovery: Discovery, *, service_id: str) -> None:
        self.discovery = discovery
        self.service_id = service_id

    async def __call__(self, ex: Exchange) -> None:
        who = ex.identity
        # A compaction summarises the history; tools it cannot call would only add noise.
        # (Requests with previous_response_id do get the block: instructions are not carried
        # over from the previous response.)
        if not who.team_id or ex.is_compaction:
            return
        assets = await self.discovery.assets(who.team_id, who.agent_id, who.user_key)
        block = render(assets, service_id=self.service_id, session_id=who.session_id)
        if block is None:
            return
        ex.body = append_block(ex.body, block)
        ex.changed = True
        ex.notes.knowledge_assets = len(assets)
