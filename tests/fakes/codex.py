"""Codex-shaped requests, written for these tests (the shapes of Codex CLI 0.169.0). One copy,
in the bench harness: the hostile benches build their bodies from the same requests."""

from bench.harness.small_codex import (
    SYSTEM_PROMPT,
    context_items,
    headers,
    request,
    session,
    text,
    text_turn,
    tool_turn,
)

__all__ = ["SYSTEM_PROMPT", "context_items", "headers", "request", "session", "text",
           "text_turn", "tool_turn"]
