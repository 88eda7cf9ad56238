"""A Codex-like client for the memory tests: replays a growing session through the proxy."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ctxproxy.proxy.memory_wiring import MEMORY, Runtime
from ctxproxy.proxy.sse import parse_events
from tests.fakes import codex
from tests.fakes.server import Running
from tests.fakes.upstream import FakeUpstream

Item = dict[str, Any]


async def post(url: str, body: dict[str, Any], headers: dict[str, str]) -> int:
    return (await exchange(url, body, headers))[0]


async def exchange(
    url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[int, list[Item]]:
    """POST a request; its status and the output items of the answer's completed event."""
    async with aiohttp.ClientSession() as s, s.post(
        url + "/v1/responses", data=json.dumps(body), headers=headers
    ) as r:
        raw = await r.read()
    for event in parse_events(raw):
        data = event["data"]
        if isinstance(data, dict) and data.get("type") == "response.completed":
            return r.status, list(data["response"]["output"])
    return r.status, []


def runtime(proxy: Running) -> Runtime:
    return proxy.app[MEMORY]


async def settle(proxy: Running) -> None:
    """Wait for the queued memory writes, then distil what they brought."""
    rt = runtime(proxy)
    await rt.queue.join()
    await rt.distiller.run_once()


async def said_in_sessions(
    proxy: Running, upstream: FakeUpstream, prompts: list[str], sessions: int = 2
) -> None:
    """The prompts said in each of ``sessions`` sessions (a claim distillation keeps needs two),
    then distilled."""
    for n in range(1, sessions + 1):
        s = Session(proxy, upstream, session_id=f"earlier-{n}")
        for prompt in prompts:
            await s.say(prompt)
    await settle(proxy)


@dataclass
class Session:
    """One Codex thread: every request resends the whole history, as Codex does."""

    proxy: Running
    upstream: FakeUpstream
    session_id: str = "sess-1"
    headers: dict[str, str] = field(default_factory=dict)
    items: list[Item] = field(default_factory=codex.context_items)
    turns: int = 0
    answer: list[Item] = field(default_factory=list)  # the last answer relayed to it

    async def send(self) -> dict[str, Any]:
        hdrs = codex.headers(session_id=self.session_id, turn_id=f"{self.session_id}-t{self.turns}",
                             **self.headers)
        status, self.answer = await exchange(
            self.proxy.url, codex.request(self.items, self.session_id), hdrs
        )
        assert status == 200
        return dict(self.upstream.last.json)

    async def say(self, prompt: str) -> dict[str, Any]:
        """A new user turn: the prompt goes out; the answer relayed is added to the history,
        as Codex resends it (ids included)."""
        self.turns += 1
        self.items = [*self.items, codex.text("user", prompt)]
        sent = await self.send()
        self.items = [*self.items, *self.answer]
        return sent

    async def say_with_tool(self, prompt: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """A turn with one tool call: two requests with the same turn id."""
        self.turns += 1
        turn = codex.tool_turn(prompt)
        user, rest, answer = turn[0], turn[1:-1], turn[-1]
        self.items = [*self.items, user]
        first = await self.send()
        self.items = [*self.items, *rest]
        second = await self.send()
        self.items = [*self.items, answer]
        return first, second


def user_texts(body: dict[str, Any]) -> list[str]:
    return [codex_text(i) for i in body["input"] if i.get("role") == "user"]


def codex_text(item: Item) -> str:
    return "\n".join(p.get("text", "") for p in item.get("content", []))


def developer_memory(body: dict[str, Any]) -> list[tuple[int, str]]:
    """(position, text) of the recall messages: the developer messages holding recalled
    memory, the standing block left out."""
    standing = _standing_at(body)
    return [
        (n, codex_text(i)) for n, i in enumerate(body["input"])
        if n != standing and i.get("role") == "developer" and "_memory" in codex_text(i)
        and not codex_text(i).startswith("<earlier_turns")  # the digest may name a block
    ]


def standing_memory(body: dict[str, Any]) -> str:
    """The standing block (working and semantic memory), "" when there is none: a developer
    message right after the context (and the cut turns' digest), before the first turn."""
    at = _standing_at(body)
    return "" if at is None else codex_text(body["input"][at])


def _standing_at(body: dict[str, Any]) -> int | None:
    items = body["input"]
    at = len(codex.context_items())
    if at < len(items) and codex_text(items[at]).startswith("<earlier_turns"):
        at += 1
    if at >= len(items) or items[at].get("role") != "developer":
        return None
    text = codex_text(items[at])
    slow = "<working_memory" in text or "<semantic_memory" in text
    return at if slow and "<episodic_memory" not in text else None


def memory_text(body: dict[str, Any]) -> str:
    """Everything the proxy injected: instructions, the standing block, recall messages, the
    cut turns' digest."""
    parts = [body.get("instructions") or "", standing_memory(body)]
    parts += [text for _, text in developer_memory(body)]
    parts += [codex_text(i) for i in body["input"] if i.get("role") == "developer"
              and codex_text(i).startswith("<earlier_turns")]
    return "\n".join(parts)
