"""The cache-friendly invariants of the window, masking and the pricing fake, seen from outside."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.economics import STRATEGIES, Strategy, build_session, run_one
from bench.harness.codex import FIXTURES, SHAPE, Shapes, load_shapes
from bench.harness.pricing import (
    BLOCK_TOKENS,
    BREAKPOINT_MODEL,
    MIN_CACHED_TOKENS,
    Bill,
    PricingUpstream,
    PromptCache,
    PromptTokenizer,
    without_marks,
)
from ctxproxy.knowledge.store import FILENAME, Catalogue
from ctxproxy.knowledge.wiki import Page
from ctxproxy.request import is_turn_start, message_text
from ctxproxy.window.masking import mask_output, mask_text
from ctxproxy.window.policy import turns_to_drop
from tests.conftest import ProxyFactory, require_shared
from tests.fakes import codex
from tests.fakes.server import serve
from tests.fakes.upstream import FakeUpstream

Item = dict[str, Any]
BIG_OUTPUT = "".join(f"line {i}: some tool output that goes on\n" for i in range(200))


def shapes_or_skip() -> Shapes:
    """The Codex shapes the replay is built from (../shared), or skip."""
    return load_shapes(require_shared(FIXTURES / SHAPE))


def codex_requests(turns: int, said: str = "") -> list[list[Item]]:
    """What Codex sends over ``turns`` tool turns: two requests per turn, append-only;
    ``said``: what the first prompt says besides its step."""
    history = codex.context_items()
    requests = []
    for n in range(1, turns + 1):
        prompt = f"turn {n}: please do step {n}" + (f". {said}" if n == 1 and said else "")
        turn = codex.tool_turn(prompt, output=BIG_OUTPUT, n_calls=2)
        requests.append([*history, turn[0]])  # the prompt
        requests.append([*history, *turn[:6]])  # the tool outputs are back
        history += turn
    return requests


async def forward_all(proxy_url: str, requests: list[list[Item]]) -> None:
    async with aiohttp.ClientSession() as http:
        for n, items in enumerate(requests):
            async with http.post(proxy_url + "/v1/responses", json=codex.request(items),
                                 headers=codex.headers(turn_id=f"t{n // 2}")) as resp:
                assert resp.status == 200
                await resp.read()


def turns_of(items: list[Item]) -> int:
    return sum(1 for i in items if is_turn_start(i))


def extends(before: list[Item], after: list[Item]) -> bool:
    return len(after) > len(before) and after[: len(before)] == before


@pytest.mark.parametrize("mask", [False, True])
async def test_between_cuts_each_forwarded_request_extends_the_previous(
    upstream: FakeUpstream, start_proxy: ProxyFactory, mask: bool
) -> None:
    keep, slack = 3, 2
    proxy = await start_proxy(keep_turns=keep, trim_slack=slack, mask_tool_outputs=mask,
                              memory_enabled=False)
    requests = codex_requests(12)
    await forward_all(proxy.url, requests)

    sent = [r.json["input"] for r in upstream.received]
    cuts = 0
    for (orig_a, orig_b), (a, b) in zip(
        itertools.pairwise(requests), itertools.pairwise(sent), strict=True
    ):
        moved = turns_to_drop(turns_of(orig_a), keep, slack) != turns_to_drop(
            turns_of(orig_b), keep, slack)
        assert extends(a, b) is not moved
        cuts += moved
    assert cuts == 3  # at 6, 9 and 12 turns: once every slack + 1 turns, not every turn


async def test_masking_shortens_older_kept_outputs_but_never_the_newest_turn(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(keep_turns=3, trim_slack=2, mask_tool_outputs=True,
                              mask_keep_chars=400, memory_enabled=False)
    requests = codex_requests(11)
    await forward_all(proxy.url, requests[-1:])

    sent = upstream.last.json["input"]
    prompts = [message_text(i) for i in sent if is_turn_start(i)]
    assert prompts == [f"turn {n}: please do step {n}" for n in (7, 8, 9, 10, 11)]
    outputs: dict[str, list[str]] = {}
    prompt = ""
    for item in sent:
        if is_turn_start(item):
            prompt = message_text(item)[:7].rstrip(":")
        if item.get("type") == "function_call_output":
            outputs.setdefault(prompt, []).append(item["output"])
    # The last cut, at 9 turns, kept turns 7-9: 7 and 8 were the older ones then.
    for turn in ("turn 7", "turn 8"):
        for out in outputs[turn]:
            assert len(out) < 800 and "ctxproxy removed" in out  # the note holds a curl line
            assert out.startswith(BIG_OUTPUT[:200]) and out.endswith(BIG_OUTPUT[-200:])
    for turn in ("turn 9", "turn 10", "turn 11"):
        assert outputs[turn] == [BIG_OUTPUT, BIG_OUTPUT]
    calls = [i for i in sent if i.get("type") == "function_call"]
    assert len(calls) == 10  # every call stays, with its output


async def test_token_budget_cuts_rarely_and_appends_between_cuts(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    budget = 30_000
    proxy = await start_proxy(keep_turns=2, trim_at_tokens=budget, memory_enabled=False)
    requests = codex_requests(14)
    await forward_all(proxy.url, requests)

    sent = [r.json["input"] for r in upstream.received]
    cuts = 0
    for a, b in itertools.pairwise(sent):
        if not extends(a, b):
            cuts += 1
            assert turns_of(b) <= turns_of(a)  # the only other move is a cut
    assert 1 <= cuts <= 3  # a turn count would have cut on each of the 12 turns past 2
    sizes = [len(json.dumps(r.json["input"], separators=(",", ":"))) // 4
             for r in upstream.received]
    turn_tokens = len(json.dumps(requests[1])) // 4 - len(json.dumps(requests[0])) // 4
    assert max(sizes) < budget + turn_tokens  # over the budget by less than one turn
    assert len(json.dumps(requests[-1])) // 4 > 1.5 * budget


async def test_knowledge_block_is_the_same_bytes_across_a_session_and_its_cuts(
    upstream: FakeUpstream, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    catalogue = Catalogue.open(tmp_path / "data" / FILENAME)
    catalogue.sync_wiki("default", "team-1", "Design docs", "How the backend is built", "/docs",
                        [Page("auth", "Authentication", "Tokens rotate every hour.")])
    catalogue.close()
    proxy = await start_proxy(team_id="team-1", keep_turns=3, trim_slack=2,
                              mask_tool_outputs=True, memory_enabled=False)
    requests = codex_requests(10)
    await forward_all(proxy.url, requests)

    instructions = {r.json.get("instructions") for r in upstream.received}
    assert len(instructions) == 1
    block = instructions.pop()
    assert isinstance(block, str) and block.startswith("<knowledge_tools>")
    sent = [r.json["input"] for r in upstream.received]
    cuts = sum(not extends(a, b) for a, b in itertools.pairwise(sent))
    assert cuts == 2  # at 6 and 9 turns; the block stayed put through both


async def test_slow_blocks_change_only_when_the_window_cuts(
    upstream: FakeUpstream, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    catalogue = Catalogue.open(tmp_path / "data" / FILENAME)
    catalogue.sync_wiki("default", "team-1", "Design docs", None, "/docs",
                        [Page("auth", "Authentication", "Tokens rotate every hour.")])
    catalogue.close()
    proxy = await start_proxy(team_id="team-1", keep_turns=3, trim_slack=2,
                              mask_tool_outputs=True, memory_enabled=True,
                              distill_interval_s=3600)
    await forward_all(proxy.url, codex_requests(10, said="Never commit to main."))

    sent = [(r.json.get("instructions"), r.json["input"]) for r in upstream.received]
    assert sent[0][0].startswith("<knowledge_tools>")
    # The front (tools, instructions with the knowledge block, the agent's context) changes
    # once: at the first cut, which lists the chat memory (some of it is out of view from
    # then on); the standing block is a message before the first kept turn, moved by cuts
    # only.
    fronts = [n for n in range(1, len(sent)) if sent[n][0] != sent[n - 1][0]]
    assert len(fronts) == 1 and not extends(sent[fronts[0] - 1][1], sent[fronts[0]][1])
    assert "chat_memory-" not in sent[0][0] and "chat_memory-" in sent[-1][0]
    changes = 0
    for (_, input_a), (_, input_b) in itertools.pairwise(sent):
        if _standing(input_a) != _standing(input_b):
            changes += 1
            assert not extends(input_a, input_b)  # a slow block moved only with a cut
    assert any("<working_memory" in _standing(items) for _, items in sent)  # it was there
    assert 1 <= changes <= 2  # two cuts, at 6 and 9 turns


def _standing(items: list[dict[str, Any]]) -> str:
    """The standing block's text in a forwarded input ("" when it has none)."""
    return next((text for item in items if item.get("role") == "developer"
                 and "<working_memory" in (text := str(item.get("content")))), "")


