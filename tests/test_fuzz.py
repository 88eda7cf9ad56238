"""Hostile input: whatever a client sends, the proxy forwards it (failing open) or answers a
clear 4xx; it never answers 500 by its own fault, and never makes a valid history invalid.

One proxy and one echo upstream run for the whole module on a background thread's loop, so
that hypothesis can send hundreds of requests through a plain synchronous client.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import pytest
from aiohttp import web
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from ctxproxy.config import load_settings
from ctxproxy.proxy.assemble import build_app
from ctxproxy.request import is_turn_start, message_text
from tests.fakes import codex
from tests.fakes.server import Running, free_port, serve

T = TypeVar("T")
KEEP_TURNS = 2  # small, so that short generated histories get cut too
MAX_BODY_MB = 1.0
FUZZ_ID = "x-fuzz-id"
FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@dataclass
class Seen:
    headers: CIMultiDict[str]
    body: bytes
    target: str = ""  # the request target as it came over the wire, still percent-encoded


@dataclass
class Stack:
    """The proxy and an upstream that answers 200 to anything and records it by fuzz id."""

    loop: asyncio.AbstractEventLoop
    proxy_url: str = ""
    port: int = 0
    upstream_port: int = 0
    seen: dict[str, Seen] = field(default_factory=dict)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def echo(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.seen[request.headers.get(FUZZ_ID, "")] = Seen(
            CIMultiDict(request.headers), body, request.raw_path)
        return web.json_response({"ok": True})


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fuzz-servers", daemon=True)
    thread.start()
    stack = Stack(loop)
    running: list[Running] = []
    try:
        upstream_app = web.Application(client_max_size=64 * 1024**2)
        upstream_app.router.add_route("*", "/{tail:.*}", stack.echo)
        upstream = stack.call(serve(upstream_app))
        running.append(upstream)
        stack.upstream_port = int(upstream.url.rsplit(":", 1)[1])
        stack.port = free_port()
        cfg = load_settings(env={}, upstream_url=upstream.url + "/v1", port=stack.port,
                            data_dir=tmp_path_factory.mktemp("fuzz") / "data",
                            keep_turns=KEEP_TURNS, max_body_mb=MAX_BODY_MB,
                            window_max_tokens=0)  # the ceiling has tests of its own
        proxy = stack.call(serve(build_app(cfg), port=stack.port))
        running.insert(0, proxy)
        stack.proxy_url = proxy.url
        yield stack
    finally:
        for r in running:
            stack.call(r.close())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, timeout=20) as c:
        yield c


@dataclass
class Outcome:
    status: int
    body: bytes
    forwarded: Seen | None


def post(stack: Stack, client: httpx.Client, raw: bytes,
         headers: dict[str, str] | None = None) -> Outcome:
    fuzz_id = uuid.uuid4().hex
    hdrs = {**(headers or {"Content-Type": "application/json"}), FUZZ_ID: fuzz_id}
    r = client.post(stack.proxy_url + "/v1/responses", content=raw, headers=hdrs)
    return Outcome(r.status_code, r.content, stack.seen.pop(fuzz_id, None))


def assert_no_fault_of_ours(out: Outcome) -> None:
    """The echo upstream always says 200, so any other status came from the proxy."""
    if out.status == 200:
        assert out.forwarded is not None
        return
    assert 400 <= out.status < 500, (out.status, out.body[:500])
    error = json.loads(out.body)["error"]
    assert error["message"] and error["type"] and error["code"]
    assert out.forwarded is None


def prompts(items: list[Any]) -> list[str]:
    return [message_text(i) for i in items if isinstance(i, dict) and is_turn_start(i)]


def tool_items(items: list[Any]) -> list[tuple[int, str, str]]:
    """(position, type, call_id) of every item that carries a string call_id."""
    return [(i, str(item.get("type", "")), item["call_id"]) for i, item in enumerate(items)
            if isinstance(item, dict) and isinstance(item.get("call_id"), str)]


def answered(items: list[Any]) -> dict[int, int]:
    """Call position -> output position: an output answers the latest unanswered call of its
    id (ids repeat: clients number calls per turn); an output before any call is an orphan."""
    pairs: dict[int, int] = {}
    open_calls: dict[str, list[int]] = {}
    for i, kind, call_id in tool_items(items):
        if kind.endswith("_output"):
            if open_calls.get(call_id):
                pairs[open_calls[call_id].pop()] = i
        else:
            open_calls.setdefault(call_id, []).append(i)
    return pairs


def aligned(before: list[Any], after: list[Any]) -> set[int]:
    """The positions in ``before`` of the tool items ``after`` kept, matched from the newest
    end by type and id (the window keeps whole newest turns; outputs may come back masked)."""
    theirs, ours = tool_items(before), tool_items(after)
    kept: set[int] = set()
    j = len(theirs) - 1
    for _, kind, call_id in reversed(ours):
        while j >= 0 and theirs[j][1:] != (kind, call_id):
            j -= 1
        assert j >= 0, f"{kind} {call_id} was not the client's"
        kept.add(theirs[j][0])
        j -= 1
    return kept


def assert_history_kept_valid(raw: bytes, out: Outcome) -> None:
    """Forwarded bytes are the client's own, or a body the window made from it without
    splitting a call from its output and keeping only the newest prompts."""
    assert out.forwarded is not None
    sent = out.forwarded.body
    if sent == raw:
        return
    client_body, body = json.loads(raw), json.loads(sent)
    assert isinstance(body, dict)
    before, after = client_body["input"], body["input"]
    theirs = prompts(before)
    kept = [p for p in prompts(after) if p in theirs]  # steps may add messages of their own
    assert kept == theirs[len(theirs) - len(kept):]
    assert min(len(theirs), 1) <= len(kept) <= KEEP_TURNS  # the newest prompt always goes
    kept_tools = aligned(before, after)
    for call, output in answered(before).items():
        assert (call in kept_tools) == (output in kept_tools), (before[call], before[output])


# --- strategies ------------------------------------------------------------------------------

json_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner,
                                                                max_size=5),
    max_leaves=30,
)
call_ids = st.sampled_from(["call_a", "call_b", "call_c"]) | json_values
roles = st.sampled_from(["user", "assistant", "developer", "system", "tool"]) | json_values
contents = (
    st.text(max_size=40)
    | st.lists(st.fixed_dictionaries({"type": st.just("input_text"), "text": st.text(max_size=40)}),
               max_size=3)
    | json_values
)
prompts_or_context = st.sampled_from([
    "fix the bug", "[tool] run it", "<environment_context>\n<cwd>/x</cwd>",
    "# AGENTS.md instructions for /x", "", "   ",
])
items = st.one_of(
    st.builds(codex.text, st.sampled_from(["user", "assistant", "developer"]), prompts_or_context),
    st.fixed_dictionaries({"type": st.just("message"), "role": roles, "content": contents}),
    st.fixed_dictionaries({"role": roles, "content": contents}),  # EasyInputMessage: no type
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": call_ids,
                           "name": st.just("exec_command"), "arguments": st.just("{}")}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": call_ids,
                           "output": json_values}),
    st.fixed_dictionaries({"type": st.sampled_from(["custom_tool_call", "reasoning",
                                                    "compaction_trigger", "additional_tools"]),
                           "call_id": call_ids}),
    st.fixed_dictionaries({"type": st.text(max_size=15)}, optional={"call_id": call_ids,
                                                                     "x": json_values}),
    json_values,  # not an object at all
)


@st.composite
def turn_histories(draw: st.DrawFn) -> list[Any]:
    """Codex-like histories (context, then turns with calls, outputs and odd items), with
    junk and orphans spliced in: enough turns for the window to cut most of them."""
    history: list[Any] = codex.context_items() if draw(st.booleans()) else []
    late: list[Any] = []  # outputs that arrive a turn after their call
    for turn in range(draw(st.integers(0, 8))):
        history.append(codex.text("user", f"prompt {turn}"))
        history += late
        late = []
        for n in range(draw(st.integers(0, 2))):
            call_id = f"call_{turn}_{n}"
            history.append({"type": "function_call", "call_id": call_id,
                            "name": "exec_command", "arguments": "{}"})
            output = {"type": "function_call_output", "call_id": call_id, "output": "ok"}
            placement = draw(st.sampled_from(["now", "now", "late", "never"]))
            if placement == "now":
                history.append(output)
            elif placement == "late":
                late.append(output)
        history += draw(st.lists(items, max_size=2))
    for junk in draw(st.lists(items, max_size=3)):
        history.insert(draw(st.integers(0, len(history))), junk)
    return history


histories = turn_histories() | st.lists(items, max_size=25)


# --- bodies ----------------------------------------------------------------------------------


@FUZZ
@given(value=json_values)
def test_any_json_value_is_forwarded_or_refused_cleanly(stack: Stack, client: httpx.Client,
                                                        value: Any) -> None:
    raw = json.dumps(value).encode()
    out = post(stack, client, raw)
    assert_no_fault_of_ours(out)
    assert out.forwarded is not None and out.forwarded.body == raw


@FUZZ
@given(input_value=json_values, extra=st.dictionaries(st.text(max_size=10), json_values,
                                                      max_size=3))
def test_input_of_any_type_is_forwarded(stack: Stack, client: httpx.Client, input_value: Any,
                                        extra: dict[str, Any]) -> None:
    raw = json.dumps({**extra, "model": "m", "input": input_value}).encode()
    out = post(stack, client, raw)
    assert_no_fault_of_ours(out)
    assert_history_kept_valid(raw, out)


REUSED_ID = [  # hypothesis found it in CI: the newest call reuses the id of a cut pair
    codex.text("user", "prompt 0"), {"type": "custom_tool_call", "call_id": "call_a"},
    codex.text("user", "prompt 1"),
    {"type": "function_call_output", "call_id": "call_a", "output": None},
    codex.text("user", "prompt 2"),
    {"type": "function_call", "call_id": "call_a", "name": "exec_command", "arguments": "{}"},
]


@FUZZ
@given(history=histories, kind=st.sampled_from(["turn", "compaction", "garbage"]))
@example(history=REUSED_ID, kind="turn")
def test_generated_histories_keep_calls_with_outputs_and_the_newest_turns(
        stack: Stack, client: httpx.Client, history: list[Any], kind: str) -> None:
    raw = json.dumps(codex.request(history)).encode()
    headers = codex.headers(kind=kind)
    if kind == "garbage":
        headers["x-codex-turn-metadata"] = '{"turn_id": ["not", "a", "string"]'
    out = post(stack, client, raw, headers)
    assert out.status == 200
    assert_history_kept_valid(raw, out)


@FUZZ
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_are_forwarded_unchanged(stack: Stack, client: httpx.Client,
                                                 data: bytes) -> None:
    out = post(stack, client, data)
    assert out.status == 200
    assert out.forwarded is not None and out.forwarded.body == data


@pytest.mark.parametrize("raw", [
    b'{"input": [{"type": "message", "role": "user", "content": "caf\xc3\xa9 \xff\xfe"}]}',
    b'{"input": "\\ud800 lone surrogate"}',
    b'{"input": [{"type": "message", "role": "user", "content": "\\udfff"}]}',
    b'\xef\xbb\xbf{"input": []}',  # a UTF-8 byte order mark
    b'{"input": [], "input": 5}',  # a duplicated key
    b'{"input": [1e999999]}',
    b'{"input": [' + b"9" * 5000 + b"]}",
])
def test_invalid_utf8_and_odd_json_are_forwarded_unchanged(stack: Stack, client: httpx.Client,
                                                           raw: bytes) -> None:
    out = post(stack, client, raw)
    assert out.status == 200
    assert out.forwarded is not None and out.forwarded.body == raw


@pytest.mark.parametrize("depth", [200, 300, 1100, 50_000])
def test_deep_nesting_is_forwarded_unchanged(stack: Stack, client: httpx.Client,
                                             depth: int) -> None:
    # Deep enough for the JSON parser's and serialiser's limits, and for Python's stack.
    nested = "[" * depth + "]" * depth
    history = codex.session(4)
    history[-1] = {**history[-1], "deep": "@@"}
    raw = json.dumps(codex.request(history)).replace('"@@"', nested).encode()
    out = post(stack, client, raw)
    assert out.status == 200
    assert_history_kept_valid(raw, out)


def test_huge_strings_under_the_limit_are_forwarded(stack: Stack, client: httpx.Client) -> None:
    history = codex.session(5)
    history[-1] = codex.text("user", "x" * int(MAX_BODY_MB * 1024 * 1024 * 0.9))
    raw = json.dumps(codex.request(history)).encode()
    out = post(stack, client, raw)
    assert out.status == 200
    assert_history_kept_valid(raw, out)
    assert out.forwarded is not None
    assert prompts(json.loads(out.forwarded.body)["input"])[-1] == message_text(history[-1])


def test_a_body_over_the_limit_gets_a_clear_413(stack: Stack, client: httpx.Client) -> None:
    raw = json.dumps({"input": "x" * int(MAX_BODY_MB * 1024 * 1024 * 1.5)}).encode()
    out = post(stack, client, raw)
    assert out.status == 413
    assert_no_fault_of_ours(out)


def test_a_function_call_output_with_no_call_is_forwarded(stack: Stack,
                                                          client: httpx.Client) -> None:
    orphan = {"type": "function_call_output", "call_id": "call_nowhere", "output": "?"}
    history = codex.session(6)
    for at in (0, 4, len(history) - 1, len(history)):
        items = [*history[:at], orphan, *history[at:]]
        raw = json.dumps(codex.request(items)).encode()
        out = post(stack, client, raw)
        assert out.status == 200
        assert_history_kept_valid(raw, out)


# --- headers ---------------------------------------------------------------------------------


def raw_request(stack: Stack, head: bytes, body: bytes = b'{"input": []}',
                target: bytes = b"/v1/responses", method: bytes = b"POST") -> tuple[int, bytes]:
    """Send bytes aiohttp's client would refuse to; return the status and the whole answer."""
    request = (method + b" " + target + b" HTTP/1.1\r\nConnection: close\r\n" + head
               + b"Content-Type: application/json\r\n"  # the only body /v1 takes
               + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    with socket.create_connection(("127.0.0.1", stack.port), timeout=20) as sock:
        sock.sendall(request)
        answer = bytearray()
        while chunk := sock.recv(65536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    return status, bytes(answer)


JSON = ("Content-Type", "application/json")


def fuzz_head(fuzz_id: str) -> bytes:
    return f"Host: 127.0.0.1\r\n{FUZZ_ID}: {fuzz_id}\r\n".encode()


@pytest.mark.parametrize("line", [
    b"x-agent-id: a\rInjected: yes",  # a bare CR
    b"x-agent-id: a\nInjected: yes",  # a bare LF
    b"x-agent-id: a\r\n Injected: yes",  # obs-fold continuation
    b"x-agent-id: a\x00Injected: yes",
    b"x-codex-turn-metadata: {\"turn_id\": \"\x7f\x01\"}",
    b"x-team-id: " + b"t" * 100_000,  # one oversized value
    b"\r\n".join(b"x-many-%d: v" % n for n in range(500)),  # too many headers
])
def test_malformed_headers_get_a_4xx_and_reach_no_upstream(stack: Stack, line: bytes) -> None:
    fuzz_id = uuid.uuid4().hex
    status, answer = raw_request(stack, fuzz_head(fuzz_id) + line + b"\r\n")
    assert 400 <= status < 500, answer[:300]
    assert fuzz_id not in stack.seen


def test_smuggled_second_request_never_reaches_the_upstream(stack: Stack) -> None:
    fuzz_id = uuid.uuid4().hex
    smuggled = (b"0\r\n\r\nPOST /v1/responses HTTP/1.1\r\nHost: x\r\n"
                + f"{FUZZ_ID}: {fuzz_id}-smuggled\r\n".encode() + b"Content-Length: 2\r\n\r\n{}")
    status, _ = raw_request(stack, fuzz_head(fuzz_id) + b"Transfer-Encoding: chunked\r\n",
                            body=smuggled)
    assert 400 <= status < 500
    assert fuzz_id + "-smuggled" not in stack.seen


def test_host_and_absolute_target_cannot_redirect_the_upstream(stack: Stack) -> None:
    fuzz_id = uuid.uuid4().hex
    head = f"Host: localhost:8443\r\n{FUZZ_ID}: {fuzz_id}\r\n".encode()
    # An absolute-form target is refused (400) and nothing is forwarded.
    status, _ = raw_request(stack, head, target=b"http://evil.example:8443/v1/responses")
    assert status == 400
    assert fuzz_id not in stack.seen
    # The Host header alone never picks the upstream.
    status, _ = raw_request(stack, head, target=b"/v1/responses")
    assert status == 200  # answered by the echo upstream, the only place the proxy sends to
    seen = stack.seen.pop(fuzz_id)
    assert "8443" not in seen.headers["Host"]
    # A Host that names another server is refused (DNS rebinding): nothing is forwarded.
    evil = f"Host: evil.example:8443\r\n{FUZZ_ID}: {fuzz_id}-evil\r\n".encode()
    assert raw_request(stack, evil, target=b"/v1/responses")[0] == 421
    assert fuzz_id + "-evil" not in stack.seen


def test_duplicated_identity_headers_are_forwarded_without_the_user_key(
        stack: Stack, client: httpx.Client) -> None:
    headers = [("x-team-id", "team-a"), ("x-team-id", "team-b"), ("x-agent-id", "a1"),
               ("X-Agent-Id", "a2"), ("x-tdai-user-key", "uk-one"),
               ("X-TDAI-User-Key", "uk-two")]
    fuzz_id = uuid.uuid4().hex
    r = client.post(stack.proxy_url + "/v1/responses",
                    content=json.dumps(codex.request(codex.session(3))).encode(),
                    headers=[*headers, (FUZZ_ID, fuzz_id), JSON])
    assert r.status_code == 200
    seen = stack.seen.pop(fuzz_id)
    assert "x-tdai-user-key" not in seen.headers
    assert b"uk-one" not in seen.body and b"uk-two" not in seen.body
    assert seen.headers.getall("x-team-id") == ["team-a", "team-b"]
    assert "uk-" not in json.dumps(dict(seen.headers))


header_names = st.sampled_from(["x-team-id", "x-agent-id", "x-tdai-user-key", "session-id",
                                "x-codex-turn-metadata", "openai-beta", "x-custom"])
# Printable ASCII; h11 (the client here) refuses values with whitespace at either end.
header_values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e),
                        max_size=200).map(lambda v: v.strip(" "))


