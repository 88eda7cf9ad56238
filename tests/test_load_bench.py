"""bench/load.py's threads and fake upstream: answered as Codex would be, sent back as it is."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.typedefs import Handler

from bench import load
from bench.harness import load_client
from bench.harness import session as bench_session
from bench.harness.agent_runs import Step, Task
from bench.harness.load_client import Run, Script, Thread, answer_events_of, answer_stream
from bench.harness.upstream import ANSWER_HEADER, create_app


def _completed_output(stream: bytes) -> list[dict[str, object]]:
    last = [event for event in stream.split(b"\n\n") if event][-1]
    payload = orjson.loads(last.split(b"data: ", 1)[1])
    assert payload["type"] == "response.completed"
    return list(payload["response"]["output"])


def _thread(answers: str, script: Script | None = None) -> Thread:
    return Thread(script or Script.make(5, 8), 0, bench_session.context_items(random.Random(3)),
                  bench_session.tools(), 0.0, rng=random.Random(1), answers=answers)


def _resends_each_answer(requests: list[tuple[bytes, dict[str, str]]]) -> int:
    """Checks each request holds the one before it and its answer; the calls answered."""
    calls = 0
    for (body, headers), (after, _) in itertools.pairwise(requests):
        sent, then = orjson.loads(body)["input"], orjson.loads(after)["input"]
        answer = _completed_output(answer_stream(headers[ANSWER_HEADER]))
        assert then[: len(sent) + len(answer)] == sent + answer
        calls += sum(str(item["type"]).endswith("call") for item in answer)
    return calls


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Task]]:
    """Three small agent runs in place of ../shared/trajectories."""
    tasks = [Task(f"task-{n}", "You are a coding agent.", f"Fix bug {n} in parser.py.", tuple(
        Step(f"Look at step {k}.", f"grep -n case{k} parser.py", f"{k}: case{k} = {n}", "e" * 8)
        for k in range(n + 1))) for n in range(3)]
    monkeypatch.setattr(load_client, "agent_tasks", lambda: tasks)
    for cached in (Script.make, answer_events_of, answer_stream):
        cached.cache_clear()
    yield tasks
    for cached in (Script.make, answer_events_of, answer_stream):
        cached.cache_clear()


def test_agent_threads_are_the_runs_in_a_row_a_request_per_model_call(runs: list[Task]) -> None:
    script = Script.make(1, 2, "agent")
    requests = list(_thread("script", script).requests())
    # Script 1 of 2 tasks: runs 2 and 0; a request for the prompt and one per command output.
    assert len(requests) == (len(runs[2].steps) + 1) + (len(runs[0].steps) + 1)
    assert _resends_each_answer(requests) == len(runs[2].steps) + len(runs[0].steps)
    prompts = [item["content"][0]["text"] for turn in script.turns for item in turn
               if item.get("role") == "user"]
    assert prompts == [runs[2].prompt, runs[0].prompt]
    outputs = [item["output"] for item in script.turns[0] if item["type"].endswith("output")]
    assert outputs == [step.output for step in runs[2].steps]


def test_each_request_sends_back_what_the_upstream_answered_a_request_per_tool_round() -> None:
    requests = list(_thread("script").requests())
    # The next request holds the history, the answer as it came, then (after calls) their
    # outputs: the proxy stores a turn once, from the answer, under the key the resent turn
    # gives it.
    calls = _resends_each_answer(requests)
    turns = Script.make(5, 8).turns
    rounds = sum(1 for turn in turns for n in range(1, len(turn))
                 if turn[n - 1]["type"].endswith("call_output")
                 and not turn[n]["type"].endswith("call_output"))
    assert len(requests) == len(turns) + rounds and calls > 0


def test_the_fixed_answers_keep_the_old_shape_two_requests_a_turn_at_most() -> None:
    script, fixed = list(_thread("script").requests()), list(_thread("fixed").requests())
    assert len(fixed) < len(script)
    assert all(ANSWER_HEADER not in headers for _, headers in fixed)


async def test_the_fake_upstream_streams_the_answer_the_header_names() -> None:
    body, headers = next(iter(_thread("script").requests()))
    async with TestClient(TestServer(create_app())) as client:
        named = await client.post("/v1/responses", data=body, headers=headers)
        canned = await client.post("/v1/responses", data=body)
        assert await named.read() == answer_stream(headers[ANSWER_HEADER])
        assert await canned.read() != await named.read()


def test_the_loop_lag_quantiles_are_the_measured_runs_own() -> None:
    bucket = "ctxproxy_event_loop_lag_seconds_bucket"
    before = {f"{bucket}[0.005]": 90.0, f"{bucket}[0.05]": 100.0, f"{bucket}[+Inf]": 100.0}
    after = {f"{bucket}[0.005]": 100.0, f"{bucket}[0.05]": 150.0, f"{bucket}[+Inf]": 200.0}
    # Of the 100 samples since, 10 within 5 ms, 50 within 50 ms, the rest above.
    assert load._lag(after, before) == ("50 ms", "+Inf")
    assert load._lag(after, {}) == ("5 ms", "+Inf")  # the warm-up's samples would count
    assert load._lag(before, before) is None


def test_the_convoy_bench_reports_every_kind_of_work() -> None:
    from bench import gil_convoy

    rows = gil_convoy.measure(0.01, 1)
    assert [name for name, _, _ in rows] == list(gil_convoy.kinds())
    assert rows[0][1][0] > 0  # beside a sleeping thread the loop makes its round trips
    assert "| nothing (the thread sleeps) |" in gil_convoy.report(rows, 1, [])
    waits = gil_convoy.caller_waits(1)
    assert [name for name, _, _ in waits] == ["one by one (redact)", "together (redact_all)"]
    assert "| together (redact_all) |" in gil_convoy.report(rows, 1, [], waits)


def test_the_measured_run_is_reported_by_when_its_requests_began() -> None:
    # The first part shows what a restart left behind; the last part may be shorter.
    run = Run(seconds=25.0, ttfb=[0.5, 0.01, 0.02, 0.03], started=[100.0, 109.9, 110.0, 124.9],
              began=100.0)
    assert load.by_window(run, 10.0) == [[0.5, 0.01], [0.02], [0.03]]



async def test_with_replicas_each_request_of_a_user_goes_to_the_next_replica() -> None:
    """bench.load --replicas: round robin per request, as a load balancer without affinity."""
    seen: list[int] = []
    apps = [create_app() for _ in range(2)]
    for n, app in enumerate(apps):
        @web.middleware
        async def count(request: web.Request, handler: Handler, n: int = n) -> web.StreamResponse:
            seen.append(n)
            return await handler(request)

        app.middlewares.append(count)
    clients = [TestClient(TestServer(app)) for app in apps]
    for client in clients:
        await client.start_server()
    try:
        urls = [str(client.make_url("/v1/responses")) for client in clients]
        _, run = await load_client.drive(urls, 1, 1.0, [Script.make(5, 4)], 0.0, seed=1)
    finally:
        for client in clients:
            await client.close()

    assert run.ok >= 4 and not run.errors
    assert seen[:6] == [0, 1, 0, 1, 0, 1]
