"""Runs the request pipeline: each step against the Exchange, a failing step undone alone.

The steps and their order are written in ``proxy/assemble.py``; this module only runs them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from ctxproxy.request import Exchange, Step

__all__ = ["LOG_EVERY_S", "Pipeline"]

log = logging.getLogger("ctxproxy.pipeline")
LOG_EVERY_S = 60.0  # a failing step is logged once per step and reason in this time


class Pipeline:
    """The steps in order. A step that raises has its changes rolled back and is counted;
    the request goes on with the other steps' work."""

    def __init__(
        self,
        steps: Sequence[Step],
        *,
        on_failure: Callable[[str, str], None] = lambda step, reason: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.steps = list(steps)
        self._on_failure = on_failure
        self._clock = clock
        self._logged: dict[tuple[str, str], float] = {}

    async def run(self, ex: Exchange) -> list[str]:
        """Apply the steps; returns the names of those that failed."""
        failed: list[str] = []
        for step in self.steps:
            saved = ex.checkpoint()
            try:
                await step(ex)
            except Exception as exc:
                ex.restore(saved)
                failed.append(step.name)
                self._failed(step.name, exc)
        return failed

    def _failed(self, step: str, exc: Exception) -> None:
        reason = type(exc).__name__
        self._on_failure(step, reason)
        now = self._clock()
        key = (step, reason)
        last = self._logged.get(key)
        if last is None or now - last >= LOG_EVERY_S:
            self._logged[key] = now
            log.warning(
                "step %s failed, the request goes on without it: %s: %s", step, reason, exc,
                exc_info=exc,
            )
