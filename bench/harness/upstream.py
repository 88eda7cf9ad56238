"""A bare aiohttp Responses upstream for benchmarks, run as its own process.

    python -m bench.harness.upstream --port 18090

``POST /v1/responses`` (or ``/responses``) reads the whole body and streams a fixed, realistic
SSE answer (reasoning item, a message in word-sized deltas, ``response.completed`` with usage),
one event per write with a loop turn between them, as a model streaming over the network would.
It parses nothing: its CPU time is the floor a proxy is compared against. A request with an
``x-bench-answer`` header (bench/load.py) gets the answer that header names instead: a thread
script's own next items (tool calls, or the turn's final answer), in as many events.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import itertools
import random
from collections.abc import Sequence
from typing import Any

import orjson
from aiohttp import web

_ANSWER = (
    "The double post comes from the retry path in workers/settle.py: when the first attempt "
    "times out after the refund was written, the retry does not look up the idempotency key "
    "and posts again. I made the settle step check the key inside the same transaction, added "
    "a regression test that forces the timeout, and ran the ledger suite: 214 passed."
)


ANSWER_HEADER = "x-bench-answer"


def _event(payload: dict[str, Any]) -> bytes:
    name = str(payload["type"]).encode()
    return b"event: " + name + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def answer_events(seed: int = 3) -> list[bytes]:
    """The SSE events of one streamed answer, in order (70 events, 17 KB)."""
    rng = random.Random(seed)
    rid, rs_id, msg_id = "resp_" + "a1" * 10, "rs_" + "b2" * 8, "msg_" + "c3" * 8
    base = {"id": rid, "object": "response", "created_at": 1795991819, "status": "in_progress",
            "model": "gpt-5.5", "output": []}
    reasoning = {"id": rs_id, "type": "reasoning",
                 "summary": [{"type": "summary_text", "text": "**Tracing the retry**"}],
                 "encrypted_content": "gAAAAAB" + base64.b64encode(rng.randbytes(1500)).decode()}
    message = {"id": msg_id, "type": "message", "status": "completed", "role": "assistant",
               "content": [{"type": "output_text", "text": _ANSWER, "annotations": []}]}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": base},
        {"type": "response.in_progress", "response": base},
        {"type": "response.output_item.added", "output_index": 0,
         "item": {"id": rs_id, "type": "reasoning", "summary": []}},
        {"type": "response.output_item.done", "output_index": 0, "item": reasoning},
        {"type": "response.output_item.added", "output_index": 1,
         "item": {**message, "status": "in_progress", "content": []}},
        {"type": "response.content_part.added", "item_id": msg_id, "output_index": 1,
         "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}},
    ]
    for i, word in enumerate(_ANSWER.split(" ")):
        events.append({"type": "response.output_text.delta", "item_id": msg_id,
                       "output_index": 1, "content_index": 0,
                       "delta": (" " if i else "") + word})
    usage = {"input_tokens": 36211, "input_tokens_details": {"cached_tokens": 30720},
             "output_tokens": 412, "output_tokens_details": {"reasoning_tokens": 320},
             "total_tokens": 36623}
    events += [
        {"type": "response.output_text.done", "item_id": msg_id, "output_index": 1,
         "content_index": 0, "text": _ANSWER},
        {"type": "response.content_part.done", "item_id": msg_id, "output_index": 1,
         "content_index": 0, "part": message["content"][0]},
        {"type": "response.output_item.done", "output_index": 1, "item": message},
        {"type": "response.completed", "response": {**base, "status": "completed",
                                                     "output": [reasoning, message],
                                                     "usage": usage}},
    ]
    return [_event(e) for e in events]


def item_events(items: Sequence[dict[str, Any]], events: int) -> list[bytes]:
    """A streamed answer whose output is ``items`` (as a client sends them back), in
    ``events`` events where its texts allow that many: each item added and done, a message's
    text and a call's arguments in deltas."""
    rid = "resp_" + hashlib.sha256(orjson.dumps(items)).hexdigest()[:20]
    base = {"id": rid, "object": "response", "created_at": 1795991819, "status": "in_progress",
            "model": "gpt-5.5", "output": []}
    # (item index, the text streamed in deltas): the fixed events first, then the deltas.
    streamed = [(n, _streamed_text(item)) for n, item in enumerate(items)]
    fixed = 3 + sum(2 if text is None else (5 if item["type"] == "message" else 3)
                    for item, (_, text) in zip(items, streamed, strict=True))
    spare = max(0, events - fixed)
    texts = [n for n, text in streamed if text]
    deltas = {n: spare // len(texts) for n in texts}
    if texts:
        deltas[texts[-1]] += spare % len(texts)
    out: list[dict[str, Any]] = [{"type": "response.created", "response": base},
                                 {"type": "response.in_progress", "response": base}]
    for n, item in enumerate(items):
        text = streamed[n][1]
        pieces = _pieces(text or "", max(1, deltas.get(n, 1)))
        if item["type"] == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            ids = {"item_id": item["id"], "output_index": n, "content_index": 0}
            out += [{"type": "response.output_item.added", "output_index": n,
                     "item": {**item, "status": "in_progress", "content": []}},
                    {"type": "response.content_part.added", **ids, "part": part}]
            out += [{"type": "response.output_text.delta", **ids, "delta": p} for p in pieces]
            out += [{"type": "response.output_text.done", **ids, "text": text},
                    {"type": "response.content_part.done", **ids,
                     "part": item["content"][0]}]
        elif text is not None:  # a call: its arguments (or a custom tool's input) streamed
            kind = ("response.function_call_arguments" if item["type"] == "function_call"
                    else "response.custom_tool_call_input")
            ids = {"item_id": item["id"], "output_index": n}
            out.append({"type": "response.output_item.added", "output_index": n,
                        "item": {**item, "status": "in_progress",
                                 ("arguments" if "arguments" in item else "input"): ""}})
            out += [{"type": kind + ".delta", **ids, "delta": p} for p in pieces]
            out.append({"type": kind + ".done", **ids,
                        ("arguments" if "arguments" in item else "input"): text})
        else:
            out.append({"type": "response.output_item.added", "output_index": n,
                        "item": {"id": item["id"], "type": item["type"], "summary": []}})
        out.append({"type": "response.output_item.done", "output_index": n, "item": item})
    usage = {"input_tokens": 36211, "input_tokens_details": {"cached_tokens": 30720},
             "output_tokens": 412, "output_tokens_details": {"reasoning_tokens": 320},
             "total_tokens": 36623}
    out.append({"type": "response.completed", "response": {
        **base, "status": "completed", "output": list(items), "usage": usage}})
    return [_event(e) for e in out]


def _streamed_text(item: dict[str, Any]) -> str | None:
    """What of an output item streams in deltas: a message's text, a call's arguments."""
    if item["type"] == "message":
        return str(item["content"][0]["text"])
    if "arguments" in item or "input" in item:
        return str(item.get("arguments", item.get("input")))
    return None


def _pieces(text: str, n: int) -> list[str]:
    """``text`` in ``n`` pieces of about one size (fewer when it is shorter)."""
    n = max(1, min(n, len(text)))
    step, extra = divmod(len(text), n)
    cuts = [k * step + min(k, extra) for k in range(n + 1)]
    return [text[a:b] for a, b in itertools.pairwise(cuts)]


def create_app(scripted: dict[str, list[bytes]] | None = None) -> web.Application:
    """``scripted``: the answers an x-bench-answer header names, made before the first
    request (bench/load.py makes them all: one made on the way would be timed)."""
    events = answer_events()
    scripted = {} if scripted is None else scripted
    sse_headers = {"Content-Type": "text/event-stream", "x-request-id": "req_bench",
                   "openai-processing-ms": "12"}

    async def responses(request: web.Request) -> web.StreamResponse:
        await request.read()
        # x-bench-pace-ms spaces the events out, as a model generating tokens does.
        pause = float(request.headers.get("x-bench-pace-ms", 0)) / 1000
        key = request.headers.get(ANSWER_HEADER)
        answer = events
        if key is not None:
            if key not in scripted:
                from bench.harness.load_client import answer_events_of  # it imports this module

                scripted[key] = answer_events_of(key)
            answer = scripted[key]
        # x-bench-first-byte-ms: the model's time to its first token (none: answered at once,
        # without a loop turn more than before the header existed).
        first = float(request.headers.get("x-bench-first-byte-ms", 0)) / 1000
        if first > 0:
            await asyncio.sleep(first)
        response = web.StreamResponse(headers=sse_headers)
        await response.prepare(request)
        for event in answer:
            await response.write(event)
            await asyncio.sleep(pause)  # at least a loop turn: one event per segment
        await response.write_eof()
        return response

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/responses", responses)
    app.router.add_post("/responses", responses)
    app.router.add_get("/healthz", healthz)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--scripts", type=int, default=0,
                        help="make the answers of bench/load.py's first N thread scripts first")
    parser.add_argument("--turns", type=int, default=12, help="of --turns turns each")
    parser.add_argument("--shape", default="chat", help="of bench/load.py's --shape")
    args = parser.parse_args()
    scripted: dict[str, list[bytes]] = {}
    if args.scripts:
        from bench.harness.load_client import Script, answer_streams

        scripted = answer_streams([Script.make(s, args.turns, args.shape)
                                   for s in range(args.scripts)])
    web.run_app(create_app(scripted), host=args.host, port=args.port, access_log=None,
                print=None, backlog=1024)


if __name__ == "__main__":
    main()
