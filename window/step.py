"""The window step: cut the forwarded history to the context plus the last turns."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import orjson

from ctxproxy.config import Settings
from ctxproxy.request import Cut, Exchange, Item, output_text
from ctxproxy.window.digest import Digests
from ctxproxy.window.masking import Archive, Output, mask_range
from ctxproxy.window.policy import CostPolicy, budget_drop, turns_to_drop

__all__ = ["OFF_LOOP_BYTES", "WindowStep"]

# Masking reads each output it masks whole (its fetch id digests the text): for a body past
# this size it runs in a thread, as the body's parse does.
OFF_LOOP_BYTES = 1024 * 1024


class WindowStep:
    """Cut the forwarded history to the context plus its last turns.

    Which turns: with ``policy`` (the cost policy, the default) where a cut pays by the
    provider's cache prices; without it, the fixed rule: keep ``keep`` turns, cutting on every
    turn, in steps of ``slack + 1`` turns, or (``trim_at_tokens``) when the input passes a
    token budget. With ``mask_chars`` set, a cut also masks the tool outputs of the older turns
    it keeps (they are read uncached at the cut anyway); which turns those are depends only on
    the cut, so the forwarded bytes stay the same until the next cut. With ``digest_chars``,
    the cut turns' prompts, commands and answers go in as one ``<earlier_turns>`` message
    before the first kept turn (the newest that fit in that many characters). With
    ``archive``, each masked output's note carries the command that fetches it whole, and the
    archive keeps it for that command.
    """

    name = "window"

    def __init__(
        self, keep: int, slack: int = 0, *, trim_at_tokens: int = 0,
        mask_chars: int | None = None, policy: CostPolicy | None = None,
        digest_chars: int = 0, archive: Archive | None = None,
        breakpoint_policy: CostPolicy | None = None,
        follows_breakpoints: Callable[[object], bool] = lambda model: False,
    ) -> None:
        self.keep = keep
        self.slack = slack
        self.trim_at_tokens = trim_at_tokens
        self.mask_chars = mask_chars
        self.policy = policy
        # The cost policy of the models that cache only at breakpoints (None: ``policy``).
        self.breakpoint_policy = breakpoint_policy
        # ... for a protocol whose pinned blocks stand before the client's context (Messages).
        self.blocks_first_policy = None if breakpoint_policy is None else replace(
            breakpoint_policy, head_cold=True)
        self.follows_breakpoints = follows_breakpoints
        self.digests = Digests(digest_chars) if digest_chars else None
        self.archive = archive

    @classmethod
    def from_settings(cls, settings: Settings, *, archive: Archive | None = None) -> WindowStep:
        policy = breakpoint_policy = None
        if settings.window_policy == "cost":
            policy = CostPolicy(
                max_turns=settings.keep_turns,
                min_turns=min(settings.keep_min_turns, settings.keep_turns),
                max_tokens=settings.window_max_tokens,
                cached=settings.cached_input_ratio,
                write=settings.cache_write_ratio,
            )
            standing = settings.memory_placement == "split" and settings.memory_enabled
            breakpoint_policy = replace(
                policy, write=settings.breakpoint_write_ratio, breakpoints=True,
                digest_tokens=settings.cut_digest_chars // 4,
                standing_tokens=settings.memory_tokens if standing else 0,
            )
        return cls(
            settings.keep_turns,
            settings.trim_slack,
            trim_at_tokens=settings.trim_at_tokens,
            mask_chars=settings.mask_keep_chars if settings.mask_tool_outputs else None,
            policy=policy,
            digest_chars=settings.cut_digest_chars,
            archive=archive,
            breakpoint_policy=breakpoint_policy,
            follows_breakpoints=settings.follows_breakpoints,
        )

    def cut(self, ex: Exchange) -> tuple[int, int]:
        """The first turn to forward, and the turn that was newest when that cut was made."""
        history = ex.history
        policy = self.policy
        # Priced by breakpoints where they are marked: the protocol's own (Messages), or the
        # items' for a model that caches only there (never on Chat: no marks are placed).
        if self.breakpoint_policy is not None and (ex.protocol.caches_at_marks or (
                ex.protocol.item_marks and self.follows_breakpoints(ex.body.get("model")))):
            policy = (self.blocks_first_policy if ex.protocol.blocks_before_context
                      else self.breakpoint_policy)
        if policy is not None:
            outside = {k: v for k, v in ex.body.items() if k != "input"}
            return policy.first_kept(history, len(orjson.dumps(outside)) // 4)
        if self.trim_at_tokens:
            drop = budget_drop(history, self.keep, self.trim_at_tokens)
        else:
            drop = turns_to_drop(history.turns, self.keep, self.slack)
        # The fixed rule keeps at least ``keep`` turns; it masks the first keep - 1 of them.
        return drop, drop + self.keep - 1

    async def __call__(self, ex: Exchange) -> None:
        if ex.items is None or ex.history_is_foreign:
            return
        drop, newest_at_cut = self.cut(ex)
        if drop == 0:
            return
        cut = ex.history.keep_from(drop)
        kept = cut.items
        if self.mask_chars is not None:
            args = (ex, cut, drop, min(newest_at_cut - drop, len(cut.starts) - 1),
                    self.mask_chars)
            if len(ex.raw) > OFF_LOOP_BYTES:
                masked = await asyncio.to_thread(self._mask, *args)
            else:
                masked = self._mask(*args)
            ex.notes.outputs_masked = sum(masked.values())
            ex.masked_turns = frozenset(masked)
        starts = cut.starts
        if self.digests is not None:
            # What was cut, in brief, right before the first kept turn: the same bytes until
            # the next cut.
            digest = await self.digests.message(ex.history, drop, ex.identity)
            if digest is not None:
                at = starts[0]
                kept.insert(at, digest)
                starts = [s + 1 for s in starts]
                ex.notes.cut_digest_chars = len(digest["content"][0]["text"])
                ex.stable_blocks = (digest,)
        ex.body = {**ex.body, "input": kept}
        ex.cut = cut.removed
        ex.first_turn = drop
        ex.starts = starts
        ex.changed = True

    def _mask(
        self, ex: Exchange, cut: Cut, drop: int, older: int, keep_chars: int
    ) -> dict[int, int]:
        """Mask the tool outputs of the first ``older`` kept turns in ``cut.items``; returns
        the outputs masked in each turn that had some (history numbering)."""
        if older <= 0:
            return {}
        archive, identity, kept = self.archive, ex.identity, cut.items
        # Every item from the first kept prompt on is kept: its place in the client's input
        # is its place here, shifted by what was cut before it.
        shift = ex.history.starts[drop] - cut.starts[0]
        outputs: dict[int, Output | None] = {}

        def pointer(i: int, item: Item) -> str | None:
            if archive is None:
                return None
            output = outputs[i] = Output.of(i + shift, item)
            return None if output is None else archive.fetch_command(identity, output)

        masked: dict[int, int] = {}
        for k in range(older):
            whole = mask_range(kept, cut.starts[k], cut.starts[k + 1], keep_chars, pointer)
            if whole:
                masked[drop + k] = len(whole)
            if archive is not None:
                # Kept again on every request between cuts: any process that forwards one of
                # them can answer the fetch line.
                for i, item in whole:
                    if (output := outputs.get(i)) is not None:
                        archive.keep(identity, output, output_text(item))
        return masked
