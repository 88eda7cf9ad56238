"""What became of one request: its access-log line, what went upstream, and how it ended.

Plain records the relay fills in on the way; the pipeline's end phase hands them to the steps
(the ledger counts them, ``explain`` keeps them).
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from typing import Any

from ctxproxy.request.exchange import Exchange, Notes

__all__ = ["Access", "End", "Sent"]


@dataclass(slots=True)
class Access:
    """One request's access-log line, filled in on the way (None: not known, left out)."""

    error: str | None = None
    fail_open: str | None = None  # the body could not be parsed: forwarded as sent
    steps_failed: list[str] | None = None
    session_id: str | None = None
    turns_in: int | None = None
    turns_forwarded: int | None = None
    items_cut: int | None = None
    bytes_in: int | None = None
    bytes_forwarded: int | None = None
    forwarded_ratio: float | None = None
    prepare_ms: float | None = None  # from the handler's start until it went upstream
    ttfb_ms: float | None = None
    upstream_error: str | None = None
    input_tokens: int | None = None
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None  # reported by models that price cache writes
    output_tokens: int | None = None
    notes: Notes | None = None

    def fields(self) -> dict[str, Any]:
        out = {k: v for k in _ACCESS_FIELDS if (v := getattr(self, k)) is not None}
        if self.notes is not None:
            out.update(self.notes.fields())
        return out


_ACCESS_FIELDS = tuple(f.name for f in dataclass_fields(Access) if f.name != "notes")


@dataclass(frozen=True, slots=True)
class Sent:
    """A request of a client protocol as it went upstream (the ledger counts its tokens)."""

    at: float  # when it arrived, by the app's clock
    raw: bytes  # the client's body
    forwarded: bytes  # what went upstream (the same object when nothing changed)
    exchange: Exchange | None  # None: not a Responses request, forwarded as sent
    # The same two, as parsed (the ledger counts these, not a second parse): the client's body
    # before the steps ran, and the body ``forwarded`` was serialised from (None: not parsed,
    # or forwarded as the client's bytes).
    client_body: dict[str, Any] | None = None
    forwarded_body: dict[str, Any] | None = None
    protocol: str = "responses"  # the client protocol's name (request.protocol.PROTOCOLS)


@dataclass(frozen=True, slots=True)
class End:
    """A model request (of any protocol) once it is over (answered, refused, broken, or its client
    gone), after its access-log line: what the pipeline's end phase hands each step."""

    exchange: Exchange | None  # None: its body was never parsed (forwarded as sent, unread)
    sent: Sent | None  # None: it never got as far as the upstream call
    access: Access
    status: int  # as the client was answered (499: the client went first)
    principal: str | None = None  # the client key's (None: no client keys)
