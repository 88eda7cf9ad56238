"""What memory put where in a session's requests, kept in the store for every replica: a
placer that lacks a turn's recall message or the pinned block reads them back as they were."""

from __future__ import annotations

from ctxproxy.memory.model import Memory, Scope, Store
from ctxproxy.memory.place import PLACEMENTS_KEPT_S, Pinned, Placer, Shown, TurnKey, shown_name

SCOPE = Scope("default", "t", "a", "u_1")


async def test_a_placement_is_stored_replaced_and_forgotten_when_old(store: Store) -> None:
    await store.place(SCOPE, "s1", "shown:3:k", b"one", now=100.0)
    await store.place(SCOPE, "s1", "shown:3:k", b"two", now=200.0)
    await store.place(SCOPE, "s2", "pinned", b"other session", now=50.0)
    assert await store.placements(SCOPE, "s1", ["shown:3:k", "pinned"]) == {"shown:3:k": b"two"}
    assert await store.placements(Scope("default", "t", "a", "u_2"), "s1", ["shown:3:k"]) == {}
    assert await store.forget_placements(150.0) == 1
    assert await store.placements(SCOPE, "s2", ["pinned"]) == {}
    assert await store.placements(SCOPE, "s1", ["shown:3:k"]) == {"shown:3:k": b"two"}


async def test_another_placer_reads_back_what_one_placed(store: Store) -> None:
    first: TurnKey = (SCOPE, "s1", "prompt-a", 4)
    newest: TurnKey = (SCOPE, "s1", "prompt-b", 9)
    message = {"type": "message", "role": "developer",
               "content": [{"type": "input_text", "text": "<episodic_memory>…"}]}
    shown = Shown(message, (("mem_1", frozenset({"line one", "line two"})),))
    chosen = (Memory("semantic", SCOPE, "k1", "Use tabs.", memory_id="mem_2",
                     attrs={"score": 0.9}, created_at=1.0, updated_at=2.0),)
    pinned = Pinned(first, message, chosen, 12)
    now = 10 * PLACEMENTS_KEPT_S  # old rows of other tests' clocks go; these stay
    await Placer("split", store=store).share(newest, shown, pinned, now=now)

    other = Placer("split", store=store)
    assert other.shown(newest) is None and other.pin(SCOPE, "s1", first) is None
    await other.load(SCOPE, "s1", [(0, first), (5, newest)])
    assert other.shown(newest) == shown
    assert other.pin(SCOPE, "s1", first) == pinned
    assert other.pin(SCOPE, "s1", newest) is None  # the window cut since: not this pin
    assert shown_name(newest) == "shown:9:prompt-b"
