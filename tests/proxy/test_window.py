from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxproxy.request import is_turn_start, message_text
from ctxproxy.window.policy import turns_to_drop, window
from tests.conftest import SHARED_FIXTURES, require_shared
from tests.fakes import codex


def prompts(items: list[dict[str, Any]]) -> list[str]:
    return [message_text(i) for i in items if is_turn_start(i)]


def load(name: str) -> dict[str, Any]:
    return json.loads(require_shared(SHARED_FIXTURES / name).read_text())["body"]


def test_window_keeps_context_and_last_turns() -> None:
    items = codex.session(8)
    result = window(items, keep=5)
    assert prompts(result.items) == [f"turn {n}: please do step {n}" for n in range(4, 9)]
    assert result.items[:3] == items[:3]
    assert result.turns_in == 8 and result.turns_kept == 5
    assert prompts(result.cut) == [f"turn {n}: please do step {n}" for n in range(1, 4)]


def test_window_keeps_tool_output_with_its_call() -> None:
    items = codex.context_items() + codex.tool_turn("a") + codex.tool_turn("b", n_calls=2)
    items += [codex.text("user", "c")]
    result = window(items, keep=2)
    kinds = [i.get("type") for i in result.items[3:]]
    assert kinds == [
        "message", "reasoning", "function_call", "function_call",
        "function_call_output", "function_call_output", "message", "message",
    ]
    assert all(i.get("type") != "function_call" for i in result.cut[1:2])


def test_window_keeps_a_call_whose_output_lands_in_a_later_turn() -> None:
    turn_a = codex.tool_turn("a")
    call, output = turn_a[2], turn_a[3]
    items = [*codex.context_items(), turn_a[0], turn_a[1], call, codex.text("user", "b"),
             output, codex.text("user", "c")]
    result = window(items, keep=2)
    assert call in result.items and output in result.items


def test_window_leaves_short_history_untouched() -> None:
    items = codex.session(5)
    result = window(items, keep=5)
    assert result.items == items and not result.changed


def test_slack_moves_the_cut_point_in_steps() -> None:
    drops = [turns_to_drop(t, keep=5, slack=4) for t in range(1, 21)]
    assert drops == [0] * 9 + [5] * 5 + [10] * 5 + [15]
    assert [turns_to_drop(t, keep=5) for t in (5, 6, 9)] == [0, 1, 4]


# --- the real Codex captures -----------------------------------------------------------------

def test_resume_request_forwards_context_and_last_five_turns() -> None:
    body = load("03_resume_7turns/0010_POST_v1_responses.json")
    result = window(body["input"], keep=5)
    assert [p.split(":")[0] for p in prompts(result.items)] == [f"turn {n}" for n in range(3, 8)]
    assert result.items[:3] == body["input"][:3]
    assert len(result.items) == len(body["input"]) - len(result.cut)
    assert {i["type"] for i in result.cut} == {"message", "reasoning", "function_call",
                                               "function_call_output"}


def test_inserted_context_messages_are_not_turns() -> None:
    body = load("03b_resume_changed_cwd_sandbox/0001_POST_v1_responses.json")
    items = body["input"]
    assert len(prompts(items)) == 8
    result = window(items, keep=5)
    assert [p.split(":")[0] for p in prompts(result.items)] == [f"turn {n}" for n in range(4, 9)]
    # The context inserted by the resume (new cwd, permissions) is still there, in place.
    tail = result.items[-4:]
    assert message_text(tail[0]).startswith("# AGENTS.md instructions")
    assert tail[1]["role"] == "developer"
    assert "<cwd>/home/dev/project2</cwd>" in message_text(tail[2])


def all_fixture_requests() -> list[Any]:
    """Every captured request under ../shared; without it, one case that skips saying so
    (an empty parameter set would skip with pytest's "got empty parameter set")."""
    found = sorted(str(p.relative_to(SHARED_FIXTURES))
                   for p in SHARED_FIXTURES.glob("*/*_POST_v1_responses.json"))
    if found:
        return found
    reason = f"{SHARED_FIXTURES} is absent: ../shared is not next to this clone (CI has it)"
    return [pytest.param("", marks=pytest.mark.skip(reason=reason), id="no-shared-fixtures")]


@pytest.mark.parametrize("name", all_fixture_requests())
def test_every_captured_request_windows_soundly(name: str) -> None:
    items = load(name)["input"]
    result = window(items, keep=2)
    assert_sound(items, result.items, keep=2)


# --- properties ------------------------------------------------------------------------------

def assert_sound(original: list[dict[str, Any]], kept: list[dict[str, Any]], keep: int) -> None:
    ids = [id(i) for i in original]
    positions = [ids.index(id(i)) for i in kept]
    assert positions == sorted(positions), "order preserved"
    first_turn = next((n for n, i in enumerate(original) if is_turn_start(i)), len(original))
    for n, item in enumerate(original):
        pinned = n < first_turn or item.get("role") in ("developer", "system") or (
            item.get("role") == "user" and not is_turn_start(item))
        if pinned:
            assert any(item is k for k in kept), f"pinned item {n} dropped"
    calls = {i["call_id"] for i in kept if i.get("type", "").endswith("call")}
    outputs = {i["call_id"] for i in kept if i.get("type", "").endswith("call_output")}
    sent_outputs = {i["call_id"] for i in original if i.get("type", "").endswith("call_output")}
    assert outputs <= calls, "no output without its call"
    assert (calls & sent_outputs) <= outputs, "no call without the output the client sent"
    assert len(prompts(kept)) == min(keep, len(prompts(original)))


turn_kinds = st.sampled_from(["text", "tool", "tool2", "context", "developer", "unknown"])


def build(kinds: list[str]) -> list[dict[str, Any]]:
    items = codex.context_items()
    for n, kind in enumerate(kinds):
        if kind == "text":
            items += codex.text_turn(f"p{n}")
        elif kind.startswith("tool"):
            items += codex.tool_turn(f"p{n}", n_calls=2 if kind == "tool2" else 1)
        elif kind == "context":
            items.append(codex.text("user", f"<environment_context>\n<cwd>/d{n}</cwd>"))
        elif kind == "developer":
            items.append(codex.text("developer", f"note {n}"))
        else:
            items.append({"type": "future_item", "payload": n})
    return items


@settings(max_examples=200, deadline=None)
@given(st.lists(turn_kinds, max_size=30), st.integers(1, 8), st.integers(0, 4))
def test_window_properties(kinds: list[str], keep: int, slack: int) -> None:
    items = build(kinds)
    result = window(items, keep, slack)
    if slack == 0:
        assert_sound(items, result.items, keep)
    assert window(result.items, keep, slack).items == result.items, "idempotent"
    kept_ids = {id(i) for i in result.items}
    assert [i for i in items if id(i) not in kept_ids] == result.cut, "nothing lost"
