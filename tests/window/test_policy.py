"""The cost policy: cut where a cut pays, never split a turn, never move an earlier cut."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from ctxproxy.config import load_settings
from ctxproxy.request import Exchange, History, is_turn_start, message_text
from ctxproxy.request.protocol import MESSAGES
from ctxproxy.window.policy import CostPolicy, Shape
from ctxproxy.window.step import WindowStep
from tests.fakes import claude_code as cc
from tests.fakes import codex

Item = dict[str, Any]
OUTPUT = "x" * 4000  # about 1,000 tokens a tool output


def agent_task(n: int, calls: int = 30) -> list[Item]:
    """One task of a coding agent: a prompt, then ``calls`` model calls with a command each."""
    items = [codex.text("user", f"task {n}: fix the bug")]
    for c in range(calls):
        call = f"call_{n}_{c}"
        items += [
            {"type": "reasoning", "id": f"rs_{n}_{c}", "summary": [], "encrypted_content": "e"},
            {"type": "function_call", "name": "exec_command", "call_id": call,
             "arguments": json.dumps({"cmd": f"grep -n thing{c} src/"})},
            {"type": "function_call_output", "call_id": call, "output": OUTPUT},
        ]
    items.append(codex.text("assistant", f"Fixed task {n}."))
    return items


def chat_turn(n: int) -> list[Item]:
    """A chat-like turn: a prompt, one command, the answer (two model calls)."""
    return codex.tool_turn(f"turn {n}: small step", output="y" * 2000)


def session(turns: list[list[Item]], prompt: str = "next") -> list[Item]:
    items = codex.context_items()
    for turn in turns:
        items += turn
    return [*items, codex.text("user", prompt)]


def first_kept(policy: CostPolicy, items: list[Item], outside: int = 5000) -> int:
    """With ``outside`` tokens of instructions and tools (Codex sends about 5-8k)."""
    return policy.first_kept(History(items), outside)[0]


def test_a_history_shows_its_turn_sizes_and_model_calls() -> None:
    history = History(session([agent_task(1, calls=4), chat_turn(2)]))
    shape = Shape.of(history)
    assert shape.calls == [5, 2, 0]  # 4 commands and the answer; a command and the answer
    assert shape.tokens[0] > 4 * 1000 > shape.tokens[1] > shape.tokens[2]


def test_a_single_turn_is_never_cut_however_long() -> None:
    policy = CostPolicy(max_turns=5, max_tokens=10_000)
    items = [*codex.context_items(), *agent_task(1, calls=60)]
    assert first_kept(policy, items) == 0


def test_agent_sessions_cut_the_finished_tasks_as_soon_as_it_pays() -> None:
    # Each task is ~30 model calls over ~30k tokens: carrying a finished task costs more in
    # cached reads than reading the kept turns cold once.
    policy = CostPolicy(max_turns=5, min_turns=2)
    tasks = [agent_task(n) for n in range(1, 4)]
    assert first_kept(policy, session(tasks[:1])) == 0  # two turns: nothing may be cut yet
    assert first_kept(policy, session(tasks[:2])) == 1  # task 1 goes, task 2 stays
    assert first_kept(policy, session(tasks)) == 2


def test_chat_sessions_wait_until_the_window_is_full_then_cut_deep() -> None:
    # Two model calls per small turn: a cut does not pay back the prefix it makes cold.
    policy = CostPolicy(max_turns=5, min_turns=2)
    turns = [chat_turn(n) for n in range(1, 12)]
    cuts = [first_kept(policy, session(turns[:n])) for n in range(0, 11)]
    assert cuts[:5] == [0] * 5  # up to five turns forwarded: no cut
    assert cuts[5] >= 2  # at the sixth, a cut deep enough to last several turns
    moves = sum(a != b for a, b in itertools.pairwise(cuts))
    assert moves <= 3  # not on every turn


def test_the_ceiling_cuts_whole_older_turns_but_never_the_newest() -> None:
    policy = CostPolicy(max_turns=10, min_turns=3, max_tokens=50_000)
    tasks = [agent_task(n, calls=12) for n in range(1, 5)]  # ~12k tokens each
    items = [*codex.context_items(), *[i for t in tasks for i in t], *agent_task(5, calls=45)]
    first = first_kept(policy, items)
    history = History(items)
    kept = history.keep_from(first).items
    assert len(json.dumps(codex.request(kept))) // 4 <= 50_000 or first == history.turns - 1
    assert first <= history.turns - 1  # the newest turn stays, whatever its size
    alone = [*codex.context_items(), *agent_task(1, calls=80)]
    assert first_kept(policy, alone) == 0


def test_a_cut_that_must_happen_leaves_the_most_turns_it_may() -> None:
    # min_turns == max_turns: the fixed window, one turn cut at a time.
    policy = CostPolicy(max_turns=2, min_turns=2)
    turns = [chat_turn(n) for n in range(1, 6)]
    assert [first_kept(policy, session(turns[:n])) for n in range(6)] == [0, 0, 1, 2, 3, 4]


# --- appending never moves an earlier cut --------------------------------------------------

shapes = st.lists(st.tuples(st.booleans(), st.integers(1, 8), st.integers(0, 6000)),
                  min_size=1, max_size=9)


def requests_of(spec: list[tuple[bool, int, int]]) -> list[list[Item]]:
    """Every request a client sends over the session: the history after each model call."""
    history = codex.context_items()
    out = []
    for n, (agent, calls, size) in enumerate(spec):
        history = [*history, codex.text("user", f"prompt {n}")]
        out.append(history)
        for c in range(calls if agent else 1):
            call = f"c{n}_{c}"
            history = [*history,
                       {"type": "function_call", "name": "exec_command", "call_id": call,
                        "arguments": "{}"},
                       {"type": "function_call_output", "call_id": call, "output": "z" * size}]
            out.append(history)
        history = [*history, codex.text("assistant", f"answer {n}")]
    return out


@settings(max_examples=60, deadline=None)
@given(shapes, st.integers(1, 6), st.integers(1, 6), st.sampled_from([0, 8_000, 30_000]))
def test_between_cuts_each_request_extends_the_one_before(
    spec: list[tuple[bool, int, int]], max_turns: int, min_turns: int, ceiling: int
) -> None:
    policy = CostPolicy(max_turns=max_turns, min_turns=min(min_turns, max_turns),
                        max_tokens=ceiling)
    previous: list[Item] | None = None
    previous_first = 0
    for items in requests_of(spec):
        history = History(items)
        first = first_kept(policy, items)
        assert first >= previous_first  # a cut never moves back
        assert first <= max(history.turns - 1, 0)  # the newest turn always goes
        forwarded = history.keep_from(first).items
        prompts = [message_text(i) for i in forwarded if is_turn_start(i)]
        assert len(prompts) <= max_turns
        if previous is not None and first == previous_first:
            assert forwarded[: len(previous)] == previous  # append-only between cuts
        previous, previous_first = forwarded, first


def test_a_breakpoint_model_cuts_where_a_large_context_would_make_a_cut_cold() -> None:
    # Short agent tasks behind a large context (instructions, tools): under prefix rules a
    # cut rewrites the context, so it does not pay; with the context end marked it does.
    items = session([agent_task(n, calls=5) for n in range(1, 4)])
    prefix_rules = CostPolicy(max_turns=5, min_turns=1, max_tokens=120_000)
    breakpoints = replace(prefix_rules, write=1.25, breakpoints=True, digest_tokens=4000,
                          standing_tokens=1200)
    assert first_kept(prefix_rules, items, outside=60_000) == 0
    assert first_kept(breakpoints, items, outside=60_000) == 3
    # A small context: both cut the finished tasks.
    assert first_kept(prefix_rules, items) == first_kept(breakpoints, items) == 3


def test_the_window_step_takes_the_policy_of_the_requests_model() -> None:
    conf = load_settings(env={}, memory_enabled=False)
    step = WindowStep.from_settings(conf)
    items = session([agent_task(n, calls=5) for n in range(1, 4)])
    big = "Follow the house rules. " * 10_000  # about 60k tokens of instructions
    cuts = {}
    for model in ("gpt-5.5", "gpt-6.1-sol"):
        body = orjson.dumps(codex.request(items, model=model, instructions=big))
        ex = Exchange.parse(body, CIMultiDictProxy(CIMultiDict()), conf)
        cuts[model] = step.cut(ex)[0]
    assert cuts == {"gpt-5.5": 0, "gpt-6.1-sol": 3}


def test_a_context_after_the_pinned_blocks_is_priced_as_written_again_at_each_cut() -> None:
    # Anthropic Messages: the digest and the standing memory end ``system``, and the client's
    # context (Claude Code's reminders) opens ``messages`` after them, so a cut writes it
    # again; only what is outside the input (system, tools) stays warm.
    big = {"type": "message", "role": "developer",
           "content": [{"type": "input_text", "text": "House rules. " * 20_000}]}  # ~65k tokens
    items = [big, *session([agent_task(n, calls=5) for n in range(1, 4)])]
    breakpoints = CostPolicy(max_turns=5, min_turns=1, max_tokens=200_000, write=1.25,
                             breakpoints=True, digest_tokens=4000, standing_tokens=1200)
    assert first_kept(breakpoints, items) == 3
    assert first_kept(replace(breakpoints, head_cold=True), items) == 0
    # With no block before it, a cut leaves the context as it was: warm.
    assert first_kept(replace(breakpoints, head_cold=True, digest_tokens=0, standing_tokens=0),
                      items) == 3


def test_the_window_step_prices_a_messages_cut_with_its_context_written_again() -> None:
    conf = load_settings(env={}, memory_enabled=False, keep_turns=5, keep_min_turns=1)
    step = WindowStep.from_settings(conf)
    first = cc.first_messages("start")
    reminder = first[0]["content"][0]
    big = {**reminder, "text": reminder["text"] + "House rules. " * 20_000}
    messages = [{**first[0], "content": [big, first[0]["content"][1]]}, first[1],
                {"role": "assistant", "content": "ok"}]
    for n in range(2, 5):
        messages += cc.tool_turn(f"[tool] turn {n}", n)
    messages.append({"role": "user", "content": "next"})

    def cut(body: dict[str, Any]) -> int:
        ex = Exchange.parse(orjson.dumps(body), CIMultiDictProxy(CIMultiDict()), conf,
                            protocol=MESSAGES)
        return step.cut(ex)[0]

    small = [first[0], *messages[1:]]
    assert cut(cc.request(small, "s")) > 0  # a small context: the finished turns go
    assert cut(cc.request(messages, "s")) == 0  # Claude Code's large reminder: kept whole
