"""When the window cuts and how many of the oldest turns: pure functions of the history.

No state in the proxy: the same history gives the same answer on any replica, windowing a
windowed history changes nothing, and appending to a history never moves an earlier cut, so
between cuts each request extends the one before it byte for byte.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from ctxproxy.request import History, Item

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
    """Cut ``items`` down to the context plus the last turns (the step's cut, as a function).
    Raises TypeError for items that are not objects."""
    history = History(items)
    drop = turns_to_drop(history.turns, keep, slack)
    cut = history.keep_from(drop)
    return WindowResult(cut.items, cut.removed, history.turns, history.turns - drop)


# --- the cost-driven cut ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Shape:
    """What a history shows of itself: tokens per turn and model calls per turn."""

    tokens: list[int]  # estimated tokens of each turn (its own items)
    calls: list[int]  # model calls each turn made

    @classmethod
    def of(cls, history: History) -> Shape:
        items, bounds = history.items, [*history.starts, len(history.items)]
        tokens = [len(orjson.dumps(items[a:b])) // 4 for a, b in itertools.pairwise(bounds)]
        return cls(tokens, history.model_calls)


@dataclass(frozen=True, slots=True)
class CostPolicy:
    """Cut where a cut pays, by the provider's prefix-cache prices.

    A cut of the turns before ``c'`` removes R tokens from every later request, each of which
    would have been a cached read (``cached`` of the price); it makes the prefix after the
    instructions cold once (the kept older turns K, and the context P before them, since the
    memory blocks in the instructions change with a cut): ``write - cached`` of the price. So a
    cut pays when ``cached * R * H > (write - cached) * (P + K)``, H being the requests until
    the next cut: the session's own model calls per turn times the turns until the window is
    full again. At each turn boundary the policy takes the best cut (none when none pays);
    past ``max_turns`` or ``max_tokens`` it must cut, and takes the best of the cuts that fit.
    It never cuts the newest turn, nor below ``min_turns`` unless the ceiling demands it.

    With ``breakpoints`` (a model that caches only at breakpoints, where the proxy marks the
    end of the agent's context), a cut leaves the prefix P warm: what it makes cold is the
    kept older turns and the blocks the cut puts before them (the digest of the cut turns,
    at most ``digest_tokens`` and never more than half of what it cut, and the standing
    memory block, ``standing_tokens``). With ``head_cold`` as well, the context P's own items
    (before the first turn) stand after those blocks and are written again at each cut:
    in an Anthropic Messages body the blocks end ``system`` and the client's context (Claude
    Code's reminders) opens ``messages``; only what is outside the input stays warm.

    The decision is replayed from the first turn boundary on, each time from what the
    history held at that boundary: appending to a history never moves an earlier cut, so
    every request between two cuts extends the one before it byte for byte, and any replica
    decides the same with no state.
    """

    max_turns: int
    min_turns: int = 2
    max_tokens: int = 0  # 0: no ceiling
    cached: float = 0.1
    write: float = 1.0
    breakpoints: bool = False
    digest_tokens: int = 0
    standing_tokens: int = 0
    head_cold: bool = False

    def first_kept(self, history: History, outside_tokens: int) -> tuple[int, int]:
        """The first turn to forward, and the turn that was the newest when that cut was
        made (the older turns it kept are the ones masking may shorten).

        ``outside_tokens``: the body's tokens outside ``input`` (instructions, tools). Every
        figure a decision reads is fixed once its boundary has passed, so the same boundary
        decides the same on every later request.
        """
        n = history.turns
        if n <= 1:
            return 0, 0
        shape = Shape.of(history)
        ends = list(itertools.accumulate(shape.tokens, initial=0))  # ends[i]: before turn i
        head = history.items[: history.starts[0]]  # the context before the first turn
        head_tokens = len(orjson.dumps(head)) // 4
        prefix = outside_tokens + head_tokens
        cut, at = _replay(self, prefix, tuple(ends[:n]), tuple(shape.calls[: n - 1]),
                          head_tokens)
        moved = self._fit(cut, n - 1, ends[n], ends, prefix)
        return (moved, n - 1) if moved != cut else (cut, at)

    def replay(
        self, prefix: int, ends: tuple[int, ...], calls: tuple[int, ...], head: int = 0,
    ) -> tuple[int, int]:
        """The cut and the turn it was made at after the last boundary ``ends`` reaches: what
        the completed turns decide (the newest turn's own size aside). ``head``: the
        context's own tokens, part of ``prefix``."""
        cut = at = made = 0
        for b in range(1, len(ends)):
            moved = self._fit(cut, b - 1, ends[b], ends, prefix)  # while b-1 was the newest
            if moved != cut:
                cut, at = moved, b - 1
            made += calls[b - 1]
            per_turn = max(made / b, 1.0)
            moved = self._decide(cut, b, ends, prefix, per_turn, head)
            if moved != cut:
                cut, at = moved, b
        return cut, at

    def _fit(self, cut: int, newest: int, end: int, ends: Sequence[int], prefix: int) -> int:
        """The fewest more turns to cut, never ``newest``, so that the turns from ``cut`` on,
        ``end`` tokens into the history, fit under max_tokens."""
        if not self.max_tokens:
            return cut
        while cut < newest and prefix + end - ends[cut] > self.max_tokens:
            cut += 1
        return cut

    def _decide(
        self, cut: int, b: int, ends: Sequence[int], prefix: int, per_turn: float,
        head: int = 0,
    ) -> int:
        """The cut at the boundary where turn ``b`` starts (turns before it complete)."""
        forced = max(cut, b + 1 - self.max_turns)  # keep at most max_turns, the newest in
        # Only what the history held at this boundary: the turns before b (b's prompt aside).
        forced = self._fit(forced, b, ends[b], ends, prefix)
        floor_ = max(b + 1 - self.min_turns, forced)  # cut no deeper than min_turns leaves
        best, best_gain = forced, -float("inf") if forced > cut else 0.0
        for new in range(max(forced, cut + 1), floor_ + 1):
            removed = ends[new] - ends[cut]
            kept = ends[b] - ends[new]  # the older turns kept: read cold once
            horizon = per_turn * (self.max_turns - (b - new))  # requests until full again
            gain = self.cached * removed * horizon - (self.write - self.cached) * (
                self._cold(prefix, kept, removed, head))
            if gain > best_gain:
                best, best_gain = new, gain
        return best

    def _cold(self, prefix: int, kept: int, removed: int, head: int = 0) -> int:
        """The tokens a cut makes cold once (written again)."""
        if not self.breakpoints:
            return prefix + kept
        blocks = min(self.digest_tokens, removed // 2) + self.standing_tokens
        # The context after the blocks is cold only when there are blocks before it.
        return kept + blocks + (head if self.head_cold and blocks else 0)


# The replay over the completed turns is a pure function of them: every request of a turn's
# tool loop (the same completed turns, a longer newest one) finds it here.
@functools.lru_cache(maxsize=4096)
def _replay(
    policy: CostPolicy, prefix: int, ends: tuple[int, ...], calls: tuple[int, ...], head: int,
) -> tuple[int, int]:
    return policy.replay(prefix, ends, calls, head)
