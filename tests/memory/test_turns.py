"""Turns, keys and the records made from them (episodic and working memory)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from ctxproxy.memory import working
from ctxproxy.memory.ingest import episodes
from ctxproxy.memory.model import Memory, Scope
from ctxproxy.memory.turns import ARGS_CHARS, OUTPUT_CHARS, render, session_key, split
from ctxproxy.memory.working import derive
from ctxproxy.plumbing.lru import SizedLRU
from ctxproxy.request import History
from ctxproxy.window.policy import window
from tests.conftest import SHARED_FIXTURES, require_shared
from tests.fakes import codex

SCOPE = Scope("svc")


def fixture_input(name: str, number: str) -> list[dict[str, Any]]:
    path = require_shared(Path(SHARED_FIXTURES) / name / f"{number}_POST_v1_responses.json")
    return list(json.loads(path.read_text())["body"]["input"])


def test_real_codex_history_splits_into_its_user_turns() -> None:
    turns = split("s", History(fixture_input("03_resume_7turns", "0010")))
    assert [t.user.split(":")[0] for t in turns] == [f"turn {n}" for n in range(1, 8)]
    assert [t.complete for t in turns] == [True] * 6 + [False]
    assert all(t.in_window for t in turns)


def test_keys_stay_the_same_when_the_history_grows() -> None:
    short = split("s", History(fixture_input("03_resume_7turns", "0008")))
    long = split("s", History(fixture_input("03_resume_7turns", "0010")))
    done = [t.key for t in short if t.complete]
    assert done and [t.key for t in long[: len(done)]] == done


def test_keys_belong_to_their_session() -> None:
    items = codex.session(3)
    assert split("a", History(items))[0].key != split("b", History(items))[0].key


def test_the_same_words_in_two_turns_are_two_turns() -> None:
    items = [*codex.context_items(), *codex.tool_turn("continue"), *codex.tool_turn("continue"),
             codex.text("user", "done?")]
    first, second, _ = split("s", History(items))
    assert first.key != second.key


def test_turns_cut_by_the_window_are_marked_outside_it() -> None:
    items = codex.session(6)
    result = window(items, 2)
    turns = split("s", History(items), result.turns_in - result.turns_kept)
    assert [t.in_window for t in turns] == [False] * 4 + [True] * 2


def test_render_keeps_tool_calls_with_bounded_arguments_and_outputs() -> None:
    items = [*codex.context_items(), *codex.tool_turn("run it", output="Q" * 5000),
             codex.text("user", "next")]
    call = next(i for i in items if i.get("type") == "function_call")
    call["arguments"] = json.dumps({"cmd": "Z" * 5000})
    text, tools = render(split("s", History(items))[0])
    assert tools == ["exec_command"]
    assert text.startswith("User: run it\n")
    assert "Tool call exec_command: " in text and "Tool output exec_command: " in text
    assert "Assistant: Done with: run it" in text
    assert text.count("Z") < ARGS_CHARS and text.count("Q") < OUTPUT_CHARS


def test_episodes_are_completed_turns_with_their_secrets_redacted() -> None:
    items = [*codex.context_items(), *codex.text_turn("deploy with password=hunter2"),
             codex.text("user", "what now?")]
    (episode,) = episodes(SCOPE, "s", split("s", History(items)), now=1.0)
    assert episode.type == "episodic" and episode.session_id == "s" and episode.turn_index == 0
    assert "hunter2" not in episode.text and "hunter2" not in str(episode.attrs)
    assert episode.attrs["user"] == "deploy with password=[REDACTED]"


def test_working_memory_is_the_task_and_the_constraints() -> None:
    items = [*codex.context_items(), *codex.text_turn("Build a CLI for the wiki. Use click."),
             *codex.text_turn("Never print the api key. Always add tests."),
             codex.text("user", "Don't touch setup.py. Now add the export command.")]
    records = derive(SCOPE, "s", split("s", History(items)), now=100.0, ttl_s=1800)
    # The task is the newest prompt's: the one the session is on now.
    assert [(m.attrs["kind"], m.text) for m in records] == [
        ("task", "Don't touch setup.py. Now add the export command."),
        ("constraint", "Never print the api key."),
        ("constraint", "Always add tests."),
        ("constraint", "Don't touch setup.py."),
    ]
    assert all(m.type == "working" and m.expires_at == 1900.0 for m in records)
    assert len({m.key for m in records}) == 4


def _without_ids(records: list[Memory]) -> list[Memory]:
    return [dataclasses.replace(m, memory_id="") for m in records]


def _fresh_memo() -> SizedLRU[tuple[str, str], Any]:
    return SizedLRU(None, working.SAID_BYTES, size_of=lambda s: s.size)


def test_working_memory_reads_each_prompt_once(monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[str] = []
    real = working.constraints
    monkeypatch.setattr(working, "constraints", lambda text: read.append(text) or real(text))
    monkeypatch.setattr(working, "_said", _fresh_memo())
    items = [*codex.context_items(), *codex.text_turn("Port the parser to Rust. Use serde."),
             *codex.text_turn("Never commit to main. Keep the old tests.")]
    first = derive(SCOPE, "s", split("s", History(items)), now=1.0, ttl_s=60)
    items.append(codex.text("user", "Always run clippy before you push."))
    read.clear()
    again = derive(SCOPE, "s", split("s", History(items)), now=1.0, ttl_s=60)
    assert read == ["Always run clippy before you push."]  # only the new prompt is read
    monkeypatch.setattr(working, "_said", _fresh_memo())
    cold = derive(SCOPE, "s", split("s", History(items)), now=1.0, ttl_s=60)
    assert _without_ids(again) == _without_ids(cold)
    # The earlier constraints as they were, the task now the newest prompt's.
    assert _without_ids(again)[1 : len(first)] == _without_ids(first)[1:]
    assert again[0].text == again[-1].text == (
        "Always run clippy before you push.")


def test_the_prompt_memo_counts_the_prompts_it_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    budget = 64 * 1024
    memo: SizedLRU[tuple[str, str], Any] = SizedLRU(None, budget, size_of=lambda s: s.size)
    monkeypatch.setattr(working, "_said", memo)
    monkeypatch.setattr(working, "SAID_BYTES", budget)
    prompts = [f"Task {n}: " + "rename the module and keep its API. " * 100 for n in range(40)]
    items = codex.context_items()
    for prompt in prompts:
        items = [*items, *codex.text_turn(prompt)]
        derive(SCOPE, "s", split("s", History(items)), now=1.0, ttl_s=60)
    assert budget - 4000 < memo.bytes <= budget  # each entry counts its 3.6 KB prompt
    huge = "Never log the token. " + "x" * (budget // 16)
    derive(SCOPE, "s", split("s", History([*codex.context_items(), *codex.text_turn(huge)])),
           now=1.0, ttl_s=60)
    assert ("constraints", huge) not in memo  # one huge prompt never empties the memo


def test_after_a_compaction_the_first_prompt_is_not_the_task() -> None:
    items = [*codex.context_items(),
             codex.text("user", "Another language model started to solve this problem: ..."),
             codex.text("user", "Keep going.")]
    assert History(items).compacted
    records = derive(SCOPE, "s", split("s", History(items)), now=0.0, ttl_s=10, compacted=True)
    assert [m.attrs["kind"] for m in records] == []


def test_a_client_without_session_id_gets_one_from_its_first_prompt() -> None:
    items = codex.session(2)
    assert session_key("thread-1", History(items)) == "thread-1"
    anon = session_key(None, History(items))
    assert anon is not None and anon.startswith("anon-")
    assert anon == session_key(None, History(codex.session(4)))
    assert session_key(None, History(codex.context_items())) is None
