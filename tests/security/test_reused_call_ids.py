"""A client that numbers its tool calls per response (``call_1``, ``call_2`` in every turn, and
``call_1`` again in a turn's next model call) gets each output linked to its own call: the
window forwards no item of a turn it cut, each masked output's fetch line fetches that output's
own text, and each stored episode shows a call with its own output (issue 43)."""

from __future__ import annotations

import io
import json
import shlex
from typing import Any

import aiohttp
import pytest

from ctxproxy.memory.model import Memory
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream
from tests.memory.conftest import Backend, backend, pg_url
from tests.memory.session import runtime, settle
from tests.window.test_masking_fetch import fetch_line, run_curl

__all__ = ["backend", "pg_url"]  # fixtures, for both stores

Item = dict[str, Any]
SESSION = "sess-reuse"
MIB = 1024 * 1024  # window.step.OFF_LOOP_BYTES: a larger body is masked in a thread
CONTEXT = len(codex.context_items())
# Keeping three turns of six cuts the first three and masks the fourth's and fifth's outputs.
WINDOW = {"window_policy": "fixed", "keep_turns": 3, "trim_slack": 0,
          "mask_tool_outputs": True, "memory_enabled": False}
CALLS = (("call_1", "a"), ("call_2", "b"))  # the first model call's, run in parallel
AGAIN = ("call_1", "c")  # the turn's second model call numbers its call from 1 again


def output(cmd: str, lines: int = 100) -> str:
    """A command's output, long enough to mask, every line naming the command."""
    return "".join(f"{cmd} says line {j:03}\n" for j in range(lines))


def call(call_id: str, cmd: str) -> Item:
    return {"type": "function_call", "name": "exec_command", "call_id": call_id,
            "arguments": json.dumps({"cmd": cmd})}


def result(call_id: str, cmd: str, lines: int = 100) -> Item:
    return {"type": "function_call_output", "call_id": call_id, "output": output(cmd, lines)}


def turn(n: int, lines: int = 100) -> list[Item]:
    """Turn ``n``: two parallel calls, their outputs, a third call reusing ``call_1``, its
    output and the answer."""
    first = [(call_id, f"t{n} {tag}") for call_id, tag in CALLS]
    again = (AGAIN[0], f"t{n} {AGAIN[1]}")
    return [codex.text("user", f"turn {n}: check the build"),
            *(call(*c) for c in first), *(result(*c, lines) for c in first),
            call(*again), result(*again, lines), codex.text("assistant", f"turn {n} is done")]


def session(complete: int, lines: int = 100) -> list[Item]:
    """The context, ``complete`` answered turns, then the next turn's prompt."""
    items = codex.context_items()
    for n in range(1, complete + 1):
        items += turn(n, lines)
    return [*items, codex.text("user", f"turn {complete + 1}: and now?")]


async def post(url: str, items: list[Item]) -> None:
    body = json.dumps(codex.request(items, session_id=SESSION)).encode()
    async with aiohttp.ClientSession() as s, s.post(
        url + "/v1/responses", data=io.BytesIO(body), headers=codex.headers(session_id=SESSION),
    ) as r:
        await r.read()
        assert r.status == 200


def is_digest(item: Item) -> bool:
    """The ``<earlier_turns>`` message the window puts in for the turns it cut."""
    return item.get("role") == "developer" and item["content"][0]["text"].startswith(
        "<earlier_turns")


def without_outputs(items: list[Item]) -> list[Item]:
    """The items with each output's text left out (masking shortens it)."""
    return [{k: v for k, v in i.items() if k != "output"} for i in items]


def cmd_of(item: Item) -> str:
    return str(json.loads(item["arguments"])["cmd"])


def answers(items: list[Item]) -> list[tuple[str, str]]:
    """Each call's command and the output the model reads for it: the first after it with
    its call_id."""
    return [(cmd_of(item), next(o["output"] for o in items[at:]
                                if o.get("type") == "function_call_output"
                                and o["call_id"] == item["call_id"]))
            for at, item in enumerate(items) if item.get("type") == "function_call"]


def fetch_id(masked: str) -> str:
    return shlex.split(fetch_line(masked))[-1].rsplit("/", 1)[1]


async def test_the_window_forwards_each_kept_call_with_its_own_output_and_no_cut_turn(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(**WINDOW)
    items = session(5)
    await post(proxy.url, items)

    sent = [i for i in upstream.last.json["input"] if not is_digest(i)]
    kept = [*items[:CONTEXT], *items[CONTEXT + 3 * len(turn(1)):]]  # turns 4, 5 and 6
    assert without_outputs(sent) == without_outputs(kept)
    pairs = answers(sent)
    assert [cmd for cmd, _ in pairs] == [f"t{n} {tag}" for n in (4, 5) for tag in "abc"]
    for cmd, text in pairs:
        assert text.startswith(f"{cmd} says line 000\n"), cmd


# Outputs of a few KB, and of enough to make the body one that is masked in a thread.
@pytest.mark.parametrize("lines", [100, 4000], ids=["small body", "large body"])
async def test_each_masked_output_fetches_its_own_text_with_an_id_of_its_own(
    upstream: FakeUpstream, start_proxy: ProxyFactory, lines: int
) -> None:
    proxy = await start_proxy(**WINDOW)
    items = session(5, lines)
    await post(proxy.url, items)
    assert (len(json.dumps(codex.request(items))) > MIB) is (lines > 100)
    sent = upstream.last.json["input"]

    masked = dict(answers(sent))
    # Turns 4 and 5 masked, three outputs each, two of them answering a call_1.
    assert sorted(masked) == [f"t{n} {tag}" for n in (4, 5) for tag in "abc"]
    assert all("ctxproxy removed" in text for text in masked.values())
    assert len({fetch_id(text) for text in masked.values()}) == len(masked)
    for cmd, text in masked.items():
        status, _, whole = await run_curl(fetch_line(text))
        assert (status, whole) == (200, output(cmd, lines)), cmd

    # The next request of the newest turn: the same cut, so the same bytes before it.
    progressed = [*items, call("call_1", "t6 a"), result("call_1", "t6 a", lines)]
    await post(proxy.url, progressed)
    assert upstream.last.json["input"][: len(sent)] == sent


async def test_each_stored_episode_shows_a_call_with_its_own_output(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(team_id="team-1", **backend.settings)
    await post(proxy.url, session(3))
    await settle(proxy)
    stored: list[Memory] = await runtime(proxy).store.list(
        None, types=["episodic"], session_id=SESSION, limit=100)

    tool_turns = sorted((m for m in stored if "Tool call" in m.text),
                        key=lambda m: m.turn_index or 0)
    assert [m.turn_index for m in tool_turns] == [0, 1, 2]
    for episode in tool_turns:
        lines = episode.text.splitlines()
        heads = [n for n, line in enumerate(lines) if line.startswith("Tool call exec_command: ")]
        assert len(heads) == 3
        for n in heads:
            cmd = json.loads(lines[n].split(": ", 1)[1])["cmd"]
            assert lines[n + 1] == f"Tool output exec_command: {cmd} says line 000", episode.text
        assert not any(line.startswith("Tool output tool") for line in lines)
