"""The request pipeline: small steps over an Exchange, in the one order written down here."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import Any, Protocol

import orjson

from config import Settings
from injectors.masking import mask_range
from proxy.request import Exchange
from proxy.window import is_context, turn_starts, window

log = logging.getLogger("ctxproxy.pipeline")


class Step(Protocol):
    """One transformation of a request. A step that raises makes the proxy fail open."""

    name: str

    async def __call__(self, ex: Exchange) -> None: ...


class WindowStep:
    """Cut the forwarded history to the context plus the last ``keep`` turns.

    When to cut: on every turn, in steps of ``slack + 1`` turns, or (``trim_at_tokens``) when
    the input passes a token budget. With ``mask_chars`` set, a cut also masks the tool outputs
    of the kept turns older than the newest one at that cut; which turns those are depends only
    on the cut point, so the forwarded bytes stay the same until the next cut.
    """

    name = "window"

    def __init__(
        self, keep: int, slack: int = 0, *, trim_at_tokens: int = 0, mask_chars: int | None = None
    ) -> None:
        self.keep = keep
        self.slack = slack
        self.trim_at_tokens = trim_at_tokens
        self.mask_chars = mask_chars

    @classmethod
    def from_settings(cls, settings: Settings) -> WindowStep:
        return cls(
            settings.keep_turns,
            settings.trim_slack,
            trim_at_tokens=settings.trim_at_tokens,
            mask_chars=settings.mask_keep_chars if settings.mask_tool_outputs else None,
        )

    async def __call__(self, ex: Exchange) -> None:
        items = ex.items
        if items is None or untouchable(ex):
            return
        if self.trim_at_tokens:
            starts = turn_starts(items)
            drop = budget_drop(items, starts, self.keep, self.trim_at_tokens)
            result = window(items, len(starts) - drop)
        else:
            result = window(items, self.keep, self.slack)
        ex.turns_in, ex.turns_forwarded = result.turns_in, result.turns_kept
        if not result.changed:
            return
        kept = result.items
        if self.mask_chars is not None:
            # Every cut keeps at least ``keep`` turns; the first keep - 1 were the older ones.
            starts = turn_starts(kept)
            kept, masked = mask_range(kept, starts[0], starts[self.keep - 1], self.mask_chars)
            ex.notes["outputs_masked"] = masked
        ex.body["input"] = kept
        ex.cut = result.cut
        ex.changed = True


def estimate_tokens(item: Any) -> int:
    """A cheap token estimate for the request path (no tokenizer): four bytes a token."""
    return len(orjson.dumps(item)) // 4


def budget_drop(items: Sequence[Any], starts: Sequence[int], keep: int, at_tokens: int) -> int:
    """How many of the oldest turns to cut so that the input stays near ``at_tokens``.

    Replays the history from its first turn: each time the forwarded input passes the budget,
    the cut point moves up to keep the last ``keep`` turns. The answer depends on the history
    alone and appending never moves an earlier cut, so between cuts each request extends the
    one before it (no state in the proxy).
    """
    if not starts:
        return 0
    est = [0 if is_context(item) else estimate_tokens(item) for item in items]
    bounds = [*starts, len(items)]
    sizes = [sum(est[a:b]) for a, b in itertools.pairwise(bounds)]
    context = sum(estimate_tokens(item) for item in items if is_context(item))
    cut, running = 0, 0
    for n, size in enumerate(sizes, start=1):
        running += size  # the turns cut .. n-1, as forwarded
        if context + running > at_tokens and n - keep > cut:
            running -= sum(sizes[cut : n - keep])
            cut = n - keep
    return cut


def untouchable(ex: Exchange) -> bool:
    """Requests whose history belongs to someone else: the server's, or a compaction's."""
    return bool(ex.body.get("previous_response_id")) or is_compaction(ex)


def is_compaction(ex: Exchange) -> bool:
    """A Codex compaction request: by its turn metadata, or a trailing compaction_trigger."""
    if ex.identity.request_kind == "compaction":
        return True
    items = ex.items or []
    return bool(items) and isinstance(items[-1], dict) and (
        items[-1].get("type") == "compaction_trigger"
    )


async def run(steps: Sequence[Step], ex: Exchange) -> None:
    """Apply ``steps`` in order. Errors propagate: the caller forwards the original bytes."""
    for step in steps:
        await step(ex)
