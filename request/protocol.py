"""The client protocols a request may speak, each a small object: how its body is read into
the items every step reads (``parse``), written back (``write_back``), which session it
belongs to, how its errors look, and how its answer reports usage and output.

OpenAI Responses (Codex), Anthropic Messages (Claude Code) and OpenAI Chat Completions
(opencode, Aider, Continue, Cline, Goose).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from ctxproxy.request import chat as chat_
from ctxproxy.request import messages as messages_
from ctxproxy.request.items import Item, message_text, prompt_message

if TYPE_CHECKING:
    from ctxproxy.request.exchange import Exchange

__all__ = [
    "CHAT", "MESSAGES", "PROTOCOLS", "RESPONSES", "Chat", "Messages", "Protocol", "Responses",
]

PINNED_SEPARATOR = "\n\n"  # between the digest and the standing memory in their one block


class Protocol:
    """What the pipeline needs to know of one client protocol (the Responses API's answers
    by default)."""

    name = "responses"
    # Where a model request goes, under the protocol's upstream base URL (Anthropic's has no
    # /v1, OpenAI's has).
    upstream_path = "responses"
    # The provider caches a prompt only at the client's cache marks (Anthropic's
    # cache_control): the window prices a cut as for BREAKPOINT_MODELS.
    caches_at_marks = False
    # Cache breakpoints may be marked on the items themselves (``injectors.breakpoints``, for
    # BREAKPOINT_MODELS): only where the protocol's items carry them as the Responses API's do.
    item_marks = True
    # The blocks the proxy pins until the next cut (the digest, the standing memory) go
    # before the client's own context: a cut makes that context cold too.
    blocks_before_context = False
    # The body's key for the items every step reads, in the body the steps see.
    items_key = "input"

    def parse(self, body: dict[str, Any]) -> tuple[dict[str, Any], list[Item], object]:
        """The body the steps see, its items, and what writing back needs. Raises ValueError
        for a shape the pipeline cannot read, TypeError for items that are not objects."""
        items = body.get("input")
        if items is not None and not isinstance(items, str | list):
            raise ValueError("input is neither a string nor a list")
        return (body, [prompt_message(items)] if isinstance(items, str)
                else items if isinstance(items, list) else [], None)

    def write_back(self, ex: Exchange) -> dict[str, Any]:
        """The body to forward, in this protocol's shape."""
        return ex.body

    def seen(self, body: Any) -> Any:
        """A body of this protocol as the steps see it (Responses-shaped), for what reads
        bodies after the fact (the ledger's counts, ``explain``); a body it cannot read,
        as it is."""
        if not isinstance(body, dict):
            return body
        try:
            return self.parse(body)[0]
        except (TypeError, ValueError):
            return body

    def system_text(self, body: Any) -> str:
        """The text of a body's system prompt, where the steps' instructions go: Responses'
        ``instructions``, Messages' ``system``, Chat's first system or developer message."""
        text = body.get("instructions") if isinstance(body, dict) else None
        return text if isinstance(text, str) else ""

    def counted(self, body: Any) -> Any:
        """A body of this protocol as the ledger counts its prompt (``ledger.counterfactual``
        reads Responses bodies and Anthropic Messages ones, each in its provider's order)."""
        return self.seen(body)

    def session(self, headers: Mapping[str, str], body: dict[str, Any]) -> str | None:
        cache_key = body.get("prompt_cache_key")
        return headers.get("session-id") or (cache_key if isinstance(cache_key, str) else None)

    def error_body(self, message: str, type_: str, code: str) -> bytes:
        return orjson.dumps(
            {"error": {"message": message, "type": type_, "code": code, "param": None}})

    def usage(self, answer: dict[str, Any] | None) -> dict[str, int] | None:
        """input (cached and written included), cached, cache-written and output tokens of an
        answer, the Responses way (``proxy.sse`` reads Responses answers itself)."""
        return None

    def output(self, answer: dict[str, Any] | None) -> list[Item] | None:
        return None


