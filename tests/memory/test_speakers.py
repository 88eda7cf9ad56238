"""Speaker-aware recall: a turn that carries a dialogue, and a question naming its speakers."""

from __future__ import annotations

from ctxproxy.memory.model import Hit, Memory, Scope, Store
from ctxproxy.memory.recall import Candidate, Recaller, Weights
from ctxproxy.memory.snippets import said_match
from ctxproxy.memory.speakers import speakers_of
from tests.memory.test_recall import cost, overhead

SCOPE = Scope("svc", "team", "agent", "u_1")
NOW = 1_800_000_000.0
# Made up, in the shape a chat transcript pasted into a turn takes.
DIALOGUE = (
    "User: [2 May, 2024] Ada: I finished the pottery class last week, a blue vase came out.\n"
    "  [2 May, 2024] Ben: Congrats Ada! I went sailing on the lake with my brother.\n"
    "  [2 May, 2024] Ada: Sailing sounds fun, Ben. Was the weather good?\n"
    "  [2 May, 2024] Ben: Windy, but we caught three trout.\n"
    "Assistant: Noted."
)


def test_a_dialogue_entry_has_its_speakers() -> None:
    lines = DIALOGUE.split("\n")
    starts = [2 if line.startswith("  ") else line.index(": ") + 2 for line in lines]
    assert speakers_of(lines, starts) == (
        frozenset({"ada"}), frozenset({"ben"}), frozenset({"ada"}), frozenset({"ben"}), None)


def test_labels_of_separate_entries_are_no_dialogue() -> None:
    lines = ["User: Remember: the port is 5433.", "Assistant: Done: noted the port."]
    assert speakers_of(lines, [6, 11]) == (None, None)


def test_one_speaker_is_no_dialogue() -> None:
    lines = ["Tool output run: Error: disk full", "  Error: retry failed"]
    assert speakers_of(lines, [17, 2]) == (None, None)


def test_said_match_counts_the_named_speakers_lines() -> None:
    # Ben's line holds "sailing" and "brother"; Ada's, "sailing".
    assert said_match(DIALOGUE, "Was Ben sailing with his brother?")[:2] == (1.0, 0.5)
    assert said_match(DIALOGUE, "Was Ada sailing with her brother?")[:2] == (0.5, 1.0)
    assert said_match(DIALOGUE, "Was the boat sailing with a brother?") is None
    assert said_match(DIALOGUE, "was ben sailing with his brother?") is None  # not a name


# Ada speaks of Ben's trip ("your brother"), Ben of his own ("I went ... my brother").
ECHOED = (
    "User: [2 May, 2024] Ben: I went sailing on the lake with my brother last week.\n"
    "  [2 May, 2024] Ada: Sailing on the lake with your brother sounds fun, Ben!\n"
    "  [2 May, 2024] Ben: It was, we caught three trout.\n"
    "Assistant: Noted."
)


def test_said_match_tells_whose_things_a_line_speaks_of() -> None:
    # Ada said the words, but of Ben's trip; Ben of his own.
    assert said_match(ECHOED, "Did Ada go sailing on the lake with her brother?") == (
        0.75, 0.75, 0.0, 0.75, 0.75, True)
    assert said_match(ECHOED, "Did Ben go sailing on the lake with his brother?") == (
        0.75, 0.75, 0.75, 0.0, 0.75, False)


# Both tell of a fishing trip; Ben's line holds one word more (the pike).
TWO_TRIPS = (
    "User: [2 May, 2024] Ben: I went sailing on the lake with my brother and my uncle, we "
    "caught three big trout and a pike at dawn one morning.\n"
    "  [2 May, 2024] Ada: Wow! We went sailing on that lake with my brother and my uncle, and "
    "caught three big trout at dawn one morning too.\n"
    "  [2 May, 2024] Ben: Nice, the pike was the best part.\n"
    "Assistant: Noted."
)
TRIP = ("Did {} catch three big trout and a pike at dawn one morning sailing on the lake with "
        "{} brother and uncle?")


def test_said_match_tells_whose_story_the_best_line_tells() -> None:
    ada = said_match(TWO_TRIPS, TRIP.format("Ada", "her"))
    ben = said_match(TWO_TRIPS, TRIP.format("Ben", "his"))
    assert ada is not None and ben is not None
    assert ada.best == ben.best > ada.own
    assert (ada.best_others, ben.best_others) == (True, False)


async def recalled(store: Store, question: str, elsewhere: float = 0.0) -> list[Memory]:
    recaller = Recaller(store, weights=Weights(), k=5, budget=1200, cost=cost,
                        overhead=overhead, elsewhere_min_score=elsewhere)
    return await recaller.recall(SCOPE, "s", question, window=(), exclude=(), budget=1200,
                                 now=NOW, min_score=0.25)


async def test_a_question_naming_the_wrong_speaker_gets_no_recall(store: Store) -> None:
    await store.upsert([Memory(type="episodic", scope=SCOPE, key="d", text=DIALOGUE,
                               session_id="old", created_at=NOW, updated_at=NOW)])
    assert [m.memory_id for m in await recalled(store, "What did Ben make in pottery class?")
            ] == []
    (got,) = await recalled(store, "What did Ada make in pottery class?")
    assert "pottery class" in got.text
    # Not a dialogue's speaker: the words alone decide, as before.
    (got,) = await recalled(store, "What came out of the pottery class?")
    assert "blue vase" in got.text


