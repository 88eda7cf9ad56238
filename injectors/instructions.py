"""Adding blocks to the system prompt (``instructions``) without touching the user's turns."""

from __future__ import annotations

from typing import Any

SEPARATOR = "\n\n"


def append_block(body: dict[str, Any], block: str) -> dict[str, Any]:
    """A new body whose ``instructions`` end with ``block`` (created when absent)."""
    current = body.get("instructions")
    text = block if not isinstance(current, str) or not current else current + SEPARATOR + block
    return {**body, "instructions": text}
