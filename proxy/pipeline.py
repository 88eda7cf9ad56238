"""Runs the request pipeline: each phase of an exchange on every step that has it, a failing
step costing only itself.

The steps and their order are written in ``proxy/assemble.py``; the phases a step may have
are in ``request/phases.py``. This module only runs them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from ctxproxy.request import (
    Answer,
    Answers,
    Completes,
    End,
    Ends,
    Exchange,
    Hold,
    Prepares,
    Step,
)

__all__ = ["LOG_EVERY_S", "Pipeline"]

log = logging.getLogger("ctxproxy.pipeline")
LOG_EVERY_S = 60.0  # a failing step is logged once per step and reason in this time


class Pipeline:
    """The steps in order. A step that raises before the upstream call has its changes rolled
    back; in any phase it is counted (``ctxproxy_step_failures_total``) and logged once a
    minute, and the request goes on with the other steps' work."""

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

    @property
    def steps(self) -> list[Step]:
        return self._steps

    @steps.setter
    def steps(self, steps: Sequence[Step]) -> None:
        # Which step has which phase, found once (a test may swap the steps: found again).
        self._steps = list(steps)
        self._prepares = [s for s in self._steps if isinstance(s, Prepares)]
        self._answers = [s for s in self._steps if isinstance(s, Answers)]
        self._completes = [s for s in self._steps if isinstance(s, Completes)]
        self._ends = [s for s in self._steps if isinstance(s, Ends)]

    async def run(self, ex: Exchange) -> list[str]:
        """Before the upstream call: apply the steps; returns the names of those that failed."""
        failed: list[str] = []
        for step in self._prepares:
            saved = ex.checkpoint()
            try:
                await step(ex)
            except Exception as exc:
                ex.restore(saved)
                failed.append(step.name)
                self._failed(step.name, exc)
        return failed

    def answering(self, ex: Exchange, status: int) -> Hold | None:
        """The upstream answered with ``status``: what the relay awaits before the chunk that
        completes the answer (None: nothing)."""
        holds: list[tuple[str, Hold]] = []
        for step in self._answers:
            try:
                hold = step.answering(ex, status)
            except Exception as exc:
                self._failed(step.name, exc)
                continue
            if hold is not None:
                holds.append((step.name, hold))
        if not holds:
            return None

        async def held() -> None:
            for name, hold in holds:
                try:
                    await hold()
                except Exception as exc:
                    self._failed(name, exc)

        return held

    def completed(self, ex: Exchange, answer: Answer) -> None:
        """The answer was relayed whole."""
        for step in self._completes:
            try:
                step.completed(ex, answer)
            except Exception as exc:
                self._failed(step.name, exc)

    def ended(self, end: End) -> None:
        """The request is over, whatever became of it."""
        for step in self._ends:
            try:
                step.ended(end)
            except Exception as exc:
                self._failed(step.name, exc)

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
