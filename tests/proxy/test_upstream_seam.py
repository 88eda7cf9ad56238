"""The upstream transport seam: the app can be handed its own client to the real API."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
from aiohttp import web

from ctxproxy.config import load_settings
from ctxproxy.proxy.assemble import build_app
from ctxproxy.proxy.upstream import Upstream
from tests.fakes import codex
from tests.fakes.server import free_port, serve
from tests.fakes.upstream import FakeUpstream


async def test_the_app_sends_through_the_upstream_it_is_given(tmp_path: Path) -> None:
    # The fake upstream listens on a Unix socket only: a request can reach it solely
    # through the connector handed to the app.
    fake = FakeUpstream()
    runner = web.AppRunner(fake.app())
    await runner.setup()
    sock = str(tmp_path / "upstream.sock")
    await web.UnixSite(runner, sock).start()
    upstream = Upstream("http://upstream.invalid/v1", 2, 5,
                        connector=lambda: aiohttp.UnixConnector(path=sock))
    settings = load_settings(env={}, upstream_url="http://upstream.invalid/v1",
                             data_dir=tmp_path / "data", keep_turns=2, window_policy="fixed",
                             trim_slack=0)
    proxy = await serve(build_app(settings, upstream=upstream), port=free_port())
    try:
        async with aiohttp.ClientSession() as http, http.post(
            proxy.url + "/v1/responses", headers=codex.headers(),
            data=json.dumps(codex.request(codex.session(5))),
        ) as r:
            assert r.status == 200
            assert b"response.completed" in await r.read()
        assert fake.last.path == "/v1/responses"
        prompts = [i for i in fake.last.json["input"] if i.get("role") == "user"
                   and "turn" in json.dumps(i)]
        assert len(prompts) == 2  # the window ran on the way
    finally:
        await proxy.close()
        await runner.cleanup()
