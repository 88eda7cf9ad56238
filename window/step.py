"""The window step: cut the forwarded history to the context plus the last turns."""

from __future__ import annotations

from config import Settings
from request import Exchange
from window.masking import mask_range
from window.policy import budget_drop, turns_to_drop

__all__ = ["WindowStep"]


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

    def drop(self, ex: Exchange) -> int:
        """How many of the oldest turns this request cuts."""
        history = ex.history
        if self.trim_at_tokens:
            return budget_drop(history, self.keep, self.trim_at_tokens)
        return turns_to_drop(history.turns, self.keep, self.slack)

    async def __call__(self, ex: Exchange) -> None:
        if ex.items is None or ex.history_is_foreign:
            return
        drop = self.drop(ex)
        if drop == 0:
            return
        cut = ex.history.keep_from(drop)
        kept = cut.items
        if self.mask_chars is not None:
            # Every cut keeps at least ``keep`` turns; the first keep - 1 were the older ones.
            masked_turns = []
            total = 0
            for k in range(min(self.keep - 1, len(cut.starts) - 1)):
                masked = mask_range(kept, cut.starts[k], cut.starts[k + 1], self.mask_chars)
                if masked:
                    masked_turns.append(drop + k)
                    total += masked
            ex.notes.outputs_masked = total
            ex.masked_turns = frozenset(masked_turns)
        ex.body = {**ex.body, "input": kept}
        ex.cut = cut.removed
        ex.first_turn = drop
        ex.starts = cut.starts
        ex.changed = True
