"""bench/trajectories.py: the replay of agent runs as Codex sessions, and its accounting."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from bench import trajectories as bench
from bench.harness import agent_runs as runs
from bench.harness.anthropic_pricing import MessagesPricingUpstream, answer_events, sse
from bench.harness.claude import ClaudeCompact, load_claude_shape
from bench.harness.codex import (
    SUMMARY_PREFIX,
    AutoCompact,
    is_prompt,
    load_shapes,
    message_text,
    user_message,
)
from bench.harness.pricing import Bill
from bench.harness.serving import serving

pytestmark = pytest.mark.skipif(
    not (runs.TRAJECTORIES.parent / "fixtures" / "codex").is_dir(),
    reason="../shared/fixtures/codex (the Codex request shapes the replay uses) is absent",
)


def write_run(folder: Path, name: str, steps: int, patch_hash: str) -> Path:
    """A mini-swe-agent trajectory: system, task, then command/output pairs, then the patch."""
    messages = [{"role": "system", "content": "You run one shell command per answer."},
                {"role": "user", "content": f"<pr_description>Fix {name} in widgets/core.py"
                 "</pr_description>"}]
    for k in range(steps):
        messages.append({"role": "assistant", "content":
                         f"THOUGHT: look at part {k}.\n\n```bash\ngrep -n render_{name}_{k} "
                         "widgets/core.py\n```"})
        listing = "".join(f"widgets/core.py:{n}: def render_{name}_{k}_{n}(self): ...\n"
                          for n in range(60))
        messages.append({"role": "user", "content":
                         f"<returncode>0</returncode>\n<output>\n{listing}</output>"})
    submit = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached"
    messages.append({"role": "assistant", "content": f"THOUGHT: done.\n\n```bash\n{submit}\n```"})
    messages.append({"role": "user", "content": f"diff --git a/widgets/{name}.py b/widgets/"
                     f"{name}.py\nindex {patch_hash} 100644\n--- a/widgets/{name}.py\n"})
    path = folder / f"{name}.traj.json"
    path.write_text(json.dumps({"instance_id": name, "messages": messages}))
    return path


@pytest.fixture
def tasks(tmp_path: Path) -> list[runs.Task]:
    return [runs.load_task(write_run(tmp_path, name, 6, h)) for name, h in
            (("alpha", "1111111aaa..2222222bbb"), ("beta", "3333333ccc..4444444ddd"))]


def test_a_run_becomes_codex_steps_with_exec_outputs(tasks: list[runs.Task]) -> None:
    task = tasks[0]
    assert len(task.steps) == 7  # six commands and the submission
    assert task.steps[0].command == "grep -n render_alpha_0 widgets/core.py"
    assert task.steps[0].thought == "THOUGHT: look at part 0."
    assert "Process exited with code 0\n" in task.steps[0].output
    assert "<returncode>" not in task.steps[0].output
    assert task.steps[0].encrypted  # every reasoning item carries encrypted content
    assert "index 1111111aaa..2222222bbb" in task.submitted


def test_a_later_task_asks_for_an_earlier_tasks_patch(tasks: list[runs.Task]) -> None:
    session = runs.build_session(tasks)
    assert session.kind == "2 tasks"
    assert [(a.task, a.source, a.value) for a in session.asks] == [
        (1, 0, "1111111aaa..2222222bbb")]
    assert session.prompt(1).startswith("Before you start")
    assert runs.build_session(tasks).thread == session.thread  # stable across processes


async def test_direct_replay_equals_itself_and_reaches_the_ask(
    tasks: list[runs.Task], tmp_path: Path
) -> None:
    session, shapes = runs.build_session(tasks), load_shapes()
    a = await bench.run_one(bench.DIRECT, session, shapes, tmp_path / "a", limit=10**9)
    b = await bench.run_one(bench.DIRECT, session, shapes, tmp_path / "b", limit=10**9)
    assert [(x.input_tokens, x.cached_tokens) for x in a.bills] == [
        (x.input_tokens, x.cached_tokens) for x in b.bills]
    assert len(a.bills) == sum(len(t.steps) + 1 for t in tasks)  # one more: the answer
    assert a.compactions == 0 and not any(r.cut for r in a.records)
    assert a.asks == {1: True}  # nothing compacted: the earlier patch is in the history
    assert a.names_seen and a.names_visible == a.names_seen
    assert a.bills[-1].cached_tokens > 0.8 * a.bills[-1].input_tokens  # append-only: warm


async def compacting(tasks: list[runs.Task], shape: Any, tmp_path: Path
                     ) -> tuple[bench.Run, bench.Run, int]:
    """The session direct without compaction, and with a limit the sixth request passes;
    checked: the first compaction comes after the request that passed it, the next request
    is smaller, every step is still replayed. Returns both runs and the first compaction."""
    session = runs.build_session(tasks)
    whole = await bench.run_one(bench.DIRECT, session, shape, tmp_path / "w", limit=10**9)
    limit = whole.bills[4].input_tokens  # passed by the sixth request
    run = await bench.run_one(bench.DIRECT, session, shape, tmp_path / "c", limit=limit)
    kinds = [r.kind for r in run.records]
    first = kinds.index("compaction")
    assert run.bills[first - 1].input_tokens > limit
    assert run.compactions == kinds.count("compaction") >= 1
    assert run.bills[first + 1].input_tokens < run.bills[first - 1].input_tokens
    assert len(run.bills) == len(whole.bills) + run.compactions  # every step still replayed
    return whole, run, first


async def test_the_client_compacts_when_the_reported_input_passes_its_limit(
    tasks: list[runs.Task], tmp_path: Path
) -> None:
    whole, run, first = await compacting(tasks, load_shapes(), tmp_path)
    assert whole.bills[4].input_tokens >= run.bills[first - 2].input_tokens
    assert max(b.input_tokens for b in run.bills) < max(b.input_tokens for b in whole.bills)


def test_a_compacted_history_keeps_context_prompts_and_summary() -> None:
    context = [{"type": "message", "role": "developer", "content": [
        {"type": "input_text", "text": "system"}]}, user_message("<environment_context>", "e")]
    history = [*context, user_message("task one", "p1"), {"type": "reasoning", "id": "r"},
               user_message("task two", "p2"), {"type": "function_call_output", "call_id": "c"}]
    compact = AutoCompact(limit=10)
    compact.seen(11)
    assert compact.due
    after = compact.compacted(history, 2, "SUMMARY: x", lambda text: len(text.split()), "s")
    assert [message_text(i) for i in after] == [
        "system", "task one", "<environment_context>", "task two", SUMMARY_PREFIX + "SUMMARY: x"]
    assert [message_text(i) for i in after if is_prompt(i)] == ["task one", "task two"]
    assert not compact.due and compact.count == 1


async def test_through_the_proxy_every_step_is_replayed_and_billed(
    tasks: list[runs.Task], tmp_path: Path
) -> None:
    session, shapes = runs.build_session(tasks), load_shapes()
    direct = await bench.run_one(bench.DIRECT, session, shapes, tmp_path / "d")
    proxied = await bench.run_one(bench.strategy("p:MEMORY_ENABLED=false"), session, shapes,
                                  tmp_path / "p")  # run_one checks usage seen == billed
    turns = [r for r in proxied.records if r.kind == "turn"]
    assert len(turns) == len([r for r in direct.records if r.kind == "turn"])


def test_a_strategy_naming_no_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="no setting"):
        bench.strategy("bad:NOT_A_SETTING=1")


@pytest.mark.skipif(not runs.TRAJECTORIES.is_dir(),
                    reason="../shared/trajectories (the real runs) is absent")
def test_the_shared_runs_load_as_tasks() -> None:
    paths = sorted(runs.TRAJECTORIES.glob("*.traj.json"))
    tasks = [runs.load_task(p) for p in bench.select(paths, False, 10)]
    repos = [runs.repo_of(t.name) for t in tasks]
    assert {r: repos.count(r) for r in repos} == {
        "django": 10, "matplotlib": 10, "scikit-learn": 10}  # a spread of each repository
    held_out = bench.select(paths, False, 10, held_out=True)
    assert len(held_out) == len(paths) - 30 and not {p.name for p in held_out} & {
        t.name + ".traj.json" for t in tasks}
    assert all(t.steps and t.steps[0].command for t in tasks)
    assert runs.build_session(tasks[:5]).asks  # at least one earlier patch can be asked for


def test_every_run_of_tasks_gets_a_session_id_of_its_own() -> None:
    # Two tasks once shared one (a weak checksum), and so one memory store in the replay.
    names = [f"django__django-{n}" for n in range(10000, 16000)]
    assert len({runs.stable_thread([n]) for n in names}) == len(names)
    assert runs.stable_thread(["django__django-11149"]) != runs.stable_thread(
        ["django__django-15380"])
    assert runs.stable_thread(["a", "b"]) == runs.stable_thread(["a", "b"])


@pytest.mark.parametrize("write", [False, True])
def test_no_write_leaves_the_results_and_the_figure_alone(
    write: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    touched: list[str] = []
    monkeypatch.setattr(bench, "main_async", lambda args, tasks: asyncio.sleep(0, []))
    monkeypatch.setattr(bench, "report", lambda *a: "the table")
    monkeypatch.setattr(bench, "plot", lambda runs, path: touched.append(f"plot {path.name}"))
    monkeypatch.setattr(bench, "write_block", lambda *a: touched.append("results"))
    bench.main(["--runs", str(tmp_path), *([] if write else ["--no-write"])])
    assert touched == ([f"plot {bench.PNG.name}", "results"] if write else [])


@pytest.mark.parametrize("plot", [None, Path("trajectories.png")])
def test_the_report_names_the_plot_only_when_one_is_made(plot: Path | None) -> None:
    args = argparse.Namespace(plot=plot, all=False, held_out=False, scope="user", ttl=600.0,
                              limit=220_000)
    text = bench.report([], [runs.Task("t", "system", "prompt", ())], args, 1.0, "cmd")
    assert ("Plot: `bench/trajectories.png`." in text) == (plot is not None)


# --- the same runs as Claude Code sessions (--protocol messages) ------------------------------


def marks_of(body: dict[str, Any]) -> list[str]:
    """Where a Messages body carries cache marks: ``system[i]``, ``messages[i][j]``."""
    found = [f"system[{i}]" for i, b in enumerate(body["system"]) if "cache_control" in b]
    for i, m in enumerate(body["messages"]):
        if isinstance(m["content"], list):
            found += [f"messages[{i}][{j}]" for j, b in enumerate(m["content"])
                      if "cache_control" in b]
    return found


def test_a_claude_code_request_carries_its_marks_and_blocks(tasks: list[runs.Task]) -> None:
    shape, task = load_claude_shape(), tasks[0]
    history = shape.context("You run one shell command per answer.")
    shape.add_prompt(history, "fix alpha", 0)
    history += shape.read_answer(b"".join(
        sse(e) for e in answer_events(shape.step(task, 0, 0), Bill("", 10, 0, 1, 0.0), "m")))[0]
    history.append(shape.call_output(0, 0, task.steps[0].output))
    raw, headers = shape.request(history, "019b7a00-0001-7000-8000-000000000001", "t", "turn")
    body = orjson.loads(raw)
    assert headers["X-Claude-Code-Session-Id"] == "019b7a00-0001-7000-8000-000000000001"
    assert marks_of(body) == ["system[1]", "system[2]", "messages[3][0]"]
    first, environment, answer, result = body["messages"]
    assert [b["text"].startswith("<system-reminder>") for b in first["content"]] == [
        True, True, False]  # Claude Code's reminder, the run's system as CLAUDE.md, the prompt
    assert environment["role"] == "system" and isinstance(environment["content"], str)
    assert [b["type"] for b in answer["content"]] == ["thinking", "tool_use"]
    assert answer["content"][1]["input"]["command"] == task.steps[0].command
    assert result["content"][0]["type"] == "tool_result"
    assert result["content"][0]["tool_use_id"] == answer["content"][1]["id"]
    assert "Chunk ID" not in result["content"][0]["content"]  # Bash's output, not Codex's


async def test_a_direct_claude_code_session_reads_what_its_newest_mark_wrote(
    tasks: list[runs.Task], tmp_path: Path
) -> None:
    session = runs.build_session(tasks)
    run = await bench.run_one(bench.DIRECT, session, load_claude_shape(), tmp_path / "d",
                              ttl_s=300, limit=10**9)
    assert len(run.bills) == sum(len(t.steps) + 1 for t in tasks)
    assert run.compactions == 0 and not any(r.cut for r in run.records)
    assert run.asks == {1: True}
    for before, after in itertools.pairwise(run.bills):
        # Each request's newest mark wrote its whole prompt; the next one reads all of it
        # (its mark is a few blocks on) and writes what it added.
        assert after.cached_tokens == before.input_tokens
        assert after.written_tokens == after.input_tokens - before.input_tokens


async def test_a_claude_code_session_through_the_proxy_is_billed_as_seen(
    tasks: list[runs.Task], tmp_path: Path
) -> None:
    session, shape = runs.build_session(tasks), load_claude_shape()
    direct = await bench.run_one(bench.DIRECT, session, shape, tmp_path / "d", ttl_s=300)
    proxied = await bench.run_one(bench.strategy("p:MEMORY_ENABLED=false"), session, shape,
                                  tmp_path / "p", ttl_s=300)  # checks usage seen == billed
    assert [r.kind for r in proxied.records if r.kind != "side"] == [
        r.kind for r in direct.records]


async def test_claude_code_compacts_into_its_reminders_summary_and_prompts(
    tasks: list[runs.Task], tmp_path: Path
) -> None:
    shape = load_claude_shape()
    _, run, first = await compacting(tasks, shape, tmp_path)
    assert run.bills[first].cached_tokens > 0  # the compaction request keeps the prefix
    history = ClaudeCompact().compacted(
        [*shape.context("system"), {"role": "user", "content": "task two"},
         {"role": "assistant", "content": [{"type": "text", "text": "done"}]}],
        2, "SUMMARY: x", lambda text: len(text.split()), "s")
    words = history[0]["content"][-1]["text"]
    assert "SUMMARY: x" in words and "<user_message>\ntask two\n</user_message>" in words
    assert history[1] == shape.environment


async def test_the_fake_anthropic_refuses_a_fifth_mark() -> None:
    upstream = MessagesPricingUpstream()
    mark = {"type": "ephemeral"}
    body = {"model": "m", "stream": True, "system": [
        {"type": "text", "text": f"part {n}", "cache_control": mark} for n in range(5)],
        "messages": [{"role": "user", "content": "hi"}]}
    async with serving(upstream.app()) as url, aiohttp.ClientSession() as http, http.post(
            url + "/v1/messages", json=body) as resp:
        error = await resp.json()
    assert resp.status == 400 and error["error"]["type"] == "invalid_request_error"
    assert upstream.bills == []


@pytest.mark.parametrize(("protocol", "png", "block"), [
    ("messages", bench.PNG_MESSAGES, bench.BLOCK_MESSAGES),
    ("chat", bench.PNG_CHAT, bench.BLOCK_CHAT)])
def test_each_client_shape_has_its_own_block_figure_and_client_defaults(
    protocol: str, png: Path, block: tuple[str, str, str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    touched: list[str] = []
    monkeypatch.setattr(bench, "main_async", lambda args, tasks: asyncio.sleep(0, []))
    monkeypatch.setattr(bench, "report", lambda *a: "the table")
    monkeypatch.setattr(bench, "plot", lambda runs, path: touched.append(path.name))
    monkeypatch.setattr(bench, "write_block", lambda *a: touched.append(a[1]))
    bench.main(["--runs", str(tmp_path), "--protocol", protocol])
    assert touched == [png.name, block[1]]  # not Codex's
    claude, codex = bench.parse_args(["--protocol", "messages"]), bench.parse_args([])
    assert (claude.ttl, claude.limit) == (300, 167_000)  # Anthropic's TTL, Claude Code's limit
    assert (codex.ttl, codex.limit) == (600, 220_000)


async def test_after_the_proxy_cuts_a_claude_code_session_the_system_is_still_read(
    tasks: list[runs.Task], tmp_path: Path
) -> None:
    session, shape = runs.build_session(tasks), load_claude_shape()
    cutting = bench.strategy("k1:WINDOW_POLICY=fixed,KEEP_TURNS=1,TRIM_SLACK=0,"
                             "MEMORY_ENABLED=false")
    run = await bench.run_one(cutting, session, shape, tmp_path / "k", ttl_s=300)
    turns = [(r, b) for r, b in zip(run.records, run.bills, strict=True) if r.kind == "turn"]
    cut = [n for n, (r, _) in enumerate(turns) if r.cut]
    assert cut  # the second task's first request forwards it alone
    first_bill = turns[0][1]
    for n in cut:
        bill = turns[n][1]
        # The marks the proxy leaves after a cut keep the tools and system read from the
        # cache (what the first request wrote at Claude Code's system marks) ...
        assert bill.cached_tokens >= 1024 and bill.cached_tokens < first_bill.input_tokens
        # ... and the next request reads all of the cut one.
        assert turns[n + 1][1].cached_tokens == bill.input_tokens
