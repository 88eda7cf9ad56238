"""Typed memory end to end: Codex-shaped sessions through the proxy and the fake upstream.

The scenarios that depend on the store run against both backends (``backend``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import threading
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ctxproxy.injectors import tokens
from ctxproxy.memory import turns
from ctxproxy.memory.model import Scope, Store, StoreError, user_ref
from ctxproxy.proxy import memory_wiring as wiring
from ctxproxy.proxy.app import METRICS
from tests.conftest import SHARED_FIXTURES, ProxyFactory, require_shared
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream
from tests.memory.conftest import Backend
from tests.memory.session import (
    Session,
    developer_memory,
    memory_text,
    post,
    runtime,
    settle,
    standing_memory,
    user_texts,
)

DB_FACT = "Our database is PostgreSQL 15 on port 5433."
CUT_EVERY_TURN: dict[str, Any] = {"keep_turns": 1, "window_policy": "fixed", "trim_slack": 0}


async def test_fact_cut_from_the_window_is_recalled_when_asked_about(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(**backend.settings, keep_turns=5, trim_slack=0)
    s = Session(proxy, upstream)
    await s.say(f"{DB_FACT} Set up the migrations folder.")
    for n in range(2, 12):
        sent = await s.say(f"turn {n}: please do step {n}")
        await runtime(proxy).queue.join()
        if n >= 6:
            assert not any("PostgreSQL" in t for t in user_texts(sent))

    sent = await s.say("Which port does the database listen on, and which version is it?")

    assert not any("PostgreSQL" in t for t in user_texts(sent))
    injected = memory_text(sent)
    assert "PostgreSQL 15 on port 5433" in injected
    assert re.search(r'<memory id="mem_[0-9a-z]{26}"', injected)


async def test_recalled_turn_goes_in_a_developer_message_before_the_newest_prompt(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(keep_turns=3, trim_slack=0)
    s = Session(proxy, upstream)
    await s.say("Set up the project skeleton.")
    await s.say(DB_FACT)
    for n in range(3, 8):
        await s.say(f"turn {n}: please do step {n}")
        await runtime(proxy).queue.join()

    sent = await s.say("What port does the database use?")

    # Earlier turns' recall messages stay before their own prompts (kept for the cache); this
    # turn's comes last, right before the newest prompt.
    recalls = developer_memory(sent)
    assert recalls
    for position, _ in recalls:
        assert sent["input"][position + 1]["role"] == "user"
    position, text = recalls[-1]
    assert sent["input"][position + 1]["content"][0]["text"] == "What port does the database use?"
    assert "<episodic_memory" in text and "PostgreSQL 15 on port 5433" in text
    assert all("PostgreSQL" not in t for _, t in recalls[:-1])
    assert "PostgreSQL" not in (sent.get("instructions") or "")


async def test_preference_from_earlier_sessions_is_in_the_first_request_of_the_next(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(**backend.settings)
    for n in (1, 2):
        s = Session(proxy, upstream, session_id=f"earlier-{n}")
        await s.say("Use Python, not Node, for the build scripts.")
        await s.say("Now add a lint step.")
    await settle(proxy)

    sent = await Session(proxy, upstream, session_id="next").say("Write a release script.")

    standing = standing_memory(sent)
    assert "<semantic_memory" in standing
    assert "Use Python, not Node, for the build scripts." in standing
    assert re.search(r'<memory id="mem_[0-9a-z]{26}" source="distilled from '
                     r'user statements">Use Python', standing)
    assert "semantic_memory" not in (sent.get("instructions") or "")  # the front is the agent's


async def test_semantic_memory_made_after_the_block_was_pinned_is_recalled_when_asked(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    # The standing block stays as it was pinned until the window cuts; a memory distilled
    # meanwhile is not in it, so recall must not leave it out as if the model saw it.
    proxy = await start_proxy(**backend.settings)
    later = Session(proxy, upstream, session_id="later")
    assert "semantic_memory" not in memory_text(await later.say("Write a release script."))
    for n in (1, 2):
        s = Session(proxy, upstream, session_id=f"earlier-{n}")
        await s.say("Use Python, not Node, for the build scripts.")
        await s.say("Now add a lint step.")
    await settle(proxy)

    sent = await later.say("Which language do the build scripts use, Python or Node?")

    assert standing_memory(sent) == ""  # still as pinned: nothing was cut
    recalled = "\n".join(text for _, text in developer_memory(sent))
    assert re.search(r'<memory id="mem_[0-9a-z]{26}" source="[^"]*">Use Python, not '
                     r"Node, for the build scripts.", recalled)


async def test_a_preference_said_once_stays_out_of_semantic_memory(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy()
    s = Session(proxy, upstream, session_id="once")
    await s.say("Use Python, not Node, for the build scripts.")
    await s.say("Now add a lint step.")
    await settle(proxy)

    sent = await Session(proxy, upstream, session_id="next").say("Write a release script.")

    assert "semantic_memory" not in memory_text(sent)


async def test_agents_and_teams_never_see_each_others_memory(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(**backend.settings, keep_turns=1)
    owner = {"x-team-id": "team-a", "x-agent-id": "coder"}
    for n in (1, 2):
        s = Session(proxy, upstream, session_id=f"owner-{n}", headers=owner)
        await s.say(f"{DB_FACT} Use Python, not Node, for the build scripts.")
        await s.say("Now add a lint step.")
    await settle(proxy)
    same = await Session(proxy, upstream, session_id="owner-3", headers=owner).say(
        "Which port does the database listen on?"
    )
    assert "PostgreSQL 15 on port 5433" in memory_text(same)

    others = [
        {"x-team-id": "team-a", "x-agent-id": "reviewer"},
        {"x-team-id": "team-b", "x-agent-id": "coder"},
        {"x-team-id": "team-a", "x-agent-id": "coder", "x-tdai-user-key": "uk-2"},
    ]
    for n, other in enumerate(others):
        s = Session(proxy, upstream, session_id=f"other-{n}", headers=other)
        await s.say("Set up the project.")
        sent = await s.say("Which port does the database listen on? Node or Python?")
        assert "PostgreSQL" not in memory_text(sent)
        assert "Python, not Node" not in memory_text(sent)


async def test_secrets_are_redacted_before_they_are_stored(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(**backend.settings, keep_turns=1, trim_slack=0)
    secrets = [
        "sk-proj-Abcdefghijklmnopqrstuvwxyz0123456789",
        "s3cr3t-Passw0rd",
        "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    ]
    s = Session(proxy, upstream)
    await s.say(
        f"Deploy with OPENAI_API_KEY={secrets[0]} to postgres://admin:{secrets[1]}@db:5432/app "
        f"and always use the token {secrets[2]} for the deploy bot."
    )
    await s.say("Which credentials does the deploy use?")
    await settle(proxy)
    sent = await s.say("And the deploy bot?")

    stored = await runtime(proxy).store.list(None, limit=1000)
    assert {m.type for m in stored} >= {"working", "episodic"}
    for memory in stored:
        dump = memory.text + repr(memory.attrs)
        assert not any(secret in dump for secret in secrets)
    injected = memory_text(sent)
    assert "[REDACTED]" in injected
    assert not any(secret in injected for secret in secrets)


async def test_replays_and_retries_store_each_turn_once(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(**backend.settings)
    s = Session(proxy, upstream)
    for n in range(1, 5):
        await s.say(f"turn {n}: please do step {n}")
    await s.say_with_tool("turn 5: run the tests")
    await s.say("turn 6: summarise")
    for _ in range(2):  # Codex retries the same request, even while the first is in flight
        await asyncio.gather(s.send(), s.send())
    await runtime(proxy).queue.join()
    # The same history under another turn id, and through a second proxy on the same store
    # (another replica, or this one after a restart: nothing cached).
    await Session(proxy, upstream, items=list(s.items), turns=99).send()
    await runtime(proxy).queue.join()
    restarted = await start_proxy(**backend.settings)
    await Session(restarted, upstream, items=list(s.items), turns=100).send()
    await runtime(restarted).queue.join()

    episodes = await runtime(restarted).store.list(None, types=["episodic"], limit=1000)
    # The last turn too: its answer was relayed; the retries that resend it add nothing.
    assert sorted(m.turn_index or 0 for m in episodes) == [0, 1, 2, 3, 4, 5]
    assert len({m.key for m in episodes}) == 6
    tool_turn = next(m for m in episodes if m.turn_index == 4)
    assert "Tool call exec_command" in tool_turn.text
    assert "Tool output exec_command" in tool_turn.text
    working = await runtime(restarted).store.list(None, types=["working"], limit=1000)
    assert [m.attrs["kind"] for m in working] == ["task"]


async def test_episodes_know_whether_they_are_still_in_the_window(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(keep_turns=2, trim_slack=0)
    s = Session(proxy, upstream)
    for n in range(1, 6):
        await s.say(f"turn {n}: please do step {n}")
        await runtime(proxy).queue.join()

    episodes = await runtime(proxy).store.list(None, types=["episodic"], limit=100)
    flags = {m.turn_index: m.in_window for m in episodes}
    # Turns 1-4 are complete, turn 5 by its relayed answer; the window keeps turns 4 and 5.
    assert flags == {0: False, 1: False, 2: False, 3: True, 4: True}


def _recall_at(body: dict[str, Any]) -> int | None:
    """Where the first recall message is (the standing block before it stays put)."""
    return next((n for n, _ in developer_memory(body)), None)


async def test_requests_between_cuts_share_their_prefix_up_to_the_recall_message(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(**backend.settings, keep_turns=3, trim_slack=3)
    s = Session(proxy, upstream)
    await s.say(f"Set up the service. {DB_FACT} Never commit to main.")
    for n in range(2, 6):
        await s.say(f"turn {n}: the database port is configured in step {n}")
    await runtime(proxy).queue.join()
    sent: list[dict[str, Any]] = []
    for n in range(6, 11):
        first, second = await s.say_with_tool(f"turn {n}: check the database port again")
        sent += [first, second]
        await runtime(proxy).queue.join()

    cuts = recalls = 0
    for n, (before, after) in enumerate(itertools.pairwise(sent)):
        if user_texts(before)[1] != user_texts(after)[1]:
            cuts += 1  # the window moved: a new prefix starts here
            continue
        assert after.get("instructions") == before.get("instructions")
        end = _recall_at(before)
        recalls += end is not None
        assert after["input"][: end or len(before["input"])] == before["input"][: end]
        if n % 2 == 0:  # the tool loop of one turn: the whole first request is a prefix
            assert after["input"][: len(before["input"])] == before["input"]
    # Turns 6 to 10 with a slack of 3 cut once (at turn 7): 8 of 9 pairs share a prefix.
    assert cuts == 1
    assert recalls >= 4
    assert "Never commit to main." not in standing_memory(sent[0])
    assert "Never commit to main." in standing_memory(sent[-1])


async def test_every_request_of_a_turn_gets_the_same_memory_bytes(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(keep_turns=2, trim_slack=0)
    s = Session(proxy, upstream)
    await s.say(DB_FACT)
    for n in range(2, 5):
        await s.say(f"turn {n}: step {n}")
        await runtime(proxy).queue.join()

    first, second = await s.say_with_tool("turn 5: which database port do we use?")

    assert developer_memory(first) and developer_memory(first) == developer_memory(second)
    assert first.get("instructions") == second.get("instructions")


async def test_store_failure_forwards_the_request_whole_without_memory(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(keep_turns=2, trim_slack=0)
    s = Session(proxy, upstream)
    await s.say(DB_FACT)
    for n in range(2, 5):
        await s.say(f"turn {n}: step {n}")
    await runtime(proxy).queue.join()
    await runtime(proxy).store.close()

    sent = await s.say("turn 5: which database port do we use?")

    assert "_memory" not in memory_text(sent)
    # No memory would show what the window cut: the history goes out as the client sent it.
    assert user_texts(sent)[1:] == [DB_FACT, *(f"turn {n}: step {n}" for n in range(2, 5)),
                                    "turn 5: which database port do we use?"]
    assert "earlier_turns" not in str(sent["input"])
    registry = proxy.app[METRICS].registry
    assert (registry.get_sample_value("ctxproxy_degraded_total", {"source": "memory"}) or 0) >= 1
    assert registry.get_sample_value("ctxproxy_memory_forwarded_whole_total") == 1

    await runtime(proxy).store.open()
    # The store is back: cut again, and the cut fact is recalled.
    sent = await s.say("turn 6: add a health check on the database port")
    assert [t for t in user_texts(sent) if t.startswith("turn")] == [
        "turn 5: which database port do we use?",
        "turn 6: add a health check on the database port"]
    assert "PostgreSQL 15 on port 5433" in memory_text(sent)


async def test_unreadable_store_file_still_serves_requests(
    upstream: FakeUpstream, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    data = tmp_path / "broken"
    data.mkdir()
    (data / "memory.sqlite3").write_bytes(b"not a database " * 500)
    proxy = await start_proxy(data_dir=data)

    sent = await Session(proxy, upstream).say("Use Python, not Node.")

    assert user_texts(sent)[-1] == "Use Python, not Node."
    assert "_memory" not in memory_text(sent)


async def test_scope_is_service_team_agent_and_user(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(service_id="svc-9")
    s = Session(proxy, upstream, headers={"x-team-id": "t", "x-agent-id": "a",
                                          "x-tdai-user-key": "uk-secret-1"})
    await s.say("Always write tests first.")

    stored = await runtime(proxy).store.list(None, limit=10)
    assert stored
    assert {m.scope for m in stored} == {Scope("svc-9", "t", "a", user_ref("uk-secret-1"))}
    assert all("uk-secret-1" not in repr(m) for m in stored)


async def test_memory_blocks_stay_within_the_token_budget(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(keep_turns=1, memory_tokens=150)
    s = Session(proxy, upstream)
    await s.say("Set up the deploy pipeline. Never deploy on Fridays.")
    for n in range(2, 9):
        await s.say(f"The deploy of service {n} needs the flag --region-{n} " + "and more " * 20)
        await runtime(proxy).queue.join()

    sent = await s.say("How do we deploy the services?")

    blocks = re.findall(r"<(\w+_memory)\b.*?</\1>", memory_text(sent), re.DOTALL)
    assert blocks  # something was recalled...
    found = re.findall(r"<(?:working|episodic|semantic)_memory\b.*?</\w+_memory>",
                       memory_text(sent), re.DOTALL)
    assert sum(tokens.count(b) for b in found) <= 150  # ...within the budget
    full = await start_proxy(keep_turns=1)
    # Another session: the same one's turn would get the recall the first proxy placed (the
    # store shares it, so that every replica forwards the same bytes).
    s2 = Session(full, upstream, session_id="sess-full", items=list(s.items), turns=50)
    sent2 = await s2.send()
    assert memory_text(sent2).count("<memory ") > memory_text(sent).count("<memory ")


async def test_memory_off_forwards_the_request_as_it_came(
    upstream: FakeUpstream, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    proxy = await start_proxy(memory_enabled=False, data_dir=tmp_path / "off")
    s = Session(proxy, upstream)
    await s.say("Use Python, not Node.")
    sent = await s.say("Next.")
    assert "instructions" not in sent
    assert not (tmp_path / "off" / "memory.sqlite3").exists()


async def test_a_store_that_could_not_open_is_retried_until_it_does(
    upstream: FakeUpstream, start_proxy: ProxyFactory, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wiring, "REOPEN_S", 0.01)
    blocker = tmp_path / "data" / "memory.sqlite3"
    blocker.mkdir(parents=True)  # a folder where the database file should be
    proxy = await start_proxy(data_dir=tmp_path / "data")
    s = Session(proxy, upstream)
    assert "_memory" not in memory_text(await s.say("Never use eval."))

    blocker.rmdir()
    opening = runtime(proxy).opening
    assert opening is not None
    await asyncio.wait_for(opening, 10)
    await s.say("Now the parser.")

    working = await runtime(proxy).store.list(None, types=["working"])
    assert "Never use eval." in [m.text for m in working]


async def test_a_real_codex_session_is_remembered_and_recalled(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy(keep_turns=2, trim_slack=0)
    folder = require_shared(Path(SHARED_FIXTURES) / "03_resume_7turns")
    for path in sorted(folder.glob("*_POST_v1_responses.json")):
        recorded = json.loads(path.read_text())
        headers = {k: v for k, v in recorded["headers"].items()
                   if k.lower() not in ("host", "content-length")}
        assert await post(proxy.url, recorded["body"], headers) == 200
        await runtime(proxy).queue.join()

    sent = upstream.last.json
    episodes = await runtime(proxy).store.list(None, types=["episodic"], limit=100)
    # Turn 7 from the answer the proxy relayed (the fake's, not the recorded one).
    assert sorted(m.turn_index or 0 for m in episodes) == [0, 1, 2, 3, 4, 5, 6]
    assert {m.session_id for m in episodes} == {"01a22974-4010-7fa0-a68c-b1ca4fc0dbf1"}
    in_window = [m.in_window for m in sorted(episodes, key=lambda m: m.turn_index or 0)]
    assert in_window == [False] * 5 + [True, True]
    position, text = developer_memory(sent)[-1]
    newest = sent["input"][position + 1]["content"][0]["text"]
    assert newest == "turn 7: please continue (mode text)"
    assert "<episodic_memory" in text
    working = standing_memory(sent)
    # The task the session opened with is a finished one: no block repeats it.
    assert "turn 1: run echo hi" not in working


async def test_a_store_that_hangs_costs_a_request_at_most_the_memory_budget(
    upstream: FakeUpstream, start_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = await start_proxy(keep_turns=2, trim_slack=0, memory_timeout_ms=200)
    s = Session(proxy, upstream)
    await s.say(DB_FACT)
    await s.say("turn 2: step 2")
    await runtime(proxy).queue.join()
    store = runtime(proxy).store
    release = asyncio.Event()

    async def hang(*args: Any, **kwargs: Any) -> Any:
        await release.wait()  # a database that stopped answering
        raise StoreError("the database went away")

    for name in ("search", "list", "upsert", "get"):
        monkeypatch.setattr(store, name, hang)

    # Bounded by the test's own timeout, not a timing assertion: without the budget the
    # request would wait on the store for ever.
    sent = await asyncio.wait_for(s.say("turn 3: which database port do we use?"), 30)

    # Memory came too late to show what the window cuts: the whole history went out.
    assert user_texts(sent)[1:] == [
        DB_FACT, "turn 2: step 2", "turn 3: which database port do we use?"]
    assert "_memory" not in memory_text(sent)
    registry = proxy.app[METRICS].registry
    assert (registry.get_sample_value("ctxproxy_degraded_total", {"source": "memory"}) or 0) >= 1
    release.set()


async def test_a_late_turn_keeps_the_last_requests_blocks_while_the_window_holds(
    upstream: FakeUpstream, start_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fixed rule in steps of three turns: turns 5 to 7 forward from turn 4 on.
    proxy = await start_proxy(keep_turns=2, trim_slack=2, memory_timeout_ms=200)
    s = Session(proxy, upstream)
    await s.say(f"turn 1: set up the migrations folder. Never commit to main. {DB_FACT}")
    for n in range(2, 5):
        await s.say(f"turn {n}: step {n}")
    before = await s.say("turn 5: step 5")
    await runtime(proxy).queue.join()
    release = asyncio.Event()

    async def hang(*args: Any, **kwargs: Any) -> Any:
        await release.wait()
        raise StoreError("the database went away")

    for name in ("search", "list", "upsert", "get"):
        monkeypatch.setattr(runtime(proxy).store, name, hang)
    sent = await asyncio.wait_for(s.say("turn 6: which database port do we use?"), 30)

    # The window has not cut since: the blocks the last request showed go in again, the
    # same bytes (its whole input is this one's prefix), and the cut stays.
    assert "Never commit to main." in standing_memory(before)
    assert sent["input"][: len(before["input"])] == before["input"]
    assert [t for t in user_texts(sent) if t.startswith("turn")] == [
        "turn 4: step 4", "turn 5: step 5", "turn 6: which database port do we use?"]
    registry = proxy.app[METRICS].registry
    assert (registry.get_sample_value("ctxproxy_degraded_total", {"source": "memory"}) or 0) >= 1
    assert registry.get_sample_value("ctxproxy_memory_forwarded_whole_total") == 0
    release.set()


async def known_session(backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory
                        ) -> tuple[Session, Store]:
    """A session whose first turn is stored, and the store its proxy writes."""
    proxy = await start_proxy(**backend.settings, keep_turns=5, trim_slack=0)
    s = Session(proxy, upstream)
    await s.say("Set up the migrations folder.")
    await runtime(proxy).queue.join()
    return s, runtime(proxy).store


def hold_upserts(store: Store, until: asyncio.Event) -> None:
    """The store's writes wait for ``until``, then go on."""
    held_upsert = store.upsert

    async def upsert(memories: Any) -> Any:
        await until.wait()
        return await held_upsert(memories)

    store.upsert = upsert  # type: ignore[method-assign]


