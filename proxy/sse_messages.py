"""Anthropic Messages answers read on the side: a stream's events (``message_start``'s usage,
the content blocks, ``message_delta``'s usage) or one JSON message. The relay copies bytes;
this only watches them."""

from __future__ import annotations

from typing import Any

import orjson

from ctxproxy.proxy.sse import EventsTap
from ctxproxy.request.protocol import MESSAGES

__all__ = ["MessagesTap"]


class MessagesTap(EventsTap):
    """Rebuilds a Messages stream's message (its usage and content blocks) from its events.

    Every event is read: a Messages stream's events are small, and what memory keeps of the
    answer (its text and tool calls) is in the deltas."""

    def __init__(self, content_encoding: str | None = None) -> None:
        super().__init__(content_encoding)
        self._message: dict[str, Any] | None = None
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        self._usage: dict[str, Any] = {}
        self._stopped = False

    def read(self, data: Any) -> None:
        if not isinstance(data, dict):
            return
        kind = data.get("type")
        if kind == "message_start" and isinstance(data.get("message"), dict):
            self._message = data["message"]
            self._usage.update(self._message.get("usage") or {})
        elif kind == "content_block_start" and isinstance(data.get("content_block"), dict):
            self._blocks[_index(data)] = dict(data["content_block"])
        elif kind == "content_block_delta" and isinstance(data.get("delta"), dict):
            block = self._blocks.get(_index(data))
            delta = data["delta"]
            if block is None:
                return
            if delta.get("type") == "text_delta":
                block["text"] = str(block.get("text", "")) + str(delta.get("text", ""))
            elif delta.get("type") == "thinking_delta":
                block["thinking"] = str(block.get("thinking", "")) + str(delta.get("thinking", ""))
            elif delta.get("type") == "input_json_delta":
                self._json.setdefault(_index(data), []).append(str(delta.get("partial_json", "")))
        elif kind == "message_delta" and isinstance(data.get("usage"), dict):
            # Its usage is cumulative: it replaces what message_start said.
            self._usage.update({k: v for k, v in data["usage"].items() if v is not None})
        elif kind == "message_stop":
            self._stopped = True

    @property
    def answer_due(self) -> bool:
        return self._stopped

    def _whole(self) -> dict[str, Any] | None:
        if self._message is None:
            return None
        content = []
        for index in sorted(self._blocks):
            block = self._blocks[index]
            if index in self._json:
                try:
                    block["input"] = orjson.loads("".join(self._json[index]) or "{}")
                except orjson.JSONDecodeError:
                    pass
            content.append(block)
        return {**self._message, "content": content, "usage": self._usage}

    def output(self) -> list[dict[str, Any]] | None:
        return MESSAGES.output(self._whole()) if self._stopped else None

    def usage(self) -> dict[str, int] | None:
        return MESSAGES.usage(self._whole())


def _index(data: dict[str, Any]) -> int:
    index = data.get("index")
    return index if isinstance(index, int) else -1
