"""Assets served by the proxy itself rather than by the core: how they plug into discovery
and into the tools routes (the chat-memory asset is one, wired in ``proxy/``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ctxproxy.knowledge.capability import Grant
from ctxproxy.knowledge.model import Asset
from ctxproxy.knowledge.params import Body
from ctxproxy.request import Identity

__all__ = ["LocalAssets"]


class LocalAssets(Protocol):
    """Assets of this proxy's own, listed beside the core's and called with a capability."""

    def owns(self, knowledge_id: str) -> bool:
        """Whether ``knowledge_id`` is one of these assets (by its form alone)."""

    def listed(self, who: Identity) -> Sequence[tuple[Asset, Grant]]:
        """The assets ``who`` may use, each with the grant its curl lines carry."""

    async def tools_list(self, grant: Grant, body: Body) -> Body:
        """``tools/list``'s data for the asset ``grant`` names; raises ServiceError."""

    async def tools_call(self, grant: Grant, session: str | None, body: Body) -> Body:
        """``tools/call``'s data; raises ServiceError (the envelope's code)."""
