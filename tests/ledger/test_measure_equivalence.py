"""The ledger counts the bodies the proxy already parsed, reusing the parts the forwarded
body shares with the client's: its rows must carry exactly the numbers the old measure
(tests/ledger/reference.py: both bodies parsed again from their bytes) gives."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.harness import ledger_reference as reference
from bench.harness import session as bench_session
from bench.harness.load_client import Script, Thread
from bench.harness.serving import Running
from ctxproxy.injectors import tokens
from ctxproxy.ledger import counterfactual
from ctxproxy.ledger.counterfactual import DirectCache, Measure, PartCounter
from ctxproxy.ledger.measure import Bodies, InThread, Measurer, Pending
from ctxproxy.ledger.model import Record
from ctxproxy.proxy import ledger_wiring
from ctxproxy.proxy.app import Access, Sent
from ctxproxy.proxy.ledger_wiring import LEDGER
from tests.conftest import ProxyFactory
from tests.fakes import codex

Body = dict[str, Any]


def count(text: str) -> int:
    """A stand-in tokenizer that tells texts of different shape apart, with counts large
    enough for small bodies to pass the provider's 1,024-token minimum of a cached prefix."""
    return 300 + len(text) // 3 + text.count('"') + text.count(" ")


def recorder(direct: DirectCache | None = None) -> Measurer:
    return Measurer(PartCounter(count), direct)


# --- generated bodies: the client's, and one forwarded from the same objects -----------------

json_scalars = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats()  # NaN and infinities too: written as null either way
    | st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
items = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["message", "reasoning"]),
                           "role": st.sampled_from(["user", "assistant", "developer"])},
                          optional={"content": json_values, "id": st.text(max_size=8)}),
    json_values,  # not every item is an object: counted all the same
)
texts = st.text(max_size=40)
tools = st.lists(st.dictionaries(st.text(max_size=6), json_values, max_size=3), max_size=3)


@st.composite
def forward(draw: st.DrawFn, client: Body) -> Body | None:
    """What a proxy might forward: most items the client's own objects, some cut, some masked
    (an equal copy or a new value), blocks added, instructions grown; None: the client's."""
    if draw(st.booleans()):
        return None
    forwarded = dict(client)
    if isinstance(client["input"], list):
        kept = [item for item in client["input"] if draw(st.booleans()) or not client["input"]]
        kept = [draw(st.sampled_from([item, orjson.loads(orjson.dumps(item)),
                                      draw(items)])) for item in kept]
        at = draw(st.integers(0, len(kept)))
        forwarded["input"] = kept[:at] + draw(st.lists(items, max_size=2)) + kept[at:]
    elif draw(st.booleans()):
        forwarded["input"] = draw(st.lists(items, max_size=3))
    if draw(st.booleans()):
        forwarded["instructions"] = f"{client.get('instructions', '')}<memory>m</memory>"
    if draw(st.booleans()):
        forwarded["tools"] = [*client.get("tools", []), {"name": "knowledge"}]
    return forwarded


