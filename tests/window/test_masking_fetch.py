"""A masked tool output's note carries a curl line; the proxy answers it with the whole output,
for the same session and scope only."""

from __future__ import annotations

import json
import logging
import shlex
import stat
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ctxproxy.proxy.outputs import (
    GONE,
    KEY_FILE,
    PATH,
    SESSION_HEADER,
    MaskedOutputs,
    OutputIds,
    load_key,
)
from ctxproxy.request import Identity
from ctxproxy.window.masking import Output, mask_output, mask_text
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream

BIG = "".join(f"line {n}: some build output worth keeping\n" for n in range(400))
WINDOW = {"window_policy": "fixed", "keep_turns": 2, "trim_slack": 0,
          "mask_tool_outputs": True, "memory_enabled": False}


def session_items() -> list[dict[str, Any]]:
    """Three turns: two with a long tool output, then a prompt. Keeping two turns cuts the
    first and masks the second's output."""
    items = codex.context_items()
    items += codex.tool_turn("turn 1: build it", output=BIG)
    items += codex.tool_turn("turn 2: build it again", output=BIG)
    items.append(codex.text("user", "turn 3: what failed?"))
    return items


async def post(url: str, items: list[dict[str, Any]], session: str, **headers: str) -> None:
    async with aiohttp.ClientSession() as s, s.post(
        url + "/v1/responses", json=codex.request(items, session_id=session),
        headers=codex.headers(session_id=session, **headers),
    ) as r:
        await r.read()
        assert r.status == 200


def masked_outputs(upstream: FakeUpstream) -> list[str]:
    sent = upstream.last.json["input"]
    return [i["output"] for i in sent if i.get("type") == "function_call_output"
            and "ctxproxy removed" in i["output"]]


def fetch_line(masked: str) -> str:
    """The curl line in a mask's note: the line after "run:"."""
    lines = masked.splitlines()
    return lines[next(n for n, line in enumerate(lines) if line.endswith("run:")) + 1]


async def run_curl(line: str, session: str | None = None) -> tuple[int, str, str]:
    """Make the call a curl line describes (its argv as a shell splits it); ``session``
    replaces the line's session header."""
    argv = shlex.split(line)
    assert argv[:3] == ["curl", "-sS", "-H"] and len(argv) == 5
    name, _, value = argv[3].partition(": ")
    assert name == SESSION_HEADER
    headers = {name: value if session is None else session}
    return await get(argv[4], headers)


async def get(url: str, headers: dict[str, str]) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as r:
        return r.status, r.headers.get("content-type", ""), await r.text()


# --- through the real app ----------------------------------------------------------------


