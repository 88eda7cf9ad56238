"""When the window cuts and how many of the oldest turns: pure functions of the history.

No state in the proxy: the same history gives the same answer on any replica, windowing a
windowed history changes nothing, and appending to a history never moves an earlier cut, so
between cuts each request extends the one before it byte for byte.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from request import History, Item

__all__ = ["WindowResult", "budget_drop", "estimate_tokens", "turns_to_drop", "window"]


def turns_to_drop(turns: int, keep: int, slack: int = 0) -> int:
    """How many of the oldest turns to cut.

    With slack, the cut point moves in steps of ``slack + 1`` turns, so the forwarded prefix
    changes once per step instead of on every turn (a warmer provider prompt cache).
    """
    excess = turns - keep
    if excess <= 0:
        return 0
    step = slack + 1
    return (excess // step) * step


def estimate_tokens(item: Any) -> int:
    """A cheap token estimate for the request path (no tokenizer): four bytes a token."""
    return len(orjson.dumps(item)) // 4


def budget_drop(history: History, keep: int, at_tokens: int) -> int:
    """How many of the oldest turns to cut so that the input stays near ``at_tokens``.

    Replays the history from its first turn: each time the forwarded input passes the budget,
    the cut point moves up to keep the last ``keep`` turns.
    """
    starts = history.starts
    if not starts:
        return 0
    items, context = history.items, history.context
    est = [0 if c else estimate_tokens(item) for item, c in zip(items, context, strict=True)]
    bounds = [*starts, len(items)]
    sizes = [sum(est[a:b]) for a, b in itertools.pairwise(bounds)]
    pinned = sum(estimate_tokens(item) for item, c in zip(items, context, strict=True) if c)
    cut, running = 0, 0
    for n, size in enumerate(sizes, start=1):
        running += size  # the turns cut .. n-1, as forwarded
        if pinned + running > at_tokens and n - keep > cut:
            running -= sum(sizes[cut : n - keep])
            cut = n - keep
    return cut


@dataclass(frozen=True, slots=True)
class WindowResult:
    """What the window did: the items to forward and the items it cut, both in input order."""

    items: list[Item]
    cut: list[Item] = field(default_factory=list)
    turns_in: int = 0
    turns_kept: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.cut)


def window(items: Sequence[Item], keep: int, slack: int = 0) -> WindowResult:
    """Cut ``items`` down to the context plus the last turns (the step's cut, as a function)."""
    if not all(isinstance(item, dict) for item in items):
        raise TypeError("input items must be objects")
    history = History(items)
    drop = turns_to_drop(history.turns, keep, slack)
    cut = history.keep_from(drop)
    return WindowResult(cut.items, cut.removed, history.turns, history.turns - drop)
