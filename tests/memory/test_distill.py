"""Distillation: user statements become semantic memory by frequency, recency and spread."""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ctxproxy.memory.distill import DAY, Distiller, Group, Mention, gather, plan, resolve, score
from ctxproxy.memory.health import Health
from ctxproxy.memory.model import Memory, Scope
from ctxproxy.memory.statements import Claim, claims
from ctxproxy.memory.store_sqlite import SqliteStore

SCOPE = Scope("svc", "team", "agent", "u_1")
T0 = 1_800_000_000.0


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    opened = SqliteStore(tmp_path / "memory.sqlite3")
    await opened.open()
    yield opened
    await opened.close()


def distiller(store: SqliteStore) -> Distiller:
    return Distiller(store, threshold=0.75, interval_s=5, health=Health())


async def said(store: SqliteStore, session: str, text: str, at: float, n: int = 0) -> Memory:
    episode = Memory(
        type="episodic", scope=SCOPE, key=f"{session}-{n}-{text}", text=f"User: {text}",
        session_id=session, turn_index=n, attrs={"user": text}, created_at=at, updated_at=at,
    )
    return (await store.upsert([episode]))[0]


async def semantic(store: SqliteStore) -> list[Memory]:
    return await store.list(SCOPE, types=["semantic"], now=T0)


# --- the score -----------------------------------------------------------------------------


def test_score_grows_with_sessions_more_than_with_repetition() -> None:
    once = score(1, 1, T0, T0)
    twice_one_session = score(2, 1, T0, T0)
    two_sessions = score(2, 2, T0, T0)
    assert once < twice_one_session < two_sessions
    assert once < 0.75 and twice_one_session < 0.75 and score(3, 1, T0, T0) < 0.75
    assert two_sessions >= 0.75


def test_score_decays_when_nobody_repeats_the_claim() -> None:
    assert score(2, 2, T0 - 0.5 * DAY, T0) == score(2, 2, T0, T0)
    assert score(2, 2, T0 - 200 * DAY, T0) < 0.75 <= score(2, 2, T0 - 2 * DAY, T0)


def _mention(text: str, session: str, at: float) -> Mention:
    return Mention(claims(text)[0], f"mem_{session}_{at}", session, at)


def test_near_duplicates_gather_into_one_group() -> None:
    groups = gather([
        _mention("Use Python, not Node.", "s1", T0),
        _mention("please use python instead of node", "s2", T0 + 1),
        _mention("Use tabs.", "s2", T0 + 2),
    ])
    assert [len(g.mentions) for g in groups] == [2, 1]
    assert groups[0].sessions == {"s1", "s2"}


def test_the_newer_of_two_contradicting_claims_wins() -> None:
    groups = gather([
        _mention("Use Python, not Node.", "s1", T0),
        _mention("Use Python, not Node.", "s2", T0 + 1),
        _mention("Use Node.", "s3", T0 + 2),
    ])
    (kept,) = resolve(groups)
    assert kept.claim.prefer == {"node"}


def test_plan_leaves_a_claim_under_the_threshold_out() -> None:
    groups = gather([_mention("Use Python, not Node.", "s1", T0)])
    writes, deletes = plan(SCOPE, groups, [], threshold=0.75, now=T0)
    assert writes == [] and deletes == []


# --- the distiller against a store ---------------------------------------------------------


async def test_preference_in_two_sessions_becomes_one_semantic_memory(
    store: SqliteStore,
) -> None:
    a = await said(store, "s1", "Use Python, not Node, for the scripts.", T0)
    b = await said(store, "s2", "please use python instead of node", T0 + 60)
    d = distiller(store)
    d.notify(SCOPE)

    assert await d.run_once(now=T0 + 120) == 1

    (memory,) = await semantic(store)
    assert memory.text == "Use Python, not Node, for the scripts."
    assert sorted(memory.sources) == sorted([a.memory_id, b.memory_id])
    assert memory.attrs["sessions"] == 2 and memory.attrs["score"] >= 0.75
    assert memory.memory_id.startswith("mem_")


