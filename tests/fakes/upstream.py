"""An in-process fake Responses API upstream: speaks the SSE protocol Codex needs, records
exactly what it received, and can be scripted to fail, stall or break mid-stream."""

from __future__ import annotations

import asyncio
import html
import itertools
import json
import re
import shlex
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes import embeddings as fake_embeddings

Handler = Callable[[web.Request, "Received"], Awaitable[web.StreamResponse]]
_ids = itertools.count(1)


@dataclass
class Received:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


def event(payload: dict[str, Any]) -> bytes:
    return f"event: {payload['type']}\ndata: {json.dumps(payload)}\n\n".encode()


def estimate_tokens(body: bytes) -> int:
    """Honest enough for Codex's context meter: about four bytes a token."""
    return max(1, len(body) // 4)


def message_item(text: str) -> dict[str, Any]:
    return {
        "id": f"msg_{uuid.uuid4().hex[:16]}",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def function_call_item(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"fc_{uuid.uuid4().hex[:16]}",
        "type": "function_call",
        "status": "completed",
        "call_id": f"call_{uuid.uuid4().hex[:20]}",
        "name": name,
        "arguments": json.dumps(arguments),
    }


def stream_events(output: list[dict[str, Any]], input_tokens: int) -> list[bytes]:
    """A complete Responses SSE answer: created, per-item added/deltas/done, completed."""
    resp_id = f"resp_{uuid.uuid4().hex[:20]}"
    base = {"id": resp_id, "object": "response", "status": "in_progress", "output": []}
    events = [
        event({"type": "response.created", "response": base}),
        event({"type": "response.in_progress", "response": base}),
    ]
    for index, item in enumerate(output):
        events.append(event({"type": "response.output_item.added", "output_index": index,
                             "item": {**item, "status": "in_progress"}}))
        if item["type"] == "message":
            text = item["content"][0]["text"]
            for word in text.split(" "):
                events.append(event({"type": "response.output_text.delta", "item_id": item["id"],
                                     "output_index": index, "content_index": 0,
                                     "delta": word + " "}))
        events.append(event({"type": "response.output_item.done", "output_index": index,
                             "item": item}))
    usage = {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": 10, "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": input_tokens + 10}
    events.append(event({"type": "response.completed",
                         "response": {**base, "status": "completed", "output": output,
                                      "usage": usage}}))
    return events


def last_user_text(body: dict[str, Any]) -> str:
    items = body.get("input")
    if isinstance(items, str):
        return items
    for item in reversed(items or []):
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            return " ".join(p.get("text", "") for p in content or [] if isinstance(p, dict))
    return ""


WIKI_PROMPT = re.compile(r"\[wiki\] ([A-Za-z0-9 ]+)")
CALL_TOOL = re.compile(r"<call_tool>(.*?)</call_tool>", re.S)
EXAMPLE_QUERY = "what you are looking for"  # the query in the block's example call_tool


def knowledge_command(body: dict[str, Any], query: str) -> str | None:
    """The first ``<call_tool>`` curl of the instructions' knowledge block, asking ``query``."""
    instructions = body.get("instructions")
    found = CALL_TOOL.search(instructions) if isinstance(instructions, str) else None
    if found is None:
        return None
    return html.unescape(found.group(1)).replace(EXAMPLE_QUERY, query)


# "[asset TYPE TOOL] {json params}": call TOOL of the block's asset of TYPE with those params.
ASSET_PROMPT = re.compile(r"\[asset ([a-z-]+) ([a-z_]+)\] (\{[^\n]*\})")
KNOWLEDGE = re.compile(r"<knowledge [^>]*>")


def asset_command(body: dict[str, Any], kind: str, tool: str, params: str) -> str | None:
    """The call_tool curl of the block's first asset of type ``kind``, calling ``tool`` with
    ``params`` (the JSON after -d edited, as a model does)."""
    instructions = body.get("instructions")
    if not isinstance(instructions, str):
        return None
    for head in KNOWLEDGE.finditer(instructions):
        if f'type="{kind}"' not in head.group(0):
            continue
        found = CALL_TOOL.search(instructions, head.end())
        if found is None:
            return None
        argv = shlex.split(html.unescape(found.group(1)))
        payload = json.loads(argv[-1])
        argv[-1] = json.dumps({**payload, "tool_name": tool, "params": json.loads(params)})
        return " ".join(shlex.quote(a) for a in argv)
    return None


def default_output(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The fake model: asks for one harmless shell command when the prompt says ``[tool]``,
    runs the knowledge block's search command when it says ``[wiki] words`` (or says it has
    no knowledge block), answers in text once the command's output is back, else echoes the
    prompt."""
    items = body.get("input")
    last = items[-1] if isinstance(items, list) and items else {}
    prompt = last_user_text(body)
    if isinstance(last, dict) and last.get("type") == "function_call_output":
        return [message_item(f"FAKE-DONE: the command ran. Prompt was: {prompt[:80]}")]
    if "[tool]" in prompt:
        return [function_call_item("exec_command", {"cmd": "echo fake-tool-ran",
                                                    "yield_time_ms": 2000})]
    asset = ASSET_PROMPT.search(prompt)
    if asset:
        cmd = asset_command(body, *asset.groups())
        if cmd is None:
            return [message_item(f"FAKE-NO-ASSET: no {asset.group(1)} in the block")]
        return [function_call_item("exec_command", {"cmd": cmd, "yield_time_ms": 5000})]
    wiki = WIKI_PROMPT.search(prompt)
    if wiki:
        cmd = knowledge_command(body, wiki.group(1).strip())
        if cmd is None:
            return [message_item("FAKE-NO-KNOWLEDGE: no <knowledge_tools> block")]
        return [function_call_item("exec_command", {"cmd": cmd, "yield_time_ms": 5000})]
    return [message_item(f"FAKE-ANSWER to: {prompt[:80]}")]


@dataclass
class FakeUpstream:
    """The fake. ``script`` holds handlers used once each, in order, before the default."""

    received: list[Received] = field(default_factory=list)
    script: list[Handler] = field(default_factory=list)
    chunk_delay_s: float = 0.0
    closed_early: asyncio.Event = field(default_factory=asyncio.Event)
    # How POST /v1/embeddings answers (tests.fakes.embeddings): ok, down (HTTP 503), slow
    # (after ``embeddings_delay_s``) or garbage (vectors of the wrong size).
    embeddings: str = "ok"
    embeddings_delay_s: float = 5.0
    embedding_requests: list[Received] = field(default_factory=list)
    embeddings_down_after: int | None = None  # requests answered before going down
    chat_cached: int = 0  # what a Chat answer's usage reports as read from the cache

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        rec = Received(request.method, request.path, request.query_string,
                       dict(request.headers), await request.read())
        if request.path.endswith("/embeddings") and request.method == "POST":
            self.embedding_requests.append(rec)  # not in ``received``: not the agent's
            return await self._embeddings(rec)
        self.received.append(rec)
        if self.script:
            return await self.script.pop(0)(request, rec)
        if request.path.endswith("/responses") and request.method == "POST":
            return await self.stream(request, rec)
        if request.path.endswith("/chat/completions") and request.method == "POST":
            from tests.fakes import chat  # it reads this module's patterns

            return await chat.answer(request, rec, self.chat_cached)
        return web.json_response({"object": "list", "data": [], "path": request.path,
                                  "query": request.query_string})

    async def _embeddings(self, rec: Received) -> web.StreamResponse:
        after = self.embeddings_down_after
        if self.embeddings == "down" or (after is not None and
                                         len(self.embedding_requests) > after):
            return web.json_response({"error": {"message": "fake outage"}}, status=503)
        if self.embeddings == "slow":
            await asyncio.sleep(self.embeddings_delay_s)
        answer = fake_embeddings.answer(rec.json)
        if self.embeddings == "garbage":
            for item in answer["data"]:
                item["embedding"] = item["embedding"][: item["index"] + 1]
        return web.json_response(answer)

    async def stream(self, request: web.Request, rec: Received,
                     output: list[dict[str, Any]] | None = None) -> web.StreamResponse:
        try:
            body = rec.json
        except (ValueError, RecursionError):
            # As the real API answers a body it cannot read.
            return web.json_response({"error": {
                "message": "We could not parse the JSON body of your request.",
                "type": "invalid_request_error", "param": None, "code": None}}, status=400)
        events = stream_events(output or default_output(body), estimate_tokens(rec.body))
        if not body.get("stream"):
            completed = json.loads(events[-1].split(b"data: ", 1)[1])
            return web.json_response(completed["response"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "x-request-id": f"req_{next(_ids)}",
                                           "openai-processing-ms": "12"})
        await resp.prepare(request)
        try:
            for chunk in events:
                await resp.write(chunk)
                if self.chunk_delay_s:
                    await asyncio.sleep(self.chunk_delay_s)
        except (ConnectionResetError, asyncio.CancelledError):
            self.closed_early.set()
            raise
        await resp.write_eof()
        return resp

    # --- scripted behaviours -------------------------------------------------------------

    def then(self, handler: Handler) -> FakeUpstream:
        self.script.append(handler)
        return self

    def then_error(self, status: int, body: dict[str, Any] | None = None,
                   headers: dict[str, str] | None = None) -> FakeUpstream:
        async def handler(request: web.Request, rec: Received) -> web.StreamResponse:
            return web.json_response(body or {"error": {"message": f"fake {status}"}},
                                     status=status, headers=headers)
        return self.then(handler)

    def then_raw_sse(self, chunks: list[bytes], *, delay_s: float = 0.0,
                     break_after: int | None = None, stall_after: int | None = None
                     ) -> FakeUpstream:
        """Send ``chunks``; optionally drop the connection or stall after some of them."""
        async def handler(request: web.Request, rec: Received) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            try:
                for i, chunk in enumerate(chunks):
                    if break_after is not None and i == break_after:
                        assert request.transport is not None
                        request.transport.close()
                        return resp
                    if stall_after is not None and i == stall_after:
                        await asyncio.sleep(3600)
                    await resp.write(chunk)
                    if delay_s:
                        await asyncio.sleep(delay_s)
            except (ConnectionResetError, asyncio.CancelledError):
                self.closed_early.set()
                raise
            await resp.write_eof()
            return resp
        return self.then(handler)

    def then_delay(self, seconds: float) -> FakeUpstream:
        """Wait before answering at all (no status line yet)."""
        async def handler(request: web.Request, rec: Received) -> web.StreamResponse:
            try:
                await asyncio.sleep(seconds)
            except asyncio.CancelledError:
                self.closed_early.set()
                raise
            return await self.stream(request, rec)
        return self.then(handler)

    @property
    def last(self) -> Received:
        return self.received[-1]
