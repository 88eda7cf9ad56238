"""A user turn's writes of what its requests brought, held until one is answered."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ctxproxy.memory.model import Memory

__all__ = ["Keep"]

Write = Callable[[], "asyncio.Future[list[Memory]]"]


class Keep:
    """What a user turn keeps of what its requests brought: its episodes (queued) and its
    working memory (written at once: the answer waits for it). Nothing is written until
    ``begin``, called when a request of the turn is answered with a success: a turn the
    upstream refused every request of (a browser's, with a history of its own making, say)
    keeps nothing. Begun once; the parsed history it held is let go then."""

    __slots__ = ("_episodes", "_working", "begun", "writing")

    def __init__(self, episodes: Callable[[], object], working: Write | None) -> None:
        self._episodes: Callable[[], object] | None = episodes
        self._working = working
        self.begun = False
        self.writing: asyncio.Future[list[Memory]] | None = None  # once begun

    def begin(self) -> asyncio.Future[list[Memory]] | None:
        """Queue the episodes and start the working-memory write (once); that write."""
        if self.begun:
            return None
        self.begun = True
        if self._working is not None:
            self.writing = self._working()
        if self._episodes is not None:
            self._episodes()
        self._episodes = self._working = None
        return self.writing
