"""bench/locomo.py on a tiny conversation written here in LoCoMo's format (the real data is
CC BY-NC and never copied into the repository)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import locomo, locomo_data

SESSIONS = {
    "session_1_date_time": "1:00 pm on 3 March, 2023",
    "session_1": [
        ("Ada", "Hi Bo! I finally adopted a greyhound puppy and named him Pistachio."),
        ("Bo", "Congrats! Where did you find Pistachio?"),
        ("Ada", "At the shelter across town, they had a whole litter."),
        ("Bo", "Lovely. I started learning the cello last month."),
        ("Ada", "That suits you, you always hummed along to concerts."),
    ],
    # Listed first, dated later: the replay goes by the dates.
    "session_2_date_time": "2:30 pm on 10 April, 2023",
    "session_2": [
        ("Bo", "My cello teacher says I improve quickly."),
        ("Ada", "Pistachio chewed my running shoes yesterday."),
        ("Bo", "Ha, puppies! Any plans for the summer?"),
        ("Ada", "We are hiking the Dolomites in July with my sister."),
    ],
}
QUESTIONS = [
    {"question": "What did Ada name her greyhound puppy?", "answer": "Pistachio",
     "evidence": ["D1:1"], "category": 4},
    {"question": "When is Ada hiking the Dolomites with her sister?", "answer": "July 2023",
     "evidence": ["D2:4; D9:99"], "category": 2},  # a stray id, as LoCoMo has some
    {"question": "Which submarine did the admiral command?", "evidence": ["D1:4"],
     "category": 5, "adversarial_answer": "none"},
]


def write_data(folder: Path) -> Path:
    conversation: dict[str, object] = {"speaker_a": "Ada", "speaker_b": "Bo"}
    for key, value in SESSIONS.items():
        if isinstance(value, str):
            conversation[key] = value
            continue
        number = key.split("_")[1]
        conversation[key] = [{"speaker": who, "dia_id": f"D{number}:{n}", "text": said}
                             for n, (who, said) in enumerate(value, start=1)]
    path = folder / "locomo.json"
    path.write_text(json.dumps([{"sample_id": "synthetic-0", "qa": QUESTIONS,
                                 "conversation": conversation}]))
    return path


def rows(out: str) -> dict[str, list[str]]:
    """The report's table rows by their first cell."""
    table = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table]
    return {c[0]: c[1:] for c in cells}


def test_sessions_replay_in_date_order_packed_within_the_message_bound(tmp_path: Path) -> None:
    conv = locomo_data.load(write_data(tmp_path), [0])[0]
    assert [s.number for s in conv.sessions] == [1, 2]
    assert conv.questions[1].evidence == ("D2:4", "D9:99")
    messages = locomo.pack(conv.sessions[0], per=2)
    assert [len(turns) for _, turns in messages] == [2, 2, 1]
    assert messages[0][0].splitlines()[0] == (
        "[3 March, 2023] Ada: Hi Bo! I finally adopted a greyhound puppy and named him "
        "Pistachio.")


async def test_a_cut_turn_comes_back_when_asked_and_the_absent_answer_gets_no_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_data(tmp_path)
    assert await locomo.main(["--data", str(data), "--conversations", "0",
                              "--per-request", "2", "--no-write"]) == 0
    table = rows(capsys.readouterr().out)
    assert set(table) >= {"category", "1 multi-hop", "4 single-hop", "5 adversarial", "1-4"}
    # Each question is a new session: its evidence in the prompt is memory's doing.
    single = table["4 single-hop"]
    assert single[:4] == ["1", "100% (1/1)", "100% (1/1)", "100% (1/1)"]
    assert single[7].startswith("100% / ")  # the store's own search finds it
    temporal = table["2 temporal"]
    assert temporal[1] == "100% (1/1)"  # the stray evidence id is left out, not missed
    tokens = [int(t) for t in temporal[4].split(" / ")]
    assert 0 < tokens[0] <= tokens[1]
    assert table["5 adversarial"][:4] == ["1", "-", "-", "0% (0/1)"]
    assert table["1 multi-hop"][0] == "0"


async def test_missing_data_says_how_to_fetch_it(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert await locomo.main(["--data", str(tmp_path / "absent.json"), "--no-write"]) == 2
    assert "snap-research/LoCoMo" in capsys.readouterr().err
