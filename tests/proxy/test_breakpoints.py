"""Explicit cache breakpoints: what the upstream receives for the models that cache only at
breakpoints (gpt-5.6 and later), and that every other model's request is as before."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from ctxproxy.config import load_settings
from ctxproxy.injectors.breakpoints import MARK_KEY, client_marks, context_end, place
from ctxproxy.proxy.explain import explain, render
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream
from tests.memory.conftest import Backend, backend, pg_url
from tests.memory.session import Session, exchange, said_in_sessions, standing_memory

__all__ = ["backend", "pg_url"]  # the fixtures: the memory test runs on both stores

Item = dict[str, Any]
MODEL = "gpt-6.1-sol"  # the Codex CLI's default model (../shared/fixtures/codex)
CUT_EVERY_TURN: dict[str, Any] = {"keep_turns": 1, "window_policy": "fixed", "trim_slack": 0}
MARK = {"mode": "explicit"}


def steady_session(turns: int) -> list[Item]:
    """A Codex-shaped history whose bytes are the same on every run (no random ids)."""
    items = codex.context_items()
    for n in range(1, turns + 1):
        prompt = f"turn {n}: please do step {n}"
        if n == turns:
            items.append(codex.text("user", prompt))
            continue
        items += [codex.text("user", prompt),
                  {"type": "function_call", "name": "exec_command", "call_id": f"call_{n}",
                   "arguments": orjson.dumps({"cmd": f"cat src/step{n}.py"}).decode(),
                   "status": "completed"},
                  {"type": "function_call_output", "call_id": f"call_{n}",
                   "output": f"def step{n}():\n" + "    pass\n" * 300},
                  codex.text("assistant", f"Done with step {n}.")]
    return items


async def forwarded(proxy_url: str, upstream: FakeUpstream, body: dict[str, Any],
                    session: str = "sess-1") -> bytes:
    status, _ = await exchange(proxy_url, body, codex.headers(session))
    assert status == 200
    return upstream.last.body


def marks(body: dict[str, Any]) -> list[tuple[int, int]]:
    return client_marks(body["input"])


def text_of(item: Item) -> str:
    return "\n".join(p.get("text", "") for p in item.get("content", []))


def prefixes(body: dict[str, Any]) -> list[bytes]:
    """Each breakpoint's prefix as the upstream reads it: everything outside the input, then
    the input up to the marked item."""
    outside = orjson.dumps({k: v for k, v in body.items() if k != "input"})
    return [outside + orjson.dumps(body["input"][: i + 1]) for i, _ in marks(body)]


class ModelSession(Session):
    """A Codex thread that names a model."""

    model: str = MODEL

    async def send(self) -> dict[str, Any]:
        hdrs = codex.headers(session_id=self.session_id,
                             turn_id=f"{self.session_id}-t{self.turns}")
        status, self.answer = await exchange(
            self.proxy.url, codex.request(self.items, self.session_id, model=self.model), hdrs)
        assert status == 200
        return dict(self.upstream.last.json)


@pytest.mark.parametrize("model", ["fake-model", "gpt-5.5"])
async def test_other_models_are_forwarded_byte_for_byte_as_before(
    model: str, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    # As a proxy that knows no breakpoint model forwards them (a cut and its digest).
    proxy = await start_proxy(memory_enabled=False, mask_fetch_mb=0)
    unaware = await start_proxy(memory_enabled=False, mask_fetch_mb=0, breakpoint_models="")
    body = codex.request(steady_session(8), model=model)
    sent = await forwarded(proxy.url, upstream, body)
    assert sent == await forwarded(unaware.url, upstream, body)
    assert b"<earlier_turns" in sent
    assert MARK_KEY.encode() not in sent
    # Nothing to cut: the client's own bytes.
    raw = orjson.dumps(codex.request(steady_session(1), model=model))
    async with aiohttp.ClientSession() as http, http.post(
        proxy.url + "/v1/responses", data=raw, headers=codex.headers("sess-2"),
    ) as resp:
        assert resp.status == 200
    assert upstream.last.body == raw


async def test_a_breakpoint_model_gets_the_context_end_and_the_cut_digest_marked(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(memory_enabled=False, **CUT_EVERY_TURN)
    sent = orjson.loads(await forwarded(proxy.url, upstream,
                                        codex.request(steady_session(4), model=MODEL)))
    items = sent["input"]
    context = len(codex.context_items())
    assert marks(sent) == [(context - 1, 1), (context, 0)]
    assert items[context - 1]["content"][1][MARK_KEY] == MARK  # <environment_context>
    assert text_of(items[context]).startswith("<earlier_turns")
    assert items[context]["content"][0][MARK_KEY] == MARK
    assert "turn 4" in text_of(items[context + 1])  # the newest turn, unmarked


async def test_the_context_end_is_marked_when_nothing_else_changed(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(memory_enabled=False)
    body = codex.request(steady_session(1), model=MODEL)  # nothing to cut
    first = await forwarded(proxy.url, upstream, body)
    second = await forwarded(proxy.url, upstream, body)
    assert first == second  # the same bytes every time
    sent = orjson.loads(first)
    assert marks(sent) == [(len(codex.context_items()) - 1, 1)]
    unmarked = dict(sent["input"][2]["content"][1])
    del unmarked[MARK_KEY]
    assert {**sent, "input": [*sent["input"][:2], {**sent["input"][2], "content": [
        sent["input"][2]["content"][0], unmarked]}, *sent["input"][3:]]} == body


async def test_the_standing_block_is_marked_and_each_breakpoints_prefix_repeats(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(**backend.settings, **CUT_EVERY_TURN)
    await said_in_sessions(proxy, upstream, ["Use Python, not Node, for the build scripts.",
                                             "Now add a lint step."])
    s = ModelSession(proxy, upstream, session_id="bp")
    # A finished turn with a long output: its cut leaves a digest.
    s.items = [*s.items, *codex.tool_turn("Read the build file.", output="line\n" * 2000)]
    await s.say("Write a release script.")
    # Two requests of one turn: the window cut once, before the first of them.
    first, second = await s.say_with_tool("Now the changelog.")
    for sent in (first, second):
        context = len(codex.context_items())
        assert text_of(sent["input"][context]).startswith("<earlier_turns")
        assert "<semantic_memory" in standing_memory(sent)
        assert "<semantic_memory" in text_of(sent["input"][context + 1])
        # The context end, and the standing block (the digest before it is in its prefix).
        assert marks(sent) == [(context - 1, 1), (context + 1, 0)]
    assert prefixes(first) == prefixes(second)
    assert len(orjson.dumps(second)) > len(orjson.dumps(first))


async def test_the_clients_own_marks_are_kept_and_ours_fill_the_room_left(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(memory_enabled=False, **CUT_EVERY_TURN)
    items = steady_session(4)
    prompts = [i for i, item in enumerate(items) if text_of(item).startswith("turn ")]
    for i in prompts[-2:]:  # the client marks its two newest prompts
        items[i] = {**items[i], "content": [{**items[i]["content"][0], MARK_KEY: MARK}]}
    sent = orjson.loads(await forwarded(proxy.url, upstream,
                                        codex.request(items, model=MODEL)))
    context = len(codex.context_items())
    assert len(marks(sent)) == 3
    assert marks(sent)[0] == (context - 1, 1)  # the context end first: it outlives a cut
    assert text_of(sent["input"][-1]).startswith("turn 4")
    assert MARK_KEY in sent["input"][-1]["content"][0]


def test_more_than_three_client_marks_keep_the_newest_three() -> None:
    items = [codex.text("user", f"turn {n}") for n in range(5)]
    items = [{**i, "content": [{**i["content"][0], MARK_KEY: MARK}]} for i in items]
    out = place(items, [0])
    assert out is not None and [i for i, _ in client_marks(out)] == [2, 3, 4]
    assert client_marks(items) == [(n, 0) for n in range(5)]  # the client's items untouched


def test_no_mark_on_an_empty_part_or_a_string_content() -> None:
    context = [
        codex.text("developer", "the agent's rules"),
        {"type": "message", "role": "user", "content": "# AGENTS.md instructions\nstring"},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "<environment_context>x</environment_context>"},
            {"type": "input_text", "text": ""}]},
        {"type": "message", "role": "developer", "content": [{"type": "input_text",
                                                              "text": ""}]},
    ]
    items = [*context, codex.text("user", "a prompt")]
    assert context_end(items, len(context)) == 2
    out = place(items, [2])
    assert out is not None
    assert MARK_KEY in out[2]["content"][0] and MARK_KEY not in out[2]["content"][1]


def test_the_default_breakpoint_models() -> None:
    settings = load_settings(env={})
    follow = ["gpt-5.6", "gpt-5.10", "gpt-5.6-codex", "gpt-6", "gpt-6.1-sol", "gpt-7"]
    prefix = ["gpt-5", "gpt-5.5", "gpt-5.1-codex", "gpt-4.1", "gpt-5-mini", "fake-model"]
    assert [m for m in follow + prefix if settings.follows_breakpoints(m)] == follow
    assert not load_settings(env={"CTXPROXY_BREAKPOINT_MODELS": ""}).follows_breakpoints(MODEL)


async def test_explain_counts_the_marks_and_no_marked_item_as_added(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(memory_enabled=False, **CUT_EVERY_TURN)
    raw = orjson.dumps(codex.request(steady_session(4), model=MODEL))
    report = explain(raw, await forwarded(proxy.url, upstream, orjson.loads(raw)))
    assert report["breakpoints"] == 2
    added = [a["item"].split(":")[0] for a in report["items_added"]]
    assert added == ["message/developer"]  # the digest alone: the marked context is not new
    assert "cache breakpoints marked: 2" in render(report)
