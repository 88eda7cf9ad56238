"""bench/load.py's client: the Codex threads its virtual users send (the bench's own turns or
the shared folder's agent runs), the answers the fake upstream streams for them, and the users
themselves."""

from __future__ import annotations

import asyncio
import collections
import functools
import random
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from bench.harness import session as bench_session
from bench.harness.agent_runs import Task, load_tasks, task_items
from bench.harness.upstream import ANSWER_HEADER, answer_events, item_events

TEAM = "team-load"
AGENTS = ("agent-a", "agent-b", "agent-c", "agent-d")
REQUEST_TIMEOUT_S = 60.0
ANSWER_EVENTS = 70  # the fake upstream's events per answer (bench/harness/upstream.py)
Item = dict[str, Any]


# --- what the client sends ---------------------------------------------------------------------


@dataclass(frozen=True)
class Script:
    """One Codex thread's turns: the items each turn adds to the history, in order."""

    turns: tuple[tuple[Item, ...], ...]
    seed: int = 0
    shape: str = "chat"

    @staticmethod
    @functools.cache
    def make(seed: int, turns: int, shape: str = "chat") -> Script:
        """Thread script ``seed``: of the bench's own turns, or (``agent``) of ``turns``
        real agent runs in a row, a task each (script ``seed`` takes the runs from
        ``seed * turns`` on, in name order)."""
        if shape == "agent":
            tasks = agent_tasks()
            picked = [tasks[(seed * turns + j) % len(tasks)] for j in range(turns)]
            return Script(tuple(tuple(task_items(t, j)) for j, t in enumerate(picked)), seed,
                          shape)
        rng = random.Random(seed)
        return Script(tuple(tuple(bench_session.turn(rng, n)) for n in range(1, turns + 1)), seed)


@functools.cache
def agent_tasks() -> list[Task]:
    """The runs of ../shared/trajectories, by name."""
    return load_tasks()


def _is_output(item: Item) -> bool:
    return str(item.get("type", "")).endswith("call_output")


def request_ends(turn: Sequence[Item], answers: str = "script") -> list[int]:
    """Where each request of a turn ends its history: after the prompt, then after each batch
    of tool outputs (Codex asks the model again once it has run the calls). ``fixed``
    answers: after the prompt and the first batch only (the bench before the upstream
    answered with the script's items)."""
    ends = [1]
    for n in range(1, len(turn)):
        if _is_output(turn[n - 1]) and not _is_output(turn[n]):
            ends.append(n)
    if _is_output(turn[-1]):
        ends.append(len(turn))
    return ends[:2] if answers == "fixed" else ends


def answer_items(turn: Sequence[Item], end: int) -> list[Item]:
    """What the model answers the request whose history ends at ``end`` of the turn: its
    items up to the next batch of tool outputs (the calls the client runs), else to the end
    of the turn (the final answer)."""
    stop = next((n for n in range(end, len(turn)) if _is_output(turn[n])), len(turn))
    return list(turn[end:stop])


def answer_key(script: Script, turn: int, step: int) -> str:
    """The x-bench-answer header: which answer the fake upstream streams."""
    return f"{script.shape}:{script.seed}:{len(script.turns)}:{turn}:{step}"


def answer_streams(scripts: Sequence[Script]) -> dict[str, list[bytes]]:
    """Every answer of ``scripts``, by key, as its events: made before anything is timed."""
    return {key: answer_events_of(key) for script in scripts
            for n, turn in enumerate(script.turns)
            for key in (answer_key(script, n, step) for step in range(len(request_ends(turn))))}


@functools.lru_cache(maxsize=4096)
def answer_events_of(key: str) -> list[bytes]:
    """The SSE events of the answer ``key`` names, one write each (bench/harness/upstream.py)."""
    shape, *numbers = key.split(":")
    seed, turns, turn, step = (int(part) for part in numbers)
    items = Script.make(seed, turns, shape).turns[turn]
    return item_events(answer_items(items, request_ends(items)[step]), ANSWER_EVENTS)


@functools.lru_cache(maxsize=4096)
def answer_stream(key: str) -> bytes:
    """The bytes a client receives for the answer ``key`` names."""
    return b"".join(answer_events_of(key))