async def test_a_constraint_is_stored_while_its_request_goes_out_and_before_its_answer(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    # Working memory is derived while recall reads and written from the upstream's success
    # status on: the upstream has the request before the write ends, and the answer ends
    # only once it has (another replica's next request comes after it).
    s, store = await known_session(backend, upstream, start_proxy)
    looked = asyncio.Event()
    hold_upserts(store, looked)  # until the upstream has the request
    seen: list[list[str]] = []

    async def look(request: Any, rec: Any) -> Any:
        working = await store.list(None, types=["working"], limit=100)
        seen.append([m.text for m in working])
        looked.set()
        return await upstream.stream(request, rec)

    upstream.then(look)
    await s.say("Always use tabs for indentation. Now add the first migration.")
    assert not any("Always use tabs" in text for text in seen[0])  # not waited for
    working = await store.list(None, types=["working"], limit=100)
    assert any("Always use tabs for indentation." in m.text for m in working)  # the answer was
    registry = s.proxy.app[METRICS].registry
    assert (registry.get_sample_value("ctxproxy_degraded_total", {"source": "memory"}) or 0) == 0


async def test_the_answer_starts_while_working_memory_is_written_and_ends_after_it(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    # The write begins at the upstream's success status; the client's first bytes do not
    # wait for it, the completed event (after which a client sends its next request) does.
    s, store = await known_session(backend, upstream, start_proxy)
    release = asyncio.Event()
    hold_upserts(store, release)
    upstream.chunk_delay_s = 0.02  # events apart, as a model streams them
    s.items = [*s.items, codex.text("user", "Always use tabs for indentation. Go on.")]
    hdrs = codex.headers(session_id=s.session_id, turn_id=f"{s.session_id}-t2")
    async with aiohttp.ClientSession() as http, http.post(
            s.proxy.url + "/v1/responses", json=codex.request(s.items, s.session_id),
            headers=hdrs) as r:
        first = await asyncio.wait_for(r.content.readuntil(b"\n\n"), 10)
        assert b"response.created" in first  # relayed while the write is held
        rest = asyncio.ensure_future(r.content.read())
        await asyncio.sleep(0.2)
        assert not rest.done()  # the completed event waits for the write
        release.set()
        assert b"response.completed" in await asyncio.wait_for(rest, 10)
    working = await store.list(None, types=["working"], limit=100)
    assert any("Always use tabs for indentation." in m.text for m in working)


async def test_a_working_memory_write_that_breaks_does_not_break_the_answer(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The write goes on while the answer streams; a bug in it is logged, and neither the
    # turn's memory (the step) nor the answer the upstream gave is lost to it.
    s, store = await known_session(backend, upstream, start_proxy)

    async def upsert(memories: Any) -> Any:
        raise RuntimeError("a bug in the write")

    store.upsert = upsert  # type: ignore[method-assign]
    sent = await s.say("Always use tabs for indentation. Now add the first migration.")
    assert "Always use tabs" in json.dumps(sent)
    assert s.answer  # the upstream's answer, relayed (say asserts the 200)
    logged = [r.getMessage() for r in caplog.records]
    assert any("writing working memory failed" in m for m in logged)
    assert not any("step memory failed" in m for m in logged)  # the turn kept its memory


def _on_standing_read(
    store: Any, monkeypatch: pytest.MonkeyPatch, event: threading.Event | asyncio.Event
) -> None:
    """Set ``event`` when ``store`` is asked for semantic memory: a standing read."""
    list_ = store.list

    async def listed(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("types") == ["semantic"]:
            event.set()
        return await list_(*args, **kwargs)

    monkeypatch.setattr(store, "list", listed)


async def test_a_known_sessions_standing_reads_go_out_before_its_history_is_split(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A turn's split and its standing reads need not wait for each other: the split waits
    # (in its worker) for the read it should not have to come before. The history is split
    # as a long one is, in a worker (a short one is split in place, before the reads go out).
    monkeypatch.setattr("ctxproxy.memory.prepare.small_history", lambda items, size: False)
    proxy = await start_proxy(**backend.settings, **CUT_EVERY_TURN)
    read, waiting, saw = threading.Event(), threading.Event(), []
    _on_standing_read(runtime(proxy).store, monkeypatch, read)
    split = turns.split

    def split_after_the_read(*args: Any, **kwargs: Any) -> Any:
        if waiting.is_set():
            saw.append(read.wait(timeout=2.0))
        return split(*args, **kwargs)

    monkeypatch.setattr(turns, "split", split_after_the_read)
    s = Session(proxy, upstream)
    await s.say(f"{DB_FACT} Set up the migrations folder.")
    await s.say("Now add the first migration.")  # the window cuts: the block is chosen again
    await runtime(proxy).queue.join()
    read.clear()
    waiting.set()

    sent = await s.say("Which port does the database listen on?")

    assert saw == [True]
    assert "PostgreSQL 15 on port 5433" in memory_text(sent)


async def test_a_new_sessions_working_memory_is_written_once_answered_and_shown_next(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A session new to this process (a restart) brings earlier turns: their working memory
    # is written once the upstream has accepted the request (a refused one keeps nothing),
    # before its answer is relayed, and the next turn's standing block shows it.
    proxy = await start_proxy(**backend.settings, **CUT_EVERY_TURN)
    store = runtime(proxy).store
    order: list[str] = []
    upsert_ = store.upsert

    async def upsert(memories: Any) -> Any:
        if any(m.type == "working" for m in memories):
            order.append("written")
        return await upsert_(memories)

    async def look(request: Any, rec: Any) -> Any:
        order.append("forwarded")
        return await upstream.stream(request, rec)

    monkeypatch.setattr(store, "upsert", upsert)
    upstream.then(look)
    s = Session(proxy, upstream)
    s.items = [*s.items, *codex.text_turn("Never commit to main. Set up the repository."),
               *codex.text_turn("Now add a README.")]

    await s.say("Add a license file.")
    assert order == ["forwarded", "written"]
    sent = await s.say("Now run the tests.")
    assert "Never commit to main." in standing_memory(sent)


async def test_a_sessions_writes_queued_behind_a_slow_store_are_done_once_and_lose_nothing(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy = await start_proxy(**backend.settings)
    store = runtime(proxy).store
    release = asyncio.Event()
    upsert = store.upsert

    async def slow(memories: Any) -> Any:
        if any(m.type == "episodic" for m in memories):
            await release.wait()  # the store falls behind the session (a restart's backlog)
        return await upsert(memories)

    monkeypatch.setattr(store, "upsert", slow)
    s = Session(proxy, upstream)
    for n in range(1, 7):
        await s.say(f"turn {n}: please do step {n}")
    release.set()
    await runtime(proxy).queue.join()

    # Each request queued a write of every turn it completed (and each relayed answer one of
    # its turn); the requests' writes still queued when a later one came were left to it.
    registry = proxy.app[METRICS].registry
    assert (registry.get_sample_value("ctxproxy_ingest_queue_superseded_total") or 0) >= 3
    episodes = await store.list(None, types=["episodic"], limit=100)
    assert sorted(m.turn_index or 0 for m in episodes) == [0, 1, 2, 3, 4, 5]
    assert len({m.key for m in episodes}) == 6
    assert not registry.get_sample_value(
        "ctxproxy_ingest_queue_dropped_total", {"reason": "jobs"})


async def test_writes_over_the_queues_bytes_are_refused_then_derived_again(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each write counts the bytes of the request it came with: behind a held store, a
    # session of 60 KB prompts passes 0.15 MiB in a few turns, and what is refused is not lost.
    proxy = await start_proxy(**backend.settings, ingest_queue_mb=0.15)
    store = runtime(proxy).store
    release = asyncio.Event()
    upsert = store.upsert

    async def slow(memories: Any) -> Any:
        if any(m.type == "episodic" for m in memories):
            await release.wait()
        return await upsert(memories)

    monkeypatch.setattr(store, "upsert", slow)
    s = Session(proxy, upstream)
    for n in range(1, 6):
        await s.say(f"turn {n}: please read this log " + f"line {n} " * 8_000)
    registry = proxy.app[METRICS].registry
    refused = registry.get_sample_value("ctxproxy_ingest_queue_dropped_total", {"reason": "bytes"})
    assert refused and refused >= 1
    release.set()
    await runtime(proxy).queue.join()
    await s.say("Summarise.")  # derives every turn before it again
    await runtime(proxy).queue.join()

    # (Its own answered turn may be refused too, while that write runs: the next request
    # would derive it.)
    episodes = await store.list(None, types=["episodic"], limit=100)
    assert {0, 1, 2, 3, 4} <= {m.turn_index or 0 for m in episodes}


async def test_working_memory_the_forwarded_prompts_say_again_stays_out_of_the_blocks(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    # An agent's instructions come again with each task's prompt: after a cut, a block that
    # repeated them would pay for them twice on every request.
    proxy = await start_proxy(**CUT_EVERY_TURN)
    s = Session(proxy, upstream)
    rule, kept = "Never push to main without a review.", "Always run the linter before committing."
    await s.say(f"Fix the parser. {rule} {kept}")
    await runtime(proxy).queue.join()

    sent = await s.say(f"Now fix the lexer. {rule}")
    await runtime(proxy).queue.join()
    later = await s.say("And the formatter, the same way.")

    def constraint(text: str) -> str:
        return f'kind="constraint">{text}</memory>'

    assert "Fix the parser" not in " ".join(user_texts(sent))  # the first turn was cut
    assert "Fix the parser" not in standing_memory(sent)  # a finished task, not repeated
    assert constraint(kept) in standing_memory(sent)
    assert constraint(rule) not in memory_text(sent)  # the forwarded prompt says it
    assert constraint(rule) in standing_memory(later)  # cut in its turn: shown again
