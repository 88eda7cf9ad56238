"""`ctxproxy memory forget` sticks: a forgotten turn is not written back when its in-window
flag changes, after a restart, or by distillation; ``--purge`` rewrites what quoted it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ctxproxy.memory.model import Memory, Scope
from tests.conftest import ProxyFactory
from tests.fakes.upstream import FakeUpstream
from tests.knowledge.wikis import ctxproxy
from tests.memory.conftest import Backend
from tests.memory.session import (
    Session,
    codex_text,
    developer_memory,
    runtime,
    settle,
    standing_memory,
)

SECRET = "zq7vaultcode"
WHO = {"x-team-id": "team-a", "x-agent-id": "coder"}
SCOPE_ARGS = ("--team", "team-a", "--agent", "coder", "--user", "")


async def cli(capsys: pytest.CaptureFixture[str], backend: Backend, *argv: str
              ) -> tuple[int, str, str]:
    """``ctxproxy memory ARGV`` against the backend the proxy uses (in a thread: it runs its
    own event loop)."""
    settings = dict(backend.settings)
    data_dir = Path(settings.pop("data_dir"))
    return await asyncio.to_thread(ctxproxy, capsys, data_dir, "memory", *argv, **settings)


async def holding(proxy: Any, text: str) -> list[Memory]:
    return [m for m in await runtime(proxy).store.list(None, limit=10_000, now=0)
            if text in m.text or text in str(m.attrs)]


async def test_a_forgotten_turn_stays_forgotten_across_reingest_and_restart(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = {**backend.settings, "keep_turns": 3, "trim_slack": 0}
    proxy = await start_proxy(**settings)
    s = Session(proxy, upstream, session_id="forget-me", headers=WHO)
    await s.say(f"The staging vault code is {SECRET}, remember it.")
    await s.say("turn 2: please do step 2")
    await s.say("turn 3: please do step 3")
    await settle(proxy)
    assert await holding(proxy, SECRET)  # the turn (and the task) were stored

    code, out, err = await cli(capsys, backend, "forget", "--search", SECRET, *SCOPE_ARGS)
    assert code == 0, err
    assert out.count("forgot mem_") >= 1
    assert await holding(proxy, SECRET) == []

    # The turn leaves the window: ingest writes its record again with in_window flipped.
    for n in range(4, 8):
        await s.say(f"turn {n}: please do step {n}")
    await settle(proxy)
    assert await holding(proxy, SECRET) == []

    # A restart: the new process has no cache of what is stored and asks the store.
    await proxy.close()
    proxy = await start_proxy(**settings)
    s.proxy = proxy
    sent = await s.say("What is the staging vault code?")
    await settle(proxy)
    assert await holding(proxy, SECRET) == []
    # Nothing recalled holds it. The cut turns' digest may: it maps this request's own input,
    # which the client still sends (forgetting erases what the proxy keeps, not the client's
    # history).
    recalled = "\n".join([sent.get("instructions") or "", standing_memory(sent),
                          *(text for _, text in developer_memory(sent))])
    assert SECRET not in recalled
    assert any(SECRET in codex_text(i) for i in s.items if i.get("role") == "user")


async def test_forget_purge_rewrites_the_records_that_quote_it(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = {**backend.settings, "keep_turns": 1, "trim_slack": 0}
    proxy = await start_proxy(**settings)
    first = Session(proxy, upstream, session_id="one", headers=WHO)
    await first.say(f"Deploy with the token {SECRET} on staging.")
    await first.say("turn 2: please do step 2")
    other = Session(proxy, upstream, session_id="two", headers=WHO)
    await other.say(f"Deploy with the token {SECRET} on staging.\nThen run the smoke tests.")
    await other.say("turn 2: please do step 2")
    await settle(proxy)
    (episode,) = [m for m in await holding(proxy, SECRET)
                  if m.type == "episodic" and m.session_id == "one"]

    code, out, err = await cli(capsys, backend, "forget", "--purge", episode.memory_id)
    assert code == 0, err
    assert f"forgot {episode.memory_id}" in out and "purged mem_" in out
    left = await holding(proxy, SECRET)
    assert left == [], [m.text for m in left]
    kept = [m for m in await runtime(proxy).store.list(Scope("default", "team-a", "coder", ""),
                                                         types=["episodic"], now=0)
            if m.session_id == "two" and m.turn_index == 0]
    assert kept and "Then run the smoke tests." in kept[0].text
    assert "[FORGOTTEN]" in kept[0].text

    # The other session resends its history: the purged episode keeps its purged text.
    await other.say("turn 3: please do step 3")
    await settle(proxy)
    assert await holding(proxy, SECRET) == []


async def test_forget_by_session_forgets_each_of_its_records(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    proxy = await start_proxy(**backend.settings, keep_turns=1, trim_slack=0)
    s = Session(proxy, upstream, session_id="gone-session", headers=WHO)
    for n in range(1, 4):
        await s.say(f"turn {n}: step {n} of the gone-session work")
    await settle(proxy)
    store = runtime(proxy).store
    assert await store.list(None, session_id="gone-session", now=0)

    code, _, err = await cli(capsys, backend, "forget", "--session", "gone-session")
    assert code == 0, err
    assert await store.list(None, session_id="gone-session", now=0) == []
    await s.say("turn 4: step 4")
    await settle(proxy)
    # Only the turn after the forgetting is remembered.
    assert [m.turn_index for m in await store.list(None, types=["episodic"],
                                                    session_id="gone-session", now=0)] == [3]


async def test_a_forgotten_distilled_memory_is_not_distilled_again(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    proxy = await start_proxy(**backend.settings, keep_turns=1, trim_slack=0,
                              semantic_threshold=0.0)
    for n in (1, 2):
        s = Session(proxy, upstream, session_id=f"pref-{n}", headers=WHO)
        await s.say("Always use pnpm, not npm, for the frontend.")
        await s.say("turn 2: please do step 2")
    await settle(proxy)
    store = runtime(proxy).store
    (fact,) = [m for m in await store.list(None, types=["semantic"], now=0) if "pnpm" in m.text]

    code, out, err = await cli(capsys, backend, "forget", fact.memory_id)
    assert code == 0 and f"forgot {fact.memory_id}" in out, err
    # The same preference, said again in a new session: distillation runs over it all.
    s = Session(proxy, upstream, session_id="pref-3", headers=WHO)
    await s.say("Always use pnpm, not npm, for the frontend.")
    await s.say("turn 2: please do step 2")
    await settle(proxy)
    await runtime(proxy).distiller.run_once()
    assert [m for m in await store.list(None, types=["semantic"], now=0) if "pnpm" in m.text] == []
