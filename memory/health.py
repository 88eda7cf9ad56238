"""Memory failures: every one is counted, the first of a run is logged, so is the recovery."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ctxproxy.config.logs import fields

__all__ = ["Health"]

log = logging.getLogger("ctxproxy.memory")


class Health:
    """Tracks whether each part of the memory side (``what``) is failing."""

    def __init__(self, count: Callable[[], None] = lambda: None) -> None:
        self._count = count
        self._failing: set[str] = set()

    def failed(self, what: str, exc: BaseException) -> None:
        self._count()
        if what not in self._failing:
            self._failing.add(what)
            log.warning(
                "memory degraded: %s failed, carrying on without it: %s", what, exc,
                extra=fields(part=what, error=type(exc).__name__),
            )

    def ok(self, what: str) -> None:
        if what in self._failing:
            self._failing.discard(what)
            log.info("memory recovered: %s works again", what, extra=fields(part=what))

    @property
    def failing(self) -> bool:
        return bool(self._failing)
