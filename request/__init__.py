"""The request model: one parse of a Responses request (its items, turns and sender) that
every step reads. Pure: no I/O, and nothing above ``config`` imported."""

from ctxproxy.request.exchange import (
    Exchange,
    Identity,
    NotAResponsesRequest,
    Notes,
    has_lossy_number,
    owner_digest,
    user_digest,
)
from ctxproxy.request.history import Cut, History, digest
from ctxproxy.request.items import (
    Item,
    call_pairs,
    is_compaction_message,
    is_context,
    is_message,
    is_turn_start,
    message_text,
    output_text,
    prompt_message,
)
from ctxproxy.request.outcome import Access, End, Sent
from ctxproxy.request.phases import (
    Answer,
    Answers,
    Completes,
    Ends,
    Hold,
    Prepares,
    Slot,
    Step,
)

__all__ = [
    "Access", "Answer", "Answers", "Completes", "Cut", "End", "Ends", "Exchange", "History",
    "Hold", "Identity", "Item", "NotAResponsesRequest", "Notes", "Prepares", "Sent", "Slot",
    "Step",
    "call_pairs", "digest", "has_lossy_number", "is_compaction_message", "is_context", "is_message",
    "is_turn_start", "message_text", "output_text", "owner_digest", "prompt_message",
    "user_digest",
]