@st.composite
def sessions(draw: st.DrawFn) -> list[tuple[Record, Body, Body | None]]:
    """Requests of a few interleaved sessions, each resending its history with new items
    (now and then rewritten, as a compaction does), parsed anew each time."""
    at = 0.0
    heads: dict[str, Body] = {}
    histories: dict[str, list[Any]] = {}
    out = []
    for _ in range(draw(st.integers(1, 16))):
        at += draw(st.sampled_from([1.0, 30.0, 1.0, 600.0, 601.0]))  # the TTL: 600 s
        session = draw(st.sampled_from(["a", "b", "c"]))
        head = heads.setdefault(session, draw(st.fixed_dictionaries(
            {}, optional={"instructions": texts | json_values, "tools": tools})))
        history = histories.setdefault(session, [])
        if history and draw(st.integers(0, 5)) == 0:
            del history[: draw(st.integers(1, len(history)))]
        history += draw(st.lists(items, min_size=1, max_size=4))
        body: Body = {"model": "m", **head, "input": history}
        if draw(st.integers(0, 9)) == 0:
            body["input"] = draw(texts | json_values)
        client = orjson.loads(orjson.dumps(body))
        record = Record(
            at=at, session_id=session, model="m",
            status=draw(st.sampled_from([200, 200, 200, 400])),
            input_tokens=draw(st.sampled_from([None, 0, 2_000, 20_000, 100_000])),
        )
        out.append((record, client, draw(forward(client))))
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions(), st.sampled_from([1, 2, 10_000]), st.sampled_from([3, 200_000]))
def test_counting_the_parsed_bodies_gives_the_old_numbers(
    requests: list[tuple[Record, Body, Body | None]], max_sessions: int, max_nodes: int,
) -> None:
    # Small bounds too: the caches must forget the same sessions and chain nodes as before.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(counterfactual, "CHAIN_NODES", max_nodes)
        new = recorder(DirectCache(sessions=max_sessions))
        from_bytes = recorder(DirectCache(sessions=max_sessions))
        old = reference.Reference(count, reference.DirectCache(sessions=max_sessions,
                                                               chain_nodes=max_nodes))
        for record, client, forwarded in requests:
            raw = orjson.dumps(client)
            sent = None if forwarded is None else orjson.dumps(forwarded)
            pending = Pending(record, raw, sent, parsed=True)
            expected = old.measure(pending)
            assert new.measure(replace(pending, bodies=Bodies(client, forwarded, 0))) == expected
            assert from_bytes.measure(pending) == expected


@st.composite
def chains(draw: st.DrawFn) -> list[tuple[str, Measure, float]]:
    """Bodies of a few sessions as chains over a small set of parts (so that prefixes are
    shared often), each part 1,100 tokens (one is a cached prefix), at times around the TTL."""
    at = 0.0
    out = []
    for _ in range(draw(st.integers(1, 30))):
        at += draw(st.sampled_from([1.0, 1.0, 300.0, 600.0, 601.0]))
        path = draw(st.lists(st.integers(0, 2), max_size=3))
        chain = tuple(bytes(path[: n + 1]) for n in range(len(path)))
        ends = tuple(1100 * (n + 1) for n in range(len(path)))
        out.append((draw(st.sampled_from("abc")), Measure(chain, ends), at))
    return out


