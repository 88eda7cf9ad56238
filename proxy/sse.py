"""Answers read on the side (server-sent events, or one JSON body): the relay copies bytes,
this only watches them."""

from __future__ import annotations

from typing import Any

import orjson

from ctxproxy.proxy.bodies import StreamDecoder
from ctxproxy.request.protocol import Protocol

__all__ = ["MAX_EVENT", "BodyTap", "EventsTap", "UsageTap", "parse_events"]

_COMPLETED = b"response.completed"
# An event ends at a blank line: "\n\n", or "\r\n\r\n", whose tail is "\n\r\n".
_ENDS = (b"\n\n", b"\n\r\n")
_OVERLAP = 2  # an end split over two chunks: the bytes of it the earlier chunk may hold
# The most of one event held while its end is awaited: a larger event is relayed all the
# same, only not read.
MAX_EVENT = 8 * 1024 * 1024


class UsageTap:
    """Finds ``usage`` and the output items in the ``response.completed`` event of a
    Responses stream.

    Fed every relayed chunk, it holds only the current event, and reads one only if it
    names ``response.completed``: each byte is searched a bounded number of times, however
    the events are chunked, and nothing delays the relay. An event over ``MAX_EVENT`` is
    dropped up to the next event's start (``skipped`` counts them).
    """

    def __init__(self, content_encoding: str | None = None) -> None:
        self._event = bytearray()  # the current event, from its start
        self._named = False  # the current event holds _COMPLETED
        self._skipping = False
        self.skipped = 0
        # A compressed stream is decoded for reading only; the relayed bytes stay as sent.
        self._decoder = StreamDecoder(content_encoding) if content_encoding else None
        self._found: bytes | None = None  # the completed event, once read
        self._completed: dict[str, Any] | None = None
        self._response_read = False

    def feed(self, chunk: bytes) -> None:
        """Watch one relayed chunk, as the upstream sent it (decoded here if compressed)."""
        if self._decoder is None:
            self._scan(chunk)
            return
        for piece in self._decoder.decode(chunk):
            self._scan(piece)

    def _scan(self, chunk: bytes) -> None:
        if self._found is not None:
            return
        event = self._event
        if not (event or self._skipping) and chunk.endswith(_ENDS) and _COMPLETED not in chunk:
            return  # whole events, none of them the completed one: nothing to hold
        new = len(event)
        event += chunk
        if self._skipping:
            self._skip(new)
            new = 0
        if not self._skipping:
            self._split(new)
        if len(event) > MAX_EVENT:
            self._skipping = True
            self._named = False
            self.skipped += 1
            del event[:-_OVERLAP]

    def _skip(self, new: int) -> None:
        """Drop the oversized event up to its end (the bytes from ``new`` on are unseen)."""
        end = _first_end(self._event, max(0, new - _OVERLAP))
        if end < 0:
            del self._event[:-_OVERLAP]
            return
        self._skipping = False
        del self._event[:end]

    def _split(self, new: int) -> None:
        """Read the events the bytes from ``new`` on complete; keep the unfinished one."""
        event = self._event
        start = 0  # where the current event starts in ``event``
        while self._found is None:
            if not self._named:
                at = event.find(_COMPLETED, max(start, new - len(_COMPLETED) + 1))
                if at < 0:
                    start = max(start, _last_end(event, max(start, new - _OVERLAP), len(event)))
                    break
                start = max(start, _last_end(event, start, at))
                self._named = True
                new = at
            end = _first_end(event, max(start, new - _OVERLAP))
            if end < 0:
                break
            self._named = False
            self._read(bytes(event[start:end]))
            start = new = end
        del event[:start]

    def _read(self, event: bytes) -> None:
        """Keep ``event`` if it is the completed one (a delta may merely quote the name)."""
        for parsed in parse_events(event):
            data = parsed.get("data")
            if isinstance(data, dict) and data.get("type") == "response.completed":
                response = data.get("response")
                self._completed = response if isinstance(response, dict) else None
                self._found = event
                self._event.clear()
                return

    def _response(self) -> dict[str, Any] | None:
        """The ``response`` of the ``response.completed`` event, or None."""
        if not self._response_read:
            self._response_read = True
            # A stream may end without the blank line after its last event.
            if self._found is None and self._named and not self._skipping:
                self._read(bytes(self._event))
        return self._completed

    @property
    def size(self) -> int:
        """Bytes kept of the stream: the completed event's."""
        return len(self._found or b"")

    @property
    def answer_due(self) -> bool:
        """Whether the answer may be complete with the chunk just fed: the
        ``response.completed`` event has been read (its end has come)."""
        return self._found is not None

    def output(self) -> list[dict[str, Any]] | None:
        """The completed response's output items (what the client was answered), or None."""
        return _output(self._response())

    def usage(self) -> dict[str, int] | None:
        """input/cached/output tokens (and cache_write_tokens when reported) of the
        completed response, or None."""
        return _usage(self._response())


