"""Chat Completions for the tests: the fake model behind the fake upstream's
``/chat/completions`` (one JSON completion, or ``data:`` chunks up to ``[DONE]``, the usage
chunk when ``stream_options.include_usage`` asks for it), and Chat-shaped requests as
opencode-like agents send them.

The fake model reads the last message: a ``tool`` result gets a closing text; a prompt with
``[tool]`` asks ``bash`` to run ``echo fake-tool-ran``; ``[wiki] words`` asks ``bash`` to run
the ``<knowledge_tools>`` block's search curl (found in the system message); anything else is
echoed.
"""

from __future__ import annotations

import html
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes.server import Running
from tests.fakes.upstream import CALL_TOOL, EXAMPLE_QUERY, WIKI_PROMPT, Received

__all__ = ["ChatSession", "answer", "headers", "request", "system_text", "tool_turn"]

SYSTEM = "You are opencode, an interactive CLI agent. " * 30
Message = dict[str, Any]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


def system_text(body: dict[str, Any]) -> str:
    return "\n".join(_text(m.get("content")) for m in body.get("messages") or []
                     if m.get("role") in ("system", "developer"))


def prompt_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            return _text(message.get("content"))
    return ""


def _reply(body: dict[str, Any]) -> Message:
    """The fake model's message."""
    messages = body.get("messages") or []
    prompt = prompt_text(body)
    if messages and messages[-1].get("role") == "tool":
        return {"role": "assistant", "content": f"FAKE-DONE: the command ran. Prompt was: "
                                                f"{prompt[:80]}"}
    command = None
    if "[tool]" in prompt:
        command = "echo fake-tool-ran"
    elif wiki := WIKI_PROMPT.search(prompt):
        found = CALL_TOOL.search(system_text(body))
        if found is None:
            return {"role": "assistant",
                    "content": "FAKE-NO-KNOWLEDGE: no <knowledge_tools> block"}
        command = html.unescape(found.group(1)).replace(EXAMPLE_QUERY, wiki.group(1).strip())
    if command is not None:
        call = {"id": f"call_{uuid.uuid4().hex[:20]}", "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"role": "assistant", "content": f"FAKE-ANSWER to: {prompt[:80]}"}


def _usage(rec: Received, cached: int) -> dict[str, Any]:
    prompt = max(1, len(rec.body) // 4)
    return {"prompt_tokens": prompt, "completion_tokens": 10, "total_tokens": prompt + 10,
            "prompt_tokens_details": {"cached_tokens": cached}}


def chunk(base: dict[str, Any], delta: Message, finish: str | None = None) -> bytes:
    data = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(data)}\n\n".encode()


def stream_chunks(message: Message, base: dict[str, Any],
                  usage: dict[str, Any] | None) -> list[bytes]:
    """A whole Chat stream for ``message``: the role, the text word by word or each tool
    call in pieces, the finish, the usage chunk if asked, ``[DONE]``."""
    out = [chunk(base, {"role": "assistant", "content": ""})]
    for word in (message.get("content") or "").split(" ") if message.get("content") else ():
        out.append(chunk(base, {"content": word + " "}))
    for k, call in enumerate(message.get("tool_calls") or ()):
        arguments = call["function"]["arguments"]
        out.append(chunk(base, {"tool_calls": [{"index": k, "id": call["id"], "type": "function",
                                                "function": {"name": call["function"]["name"],
                                                             "arguments": ""}}]}))
        for at in range(0, len(arguments), 16):
            out.append(chunk(base, {"tool_calls": [{"index": k, "function": {
                "arguments": arguments[at:at + 16]}}]}))
    out.append(chunk(base, {}, "tool_calls" if message.get("tool_calls") else "stop"))
    if usage is not None:
        out.append(f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n".encode())
    out.append(b"data: [DONE]\n\n")
    return out


async def answer(request: web.Request, rec: Received, cached: int = 0,
                 reply: Message | None = None) -> web.StreamResponse:
    """The fake upstream's answer to a ``/chat/completions`` request."""
    try:
        body = rec.json
    except ValueError:
        return web.json_response({"error": {"message": "We could not parse the JSON body",
                                            "type": "invalid_request_error"}}, status=400)
    message = reply or _reply(body)
    base = {"id": f"chatcmpl-{uuid.uuid4().hex[:20]}", "object": "chat.completion.chunk",
            "created": 1, "model": str(body.get("model", "gpt-fake"))}
    if not body.get("stream"):
        return web.json_response({**base, "object": "chat.completion", "choices": [{
            "index": 0, "message": message,
            "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
            "usage": _usage(rec, cached)})
    options = body.get("stream_options") or {}
    usage = _usage(rec, cached) if options.get("include_usage") else None
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for piece in stream_chunks(message, base, usage):
        await resp.write(piece)
    await resp.write_eof()
    return resp


# --- requests, as an agent sends them ---------------------------------------------------------


def headers(session_id: str, **extra: str) -> dict[str, str]:
    return {"Authorization": "Bearer sk-client", "content-type": "application/json",
            "x-session-id": session_id, **extra}


def request(messages: list[Message], *, stream: bool = True,
            usage: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "gpt-5", "messages": [{"role": "system", "content": SYSTEM}, *messages],
        "tools": [{"type": "function", "function": {
            "name": "bash", "description": "Run a command", "parameters": {
                "type": "object", "properties": {"command": {"type": "string"}}}}}],
        "stream": stream}
    if stream and usage:
        body["stream_options"] = {"include_usage": True}
    return body


def tool_turn(prompt: str, n: int) -> list[Message]:
    """A turn with one bash call and its result, then the closing text."""
    call = f"call_{n:04d}{uuid.uuid4().hex[:8]}"
    return [{"role": "user", "content": prompt},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": call, "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"command": f"echo {n}"})}}]},
            {"role": "tool", "tool_call_id": call, "content": f"output of {n} " * 30},
            {"role": "assistant", "content": f"done {n}"}]