@settings(max_examples=300, deadline=None)
@given(chains(), st.sampled_from([1, 2, 3]), st.sampled_from([1, 2, 3, 5, 200_000]))
def test_the_direct_cache_forgets_what_it_forgot_before(
    bodies: list[tuple[str, Measure, float]], max_sessions: int, max_nodes: int,
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(counterfactual, "CHAIN_NODES", max_nodes)
        new = DirectCache(sessions=max_sessions)
        old = reference.DirectCache(sessions=max_sessions, chain_nodes=max_nodes)
        for session, measure, at in bodies:
            assert new.read_and_store(session, measure, at) == old.read_and_store(
                session, measure, at)


def test_a_part_shared_by_identity_is_counted_as_its_own_kind() -> None:
    # The same string object: the client's input as text, forwarded as a JSON item.
    text = "hello there"
    client: Body = {"input": text}
    forwarded: Body = {"input": [text]}
    record = Record(at=1.0, session_id="s", model="m", status=200, input_tokens=100)
    pending = Pending(record, orjson.dumps(client), orjson.dumps(forwarded), parsed=True)
    expected = reference.Reference(count).measure(pending)
    assert expected.client_tokens != expected.forwarded_tokens
    assert recorder().measure(replace(pending, bodies=Bodies(client, forwarded, 0))) == expected


# --- the proxy's own rows, on the load's Codex bodies -----------------------------------------


class Spy:
    """What a running proxy's recorder was handed, the same rows as it had them before (the
    bytes), and the rows it wrote."""

    def __init__(self, proxy: Running, monkeypatch: pytest.MonkeyPatch) -> None:
        recorder = proxy.app[LEDGER].recorder
        assert recorder is not None
        self.recorder = recorder
        self.handed: list[Pending] = []
        self.as_bytes: list[Pending] = []
        self.rows: list[Record] = []
        assert isinstance(recorder.counting, InThread)  # the proxy fixture's default
        measurer = recorder.counting.measurer
        pending, measure_all = ledger_wiring.pending, measurer.measure_all

        def spy_pending(app: web.Application, sent: Sent, info: Access, status: int, *,
                        bodies: bool = True, principal: str = "") -> Pending:
            self.handed.append(pending(app, sent, info, status, bodies=bodies,
                                       principal=principal))
            forwarded = None if sent.forwarded is sent.raw else sent.forwarded
            self.as_bytes.append(replace(self.handed[-1], raw=sent.raw, forwarded=forwarded,
                                         bodies=None))
            return self.handed[-1]

        def spy_measure_all(batch: list[Pending]) -> list[Record]:
            self.rows.extend(records := measure_all(batch))
            return records

        monkeypatch.setattr(ledger_wiring, "pending", spy_pending)
        measurer.measure_all = spy_measure_all  # type: ignore[method-assign]

    async def old_rows(self) -> list[Record]:
        await self.recorder.join()
        old = reference.Reference(tokens.count)
        return [old.measure(p) for p in self.as_bytes]


async def post(proxy: Running, body: bytes, headers: dict[str, str] | None = None) -> int:
    async with aiohttp.ClientSession() as http, http.post(
        proxy.url + "/v1/responses", data=body,
        headers=headers or {"Content-Type": "application/json"},
    ) as resp:
        await resp.read()
        return resp.status


async def test_rows_of_the_running_proxy_have_the_old_numbers(
    start_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The window cuts from the third turn and masks old outputs; memory and its blocks are on:
    # the forwarded bodies share most, not all, of their items with the client's.
    proxy = await start_proxy(window_policy="fixed", keep_turns=2, trim_slack=0,
                              mask_tool_outputs=True)
    spy = Spy(proxy, monkeypatch)
    rng = random.Random(7)
    context, tool_specs = bench_session.context_items(rng), bench_session.tools()
    for seed in (1, 2, 3):
        thread = Thread(Script.make(seed, 6), seed, context, tool_specs, 0.0)
        for body, headers in thread.requests():
            assert await post(proxy, body, headers) == 200
    await post(proxy, b'{"input": 5}')  # not a Responses request: forwarded as sent

    assert spy.rows == await spy.old_rows()
    assert len(spy.handed) > 20 and not spy.handed[-1].parsed
    parsed = spy.handed[:-1]
    assert all(p.bodies is not None and not p.raw for p in parsed)  # no bytes kept
    # Changed bodies (cut, or with memory blocks) and bodies forwarded as sent (a thread's
    # first turns, before the window cuts: another thread's turns are not recalled) both.
    assert all(p.bodies is not None for p in parsed)
    assert any(p.bodies.forwarded is not None for p in parsed if p.bodies is not None)
    assert any(p.bodies.forwarded is None for p in parsed if p.bodies is not None)
    assert any(r.items_cut for r in spy.rows)  # the comparison covers cut bodies
    assert all(r.direct_input is not None for r in spy.rows[:-1])
    assert any(r.direct_cached for r in spy.rows)  # the direct cache was hit


async def test_a_body_forwarded_as_sent_is_counted_once_with_the_old_numbers(
    start_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy = await start_proxy(memory_enabled=False, chat_memory_asset=False)
    spy = Spy(proxy, monkeypatch)
    for turns in (1, 2):
        assert await post(proxy, orjson.dumps(codex.request(codex.session(turns), "sess-1")),
                          codex.headers("sess-1")) == 200
    assert spy.rows == await spy.old_rows()
    assert [p.bodies.forwarded if p.bodies else "bytes" for p in spy.handed] == [None, None]
    assert all(r.client_tokens == r.forwarded_tokens for r in spy.rows)