class Responses(Protocol):
    """OpenAI Responses: the body is the view."""


class Messages(Protocol):
    """Anthropic Messages (``request.messages``)."""

    name = "messages"
    upstream_path = "v1/messages"
    caches_at_marks = True
    item_marks = False  # its own marks (cache_control): set as the body is written back
    blocks_before_context = True  # at the end of system; Claude Code's context is in messages

    def counted(self, body: Any) -> Any:
        return body  # tools, each system block, each message: Anthropic's order

    def system_text(self, body: Any) -> str:
        system = body.get("system") if isinstance(body, dict) else None
        return system if isinstance(system, str) else message_text({"content": system})

    def parse(self, body: dict[str, Any]) -> tuple[dict[str, Any], list[Item], object]:
        items, view = messages_.parse(body)
        # ``messages`` becomes ``input`` where it stands: written back, the keys keep their order.
        seen = {("input" if k == "messages" else k): (items if k == "messages" else v)
                for k, v in body.items() if k != "input"}
        return seen, items, view

    def write_back(self, ex: Exchange) -> dict[str, Any]:
        """The Messages body: the items as messages; at the end of ``system`` what steps
        appended to ``instructions``, then the blocks pinned until the next cut (the cut
        digest, the standing memory) as one text block; after a cut, or with such a block,
        the cache marks: at the end of the stable context (the client's system and the
        knowledge block), after the pinned block, and at the end of the client's context in
        ``messages``."""
        view = ex.view
        assert isinstance(view, messages_.MessagesView)
        items = ex.items or []
        first = ex.starts[0] if ex.starts else len(items)
        # The end of the agent's context: the last of the client's items before the first
        # forwarded prompt (the window pins context wherever it stood).
        head_end = next((items[i] for i in range(first - 1, -1, -1)
                         if id(items[i]) in view.origins), None)
        pinned = {id(block) for block in ex.stable_blocks}
        messages, (head_at,) = messages_.write_back(
            view, [item for item in items if id(item) not in pinned], (head_end,))
        system = messages_.system_blocks(ex.body.get("system"), ex.body.get("instructions"))
        pinned_text = PINNED_SEPARATOR.join(
            text for block in ex.stable_blocks if (text := message_text(block)))
        system = messages_.system_blocks(system, pinned_text)
        # The stable context ends right before the pinned block (one block, appended last).
        stable_end = len(system) - 2 if pinned_text and isinstance(system, list) else None
        if ex.first_turn or pinned_text:
            wanted: list[messages_.Place | None] = [
                (-1, stable_end if pinned_text else None),
                (-1, None) if pinned_text else None,
                (head_at, None) if head_at is not None else None,
            ]
            system, messages = messages_.marks(system, messages, wanted)
        out: dict[str, Any] = {}
        for key, value in ex.body.items():
            if key == "input":
                out["messages"] = messages
            elif key == "system":
                out["system"] = system
            elif key != "instructions":
                out[key] = value
        if "system" not in out and system is not None:
            out["system"] = system
        return out

    def session(self, headers: Mapping[str, str], body: dict[str, Any]) -> str | None:
        """Claude Code's ``X-Claude-Code-Session-Id``, or the session in ``metadata.user_id``
        (a JSON string)."""
        found = headers.get("x-claude-code-session-id")
        if found:
            return found
        meta = body.get("metadata")
        user_id = meta.get("user_id") if isinstance(meta, dict) else None
        if not isinstance(user_id, str) or not user_id.startswith("{"):
            return None
        try:
            parsed = orjson.loads(user_id)
        except orjson.JSONDecodeError:
            return None
        session = parsed.get("session_id") if isinstance(parsed, dict) else None
        return session if isinstance(session, str) and session else None

    def error_body(self, message: str, type_: str, code: str) -> bytes:
        return orjson.dumps({"type": "error", "error": {"type": _ERROR_TYPES.get(
            code, type_ if type_ in _ANTHROPIC_TYPES else "api_error"), "message": message}})

    def usage(self, answer: dict[str, Any] | None) -> dict[str, int] | None:
        """A Messages usage the Responses way: Anthropic's ``input_tokens`` leaves out what
        the cache read and wrote; the ledger's input tokens hold them."""
        usage = answer.get("usage") if isinstance(answer, dict) else None
        if not isinstance(usage, dict):
            return None
        fresh, read, written, out = (_int(usage.get(k)) for k in (
            "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
            "output_tokens"))
        return {"input_tokens": fresh + read + written, "cached_tokens": read,
                "cache_write_tokens": written, "output_tokens": out}

    def output(self, answer: dict[str, Any] | None) -> list[Item] | None:
        content = answer.get("content") if isinstance(answer, dict) else None
        return messages_.output_items(content) if isinstance(content, list) else None


