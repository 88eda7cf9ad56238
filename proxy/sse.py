"""Server-sent events, read on the side: the relay copies bytes, this only watches them."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.bodies import StreamDecoder

_COMPLETED = b"response.completed"
_MAX_TAIL = 8 * 1024 * 1024


class UsageTap:
    """Finds ``usage`` and the output items in the ``response.completed`` event of a
    Responses stream.

    Fed every relayed chunk; it only starts keeping bytes once the completed event appears,
    so it costs a substring search per chunk and never delays the relay.
    """

    def __init__(self, content_encoding: str | None = None) -> None:
        self._tail = bytearray()
        self._seen = False
        self._pending = b""  # the current, unfinished event
        # A compressed stream is decoded for reading only; the relayed bytes stay as sent.
        self._decoder = StreamDecoder(content_encoding) if content_encoding else None
        self._response_read = False
        self._completed: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> None:
        """Watch one relayed chunk, as the upstream sent it (decoded here if compressed)."""
        if self._decoder is None:
            self._scan(chunk)
            return
        for piece in self._decoder.decode(chunk):
            self._scan(piece)

    def _scan(self, chunk: bytes) -> None:
        if self._seen:
            if len(self._tail) < _MAX_TAIL:
                self._tail += chunk
            return
        buf = self._pending + chunk
        at = buf.find(_COMPLETED)
        if at >= 0:
            self._seen = True
            start = buf.rfind(b"\n\n", 0, at)
            self._tail += buf[start + 2 if start >= 0 else 0 :]
            return
        end = buf.rfind(b"\n\n")
        self._pending = buf[end + 2 :] if end >= 0 else buf

    def _response(self) -> dict[str, Any] | None:
        """The ``response`` of the ``response.completed`` event (parsed once), or None."""
        if self._response_read:
            return self._completed
        self._response_read = True
        for event in parse_events(bytes(self._tail)):
            data = event.get("data")
            if not isinstance(data, dict) or data.get("type") != "response.completed":
                continue
            response = data.get("response")
            self._completed = response if isinstance(response, dict) else None
            break
        return self._completed

    @property
    def size(self) -> int:
        """Bytes kept of the stream's tail (the completed event, mostly)."""
        return len(self._tail)

    def output(self) -> list[dict[str, Any]] | None:
        """The completed response's output items (what the client was answered), or None."""
        response = self._response()
        output = response.get("output") if response is not None else None
        if not isinstance(output, list):
            return None
        return [item for item in output if isinstance(item, dict)]

    def usage(self) -> dict[str, int] | None:
        """input/cached/output tokens of the completed response, or None."""
        response = self._response()
        if response is not None:
            usage = response.get("usage")
            if not isinstance(usage, dict):
                return None
            details = usage.get("input_tokens_details")
            cached = details.get("cached_tokens") if isinstance(details, dict) else 0
            return {
                "input_tokens": _int(usage.get("input_tokens")),
                "cached_tokens": _int(cached),
                "output_tokens": _int(usage.get("output_tokens")),
            }
        return None


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


def parse_events(data: bytes) -> list[dict[str, Any]]:
    """Split an SSE byte stream into events ({'event': name, 'data': parsed JSON or str})."""
    events = []
    for block in data.replace(b"\r\n", b"\n").split(b"\n\n"):
        name = None
        lines = []
        for line in block.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode("utf-8", "replace")
            elif line.startswith(b"data:"):
                lines.append(line[5:].lstrip(b" "))
        if not lines:
            continue
        payload = b"\n".join(lines)
        try:
            parsed: Any = orjson.loads(payload)
        except orjson.JSONDecodeError:
            parsed = payload.decode("utf-8", "replace")
        events.append({"event": name, "data": parsed})
    return events
