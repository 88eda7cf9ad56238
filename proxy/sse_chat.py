"""Chat Completions answers read on the side: a stream's ``data:`` chunks up to ``[DONE]``
(the text and tool-call deltas of the first choice, and the usage chunk a client asks for
with ``stream_options.include_usage``), or one JSON completion. The relay copies bytes; this
only watches them."""

from __future__ import annotations

from typing import Any

from ctxproxy.proxy.sse import EventsTap
from ctxproxy.request.protocol import CHAT

__all__ = ["ChatTap"]

DONE = "[DONE]"


class ChatTap(EventsTap):
    """Rebuilds a Chat stream's completion (its first choice's message and its usage) from
    its chunks.

    Every chunk is read: they are small, and what memory keeps of the answer (its text and
    tool calls) is in the deltas.
    """

    def __init__(self, content_encoding: str | None = None) -> None:
        super().__init__(content_encoding)
        self._text: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._arguments: dict[int, list[str]] = {}
        self._usage: dict[str, Any] | None = None
        self._done = False

    def read(self, data: Any) -> None:
        if data == DONE:
            self._done = True
        elif isinstance(data, dict):
            self._chunk(data)

    def _chunk(self, data: dict[str, Any]) -> None:
        if isinstance(data.get("usage"), dict):
            self._usage = data["usage"]
        choices = data.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        delta = first.get("delta") if isinstance(first, dict) else None
        if not isinstance(delta, dict) or (isinstance(first, dict) and first.get("index", 0)):
            return  # only the first choice is the answer the agent goes on with
        if isinstance(delta.get("content"), str):
            self._text.append(delta["content"])
        for call in delta.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            index = call.get("index")
            at = index if isinstance(index, int) else len(self._calls)
            whole = self._calls.setdefault(at, {"id": "", "type": "function",
                                                "function": {"name": ""}})
            if isinstance(call.get("id"), str):
                whole["id"] = call["id"]
            function = call.get("function")
            if isinstance(function, dict):
                if isinstance(function.get("name"), str):
                    whole["function"]["name"] += function["name"]
                if isinstance(function.get("arguments"), str):
                    self._arguments.setdefault(at, []).append(function["arguments"])

    @property
    def answer_due(self) -> bool:
        return self._done

    def _whole(self) -> dict[str, Any]:
        calls = [{**self._calls[k], "function": {
            **self._calls[k]["function"], "arguments": "".join(self._arguments.get(k, ()))}}
            for k in sorted(self._calls)]
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._text)}
        if calls:
            message["tool_calls"] = calls
        answer: dict[str, Any] = {"choices": [{"index": 0, "message": message}]}
        if self._usage is not None:
            answer["usage"] = self._usage
        return answer

    def output(self) -> list[dict[str, Any]] | None:
        return CHAT.output(self._whole()) if self._done else None

    def usage(self) -> dict[str, int] | None:
        return CHAT.usage(self._whole())