class Chat(Protocol):
    """OpenAI Chat Completions (``request.chat``): errors in OpenAI's shape, as Responses'."""

    name = "chat"
    upstream_path = "chat/completions"
    # A Chat message has no place for a breakpoint mark: whatever caching the provider does
    # is its own, by prefix.
    item_marks = False

    def system_text(self, body: Any) -> str:
        first = chat_.first_system(body.get("messages")) if isinstance(body, dict) else None
        return message_text(first) if first is not None else ""

    def parse(self, body: dict[str, Any]) -> tuple[dict[str, Any], list[Item], object]:
        items, view = chat_.parse(body)
        # ``messages`` becomes ``input`` where it stands: written back, the keys keep their order.
        seen = {("input" if k == "messages" else k): (items if k == "messages" else v)
                for k, v in body.items()}
        return seen, items, view

    def write_back(self, ex: Exchange) -> dict[str, Any]:
        """The Chat body: the items as messages, ``instructions`` at the end of the system
        message."""
        view = ex.view
        assert isinstance(view, chat_.ChatView)
        messages = chat_.system_with(chat_.write_back(view, ex.items or []),
                                     ex.body.get("instructions"))
        return {("messages" if key == "input" else key): (messages if key == "input" else value)
                for key, value in ex.body.items() if key != "instructions"}

    def session(self, headers: Mapping[str, str], body: dict[str, Any]) -> str | None:
        """A ``session-id`` or ``x-session-id`` header, else the body's ``prompt_cache_key``."""
        return headers.get("x-session-id") or super().session(headers, body)

    def usage(self, answer: dict[str, Any] | None) -> dict[str, int] | None:
        """A Chat usage the Responses way: ``prompt_tokens`` hold the cached ones."""
        usage = answer.get("usage") if isinstance(answer, dict) else None
        if not isinstance(usage, dict):
            return None
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else 0
        return {"input_tokens": _int(usage.get("prompt_tokens")), "cached_tokens": _int(cached),
                "output_tokens": _int(usage.get("completion_tokens"))}

    def output(self, answer: dict[str, Any] | None) -> list[Item] | None:
        """The first choice's message as output items (what memory keeps of an answer)."""
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return None
        return chat_.answer_items(choices[0].get("message"))


# The proxy's own error codes as Anthropic's error types.
_ERROR_TYPES = {
    "request_too_large": "request_too_large", "invalid_api_key": "authentication_error",
    "identity_not_allowed": "permission_error", "origin_not_allowed": "permission_error",
    "upstream_unreachable": "api_error", "upstream_timeout": "api_error",
}
_ANTHROPIC_TYPES = frozenset({
    "invalid_request_error", "authentication_error", "permission_error", "not_found_error",
    "request_too_large", "rate_limit_error", "api_error", "overloaded_error",
})


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


RESPONSES = Responses()
MESSAGES = Messages()
CHAT = Chat()
PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (RESPONSES, MESSAGES, CHAT)}
