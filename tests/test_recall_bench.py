"""bench.recall's results block holds one run of every store: a run of some does not replace
it (it would drop the other store's rows); its wrapper of the memory step runs."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import orjson

from bench.harness.serving import serve_plain
from bench.harness.small_codex import context_items, headers, request, text
from bench.recall import Recorder, parse_args, timed_memory
from ctxproxy.config import load_settings
from ctxproxy.memory.step import scope_of
from ctxproxy.proxy.assemble import build_app
from ctxproxy.proxy.memory_wiring import MEMORY
from ctxproxy.request import Identity


def test_a_run_of_one_store_writes_nothing_and_a_run_of_both_does() -> None:
    one = parse_args(["--stores", "sqlite"])
    assert one.no_write and one.partial
    both = parse_args(["--stores", "postgres,sqlite"])
    assert not both.no_write and not both.partial
    asked = parse_args(["--no-write"])
    assert asked.no_write and not asked.partial


async def test_the_timed_memory_step_runs_and_the_turn_is_kept(tmp_path: Path) -> None:
    """The bench's wrapper of the memory step goes in through the pipeline's ``steps``
    setter: put into the list the property returns, it never ran (the pipeline sorts its
    steps by phase when they are set), and bench.recall read an empty list of what it added."""
    recorder = Recorder()
    upstream, upstream_url = await serve_plain(recorder.app())
    settings = load_settings(env={}, data_dir=tmp_path, upstream_url=upstream_url + "/v1",
                             memory_process=False, stats_enabled=False)
    app = build_app(settings)
    proxy, proxy_url = await serve_plain(app)
    try:
        timed = timed_memory(app)
        assert timed is not None
        body = request([*context_items(), text("user", "the port is 5433")], "sess-1")
        async with aiohttp.ClientSession() as client, client.post(
                proxy_url + "/v1/responses", data=orjson.dumps(body),
                headers=headers("sess-1", "sess-1-t0")) as resp:
            await resp.read()
            assert resp.status == 200
        assert len(timed.ms) == len(timed.added) == 1
        # Its other phases still reach the memory step: the answered turn is stored.
        await app[MEMORY].queue.join()
        scope = scope_of(settings, Identity(None, None, None, session_id=None))
        stored = await app[MEMORY].store.list(scope, session_id="sess-1", limit=10)
        assert any("5433" in m.text for m in stored)
    finally:
        await proxy.cleanup()
        await upstream.cleanup()
