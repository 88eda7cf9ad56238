"""A failing step costs only itself: undone alone, counted, the others' work forwarded."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ctxproxy.proxy.app import PIPELINE
from ctxproxy.proxy.pipeline import Pipeline
from ctxproxy.request import Exchange, Step, is_turn_start
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.server import Running
from tests.fakes.upstream import FakeUpstream
from tests.knowledge.wikis import add_wiki, ctxproxy, write_wiki

Capsys = pytest.CaptureFixture[str]
TEAM = {"x-team-id": "team-1"}
FACT = "The staging database listens on port 6543."


class Exploding:
    """Runs the real step (its changes land on the exchange), then raises."""

    def __init__(self, inner: Step, exc: Exception) -> None:
        self.name = inner.name
        self._inner = inner
        self._exc = exc

    async def __call__(self, ex: Exchange) -> None:
        await self._inner(ex)
        ex.notes.outputs_masked = 999  # a note written before the failure is undone too
        raise self._exc


@pytest.fixture
def seeded(tmp_path: Path, capsys: Capsys) -> Path:
    """A data dir with a wiki of team-1 and a semantic memory of its scope."""
    data_dir = tmp_path / "data"
    add_wiki(capsys, data_dir, write_wiki(tmp_path / "docs"))
    code, _, err = ctxproxy(capsys, data_dir, "memory", "add", FACT, "--team", "team-1")
    assert code == 0, err
    return data_dir


def explode(proxy: Running, name: str, exc: Exception) -> None:
    pipeline = proxy.app[PIPELINE]
    assert name in [s.name for s in pipeline.steps]
    pipeline.steps = [Exploding(s, exc) if s.name == name else s for s in pipeline.steps]


async def send(proxy: Running, items: list[dict[str, Any]], **headers: str) -> None:
    async with aiohttp.ClientSession() as http, http.post(
        proxy.url + "/v1/responses", data=json.dumps(codex.request(items)),
        headers=codex.headers(**headers),
    ) as r:
        assert r.status == 200
        await r.read()


def effects(upstream: FakeUpstream) -> dict[str, bool]:
    body = upstream.last.json
    instructions = body.get("instructions") or ""
    prompts = [i for i in body["input"] if is_turn_start(i)]
    return {
        "window": len(prompts) == 2,
        "knowledge": "<knowledge_tools>" in instructions,
        "memory": any(FACT in str(i.get("content")) for i in body["input"]
                      if i.get("role") == "developer"),
    }


async def metric(proxy: Running, name: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(proxy.url + "/metrics") as r:
        return "\n".join(line for line in (await r.text()).splitlines() if name in line)


async def test_every_step_works_when_none_fails(
    upstream: FakeUpstream, start_proxy: ProxyFactory, seeded: Path
) -> None:
    proxy = await start_proxy(data_dir=seeded, keep_turns=2, trim_slack=0)
    await send(proxy, codex.session(6), **TEAM)
    assert effects(upstream) == {"window": True, "knowledge": True, "memory": True}


@pytest.mark.parametrize("failing", ["window", "knowledge", "memory"])
async def test_a_failing_step_is_undone_alone_and_the_others_are_forwarded(
    upstream: FakeUpstream, start_proxy: ProxyFactory, seeded: Path, failing: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    proxy = await start_proxy(data_dir=seeded, keep_turns=2, trim_slack=0)
    explode(proxy, failing, RuntimeError("boom"))
    caplog.set_level(logging.WARNING, "ctxproxy.pipeline")
    caplog.set_level(logging.INFO, "ctxproxy.access")  # the handler's level: the last set
    for _ in range(3):
        await send(proxy, codex.session(6), **TEAM)

    expected = {"window": True, "knowledge": True, "memory": True, failing: False}
    assert effects(upstream) == expected
    # The notes are the access log's: the failed step's note is not among them.
    for _ in range(100):  # the last line is written once its answer has gone out
        logged = [r.fields for r in caplog.records  # type: ignore[attr-defined]
                  if r.name == "ctxproxy.access" and r.fields.get("route") == "responses"]  # type: ignore[attr-defined]
        if len(logged) == 3:
            break
        await asyncio.sleep(0.01)
    assert len(logged) == 3 and all(e.get("outputs_masked") != 999 for e in logged)
    counted = await metric(proxy, "ctxproxy_step_failures_total{")
    assert f'reason="RuntimeError",step="{failing}"}} 3.0' in counted
    # Said once per step and reason, not once per request.
    said = [r for r in caplog.records if r.name == "ctxproxy.pipeline"]
    assert len(said) == 1 and failing in said[0].getMessage()


async def test_a_user_key_the_core_cannot_send_costs_only_the_knowledge_block(
    upstream: FakeUpstream, start_proxy: ProxyFactory, tmp_path: Path,
) -> None:
    # An HTTP header cannot carry this key: the core client raises UnicodeEncodeError. The
    # window's cut must still go out.
    proxy = await start_proxy(core_url="http://127.0.0.1:9/", keep_turns=2, trim_slack=0,
                              memory_enabled=False)
    await send(proxy, codex.session(8), **TEAM, **{"x-agent-id": "coder"},
               **{"x-tdai-user-key": "clé-ünïcode"})
    forwarded = [i for i in upstream.last.json["input"] if is_turn_start(i)]
    assert len(forwarded) == 2
    assert "<knowledge_tools>" not in (upstream.last.json.get("instructions") or "")
    counted = await metric(proxy, "ctxproxy_step_failures_total{")
    assert 'reason="UnicodeEncodeError",step="knowledge"} 1.0' in counted


async def test_pipeline_without_failures_reports_none() -> None:
    seen: list[str] = []

    class Note:
        name = "note"

        async def __call__(self, ex: Exchange) -> None:
            seen.append(ex.identity.session_id or "")

    from multidict import CIMultiDict, CIMultiDictProxy

    from ctxproxy.config import load_settings

    ex = Exchange.parse(json.dumps(codex.request(codex.session(2))).encode(),
                        CIMultiDictProxy(CIMultiDict(codex.headers())), load_settings(env={}))
    assert await Pipeline([Note()]).run(ex) == []
    assert seen == ["sess-1"]
