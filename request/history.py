"""A request's ``input`` as a history of turns, parsed once and read by every step.

A *turn* starts at a user message that is a real prompt (not one of the agent's context
messages) and runs to the next one. Context is pinned wherever it stands; a turn's reasoning,
calls, outputs and unknown items belong to it; a call and its output (the nearest after it with
its ``call_id``: ids may repeat across turns) go together.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from ctxproxy.request.items import (
    SYSTEM_ROLES,
    Item,
    call_pairs,
    is_compaction_message,
    is_context,
    message_text,
)

__all__ = ["MODEL_ITEMS", "Cut", "History", "digest"]


# Items the model writes (besides assistant messages); a run of them is one model call.
MODEL_ITEMS = frozenset({
    "reasoning", "function_call", "custom_tool_call", "local_shell_call", "web_search_call",
    "file_search_call", "computer_call", "image_generation_call", "mcp_call",
})


def digest(*parts: object) -> str:
    """A short stable digest of JSON-able parts (keys derived from content)."""
    return hashlib.sha256(orjson.dumps(parts)).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Cut:
    """The history with its oldest turns removed: what is forwarded and what is not."""

    items: list[Item]  # forwarded, in input order
    removed: list[Item]  # cut, in input order
    starts: list[int]  # positions of the kept turns' prompts in ``items``


# Codex resends a session's whole history on every request: the same prompts' keys are
# derived again and again. Remembered for prompts up to this size (a bound on what the cache
# holds), by their text itself, so a key is the digest's, whatever came before.
_CACHED_PROMPT_CHARS = 1024


@functools.lru_cache(maxsize=8192)
def _cached_prompt_key(session: str, text: str, prompt_id: str | None) -> str:
    return "prompt:" + digest(session, text, prompt_id)


def _prompt_key(session: str, text: str, prompt_id: object) -> str:
    if len(text) <= _CACHED_PROMPT_CHARS and (prompt_id is None or type(prompt_id) is str):
        return _cached_prompt_key(session, text, prompt_id)
    return "prompt:" + digest(session, text, prompt_id)


class History:
    """The client's ``input`` items, their turns, context flags and call links.

    One pass over the items builds it; nothing here copies or changes an item.
    """

    __slots__ = (
        "_pairs", "_prompt_keys", "compacted", "context", "items", "model_calls", "starts"
    )

    def __init__(self, items: Sequence[Item]) -> None:
        self.items: Sequence[Item] = items
        self.context: list[bool] = []
        self.starts: list[int] = []  # index of each turn's prompt
        self.compacted = False  # a compaction rewrote it: its first prompt is not the session's
        self._prompt_keys: tuple[str, list[str]] | None = None
        # Model calls each turn made: a run of items the model wrote is one call.
        self.model_calls: list[int] = []
        model_calls: list[int] = []
        context, starts = self.context, self.starts
        inside = False  # the previous item was the model's
        for i, item in enumerate(items):
            if type(item) is not dict:
                raise TypeError("input items must be objects")
            # Most items are reasoning, calls and outputs: one lookup settles them.
            kind = item.get("type", "message")
            if kind != "message" or "role" not in item:
                context.append(kind == "additional_tools")
                model = type(kind) is str and kind in MODEL_ITEMS
            else:
                role = item.get("role")
                is_ctx = is_context(item) if role == "user" else (
                    type(role) is str and role in SYSTEM_ROLES
                )
                context.append(is_ctx)
                if role == "user":
                    if not is_ctx:
                        starts.append(i)
                        model_calls.append(0)
                    elif not self.compacted and is_compaction_message(item):
                        self.compacted = True
                model = role == "assistant"
            if model and not inside and model_calls:
                model_calls[-1] += 1
            inside = model
        self.model_calls = model_calls
        self._pairs = call_pairs(items)

    @property
    def turns(self) -> int:
        return len(self.starts)

    def span(self, n: int) -> tuple[int, int]:
        """Turn ``n``'s items as a slice: from its prompt to the next prompt."""
        end = self.starts[n + 1] if n + 1 < len(self.starts) else len(self.items)
        return self.starts[n], end

    def prompt(self, n: int) -> Item:
        return self.items[self.starts[n]]

    def prompt_text(self, n: int) -> str:
        return message_text(self.prompt(n))

    def turn_items(self, n: int) -> tuple[Item, ...]:
        """Turn ``n``'s own items (its context messages left out), prompt first."""
        start, end = self.span(n)
        return tuple(self.items[i] for i in range(start, end) if not self.context[i])

    def prompt_keys(self, session: str) -> list[str]:
        """Each turn's key: from the session and its prompt alone, so that any request whose
        history holds the turn derives the same key."""
        if self._prompt_keys is None or self._prompt_keys[0] != session:
            keys = [_prompt_key(session, message_text(p), p.get("id"))
                    for p in (self.items[i] for i in self.starts)]
            self._prompt_keys = (session, keys)
        return self._prompt_keys[1]

    def keep_from(self, first: int) -> Cut:
        """Cut the turns before turn ``first``, keeping context and linked calls."""
        if first <= 0 or not self.starts:
            return Cut(list(self.items), [], list(self.starts))
        boundary = self.starts[first] if first < len(self.starts) else len(self.items)
        head = self.starts[0]
        keep = [i < head or i >= boundary or c for i, c in enumerate(self.context)]
        # A call and its output travel together: if either is kept, both are (an output
        # that came after the next prompt keeps its call). Nothing else shares the pair's id.
        for call, output in self._pairs.items():
            if keep[call] or keep[output]:
                keep[call] = keep[output] = True
        items: list[Item] = []
        removed: list[Item] = []
        starts: list[int] = []
        kept_starts = set(self.starts[first:])
        for i, item in enumerate(self.items):
            if keep[i]:
                if i in kept_starts:
                    starts.append(len(items))
                items.append(item)
            else:
                removed.append(item)
        return Cut(items, removed, starts)
