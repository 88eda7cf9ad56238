"""A fake Chat Completions upstream that bills each request by OpenAI's prompt-cache rules
(bench/harness/pricing.py's ``prefix`` or ``breakpoint``) and reports that bill in the
usage chunk, as a Chat client reads it.

The prompt is tokenised as the ledger counts a Chat body (``prompt_parts``: the tools, then
each message); a Chat message has no place for a breakpoint mark, so under ``breakpoint``
rules a prefix is stored only at the end of each prompt. The answer is streamed as ``data:``
chunks: the role, the text, each tool call (its arguments in one piece), the finish reason,
the usage chunk when ``stream_options.include_usage`` asks for it, ``[DONE]``. As OpenAI
does, it refuses (HTTP 400, before the model: neither run nor billed) a ``tool`` message that
does not answer a call of the assistant message before it, and an assistant message whose
calls are not all answered right after it: a window that split a call from its output would
be seen here.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from bench.harness.pricing import Bill, PricingUpstream

Message = dict[str, Any]


def usage(bill: Bill) -> dict[str, Any]:
    return {"prompt_tokens": bill.input_tokens, "completion_tokens": bill.output_tokens,
            "total_tokens": bill.input_tokens + bill.output_tokens,
            "prompt_tokens_details": {"cached_tokens": bill.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": 0}}


def chunks(message: Message, bill: Bill, model: str, with_usage: bool) -> list[dict[str, Any]]:
    """The chunks of one streamed answer."""
    base = {"id": f"chatcmpl-{uuid.uuid4().hex[:20]}", "object": "chat.completion.chunk",
            "created": int(bill.at), "model": model}

    def delta(d: Message, finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": d, "finish_reason": finish}]}

    out = [delta({"role": "assistant", "content": ""})]
    if message.get("content"):
        out.append(delta({"content": message["content"]}))
    for k, call in enumerate(message.get("tool_calls") or ()):
        out.append(delta({"tool_calls": [{"index": k, **call}]}))
    out.append(delta({}, "tool_calls" if message.get("tool_calls") else "stop"))
    if with_usage:
        out.append({**base, "choices": [], "usage": usage(bill)})
    return out


def tool_order_error(messages: list[Message]) -> str | None:
    """What OpenAI says of messages whose tool calls and tool messages do not pair up."""
    waiting: set[str] = set()  # the calls of the last assistant message not answered yet
    for message in messages:
        role = message.get("role")
        if role == "tool":
            if message.get("tool_call_id") not in waiting:
                return ("Invalid parameter: messages with role 'tool' must be a response to a "
                        "preceeding message with 'tool_calls'.")
            waiting.discard(message["tool_call_id"])
            continue
        if waiting:
            return ("An assistant message with 'tool_calls' must be followed by tool messages "
                    "responding to each 'tool_call_id'. The following tool_call_ids did not "
                    f"have response messages: {', '.join(sorted(waiting))}")
        if role == "assistant":
            waiting = {str(c.get("id")) for c in message.get("tool_calls") or ()}
    return None if not waiting else f"tool_call_ids without a response: {sorted(waiting)}"


@dataclass
class ChatPricingUpstream(PricingUpstream):
    """The in-process fake: its model answers with assistant messages (the first is the
    answer); ``bills`` as ``PricingUpstream``'s."""

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024**3)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = orjson.loads(raw)
        error = tool_order_error(body.get("messages") or [])
        if error is not None:
            return web.json_response({"error": {
                "message": error, "type": "invalid_request_error", "param": "messages",
                "code": None}}, status=400)
        message = self.model(body, raw)[0]
        bill = self.price(body, [message])
        model = str(body.get("model"))
        if not body.get("stream"):
            return web.json_response({
                "id": f"chatcmpl-{uuid.uuid4().hex[:20]}", "object": "chat.completion",
                "created": int(bill.at), "model": model,
                "choices": [{"index": 0, "message": message,
                             "finish_reason": "tool_calls" if message.get("tool_calls")
                             else "stop"}],
                "usage": usage(bill)})
        options = body.get("stream_options") or {}
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        # One write: the bench measures tokens, not streaming.
        await resp.write(b"".join(
            b"data: " + orjson.dumps(c) + b"\n\n"
            for c in chunks(message, bill, model, bool(options.get("include_usage"))))
            + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
