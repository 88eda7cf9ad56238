"""The request pipeline: small steps over an Exchange, in the one order written down here."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from proxy.request import Exchange
from proxy.window import window

log = logging.getLogger("ctxproxy.pipeline")


class Step(Protocol):
    """One transformation of a request. A step that raises makes the proxy fail open."""

    name: str

    async def __call__(self, ex: Exchange) -> None: ...


class WindowStep:
    """Cut the forwarded history to the context plus the last ``keep`` turns."""

    name = "window"

    def __init__(self, keep: int, slack: int = 0) -> None:
        self.keep = keep
        self.slack = slack

    async def __call__(self, ex: Exchange) -> None:
        items = ex.items
        if items is None or untouchable(ex):
            return
        result = window(items, self.keep, self.slack)
        ex.turns_in, ex.turns_forwarded = result.turns_in, result.turns_kept
        if result.changed:
            ex.body["input"] = result.items
            ex.cut = result.cut
            ex.changed = True


def untouchable(ex: Exchange) -> bool:
    """Requests whose history belongs to someone else: the server's, or a compaction's."""
    if ex.body.get("previous_response_id"):
        return True
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
