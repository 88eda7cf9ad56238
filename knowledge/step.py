"""The knowledge pipeline step: discover the caller's assets and append the block."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from cachetools import LRUCache

from ctxproxy.injectors.instructions import append_block
from ctxproxy.injectors.knowledge_block import render
from ctxproxy.knowledge.capability import CapabilityKey, Grant, mint
from ctxproxy.knowledge.client import Discovery
from ctxproxy.knowledge.local import LocalAssets
from ctxproxy.knowledge.model import Asset
from ctxproxy.request import Exchange, Identity

__all__ = ["KnowledgeStep"]

BLOCKS = 4096  # rendered blocks kept (a few KiB each)


class KnowledgeStep:
    """Appends ``<knowledge_tools>`` to ``instructions``; no team or no assets: no change.

    Discovery never raises (a failure is an empty result, logged and counted there), so this
    step leaves the request exactly as the window made it whenever there is nothing to add.
    """

    name = "knowledge"

    def __init__(
        self, discovery: Discovery, *, service_id: str, capability: CapabilityKey | None = None,
        local: LocalAssets | None = None, clock: Callable[[], float] = time.time,
    ) -> None:
        self.discovery = discovery
        self.local = local  # the proxy's own assets (chat memory), listed after the core's
        self.service_id = service_id
        self.capability = capability  # the embedded core's tools want one per asset and scope
        self._clock = clock
        self._blocks: LRUCache[tuple[object, ...], str | None] = LRUCache(BLOCKS)

    async def __call__(self, ex: Exchange) -> None:
        who = ex.identity
        # A compaction summarises the history; tools it cannot call would only add noise.
        # (Requests with previous_response_id do get the block: instructions are not carried
        # over from the previous response.)
        if not who.team_id or ex.is_compaction:
            return
        assets = list(await self.discovery.assets(who.team_id, who.agent_id, who.user_key))
        capabilities = self._capabilities(who, assets)
        # The chat memory is listed once the window has cut this session: before that all of
        # it is in view, and a listing on every request of a session that never needs it
        # costs more than the session's cut would save.
        if self.local is not None and self.capability is not None and ex.first_turn:
            now = self._clock()
            for asset, grant in self.local.listed(who):
                assets.append(asset)
                capabilities[asset.item.knowledge_id] = mint(self.capability, grant, now=now)
        key = (tuple(assets), who.session_id, tuple(sorted(capabilities.items())))
        try:
            block = self._blocks[key]
        except KeyError:
            # The same bytes for every request of a session until its assets or capabilities
            # change: rendered once (an lxml tree a request was a fair share of this step).
            block = self._blocks[key] = render(
                assets, service_id=self.service_id, session_id=who.session_id,
                capabilities=capabilities)
        if block is None:
            return
        ex.body = append_block(ex.body, block)
        ex.changed = True
        ex.notes.knowledge_assets = len(assets)

    def _capabilities(self, who: Identity, assets: Sequence[Asset]) -> dict[str, str]:
        """Each asset's capability for this caller: bound to the agent and user when
        discovery listed the agent's bound assets, else to the team (the same rule)."""
        if self.capability is None or not who.team_id:
            return {}
        bound = bool(who.agent_id and who.user_key)
        now = self._clock()
        return {
            a.item.knowledge_id: mint(self.capability, Grant(
                self.service_id, who.team_id, (who.agent_id or "") if bound else "",
                who.user if bound else "", a.item.knowledge_id), now=now)
            for a in assets
        }
