"""A fake Anthropic Messages upstream that bills each request by Anthropic's prompt-cache rules
and reports that bill in ``usage``, as Claude Code reads it.

- Input tokens: tiktoken over the prompt in Anthropic's order: each tool, each ``system``
  block, then each content block of each message with its message's role (a string content
  is one text block); ``cache_control`` marks are control fields, not prompt: left out.
- Cache (``bench/harness/pricing.py``'s ``BreakpointCache``): a prefix is stored only at a
  ``cache_control`` mark (at most 4 a request, else HTTP 400). A request reads the longest
  stored prefix, exactly repeated, that ends at a block at most 20 blocks before one of its
  marks (Anthropic looks that far back from each), from 1024 tokens on; the marks not stored
  yet are written: the tokens from the read up to the furthest of them are billed as written
  (``cache_creation_input_tokens``, 1.25x), those after the furthest mark as plain input
  (``input_tokens``), the read at 0.1x (``cache_read_input_tokens``). An entry lives 5
  minutes of the injected clock from its last use.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from bench.harness.pricing import Bill, BreakpointCache, Clock, PromptTokenizer

Block = dict[str, Any]
# The fake model: the forwarded body (parsed and raw) in, the answer's content blocks out.
Model = Callable[[dict[str, Any], bytes], list[Block]]

MARK = "cache_control"
MAX_MARKS = 4
LOOKBACK_BLOCKS = 20
TTL_S = 300.0  # Anthropic's default cache lifetime, refreshed on each use


def prompt_blocks(body: dict[str, Any]) -> list[tuple[bytes, bool]]:
    """Each block of the prompt in Anthropic's order, serialised without its mark (sorted
    keys), and whether it carries a mark."""
    out: list[tuple[bytes, bool]] = []

    def add(block: Any, role: str | None = None) -> None:
        if not isinstance(block, dict):
            block = {"type": "text", "text": str(block)}
        clean = {k: v for k, v in block.items() if k != MARK}
        if role is not None:
            clean = {"role": role, **clean}
        out.append((orjson.dumps(clean, option=orjson.OPT_SORT_KEYS), MARK in block))

    for tool in body.get("tools") or []:
        add(tool)
    system = body.get("system")
    for block in [system] if isinstance(system, str) else system or []:
        add(block)
    for message in body.get("messages") or []:
        content = message.get("content")
        for block in [content] if isinstance(content, str) else content or []:
            add(block, str(message.get("role")))
    return out


def sse(event: dict[str, Any]) -> bytes:
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def usage(bill: Bill) -> dict[str, int]:
    return {"input_tokens": bill.input_tokens - bill.cached_tokens - bill.written_tokens,
            "cache_creation_input_tokens": bill.written_tokens,
            "cache_read_input_tokens": bill.cached_tokens, "output_tokens": bill.output_tokens}


def answer_events(content: list[Block], bill: Bill, model: str) -> list[dict[str, Any]]:
    """The Messages events of one answer: each block started, its whole text (or input) in
    one delta, stopped; the usage at the start and, cumulative, at the end."""
    message: dict[str, Any] = {"id": f"msg_{len(content)}_{int(bill.at)}", "type": "message",
               "role": "assistant", "model": model, "content": [], "stop_reason": None,
               "stop_sequence": None, "usage": {**usage(bill), "output_tokens": 1}}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": message}]
    for index, block in enumerate(content):
        kind = block["type"]
        start: Block
        if kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                      {"type": "signature_delta", "signature": block["signature"]}]
        elif kind == "tool_use":
            start = {**block, "input": {}}
            deltas = [{"type": "input_json_delta",
                       "partial_json": orjson.dumps(block["input"]).decode()}]
        else:
            start = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block["text"]}]
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": index})
    stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
    events += [{"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": usage(bill)}, {"type": "message_stop"}]
    return events


def echo_model(body: dict[str, Any], raw: bytes) -> list[Block]:
    return [{"type": "text", "text": "ok"}]


@dataclass
class MessagesPricingUpstream:
    """The in-process fake. ``bills`` holds one Bill per priced request, in arrival order."""

    model: Model = echo_model
    clock: Clock = time.monotonic
    ttl_s: float = TTL_S
    tokenizer: PromptTokenizer = field(default_factory=PromptTokenizer)
    bills: list[Bill] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cache = BreakpointCache(self.ttl_s)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024**3)
        app.router.add_post("/v1/messages", self._handle)
        return app

    def price(self, body: dict[str, Any], content: list[Block]) -> Bill:
        """The bill of one request: one cache for the whole account (Anthropic's caches are
        an organisation's, not a session's)."""
        parts, marks = [], []
        for n, (part, mark) in enumerate(prompt_blocks(body)):
            parts.append(self.tokenizer.parts_of(part))
            if mark:
                marks.append(n)
        now = self.clock()
        cached, written = self.cache.read_and_store("", parts, marks, now, LOOKBACK_BLOCKS)
        out = self.tokenizer.count(orjson.dumps(content).decode())
        bill = Bill("", sum(count for count, _ in parts), cached, out, now, written)
        self.bills.append(bill)
        return bill

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = orjson.loads(raw)
        marks = sum(mark for _, mark in prompt_blocks(body))
        if marks > MAX_MARKS:  # before the model: a rejected request is neither run nor billed
            return web.json_response({"type": "error", "error": {
                "type": "invalid_request_error",
                "message": f"A maximum of {MAX_MARKS} blocks with cache_control may be "
                           f"provided. Found {marks}."}}, status=400)
        content = self.model(body, raw)
        bill = self.price(body, content)
        events = answer_events(content, bill, str(body.get("model")))
        if not body.get("stream"):
            return web.json_response({**events[0]["message"], "content": content,
                                      "stop_reason": events[-2]["delta"]["stop_reason"],
                                      "usage": usage(bill)})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"".join(sse(event) for event in events))  # the bench measures tokens
        await resp.write_eof()
        return resp


def anthropic_note() -> str:
    """One sentence for a report: the cache rules its bills were priced by."""
    return (f"Cache rules: Anthropic's (prefixes stored only at `cache_control` marks, at most "
            f"{MAX_MARKS} a request; read when exactly repeated and ending at most "
            f"{LOOKBACK_BLOCKS} blocks before a mark of the request; reads cost 0.1x, writes "
            "1.25x, both in every cost column; *written*: the share of the input written).")