@FUZZ
@given(pairs=st.lists(st.tuples(header_names, header_values), max_size=8))
def test_any_printable_header_values_are_forwarded_as_sent(
        stack: Stack, client: httpx.Client, pairs: list[tuple[str, str]]) -> None:
    fuzz_id = uuid.uuid4().hex
    r = client.post(stack.proxy_url + "/v1/responses",
                    content=json.dumps(codex.request(codex.session(3))).encode(),
                    headers=[*pairs, (FUZZ_ID, fuzz_id), JSON])
    assert r.status_code == 200
    seen = stack.seen.pop(fuzz_id)
    for name in {n for n, _ in pairs if n != "x-tdai-user-key"}:
        assert seen.headers.getall(name) == [v for n, v in pairs if n == name]
    assert "x-tdai-user-key" not in seen.headers


def test_header_bytes_outside_ascii_are_forwarded_unchanged(stack: Stack) -> None:
    fuzz_id = uuid.uuid4().hex
    status, _ = raw_request(stack, fuzz_head(fuzz_id) + b"x-agent-id: caf\xe9\r\n")
    seen = stack.seen.pop(fuzz_id, None)
    if status != 200:  # refusing the request is fine too; altering it silently is not
        assert 400 <= status < 500 and seen is None
        return
    assert seen is not None
    assert seen.headers["x-agent-id"].encode("utf-8", "surrogateescape") == b"caf\xe9"


