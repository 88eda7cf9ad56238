"""The phases of one exchange, and what a pipeline step implements of them.

A step is any object with a ``name`` and one or more of these methods; the pipeline
(``proxy/pipeline.py``) calls each phase on every step that has it, in the order
``proxy/assemble.py`` lists the steps, and a step that raises in a phase costs only itself:

1. ``await step(ex)``: before the upstream call; may change the body (undone if it raises).
2. ``step.answering(ex, status)``: the upstream answered with ``status``, before the answer is
   relayed. It may return a ``Hold``: the relay awaits it before the chunk that completes the
   answer goes on (never before the answer's first bytes).
3. ``step.completed(ex, answer)``: the answer was relayed whole (its output items, size, usage).
4. ``step.ended(end)``: the request is over, whatever became of it (always, after the
   access-log line; ``end.exchange`` is None when the body was never parsed).

A step keeps what it knows of one request on the exchange, in a ``Slot`` of its own: it goes
with the request, and nothing needs clearing when the request ends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, cast, runtime_checkable

from ctxproxy.request.exchange import Exchange
from ctxproxy.request.items import Item
from ctxproxy.request.outcome import End

__all__ = ["Answer", "Answers", "Completes", "Ends", "Hold", "Prepares", "Slot", "Step"]

T = TypeVar("T")
# What the relay awaits before the chunk that completes the answer (see ``Answers``).
Hold = Callable[[], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class Answer:
    """An answer relayed whole: its output items (a ``response.completed`` event's, or a JSON
    body's), about how many bytes it took, and its usage (None: not reported)."""

    output: list[Item]
    size: int
    usage: dict[str, int] | None = None


class Slot(Generic[T]):
    """A step's per-request state on the exchange, made on first use (like a ContextVar,
    keyed by this object)."""

    __slots__ = ("_make",)

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make

    def of(self, ex: Exchange) -> T:
        value = ex.slots.get(self)
        if value is None:
            value = ex.slots[self] = self._make()
        return cast(T, value)

    def get(self, ex: Exchange) -> T | None:
        """The state, if the step made it for this exchange."""
        return cast("T | None", ex.slots.get(self))


class Step(Protocol):
    """A pipeline step: a name (metrics and logs say it) and any of the phases below."""

    name: str


@runtime_checkable
class Prepares(Protocol):
    """Phase 1: before the upstream call."""

    name: str

    async def __call__(self, ex: Exchange) -> None: ...


@runtime_checkable
class Answers(Protocol):
    """Phase 2: the upstream's status, before its answer is relayed."""

    name: str

    def answering(self, ex: Exchange, status: int) -> Hold | None: ...


@runtime_checkable
class Completes(Protocol):
    """Phase 3: the answer, relayed whole."""

    name: str

    def completed(self, ex: Exchange, answer: Answer) -> None: ...


@runtime_checkable
class Ends(Protocol):
    """Phase 4: the request is over, whatever became of it."""

    name: str

    def ended(self, end: End) -> None: ...
