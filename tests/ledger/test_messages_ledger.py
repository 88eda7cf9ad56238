"""The ledger on Anthropic Messages (Claude Code) requests: a row's tokens count the whole
prompt as Anthropic reads it (tools, system, messages), and the estimate of the client's own
cache follows Claude Code's sessions although it moves its cache mark on every request."""

from __future__ import annotations

import orjson

from ctxproxy.injectors import tokens
from ctxproxy.ledger.counterfactual import DirectCache, PartCounter, prompt_parts
from ctxproxy.ledger.model import Record
from ctxproxy.proxy.ledger_wiring import LEDGER
from tests.conftest import ProxyFactory
from tests.fakes import claude_code as cc
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.server import Running

RULES = "Follow the house style in every file you touch, and say why in each commit. "


async def rows(proxy: Running, session: str) -> list[Record]:
    side = proxy.app[LEDGER]
    assert side.recorder is not None and side.ledger is not None
    await side.recorder.join()
    return await side.ledger.timeline(session)


def session_messages(turns: int) -> list[cc.Message]:
    messages = [*cc.first_messages("turn 1"), {"role": "assistant", "content": "ok"}]
    for n in range(2, turns + 1):
        messages += cc.tool_turn(f"[tool] turn {n}", n)
    return [*messages, {"role": "user", "content": "last turn"}]


async def test_a_rows_tokens_count_the_system_and_the_messages(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic,
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url, memory_enabled=False,
                              window_policy="fixed", keep_turns=20)
    body = cc.request(session_messages(3), "plain")
    big = {**body, "system": [*body["system"], {"type": "text", "text": RULES * 200}]}
    for name, sent in (("plain", body), ("big", big)):
        status, _ = await cc.post(proxy.url, sent, cc.headers(name))
        assert status == 200
    [plain] = await rows(proxy, "plain")
    [large] = await rows(proxy, "big")
    assert plain.client_tokens is not None and large.client_tokens is not None
    # The system block the second request added is counted, and nothing was forwarded cut.
    assert large.client_tokens - plain.client_tokens == tokens.count(
        orjson.dumps({"text": RULES * 200, "type": "text"}, option=orjson.OPT_SORT_KEYS).decode())
    assert plain.forwarded_tokens == plain.client_tokens
    # Every message counts: the prompt is far more than its tools and system.
    system_and_tools = tokens.count(orjson.dumps(body["tools"]).decode()) + sum(
        tokens.count(b["text"]) for b in body["system"])
    assert plain.client_tokens > system_and_tools + 3 * 30 * 3  # three turns' tool outputs
    assert plain.input_tokens is not None and plain.direct_input is not None


async def test_a_cut_shows_as_fewer_forwarded_tokens(
    start_proxy: ProxyFactory, anthropic: FakeAnthropic,
) -> None:
    proxy = await start_proxy(anthropic_url=anthropic.url, memory_enabled=False,
                              window_policy="fixed", keep_turns=2, trim_slack=0,
                              cut_digest_chars=0)
    status, _ = await cc.post(proxy.url, cc.request(session_messages(6), "cut"),
                              cc.headers("cut"))
    assert status == 200
    [row] = await rows(proxy, "cut")
    assert row.turns_in == 7 and row.turns_forwarded == 2 and row.items_cut > 0
    assert row.client_tokens is not None and row.forwarded_tokens is not None
    assert row.forwarded_tokens < row.client_tokens


def test_claude_codes_moving_cache_mark_does_not_break_the_direct_estimate() -> None:
    # Claude Code marks its newest message: the next request carries that message unmarked.
    messages = session_messages(4)
    first = cc.request(messages, "s")
    second = cc.request([*messages, {"role": "assistant", "content": "done"},
                         {"role": "user", "content": "one more"}], "s")
    assert "cache_control" in orjson.dumps(first["messages"][-1]).decode()
    assert "cache_control" not in orjson.dumps(second["messages"][-3]).decode()
    counter, direct = PartCounter(tokens.count), DirectCache()
    one, two = counter.measure(first), counter.measure(second)
    assert two.chain[: len(one.chain)] == one.chain
    direct.read_and_store("s", one, 0.0)
    assert direct.read_and_store("s", two, 1.0) == one.tokens // 128 * 128
    # The parts are Anthropic's: tools, each system block, each message.
    assert len(prompt_parts(first)) == 1 + len(first["system"]) + len(first["messages"])
