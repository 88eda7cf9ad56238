"""bench/trajectories.py --protocol chat: the agent runs replayed as Chat Completions sessions
(bench/harness/chat.py) against the fake Chat upstream priced by OpenAI's rules
(bench/harness/chat_pricing.py), on a tiny slice of made-up runs."""

from __future__ import annotations

import itertools
from pathlib import Path

import aiohttp
import orjson
import pytest

from bench import trajectories as bench
from bench.harness import agent_runs as runs
from bench.harness.chat import ChatCompact, load_chat_shape, read_answer
from bench.harness.chat_pricing import ChatPricingUpstream, chunks
from bench.harness.codex import COMPACTION_PROMPT, SUMMARY_PREFIX
from bench.harness.pricing import BREAKPOINT_MODEL, Bill, Rules
from bench.harness.serving import serving
from tests.test_trajectories_bench import compacting, write_run

pytestmark = pytest.mark.skipif(
    not (runs.TRAJECTORIES.parent / "fixtures" / "codex").is_dir(),
    reason="../shared/fixtures/codex (the Codex request shapes the replay uses) is absent",
)
THREAD = "019b7a00-0001-7000-8000-000000000001"


@pytest.fixture
def tasks(tmp_path: Path) -> list[runs.Task]:
    return [runs.load_task(write_run(tmp_path, name, 6, h)) for name, h in
            (("alpha", "1111111aaa..2222222bbb"), ("beta", "3333333ccc..4444444ddd"))]


def test_a_chat_request_carries_system_prompt_call_and_tool_message(
    tasks: list[runs.Task],
) -> None:
    shape, task = load_chat_shape(), tasks[0]
    history = shape.context("You run one shell command per answer.")
    shape.add_prompt(history, "fix alpha", 0)
    stream = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks(
        shape.step(task, 0, 0)[0], Bill("", 10, 0, 1, 0.0), "m", True)) + b"data: [DONE]\n\n"
    answer, usage = read_answer(stream)
    history += answer
    history.append(shape.call_output(0, 0, task.steps[0].output))
    raw, headers = shape.request(history, THREAD, "t", "turn")
    body = orjson.loads(raw)
    assert usage == {"input": 10, "cached": 0}
    assert body["prompt_cache_key"] == THREAD and headers["session-id"] == THREAD
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert {t["type"] for t in body["tools"]} == {"function"}
    assert "exec_command" in [t["function"]["name"] for t in body["tools"]]
    roles = [m["role"] for m in body["messages"]]
    assert roles[0] == "system" and roles[-3:] == ["user", "assistant", "tool"]
    assert "You run one shell command per answer." in body["messages"][0]["content"]
    assert "Codex" in body["messages"][0]["content"]  # Codex's own instructions first
    assert all("type" not in m for m in body["messages"])  # Chat messages, not Responses items
    call, result = body["messages"][-2], body["messages"][-1]
    assert call["content"] == task.steps[0].thought
    assert orjson.loads(call["tool_calls"][0]["function"]["arguments"])["cmd"] == (
        task.steps[0].command)
    assert result["tool_call_id"] == call["tool_calls"][0]["id"]
    assert result["content"] == task.steps[0].output
    compaction = orjson.loads(shape.request(shape.compaction_input(history), THREAD, "t",
                                            "compaction")[0])
    assert "tools" not in compaction and compaction["messages"][-1]["content"] == (
        COMPACTION_PROMPT)


@pytest.mark.parametrize("rules", ["prefix", "breakpoint"])
async def test_a_direct_chat_session_reads_its_previous_prompt(
    rules: Rules, tasks: list[runs.Task], tmp_path: Path
) -> None:
    session = runs.build_session(tasks)
    run = await bench.run_one(bench.DIRECT, session, load_chat_shape(rules=rules),
                              tmp_path / "d", limit=10**9, rules=rules)
    assert len(run.bills) == sum(len(t.steps) + 1 for t in tasks)
    assert run.compactions == 0 and not any(r.cut for r in run.records)
    assert run.asks == {1: True}
    assert run.names_seen and run.names_visible == run.names_seen
    for before, after in itertools.pairwise(run.bills):
        # Append-only: each prompt extends the last, read back whole (prefix rules: in
        # 128-token blocks; breakpoint rules: stored at the end of each prompt, no marks).
        shared = before.input_tokens
        assert after.cached_tokens == (shared // 128 * 128 if rules == "prefix" else shared)
        assert after.written_tokens == (0 if rules == "prefix"
                                        else after.input_tokens - shared)


async def test_a_chat_session_through_the_proxy_is_billed_as_seen_and_keeps_calls_paired(
    tasks: list[runs.Task], tmp_path: Path
) -> None:
    session, shape = runs.build_session(tasks), load_chat_shape()
    direct = await bench.run_one(bench.DIRECT, session, shape, tmp_path / "d")
    cutting = bench.strategy("k1:WINDOW_POLICY=fixed,KEEP_TURNS=1,TRIM_SLACK=0,"
                             "MEMORY_ENABLED=false")
    # run_one checks usage seen == billed; the fake refuses unpaired calls with HTTP 400.
    run = await bench.run_one(cutting, session, shape, tmp_path / "k")
    turns = [(r, b) for r, b in zip(run.records, run.bills, strict=True) if r.kind == "turn"]
    assert len(turns) == len([r for r in direct.records if r.kind == "turn"])
    cut = [n for n, (r, _) in enumerate(turns) if r.cut]
    assert cut  # the second task's first request forwards it alone
    for n in cut:
        bill = turns[n][1]
        assert bill.input_tokens < direct.bills[n].input_tokens
        assert turns[n + 1][1].cached_tokens == bill.input_tokens // 128 * 128


async def test_the_fake_chat_upstream_refuses_a_tool_message_without_its_call() -> None:
    upstream = ChatPricingUpstream()
    body = {"model": "m", "stream": True, "messages": [
        {"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "call_1", "content": "out"}]}
    async with serving(upstream.app()) as url, aiohttp.ClientSession() as http, http.post(
            url + "/v1/chat/completions", json=body) as resp:
        error = await resp.json()
    assert resp.status == 400 and error["error"]["type"] == "invalid_request_error"
    assert upstream.bills == []


async def test_the_chat_client_compacts_as_codex_does(
    tasks: list[runs.Task], tmp_path: Path
) -> None:
    shape = load_chat_shape()
    _, run, first = await compacting(tasks, shape, tmp_path)
    assert run.bills[first].cached_tokens == 0  # no tools: its prefix is not the turns'
    context = shape.context("system")
    history = ChatCompact().compacted(
        [*context, {"role": "user", "content": "task one"},
         {"role": "assistant", "content": "done"}, {"role": "user", "content": "task two"}],
        len(context), "SUMMARY: x", lambda text: len(text.split()), "s")
    assert history == [context[0], {"role": "user", "content": "task one"}, *context[1:],
                       {"role": "user", "content": "task two"},
                       {"role": "user", "content": SUMMARY_PREFIX + "SUMMARY: x"}]


def test_the_chat_shape_takes_codex_defaults_and_the_breakpoint_model() -> None:
    args = bench.parse_args(["--protocol", "chat", "--cache-rules", "breakpoint"])
    assert (args.ttl, args.limit, args.cache_rules) == (600, 220_000, "breakpoint")  # Codex's
    assert load_chat_shape(rules="breakpoint").body["model"] == BREAKPOINT_MODEL