def test_masking_is_deterministic_and_leaves_short_outputs_alone() -> None:
    item = {"type": "function_call_output", "call_id": "c1", "output": BIG_OUTPUT}
    once, twice = mask_output(item, 300), mask_output(dict(item), 300)
    assert once == twice and once is not item and item["output"] == BIG_OUTPUT
    assert mask_text("short output\n", 300) == "short output\n"
    call = {"type": "function_call", "call_id": "c1", "arguments": BIG_OUTPUT}
    assert mask_output(call, 300) is call


# --- the pricing fake ------------------------------------------------------------------------


def test_cache_counts_from_1024_tokens_in_128_token_steps() -> None:
    cache = PromptCache(ttl_s=600)
    first = list(range(5000))
    assert cache.read_and_store("k", first, now=0) == 0
    # Shares 1000 tokens: under the 1024 minimum, nothing is cached.
    assert cache.read_and_store("k", first[:1000] + [-1] * 4000, now=1) == 0
    # Shares 3000 tokens: counted down to a multiple of 128.
    assert cache.read_and_store("k", first[:3000] + [-2] * 2000, now=2) == 2944
    assert cache.read_and_store("other", first, now=3) == 0  # keys never share
    assert MIN_CACHED_TOKENS == 1024


def test_cache_forgets_after_the_idle_ttl_and_use_refreshes_it() -> None:
    cache = PromptCache(ttl_s=300)
    prompt = list(range(2048))
    cache.read_and_store("k", prompt, now=0)
    assert cache.read_and_store("k", prompt, now=250) == 2048
    assert cache.read_and_store("k", prompt, now=500) == 2048  # refreshed at 250
    assert cache.read_and_store("k", prompt, now=801) == 0  # 301 s idle