def read_stream(raw: bytes) -> Message:
    """The message a Chat stream's chunks add up to."""
    text, calls = [], {}
    for line in raw.split(b"\n"):
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        data = json.loads(line[6:])
        for choice in data.get("choices") or ():
            delta = choice["delta"]
            text.append(delta.get("content") or "")
            for call in delta.get("tool_calls") or ():
                whole = calls.setdefault(call["index"], {"id": call.get("id"), "arguments": ""})
                whole["arguments"] += call["function"].get("arguments", "")
    return {"role": "assistant", "content": "".join(text), "calls": list(calls.values())}


async def post(url: str, body: dict[str, Any], hdrs: dict[str, str],
               route: str = "/v1/chat/completions") -> tuple[int, Any]:
    """POST a Chat request; the status and the answer's message (or error body)."""
    async with aiohttp.ClientSession() as s, s.post(
            url + route, data=json.dumps(body), headers=hdrs) as r:
        raw = await r.read()
        kind = r.headers.get("content-type", "")
    if r.status != 200 or kind.startswith("application/json"):
        parsed = json.loads(raw)
        return r.status, parsed["choices"][0]["message"] if r.status == 200 else parsed
    return r.status, read_stream(raw)


@dataclass
class ChatSession:
    """One Chat agent's session through the proxy: each request resends the whole history."""

    proxy: Running
    received: list[Received]
    session_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    extra_headers: dict[str, str] = field(default_factory=dict)
    messages: list[Message] = field(default_factory=list)

    async def say(self, prompt: str) -> dict[str, Any]:
        """A text turn; returns what the upstream received."""
        self.messages = [*self.messages, {"role": "user", "content": prompt}]
        status, message = await post(self.proxy.url, request(self.messages),
                                     headers(self.session_id, **self.extra_headers))
        assert status == 200, message
        self.messages.append({"role": "assistant", "content": message["content"] or "ok"})
        return dict(self.received[-1].json)