async def test_a_masked_output_is_fetched_whole_with_its_curl_line(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(**WINDOW)
    await post(proxy.url, session_items(), "sess-a")

    (masked,) = masked_outputs(upstream)  # turn 1 cut, turn 2 masked, turn 3 the newest
    assert len(masked) < 1500 and masked.startswith(BIG[:400]) and masked.endswith(BIG[-400:])
    line = fetch_line(masked)
    assert f"'{SESSION_HEADER}: sess-a' {proxy.url}{PATH}" in line
    output_id = shlex.split(line)[-1].rsplit("/", 1)[1]
    assert len(output_id) == 26 and output_id.isalnum()  # 128 bits in base32

    status, content_type, text = await run_curl(line)
    assert (status, text) == (200, BIG)
    assert content_type == "text/plain; charset=utf-8"


async def test_another_sessions_header_a_made_up_id_or_no_header_get_404(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(**WINDOW)
    items = session_items()
    await post(proxy.url, items, "sess-a")
    line_a = fetch_line(masked_outputs(upstream)[0])
    # Another session with the very same items (same call ids): its own line, its own id.
    await post(proxy.url, items, "sess-b")
    line_b = fetch_line(masked_outputs(upstream)[0])
    assert shlex.split(line_a)[-1] != shlex.split(line_b)[-1]
    assert (await run_curl(line_b))[::2] == (200, BIG)

    assert await run_curl(line_a, session="sess-b") == (404, "text/plain; charset=utf-8", GONE)
    url_a = shlex.split(line_a)[-1]
    assert (await get(url_a, {}))[::2] == (404, GONE)
    made_up = url_a[:-8] + "aaaaaaaa"
    assert (await get(made_up, {SESSION_HEADER: "sess-a"}))[::2] == (404, GONE)
    assert upstream.last.path.endswith("/responses")  # a fetch never goes upstream


async def test_the_id_depends_on_the_scope(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(**WINDOW)
    items = session_items()
    await post(proxy.url, items, "sess-a", **{"x-team-id": "team-1"})
    line_1 = fetch_line(masked_outputs(upstream)[0])
    await post(proxy.url, items, "sess-a", **{"x-team-id": "team-2"})
    line_2 = fetch_line(masked_outputs(upstream)[0])
    assert line_1 != line_2


async def test_the_line_is_the_same_after_a_restart_and_the_store_answers_it(
    upstream: FakeUpstream, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    first = await start_proxy(**WINDOW)
    items = session_items()
    await post(first.url, items, "sess-a")
    body_before = upstream.last.body
    key = tmp_path / "data" / KEY_FILE
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    await first.close()

    # A new process on the same data dir (and port, as a restart would have it): the output
    # comes from the store before the session sends anything again.
    again = await start_proxy(port=int(first.url.rsplit(":", 1)[1]), **WINDOW)
    line = fetch_line(masked_outputs(upstream)[0])
    assert (await run_curl(line))[::2] == (200, BIG)
    assert (await run_curl(line, session="sess-b"))[::2] == (404, GONE)
    await post(again.url, items, "sess-a")
    assert upstream.last.body == body_before  # the same bytes: the prompt cache holds


async def test_without_the_store_a_restart_forgets_until_the_next_request(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    first = await start_proxy(mask_store_mb=0, **WINDOW)
    items = session_items()
    await post(first.url, items, "sess-a")
    await first.close()
    again = await start_proxy(port=int(first.url.rsplit(":", 1)[1]), mask_store_mb=0, **WINDOW)
    line = fetch_line(masked_outputs(upstream)[0])
    assert (await run_curl(line))[::2] == (404, GONE)  # not held here yet: rerun the command
    await post(again.url, items, "sess-a")
    assert (await run_curl(line))[::2] == (200, BIG)


async def test_the_fetch_route_needs_no_client_key_but_the_rest_still_does(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(client_keys="ck-alpha", upstream_api_key="sk-real", **WINDOW)
    await post(proxy.url, session_items(), "sess-a", Authorization="Bearer ck-alpha")
    line = fetch_line(masked_outputs(upstream)[0])
    # The model's shell has no client key: the id and the session are the credential.
    assert (await run_curl(line))[::2] == (200, BIG)
    assert (await run_curl(line, session="sess-b"))[::2] == (404, GONE)
    received = len(upstream.received)
    url = shlex.split(line)[-1]
    for path in (url + "/extra", url.rsplit("/", 1)[0] + "/", proxy.url + "/v1/models"):
        assert (await get(path, {SESSION_HEADER: "sess-a"}))[0] == 401
    assert len(upstream.received) == received


async def test_the_access_log_leaves_the_id_out(
    upstream: FakeUpstream, start_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = await start_proxy(**WINDOW)
    await post(proxy.url, session_items(), "sess-a")
    line = fetch_line(masked_outputs(upstream)[0])
    output_id = shlex.split(line)[-1].rsplit("/", 1)[1]
    with caplog.at_level(logging.INFO):
        assert (await run_curl(line))[0] == 200
    entries = [r.fields for r in caplog.records if r.name == "ctxproxy.access"]  # type: ignore[attr-defined]
    assert [(e["route"], e["status"]) for e in entries] == [("outputs", 200)]
    assert output_id not in json.dumps(entries)


async def test_without_a_fetch_budget_the_note_has_no_line(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(mask_fetch_mb=0, **WINDOW)
    await post(proxy.url, session_items(), "sess-a")
    (masked,) = masked_outputs(upstream)
    assert "curl" not in masked and "ctxproxy removed" in masked


# --- the pure parts --------------------------------------------------------------------------


def test_the_note_holds_the_line_and_is_a_function_of_its_inputs() -> None:
    line = "curl -sS -H 'x-ctxproxy-session: s' http://127.0.0.1:8787/ctxproxy/outputs/abc"
    masked = mask_text(BIG, 600, line)
    assert masked == mask_text(BIG, 600, line) and fetch_line(masked) == line
    assert masked.startswith(BIG[:300]) and masked.endswith(BIG[-300:])
    # An output the longer note would not make shorter stays whole.
    assert mask_text(BIG[:700], 600, line) == BIG[:700]
    assert "ctxproxy removed" in mask_text(BIG[:700], 600)


def test_the_pointer_is_asked_only_for_outputs_long_enough_to_mask() -> None:
    asked: list[tuple[int, str]] = []

    def pointer(place: int, item: dict[str, Any]) -> str:
        asked.append((place, item["call_id"]))
        return "curl -sS x"

    short = {"type": "function_call_output", "call_id": "c1", "output": "ok\n"}
    assert mask_output(short, 600, pointer) is short and asked == []
    parts = {"type": "custom_tool_call_output", "call_id": "c2",
             "output": [{"type": "input_text", "text": BIG}, {"type": "input_image"}]}
    masked = mask_output(parts, 600, pointer, 7)
    assert asked == [(7, "c2")] and "curl -sS x" in masked["output"][0]["text"]
    assert masked["output"][1] == {"type": "input_image"}


def test_the_key_is_made_once_and_kept(tmp_path: Path) -> None:
    key = load_key(tmp_path / "d")
    assert len(key) == 32 and load_key(tmp_path / "d") == key
    assert stat.S_IMODE((tmp_path / "d" / KEY_FILE).stat().st_mode) == 0o600
    assert [p.name for p in (tmp_path / "d").iterdir()] == [KEY_FILE]  # no temporary left


def test_the_store_keeps_to_its_budget_least_recently_used_out_first() -> None:
    who = Identity("team-1", "coder", "uk-1", "sess-a")
    outputs = MaskedOutputs(OutputIds(b"k" * 32, "default"), "http://127.0.0.1:8787", 12_000)
    ids = {}
    for place, call in enumerate(("c1", "c2", "c3")):
        output = Output(place, call, call)
        outputs.keep(who, output, call * 2500)  # ~5 KB each: two fit
        ids[call] = (outputs.fetch_command(who, output) or "").rsplit("/", 1)[1]
    assert outputs.get(ids["c1"], "sess-a") is None
    assert outputs.get(ids["c3"], "sess-a") == "c3" * 2500
    assert outputs.get(ids["c3"], "sess-b") is None
    outputs.keep(who, Output(3, "c4", "c4"), "x" * 100_000)  # over the budget: not kept
    assert outputs.get(ids["c3"], "sess-a") is not None
    # No usable session, no line and nothing kept.
    c1 = Output(0, "c1", "c1")
    assert outputs.fetch_command(Identity("t", "a", None, None), c1) is None
    assert outputs.fetch_command(Identity("t", "a", None, "two words"), c1) is None