# --- request targets -------------------------------------------------------------------------


def forward_target(stack: Stack, target: str) -> tuple[int, Seen | None]:
    fuzz_id = uuid.uuid4().hex
    status, _ = raw_request(stack, fuzz_head(fuzz_id), target=target.encode(), method=b"GET",
                            body=b"")
    return status, stack.seen.pop(fuzz_id, None)


@pytest.mark.parametrize("target,expected", [
    ("/v1/models", "/v1/models"),
    ("/v1/models?limit=2&order=desc", "/v1/models?limit=2&order=desc"),
    ("/v1/files/file-abc/content", "/v1/files/file-abc/content"),
    ("/v1/models?after=a%26b&limit=2", "/v1/models?after=a%26b&limit=2"),
    ("/models", "/v1/models"),
    # A target that looks like a network path is only a path under the upstream URL.
    ("//evil.example/v1/models", "/v1/evil.example/v1/models"),
])
def test_request_targets_reach_the_upstream_under_its_url(stack: Stack, target: str,
                                                          expected: str) -> None:
    status, seen = forward_target(stack, target)
    assert status == 200
    assert seen is not None
    assert seen.target == expected
    assert seen.headers["Host"] == f"127.0.0.1:{stack.upstream_port}"


@pytest.mark.parametrize("target", [
    "/v1/files/abc%2Fdef/content", "/v1/models?x=%25zz", "/v1/files/a%20b",
    "/v1/models?q=a+b%2Bc", "/v1/models?x=%C3%A9",
])
def test_percent_encoded_targets_are_forwarded_as_sent(stack: Stack, target: str) -> None:
    status, seen = forward_target(stack, target)
    assert status == 200
    assert seen is not None and seen.target == target


@pytest.mark.parametrize("target", ["/v1/files/a%00b", "/v1/models?x=%00"])
def test_an_encoded_nul_in_the_target_gets_a_4xx(stack: Stack, target: str) -> None:
    status, seen = forward_target(stack, target)
    assert seen is None or seen.target == target
    assert status == 200 or 400 <= status < 500