async def test_a_question_naming_the_one_who_echoed_anothers_words_gets_no_recall(
    store: Store,
) -> None:
    await store.upsert([Memory(type="episodic", scope=SCOPE, key="e", text=ECHOED,
                               session_id="old", created_at=NOW, updated_at=NOW)])
    assert await recalled(store, "Did Ada go sailing on the lake with her brother?") == []
    (got,) = await recalled(store, "Did Ben go sailing on the lake with his brother?")
    assert "with my brother" in got.text


async def test_a_question_whose_words_are_best_held_by_anothers_story_gets_no_recall(
    store: Store,
) -> None:
    # Ada's own line holds almost as many of the words (within OWN_MARGIN), Ben's the most.
    await store.upsert([Memory(type="episodic", scope=SCOPE, key="t", text=TWO_TRIPS,
                               session_id="old", created_at=NOW, updated_at=NOW)])
    assert await recalled(store, TRIP.format("Ada", "her")) == []
    (got,) = await recalled(store, TRIP.format("Ben", "his"))
    assert "pike at dawn" in got.text


# Ada asks about the crash Ben tells of (no "I" or "you" to say whose it was).
ASKED = (
    "User: [2 May, 2024] Ben: The bike crash on the trip was scary, everyone is fine now.\n"
    "  [2 May, 2024] Ada: Oh no! Were the kids upset by the crash?\n"
    "  [2 May, 2024] Ben: They were scared but calm.\n"
    "Assistant: Noted."
)


def test_what_the_named_speaker_asks_is_not_what_they_said() -> None:
    ada = said_match(ASKED, "Were Ada's kids upset by the crash?")
    ben = said_match(ASKED, "Were Ben's kids upset by the crash?")
    assert ada is not None and ben is not None
    assert (ada.said, ada.other) == (0.0, 1 / 3)  # her words are all in her question
    assert (ben.said, ben.other) == (1 / 3, 1.0)  # Ada's question is still another's line


async def test_a_question_whose_words_only_the_named_speaker_asked_gets_no_recall(
    store: Store,
) -> None:
    await store.upsert([Memory(type="episodic", scope=SCOPE, key="a", text=ASKED,
                               session_id="old", created_at=NOW, updated_at=NOW)])
    assert await recalled(store, "Were Ada's kids upset by the crash?") == []
    (got,) = await recalled(store, "Were Ben's kids upset by the crash?")
    assert "bike crash" in got.text


async def test_a_lone_line_of_the_conversation_goes_with_its_dialogues(store: Store) -> None:
    # One speaker's line alone in a turn is no dialogue, but it is the same conversation's.
    lone = "User: [3 May, 2024] Ben: That pottery class sounds great, Ada.\nAssistant: Noted."
    other = "User: the pottery class schedule moved to Tuesday.\nAssistant: Noted."
    await store.upsert([
        Memory(type="episodic", scope=SCOPE, key=key, text=text, session_id="old",
               created_at=NOW, updated_at=NOW)
        for key, text in (("d", DIALOGUE), ("l", lone), ("o", other))])
    got = await recalled(store, "What did Ben make in pottery class?")
    assert [m.key for m in got] == ["o"]  # not a line of Ada and Ben's
    got = await recalled(store, "What did Ada make in pottery class?")
    assert {m.key for m in got} == {"d", "l", "o"}


async def test_a_dialogue_naming_the_asked_speaker_passes_another_sessions_bar(
    store: Store,
) -> None:
    await store.upsert([Memory(type="episodic", scope=SCOPE, key="d", text=DIALOGUE,
                               session_id="old", created_at=NOW, updated_at=NOW)])
    # Ada's line holds 3 of the 7 words (under 0.5 of them) and 2 of the 6 but her name.
    question = "What colour was the vase Ada's pottery teacher glazed in spring?"
    (got,) = await recalled(store, question, elsewhere=0.5)
    assert "blue vase" in got.text
    # Without the name the words alone must pass it.
    unnamed = "What colour was the vase the pottery teacher glazed in spring?"
    assert await recalled(store, unnamed, elsewhere=0.5) == []
    assert [m.key for m in await recalled(store, unnamed)] == ["d"]


def test_fused_rankings_keep_another_sessions_bar_for_a_named_dialogue() -> None:
    # Hybrid recall: the bar keeps a named dialogue with few of the question's words from
    # displacing what meaning found; the name lets it through lexical recall only.
    dialogue = Memory(type="episodic", scope=SCOPE, key="d", text=DIALOGUE, session_id="old",
                      created_at=NOW, updated_at=NOW)
    recaller = Recaller(None, weights=Weights(), k=5, budget=1200,  # type: ignore[arg-type]
                        cost=cost, overhead=overhead, elsewhere_min_score=0.5)
    question = "What colour was the vase Ada's pottery teacher glazed in spring?"

    def pick(candidates: list[Candidate], rankings: list[list[Hit]]) -> list[str]:
        return [m.key for m in recaller._pick(
            candidates, question, session="s", exclude=(), shown={}, min_score=0.25,
            budget=1200, now=NOW, rankings=rankings)]

    assert pick([Candidate(dialogue, 1.0)], []) == ["d"]
    assert pick([], [[Hit(dialogue, 0.5)], [Hit(dialogue, 0.9, 0.1, (0, 40))]]) == []