TOKENIZER = PromptTokenizer()
MARKED = {"prompt_cache_breakpoint": {"mode": "explicit"}}


def said(n: int, marked: bool = False, words: int = 700) -> Item:
    """A user message of about ``words`` tokens, unique to ``n``; ``marked``: an explicit
    cache breakpoint on its content part."""
    text = f"message {n}: " + " ".join(f"w{n}x{i}" for i in range(words // 4))
    part = {"type": "input_text", "text": text, **(MARKED if marked else {})}
    return {"type": "message", "role": "user", "content": [part]}


def priced(items: list[Item]) -> dict[str, Any]:
    return {"model": BREAKPOINT_MODEL, "input": items, "prompt_cache_key": "k"}


def ends(items: list[Item]) -> list[int]:
    """The tokens up to the end of each item, as the fake counts them (marks left out)."""
    return list(itertools.accumulate(
        n for n, _ in TOKENIZER.parts(without_marks(priced(items)))))


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_breakpoint_rules_cache_an_append_only_session_exactly_and_bill_the_writes() -> None:
    by_prefix = PricingUpstream(tokenizer=TOKENIZER)
    by_breakpoint = PricingUpstream(tokenizer=TOKENIZER, rules="breakpoint")
    items: list[Item] = []
    for n in range(6):
        items.append(said(n))
        for fake in (by_prefix, by_breakpoint):
            fake.price(priced(items), [])
    before = [0, *ends(items)[:-1]]  # each request reads the whole previous one
    for n, (p, b) in enumerate(zip(by_prefix.bills, by_breakpoint.bills, strict=True)):
        assert p.input_tokens == b.input_tokens and p.written_tokens == 0
        read = before[n] if before[n] >= MIN_CACHED_TOKENS else 0
        assert b.cached_tokens == read  # exactly, no 128-token rounding
        assert p.cached_tokens == read // BLOCK_TOKENS * BLOCK_TOKENS
        # The end of the prompt is a breakpoint: once at 1024 tokens, all that is not read is
        # written.
        assert b.written_tokens == (b.input_tokens - read
                                    if b.input_tokens >= MIN_CACHED_TOKENS else 0)
    assert by_breakpoint.bills[0].written_tokens == 0  # one item: under 1024 tokens
    assert by_breakpoint.bills[-1].cost(0.1) > by_prefix.bills[-1].cost(0.1)


def test_breakpoint_rules_read_nothing_past_a_changed_item_without_a_mark_before_it() -> None:
    fake = PricingUpstream(tokenizer=TOKENIZER, rules="breakpoint")
    first = [said(0), said(1), said(2), said(3)]
    changed = [said(0), said(1), said(9), said(3)]  # the third item differs
    fake.price(priced(first), [])
    fake.price(priced(changed), [])
    assert fake.bills[-1].cached_tokens == 0  # two items (1,448 tokens) match, and count for none
    prefix = PricingUpstream(tokenizer=TOKENIZER)
    prefix.price(priced(first), [])
    prefix.price(priced(changed), [])
    assert prefix.bills[-1].cached_tokens > 0  # where the prefix rules read them


def test_breakpoint_rules_read_up_to_a_marked_item_before_the_change() -> None:
    fake = PricingUpstream(tokenizer=TOKENIZER, rules="breakpoint")
    first = [said(0), said(1, marked=True), said(2), said(3)]
    fake.price(priced(first), [])
    assert fake.bills[0].written_tokens == fake.bills[0].input_tokens
    # The mark moved on (a proxy marks its newest stable item): the items are the same tokens.
    changed = [said(0), said(1), said(9, marked=True), said(3)]
    fake.price(priced(changed), [])
    bill = fake.bills[1]
    assert bill.input_tokens == ends(changed)[-1]
    assert bill.cached_tokens == ends(first)[1]  # exactly to the marked item's end
    assert bill.written_tokens == bill.input_tokens - bill.cached_tokens
    assert bill.cost(0.1, 1.25) == pytest.approx(
        0.1 * bill.cached_tokens + 1.25 * bill.written_tokens)


def test_breakpoint_rules_forget_after_the_idle_ttl_and_a_read_refreshes() -> None:
    clock = Clock()
    fake = PricingUpstream(clock=clock, ttl_s=300, tokenizer=TOKENIZER, rules="breakpoint")
    body = priced([said(0), said(1), said(2)])
    for clock.now in (0, 250, 500, 801):
        fake.price(body, [])
    total = fake.bills[0].input_tokens
    assert [(b.cached_tokens, b.written_tokens) for b in fake.bills] == [
        (0, total), (total, 0), (total, 0), (0, total)]  # 301 s idle: written again


async def test_breakpoint_fake_refuses_four_marks_and_reports_writes_in_usage() -> None:
    fake = PricingUpstream(rules="breakpoint")
    running = await serve(fake.app())
    try:
        async with aiohttp.ClientSession() as http:
            four = priced([said(n, marked=True) for n in range(4)])
            async with http.post(running.url + "/v1/responses", json=four) as resp:
                assert resp.status == 400
                error = (await resp.json())["error"]
            three = priced([said(n, marked=n < 3) for n in range(4)])
            async with http.post(running.url + "/v1/responses", json=three) as resp:
                assert resp.status == 200
                usage = (await resp.json())["usage"]
    finally:
        await running.close()
    assert error["type"] == "invalid_request_error" and "breakpoints" in error["message"]
    assert len(fake.bills) == 1  # the refused request was not billed
    assert usage["input_tokens_details"] == {
        "cached_tokens": 0, "cache_write_tokens": usage["input_tokens"]}


async def test_prefix_rules_report_usage_without_cache_writes() -> None:
    fake = PricingUpstream()
    running = await serve(fake.app())
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(running.url + "/v1/responses",
                                 json=priced([said(0), said(1)])) as resp:
                usage = (await resp.json())["usage"]
    finally:
        await running.close()
    assert usage["input_tokens_details"] == {"cached_tokens": 0}
    bill = Bill("k", 1000, 600, 0, 0.0)
    assert bill.written_tokens == 0 and bill.cost(0.1) == 400 + 60


async def test_access_log_has_upstream_usage_and_the_forwarded_ratio(
    start_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    pricing = PricingUpstream()
    running = await serve(pricing.app())
    try:
        proxy = await start_proxy(upstream_url=running.url + "/v1", keep_turns=3, trim_slack=0)
        caplog.set_level(logging.INFO, logger="ctxproxy.access")
        requests = codex_requests(5)
        await forward_all(proxy.url, [requests[-2], requests[-1]])
    finally:
        await running.close()

    lines = [r.fields for r in caplog.records if r.name == "ctxproxy.access"]  # type: ignore[attr-defined]
    assert [(f["input_tokens"], f["cached_tokens"]) for f in lines] == [
        (b.input_tokens, b.cached_tokens) for b in pricing.bills
    ]
    assert lines[1]["cached_tokens"] > 0  # the second request reads the first one's prefix
    for f in lines:
        assert f["forwarded_ratio"] == round(f["bytes_forwarded"] / f["bytes_in"], 4)
        assert f["forwarded_ratio"] < 0.8  # five turns cut to three


# --- the replay ------------------------------------------------------------------------------


def test_sessions_are_reproducible_and_plant_facts_before_asking() -> None:
    a, b = build_session(20), build_session(20)
    assert a == b
    assert len(a.turns) == 20 and len(a.facts) >= 2
    for fact in a.facts:
        assert fact.planted < fact.asked
        assert fact.value not in a.turns[fact.asked - 1].prompt
    sizes = [len(out) for t in a.turns for out in t.outputs.values()]
    assert min(sizes) >= 1000 and max(sizes) <= 8500


async def test_replay_bills_every_request_and_direct_recalls_every_fact(tmp_path: Path) -> None:
    session, shapes = build_session(10), shapes_or_skip()
    direct = await run_one(STRATEGIES["direct"], session, shapes, 600, tmp_path / "d")
    cut = await run_one(Strategy("cut", {"memory_enabled": False, "keep_turns": 2}, ""),
                        session, shapes, 600, tmp_path / "w")
    assert direct.recall == 1.0
    assert len(direct.bills) == len(cut.bills) == sum(len(t.responses) for t in session.turns)
    assert sum(b.input_tokens for b in cut.bills) < sum(b.input_tokens for b in direct.bills)
    assert sum(b.cached_tokens for b in direct.bills) / sum(
        b.input_tokens for b in direct.bills) > 0.8


async def test_breakpoint_rules_price_a_direct_session_that_names_a_breakpoint_model(
    tmp_path: Path,
) -> None:
    session = build_session(10)
    shapes = load_shapes(require_shared(FIXTURES / SHAPE), rules="breakpoint")
    assert shapes.body["model"] == BREAKPOINT_MODEL
    run = await run_one(STRATEGIES["direct"], session, shapes, 600, tmp_path, rules="breakpoint")
    prefix = await run_one(STRATEGIES["direct"], session, shapes_or_skip(), 600, tmp_path)
    assert run.recall == 1.0 and run.front_misses == 0
    total = sum(b.input_tokens for b in run.bills)
    written = sum(b.written_tokens for b in run.bills)
    assert sum(b.cached_tokens for b in run.bills) + written == total  # append-only: all read
    assert 0 < written < 0.1 * total  # or written once
    assert run.cost(0.1) > prefix.cost(0.1)  # the writes cost more than the rounding saves


# --- the defaults ----------------------------------------------------------------------------


async def test_the_defaults_cost_no_more_than_direct_on_a_ten_turn_session(
    tmp_path: Path,
) -> None:
    session, shapes = build_session(10), shapes_or_skip()
    direct = await run_one(STRATEGIES["direct"], session, shapes, 600, tmp_path / "d")
    defaults = await run_one(STRATEGIES["defaults"], session, shapes, 600, tmp_path / "p")
    # nothing else changed
    assert defaults.strategy.settings == {"distill_interval_s": 0.05, "memory_process": False}
    assert defaults.cost(0.1) <= direct.cost(0.1) * 1.02
    assert defaults.recall == 1.0


async def test_with_the_defaults_and_memory_each_request_between_cuts_extends_the_last(
    tmp_path: Path,
) -> None:
    session = build_session(24, seed=3)
    run = await run_one(STRATEGIES["defaults"], session, shapes_or_skip(), 600, tmp_path)
    assert run.blocks and run.recall == 1.0  # recall messages were there, and found the facts
    cold = []
    for n in range(1, len(run.bills)):
        before, after = run.bills[n - 1], run.bills[n]
        # The provider's cache holds the whole previous request when it is a prefix of this one.
        if after.cached_tokens < before.input_tokens // BLOCK_TOKENS * BLOCK_TOKENS:
            cold.append(n)
    # A new prefix starts only where the window cut: at a turn's first request, and rarely.
    assert all(run.turn_of[n] != run.turn_of[n - 1] for n in cold), cold
    assert 1 <= len(cold) <= 6, cold