async def test_running_again_changes_nothing(store: SqliteStore) -> None:
    await said(store, "s1", "Use Python, not Node.", T0)
    await said(store, "s2", "Use Python, not Node.", T0 + 60)
    d = distiller(store)
    d.notify(SCOPE)
    await d.run_once(now=T0 + 120)
    before = await semantic(store)

    d.notify(SCOPE)
    assert await d.run_once(now=T0 + 180) == 0
    assert await semantic(store) == before


async def test_a_claim_said_in_one_session_only_stays_episodic(store: SqliteStore) -> None:
    for n in range(3):
        await said(store, "s1", "Use Python, not Node.", T0 + n, n)
    d = distiller(store)
    d.notify(SCOPE)
    await d.run_once(now=T0 + 60)
    assert await semantic(store) == []


async def test_a_contradicted_preference_is_superseded_not_duplicated(
    store: SqliteStore,
) -> None:
    await said(store, "s1", "Use Python, not Node.", T0)
    await said(store, "s2", "Use Python, not Node.", T0 + 60)
    d = distiller(store)
    d.notify(SCOPE)
    await d.run_once(now=T0 + 120)
    (old,) = await semantic(store)

    newer = await said(store, "s3", "Use Node for the scripts.", T0 + 3600)
    d.notify(SCOPE)
    await d.run_once(now=T0 + 3700)

    (current,) = await semantic(store)
    assert current.text == "Use Node for the scripts."
    assert current.attrs["prefer"] == ["node"]
    assert current.attrs["supersedes"] == [old.memory_id]
    assert old.memory_id in current.sources and newer.memory_id in current.sources
    assert await store.get(old.memory_id) is None


async def test_a_changed_fact_supersedes_the_old_value(store: SqliteStore) -> None:
    for n, session in enumerate(("s1", "s2")):
        await said(store, session, "Our database is PostgreSQL 15 on port 5433.", T0 + n)
    d = distiller(store)
    d.notify(SCOPE)
    await d.run_once(now=T0 + 10)
    await said(store, "s3", "Our database is MySQL 8 now.", T0 + 100)
    d.notify(SCOPE)
    await d.run_once(now=T0 + 110)

    (fact,) = await semantic(store)
    assert fact.text == "Our database is MySQL 8 now."
    assert fact.attrs["subject"] == "database"


async def test_new_episodes_reinforce_the_existing_memory(store: SqliteStore) -> None:
    await said(store, "s1", "Use Python, not Node.", T0)
    await said(store, "s2", "Use Python, not Node.", T0 + 1)
    d = distiller(store)
    d.notify(SCOPE)
    await d.run_once(now=T0 + 10)
    (first,) = await semantic(store)

    third = await said(store, "s3", "use python rather than node", T0 + 100)
    d.notify(SCOPE)
    await d.run_once(now=T0 + 110)

    (again,) = await semantic(store)
    assert again.memory_id == first.memory_id and again.text == first.text
    assert third.memory_id in again.sources and again.attrs["sessions"] == 3


async def test_forgotten_episodes_do_not_bring_their_memory_back(store: SqliteStore) -> None:
    a = await said(store, "s1", "Use Python, not Node.", T0)
    b = await said(store, "s2", "Use Python, not Node.", T0 + 1)
    d = distiller(store)
    d.notify(SCOPE)
    await d.run_once(now=T0 + 10)
    (memory,) = await semantic(store)
    # What `ctxproxy memory forget` does, from another process: the distiller's cache
    # still holds the episodes' claims.
    await store.delete([a.memory_id, b.memory_id, memory.memory_id])

    d.notify(SCOPE)
    await d.run_once(now=T0 + 20)
    assert await semantic(store) == []


async def test_scopes_are_distilled_apart(store: SqliteStore) -> None:
    other = Scope("svc", "team", "other-agent", "u_1")
    await said(store, "s1", "Use Python, not Node.", T0)
    episode = Memory(type="episodic", scope=other, key="x", text="User: Use Python, not Node.",
                     session_id="s2", attrs={"user": "Use Python, not Node."},
                     created_at=T0, updated_at=T0)
    await store.upsert([episode])
    d = distiller(store)
    d.notify(SCOPE)
    d.notify(other)
    await d.run_once(now=T0 + 10)
    assert await store.list(None, types=["semantic"], now=T0) == []