class EventsTap:
    """Reads every event of a stream whose events are small (Messages, Chat Completions):
    each event's ``data`` goes to ``read``. An event over ``MAX_EVENT`` is relayed unread
    (``skipped``)."""

    def __init__(self, content_encoding: str | None = None) -> None:
        self._pending = bytearray()
        self._decoder = StreamDecoder(content_encoding) if content_encoding else None
        self.skipped = 0
        self.size = 0

    def feed(self, chunk: bytes) -> None:
        pieces = [chunk] if self._decoder is None else self._decoder.decode(chunk)
        for piece in pieces:
            self._pending += piece.replace(b"\r\n", b"\n")
            end = self._pending.rfind(b"\n\n")
            if end < 0:
                if len(self._pending) > MAX_EVENT:
                    self.skipped += 1
                    self._pending.clear()
                continue
            whole = bytes(self._pending[: end + 2])
            del self._pending[: end + 2]
            self.size += len(whole)
            for event in parse_events(whole):
                self.read(event.get("data"))

    def read(self, data: Any) -> None:
        """One event's data: parsed JSON, or the text that was not JSON."""


class BodyTap:
    """Reads ``usage`` and the output items of a non-streamed answer: one JSON body, the
    Responses object itself, or (``protocol``) another protocol's answer, read by it.

    Fed every relayed chunk, it keeps at most ``MAX_EVENT`` bytes and parses them once, after
    the relay; a larger body is relayed all the same, only not read (``skipped`` is 1).
    """

    def __init__(self, content_encoding: str | None = None,
                 protocol: Protocol | None = None) -> None:
        self._protocol = protocol
        self._body = bytearray()
        self.skipped = 0
        self._decoder = StreamDecoder(content_encoding) if content_encoding else None
        self._response: dict[str, Any] | None = None
        self._read = False

    def feed(self, chunk: bytes) -> None:
        if self.skipped:
            return
        pieces = [chunk] if self._decoder is None else self._decoder.decode(chunk)
        for piece in pieces:
            self._body += piece
            if len(self._body) > MAX_EVENT:
                self.skipped = 1
                self._body = bytearray()
                return

    @property
    def answer_due(self) -> bool:
        """Always: which chunk ends a JSON body is not known before it, so what waits for the
        answer's end waits before its first bytes."""
        return True

    @property
    def size(self) -> int:
        """Bytes kept of the answer: the body's, when it was read."""
        return len(self._body)

    def _parsed(self) -> dict[str, Any] | None:
        if not self._read:
            self._read = True
            if self._body:
                try:
                    parsed = orjson.loads(self._body)
                except orjson.JSONDecodeError:
                    parsed = None
                self._response = parsed if isinstance(parsed, dict) else None
        return self._response

    def output(self) -> list[dict[str, Any]] | None:
        """The answer's output items, or None (an error body has none)."""
        if self._protocol is not None:
            return self._protocol.output(self._parsed())
        return _output(self._parsed())

    def usage(self) -> dict[str, int] | None:
        """input/cached/output tokens (and cache_write_tokens when reported) of the answer,
        or None."""
        if self._protocol is not None:
            return self._protocol.usage(self._parsed())
        return _usage(self._parsed())


def _output(response: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    output = response.get("output") if response is not None else None
    if not isinstance(output, list):
        return None
    return [item for item in output if isinstance(item, dict)]


def _usage(response: dict[str, Any] | None) -> dict[str, int] | None:
    usage = response.get("usage") if response is not None else None
    if not isinstance(usage, dict):
        return None
    details = usage.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    found = {
        "input_tokens": _int(usage.get("input_tokens")),
        "cached_tokens": _int(cached),
        "output_tokens": _int(usage.get("output_tokens")),
    }
    # Only models that price cache writes apart report them: absent, it is left out.
    written = details.get("cache_write_tokens") if isinstance(details, dict) else None
    if isinstance(written, int):
        found["cache_write_tokens"] = written
    return found


def _first_end(data: bytearray, start: int) -> int:
    """Where the first event ending at or after ``start`` ends (past its blank line), or -1."""
    # The second search stops where the first found one: each byte is read at most twice
    # (a regular expression's search costs more per call than the bytes it reads here).
    lf = data.find(b"\n\n", start)
    crlf = data.find(b"\n\r\n", start, len(data) if lf < 0 else lf + 1)
    if crlf >= 0:
        return crlf + 3
    return -1 if lf < 0 else lf + 2


def _last_end(data: bytearray, start: int, stop: int) -> int:
    """Where the last event ending within ``start:stop`` ends (past its blank line), or -1."""
    ends = [at + len(end) for end in _ENDS if (at := data.rfind(end, start, stop)) >= 0]
    return max(ends, default=-1)


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
