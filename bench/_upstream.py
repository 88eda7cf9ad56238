"""A bare aiohttp Responses upstream for benchmarks, run as its own process.

    python -m bench._upstream --port 18090

``POST /v1/responses`` (or ``/responses``) reads the whole body and streams a fixed, realistic
SSE answer (reasoning item, a message in word-sized deltas, ``response.completed`` with usage),
one event per write with a loop turn between them, as a model streaming over the network would.
It parses nothing: its CPU time is the floor a proxy is compared against.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import random
from typing import Any

import orjson
from aiohttp import web

_ANSWER = (
    "The double post comes from the retry path in workers/settle.py: when the first attempt "
    "times out after the refund was written, the retry does not look up the idempotency key "
    "and posts again. I made the settle step check the key inside the same transaction, added "
    "a regression test that forces the timeout, and ran the ledger suite: 214 passed."
)


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


def create_app() -> web.Application:
    events = answer_events()
    sse_headers = {"Content-Type": "text/event-stream", "x-request-id": "req_bench",
                   "openai-processing-ms": "12"}

    async def responses(request: web.Request) -> web.StreamResponse:
        await request.read()
        # x-bench-pace-ms spaces the events out, as a model generating tokens does.
        pause = float(request.headers.get("x-bench-pace-ms", 0)) / 1000
        response = web.StreamResponse(headers=sse_headers)
        await response.prepare(request)
        for event in events:
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
    args = parser.parse_args()
    web.run_app(create_app(), host=args.host, port=args.port, access_log=None,
                print=None, backlog=1024)


if __name__ == "__main__":
    main()
