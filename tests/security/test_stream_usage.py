"""Issue 43, class 9: the usage read from an upstream stream costs time linear in the stream,
however large one event is or however it is chunked, and holds a bounded part of it; the
client gets every byte all the same, and the usage of a normal ``response.completed`` after
an oversized event is still read."""

from __future__ import annotations

import logging
from collections.abc import Callable

import aiohttp
import orjson
import pytest

from ctxproxy.proxy.ledger_wiring import LEDGER
from ctxproxy.proxy.sse import MAX_EVENT, UsageTap
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream, message_item, stream_events
from tests.memory.conftest import Backend, backend, pg_url
from tests.memory.test_linear_time import assert_linear

__all__ = ["backend", "pg_url"]

USAGE = {"input_tokens": 4321, "cached_tokens": 0, "output_tokens": 10}
# What a model may well write about this API: a delta that names the completed event.
QUOTED = b"the stream ends with a response.completed event; "


def answer() -> list[bytes]:
    """A normal answer, its usage USAGE."""
    return stream_events([message_item("after the big one")], USAGE["input_tokens"])


def huge_event(size: int, text: bytes = b"") -> bytes:
    """One event of ``size`` bytes, its delta ``text`` then x, no blank line until its end."""
    head = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",' \
           b'"delta":"' + text
    return head + b"x" * (size - len(head) - 4) + b'"}\n\n'


def in_chunks(data: bytes, size: int) -> list[bytes]:
    return [data[at : at + size] for at in range(0, len(data), size)]


def crlf_events(size: int) -> bytes:
    """Many small events, their lines ended by CRLF."""
    one = b'event: response.output_text.delta\r\ndata: {"delta":"word "}\r\n\r\n'
    return one * (size // len(one))


# Each shape as chunks of a stream, a normal answer after it.
SHAPES: dict[str, Callable[[int], list[bytes]]] = {
    "one event under the bound": lambda n: in_chunks(huge_event(n) + b"".join(answer()), 4096),
    "one event over the bound": lambda n: in_chunks(huge_event(n) + b"".join(answer()), 65536),
    "crlf events": lambda n: in_chunks(crlf_events(n) + b"".join(answer()), 4096),
}
SIZES = {
    "one event under the bound": (MAX_EVENT // 20, MAX_EVENT // 2),
    "one event over the bound": (MAX_EVENT // 4, MAX_EVENT * 5 // 2),
    "crlf events": (MAX_EVENT // 20, MAX_EVENT // 2),
}


def read(chunks: list[bytes]) -> dict[str, int] | None:
    tap = UsageTap()
    for chunk in chunks:
        tap.feed(chunk)
    return tap.usage()


@pytest.mark.parametrize("shape", SHAPES)
def test_reading_usage_is_linear_in_the_stream(shape: str) -> None:
    small, big = SIZES[shape]
    assert read(SHAPES[shape](big)) == USAGE
    assert_linear(read, SHAPES[shape], (small, big))


@pytest.mark.parametrize("crlf", [False, True], ids=["lf", "crlf"])
@pytest.mark.parametrize("cut", [1, 2, 3, 4096])
def test_an_oversized_event_is_dropped_up_to_its_end_however_chunked(
    cut: int, crlf: bool
) -> None:
    # Cut ``cut`` bytes before the oversized event's end: within its blank line, or before.
    huge, rest = huge_event(MAX_EVENT + 8192, QUOTED), b"".join(answer())
    if crlf:
        huge, rest = huge.replace(b"\n", b"\r\n"), rest.replace(b"\n", b"\r\n")
    tap = UsageTap()
    for chunk in [*in_chunks(huge[:-cut], 65536), huge[-cut:] + rest]:
        tap.feed(chunk)
    assert tap.usage() == USAGE
    assert tap.skipped == 1
    assert 0 < tap.size < len(rest)  # the completed event only


async def test_an_oversized_event_is_relayed_whole_and_the_usage_after_it_recorded(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, "ctxproxy")
    sent = [*answer()[:2], *in_chunks(huge_event(MAX_EVENT + 2 * 1024 * 1024, QUOTED), 65536),
            *answer()[2:]]
    upstream.then_raw_sse(sent)
    proxy = await start_proxy(**backend.settings)
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.url + "/v1/responses",
                             data=orjson.dumps(codex.request(codex.session(2))),
                             headers=codex.headers()) as resp:
            got = await resp.read()
        async with http.get(proxy.url + "/metrics") as resp:
            metrics = await resp.text()
    assert got == b"".join(sent)
    side = proxy.app[LEDGER]
    assert side.recorder is not None and side.ledger is not None
    await side.recorder.join()
    [row] = await side.ledger.timeline("sess-1")
    assert (row.input_tokens, row.cached_tokens, row.output_tokens) == (4321, 0, 10)
    assert "ctxproxy_stream_events_unread_total 1.0" in metrics
    assert any("too large to read for usage" in r.getMessage() for r in caplog.records)