async def test_a_failing_store_keeps_the_scope_for_the_next_run(store: SqliteStore) -> None:
    await said(store, "s1", "Use Python, not Node.", T0)
    await said(store, "s2", "Use Python, not Node.", T0 + 1)
    failures: list[int] = []
    d = Distiller(store, threshold=0.75, interval_s=5, health=Health(lambda: failures.append(1)))
    d.notify(SCOPE)
    await store.close()

    assert await d.run_once(now=T0 + 10) == 0
    assert failures == [1]
    await store.open()  # the store is back: the scope was kept for the next run
    assert await d.run_once(now=T0 + 20) == 1


async def test_a_newer_memory_added_by_hand_is_not_overruled_by_older_episodes(
    store: SqliteStore,
) -> None:
    await said(store, "s1", "Use Python, not Node.", T0)
    await said(store, "s2", "Use Python, not Node.", T0 + 1)
    added = Memory(type="semantic", scope=SCOPE, key="cli:1", text="Use Node for everything.",
                   created_at=T0 + 50, updated_at=T0 + 50)
    await store.upsert([added])
    d = distiller(store)
    d.notify(SCOPE)
    await d.run_once(now=T0 + 60)

    assert [m.text for m in await semantic(store)] == ["Use Node for everything."]


# --- the index gives what comparing every pair gave ----------------------------------------


def _pairwise_gather(mentions: list[Mention]) -> list[list[Mention]]:
    groups: list[list[Mention]] = []
    for mention in sorted(mentions, key=lambda m: (m.at, m.episode)):
        for group in groups:
            if group[0].claim.same(mention.claim):
                group.append(mention)
                break
        else:
            groups.append([mention])
    return groups


def _pairwise_resolve(groups: list[Group]) -> list[Group]:
    beaten: set[int] = set()
    for i, a in enumerate(groups):
        for j in range(i + 1, len(groups)):
            b = groups[j]
            if a.claim.conflicts(b.claim):
                beaten.add(i if a.last_seen < b.last_seen else j)
    return [g for n, g in enumerate(groups) if n not in beaten]


def _random_claim(rng: random.Random) -> Claim:
    words = ["lint", "tests", "main", "push", "deploy", "python", "node", "go", "docs"]
    kind = rng.choice(["prefer", "fact", "rule"])
    if kind == "prefer":
        prefer = frozenset(rng.sample(words[4:], rng.randint(0, 1)))
        avoid = frozenset(rng.sample(words[4:], 1 if not prefer else rng.randint(0, 1)))
        return Claim("prefer", prefer=prefer, avoid=avoid - prefer or frozenset({"x"}))
    phrase = " ".join(rng.sample(words, rng.randint(1, 5)))
    if kind == "fact":
        return Claim("fact", rng.choice(["database", "port"]), phrase)
    return Claim("rule", phrase, rng.choice("+-"))


@pytest.mark.parametrize("seed", range(40))
def test_gather_and_resolve_match_comparing_every_pair(seed: int) -> None:
    rng = random.Random(seed)
    mentions = [
        Mention(_random_claim(rng), f"e{n}", f"s{rng.randint(0, 3)}", T0 + rng.randint(0, 20))
        for n in range(rng.randint(1, 60))
    ]
    groups = gather(mentions)
    assert [g.mentions for g in groups] == _pairwise_gather(mentions)
    assert [g.first for g in resolve(groups)] == [g.first for g in _pairwise_resolve(groups)]


def test_resolve_of_thousands_of_groups_stays_near_linear() -> None:
    def groups(count: int) -> list[Group]:
        mentions = []
        for n in range(count):
            for text in (f"use tool{n}, not node", f"our service{n % 50} is host{n}",
                         f"always run check{n} first", f"never run check{n} first"):
                mentions.append(Mention(claims(text)[0], f"e{n}", "s", T0 + n))
        return gather(mentions)

    small, big = groups(200), groups(2000)
    start = time.perf_counter()
    resolve(small)
    small_s = time.perf_counter() - start
    start = time.perf_counter()
    resolve(big)
    big_s = time.perf_counter() - start
    assert big_s < 30 * small_s + 0.05  # 10x the groups: pairwise would be 100x
