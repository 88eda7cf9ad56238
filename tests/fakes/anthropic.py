"""An in-process fake Anthropic Messages upstream: streams Messages events (``message_start``,
``content_block_*``, ``message_delta``, ``message_stop``) or answers one JSON message, records
what it received, and asks for a Bash tool call when the prompt says so; it counts tokens and
lists one model (``GET /v1/models``).

The fake model reads the last user message: a ``tool_result`` there gets a closing text; a
prompt with ``[tool]`` asks Bash to run ``echo fake-tool-ran``; ``[wiki] words`` asks Bash to
run the ``<knowledge_tools>`` block's search curl (found in ``system``); anything else is
echoed.
"""

from __future__ import annotations

import html
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.upstream import CALL_TOOL, EXAMPLE_QUERY, WIKI_PROMPT, Received

__all__ = ["FakeAnthropic", "message_events", "system_text", "user_text"]

REMINDER = "<system-reminder>"
MODEL = "claude-fake"  # the one model GET /v1/models lists


def sse(payload: dict[str, Any]) -> bytes:
    return f"event: {payload['type']}\ndata: {json.dumps(payload)}\n\n".encode()


def system_text(body: dict[str, Any]) -> str:
    system = body.get("system")
    if isinstance(system, str):
        return system
    return "\n".join(b.get("text", "") for b in system or [] if isinstance(b, dict))


def _texts(message: dict[str, Any]) -> list[str]:
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    return [b["text"] for b in content or []
            if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)]


def user_text(body: dict[str, Any]) -> str:
    """The last user message's own words (Claude Code's ``<system-reminder>`` blocks left
    out)."""
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            return "\n".join(t for t in _texts(message) if not t.lstrip().startswith(REMINDER))
    return ""


def prompt_text(body: dict[str, Any]) -> str:
    """The newest real prompt: the last user message with words of its own."""
    for message in reversed(body.get("messages") or []):
        if message.get("role") != "user":
            continue
        words = "\n".join(t for t in _texts(message) if not t.lstrip().startswith(REMINDER))
        if words.strip():
            return words
    return ""


def _answered_tool(body: dict[str, Any]) -> bool:
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    content = last.get("content") if isinstance(last, dict) else None
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content)


def knowledge_command(body: dict[str, Any], query: str) -> str | None:
    found = CALL_TOOL.search(system_text(body))
    if found is None:
        return None
    return html.unescape(found.group(1)).replace(EXAMPLE_QUERY, query)


def default_content(body: dict[str, Any]) -> list[dict[str, Any]]:
    if _answered_tool(body):
        return [{"type": "text", "text": f"FAKE-DONE: the command ran. Prompt was: "
                                          f"{prompt_text(body)[:80]}"}]
    prompt = prompt_text(body)
    if "[tool]" in prompt:
        return [tool_use("Bash", {"command": "echo fake-tool-ran",
                                  "description": "Print a marker"})]
    wiki = WIKI_PROMPT.search(prompt)
    if wiki:
        cmd = knowledge_command(body, wiki.group(1).strip())
        if cmd is None:
            return [{"type": "text", "text": "FAKE-NO-KNOWLEDGE: no <knowledge_tools> block"}]
        return [tool_use("Bash", {"command": cmd, "description": "Search the knowledge"})]
    return [{"type": "text", "text": f"FAKE-ANSWER to: {prompt[:80]}"}]


def tool_use(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": name,
            "input": arguments}


def usage_of(input_tokens: int, cache_read: int = 0, cache_write: int = 0) -> dict[str, int]:
    return {"input_tokens": input_tokens, "cache_creation_input_tokens": cache_write,
            "cache_read_input_tokens": cache_read, "output_tokens": 10}


def message_events(content: list[dict[str, Any]], model: str,
                   usage: dict[str, int]) -> list[bytes]:
    """A whole Messages stream for ``content``."""
    message = {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
               "model": model, "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": {**usage, "output_tokens": 1}}
    events = [sse({"type": "message_start", "message": message}), sse({"type": "ping"})]
    for index, block in enumerate(content):
        if block["type"] == "tool_use":
            events.append(sse({"type": "content_block_start", "index": index,
                               "content_block": {**block, "input": {}}}))
            whole = json.dumps(block["input"])
            for at in range(0, len(whole), 20):
                events.append(sse({"type": "content_block_delta", "index": index, "delta": {
                    "type": "input_json_delta", "partial_json": whole[at:at + 20]}}))
        else:
            events.append(sse({"type": "content_block_start", "index": index,
                               "content_block": {"type": "text", "text": ""}}))
            for word in block["text"].split(" "):
                events.append(sse({"type": "content_block_delta", "index": index,
                                   "delta": {"type": "text_delta", "text": word + " "}}))
        events.append(sse({"type": "content_block_stop", "index": index}))
    stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
    events.append(sse({"type": "message_delta",
                       "delta": {"stop_reason": stop, "stop_sequence": None},
                       "usage": {"output_tokens": usage["output_tokens"]}}))
    events.append(sse({"type": "message_stop"}))
    return events


@dataclass
class FakeAnthropic:
    """The fake. ``script`` holds answers (content block lists, or (status, error body)) used
    once each, in order, before the default model."""

    received: list[Received] = field(default_factory=list)
    script: list[Any] = field(default_factory=list)
    cache_read: int = 0  # what usage reports as read from the cache
    cache_write: int = 0
    url: str = ""

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    @property
    def messages(self) -> list[Received]:
        """The model calls received (``/v1/messages``; not ``count_tokens``)."""
        return [r for r in self.received if r.path == "/v1/messages" and r.method == "POST"]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        rec = Received(request.method, request.path, request.query_string,
                       dict(request.headers), await request.read())
        self.received.append(rec)
        if request.path == "/v1/messages/count_tokens":
            return web.json_response({"input_tokens": max(1, len(rec.body) // 4)})
        if request.method == "GET" and request.path in ("/v1/models", f"/v1/models/{MODEL}"):
            model = {"type": "model", "id": MODEL, "display_name": "Claude Fake",
                     "created_at": "2026-01-01T00:00:00Z"}
            return web.json_response(model if request.path.endswith(MODEL) else {
                "data": [model], "has_more": False, "first_id": MODEL, "last_id": MODEL})
        if request.path != "/v1/messages" or request.method != "POST":
            return web.json_response({"type": "error", "error": {
                "type": "not_found_error", "message": f"no {request.path} here"}}, status=404)
        try:
            body = rec.json
        except ValueError:
            return web.json_response({"type": "error", "error": {
                "type": "invalid_request_error", "message": "body is not JSON"}}, status=400)
        planned = self.script.pop(0) if self.script else None
        if isinstance(planned, tuple):
            status, error = planned
            return web.json_response(error, status=status)
        content = planned if planned is not None else default_content(body)
        usage = usage_of(max(1, len(rec.body) // 4) - self.cache_read - self.cache_write,
                         self.cache_read, self.cache_write)
        model = str(body.get("model", "claude-fake"))
        if not body.get("stream"):
            stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
            return web.json_response({
                "id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
                "model": model, "content": content, "stop_reason": stop,
                "stop_sequence": None, "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "request-id": f"req_{uuid.uuid4().hex[:12]}"})
        await resp.prepare(request)
        for chunk in message_events(content, model, usage):
            await resp.write(chunk)
        await resp.write_eof()
        return resp