@dataclass
class Thread:
    """A Codex thread in progress: its ids and the requests of each turn."""

    script: Script
    user: int
    context: list[Item]
    tools: list[Item]
    pace_ms: float
    jitter: float = 0.0  # each answer's pace is pace_ms times 1 +- up to this
    first_byte_ms: float = 0.0  # how long the upstream thinks before its first byte
    rng: random.Random = field(default_factory=random.Random)
    session_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    # script: the upstream answers each request with the script's own next items, which the
    # client sends back as they came (as Codex does); fixed: one canned answer for every
    # request, and two requests a turn at most (the bench until 2026-12-01).
    answers: str = "script"

    def requests(self, first_turn: int = 0) -> Iterator[tuple[bytes, dict[str, str]]]:
        """Its requests in order, from ``first_turn`` on (a thread already under way)."""
        done: list[Item] = [item for turn in self.script.turns[:first_turn] for item in turn]
        for n, turn in enumerate(self.script.turns[first_turn:], start=first_turn):
            turn_id = f"{self.session_id[:8]}-turn-{n}"
            for step, end in enumerate(request_ends(turn, self.answers)):
                headers = self._headers(turn_id)
                if self.answers == "script":
                    headers[ANSWER_HEADER] = answer_key(self.script, n, step)
                yield self._body([*self.context, *done, *turn[:end]], turn_id), headers
            done += turn

    def _meta(self, turn_id: str) -> str:
        return orjson.dumps({"session_id": self.session_id, "turn_id": turn_id,
                             "request_kind": "turn",
                             "window_id": f"{self.session_id}:0"}).decode()

    def _body(self, items: list[Item], turn_id: str) -> bytes:
        sid = self.session_id
        return orjson.dumps({
            "model": "gpt-5.5", "stream": True, "input": items, "tools": self.tools,
            "tool_choice": "auto", "parallel_tool_calls": True,
            "reasoning": {"summary": "auto"}, "store": False,
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": sid,
            "client_metadata": {"x-codex-turn-metadata": self._meta(turn_id), "session_id": sid},
        })

    def _headers(self, turn_id: str) -> dict[str, str]:
        sid = self.session_id
        agent = AGENTS[self.user % len(AGENTS)]
        return {
            **bench_session.headers(),
            "x-codex-window-id": f"{sid}:0", "x-codex-turn-metadata": self._meta(turn_id),
            "x-client-request-id": sid, "session-id": sid, "thread-id": sid,
            "x-team-id": TEAM, "x-agent-id": agent, "x-tdai-user-key": f"key-{agent}",
            "x-bench-pace-ms": str(self.pace_ms * self.rng.uniform(1 - self.jitter,
                                                                    1 + self.jitter)),
            "x-bench-first-byte-ms": str(self.first_byte_ms),
        }


# --- the client ----------------------------------------------------------------------------------


@dataclass
class Run:
    """What one phase measured."""

    seconds: float = 0.0
    ttfb: list[float] = field(default_factory=list)  # seconds, per successful request
    started: list[float] = field(default_factory=list)  # when each of them began (perf_counter)
    began: float = 0.0  # when the phase began (perf_counter)
    total: list[float] = field(default_factory=list)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    first_errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> int:
        return len(self.total)

    def error(self, kind: str, detail: str) -> None:
        self.errors[kind] += 1
        if len(self.first_errors) < 5:
            self.first_errors.append(f"{kind}: {detail}"[:300])


async def one(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str],
              expected: bytes, run: Run) -> None:
    began = time.perf_counter()
    first = 0.0
    received = bytearray()
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            async for chunk in resp.content.iter_any():
                if not first:
                    first = time.perf_counter()
                received += chunk
            status = resp.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        run.error(type(exc).__name__, str(exc))
        return
    end = time.perf_counter()
    if status != 200:
        run.error(f"status {status}", bytes(received[:200]).decode(errors="replace"))
    elif received != expected:
        run.error("not the upstream's stream", f"{len(received)} bytes")
    else:
        run.ttfb.append(first - began)
        run.total.append(end - began)
        run.started.append(began)


async def drive(url: str | Sequence[str], users: int, seconds: float, scripts: Sequence[Script],
                pace_ms: float, seed: int, *, jitter: float = 0.0, warmup: float = 0.0,
                measuring: Callable[[], None] = lambda: None,
                answers: str = "script", first_byte_ms: float = 0.0) -> tuple[Run, Run]:
    """``users`` virtual users running threads back to back for ``warmup`` + ``seconds``; a
    request started in time is finished and counted: in the first Run when it started in
    the warm-up, else in the second. The same users go on from the warm-up into the
    measurement (``measuring`` is called between the two), so what is measured is a steady
    state, not every session arriving at once. With several ``url``s (replicas), each
    request of a user goes to the next one in turn, as a load balancer without affinity
    sends them."""
    urls = [url] if isinstance(url, str) else list(url)
    warm, run = Run(), Run()
    fixed = b"".join(answer_events())
    rng = random.Random(seed)
    context = bench_session.context_items(random.Random(seed))
    tools = bench_session.tools()
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    began = time.perf_counter()
    measure_at = began + warmup
    stop_at = measure_at + seconds
    warm.began, run.began = began, measure_at

    async def user(n: int) -> None:
        # Spread the users' first requests over one answer's time, and start each in the
        # middle of a thread: threads end at different times from then on.
        await asyncio.sleep(n / users * ANSWER_EVENTS * pace_ms / 1000)
        first_turn = rng.randrange(len(scripts[0].turns))
        # Each user its own connections, as each Codex process has: a session's requests
        # come over its own keep-alive connection (and so, with SO_REUSEPORT, to one worker).
        sent = n  # users start on different replicas
        async with aiohttp.ClientSession(timeout=timeout) as client:
            while time.perf_counter() < stop_at:
                thread = Thread(rng.choice(scripts), n, context, tools, pace_ms, jitter,
                                first_byte_ms, rng, answers=answers)
                for body, headers in thread.requests(first_turn):
                    now = time.perf_counter()
                    if now >= stop_at:
                        return
                    key = headers.get(ANSWER_HEADER)
                    expected = fixed if key is None else answer_stream(key)
                    await one(client, urls[sent % len(urls)], body, headers, expected,
                              run if now >= measure_at else warm)
                    sent += 1
                first_turn = 0

    async def switch() -> None:
        await asyncio.sleep(warmup)
        await asyncio.to_thread(measuring)  # it may scrape the proxy: not on this loop

    await asyncio.gather(switch(), *(user(n) for n in range(users)))
    warm.seconds = min(warmup, time.perf_counter() - began)
    run.seconds = time.perf_counter() - measure_at
    return warm, run
