from __future__ import annotations

import json
import logging
import subprocess
import sys

import aiohttp
import pytest

from ctxproxy.config import describe_settings
from ctxproxy.proxy.cli import main
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream


def test_help_lists_every_setting_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["serve", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        out = capsys.readouterr().out
        for name, default, _ in describe_settings():
            assert name in out
            assert f"[default: {default}]" in out


def test_an_invalid_setting_stops_start_up_naming_the_variable() -> None:
    env = {"CTXPROXY_KEEP_TURNS": "zero", "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-m", "ctxproxy.proxy", "serve"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0
    assert "CTXPROXY_KEEP_TURNS" in run.stderr


async def test_access_log_has_one_line_per_request_without_secrets(
        upstream: FakeUpstream, start_proxy: ProxyFactory,
        caplog: pytest.LogCaptureFixture) -> None:
    proxy = await start_proxy(upstream_api_key="sk-upstream-SECRET", keep_turns=2, trim_slack=0)
    headers = codex.headers(**{"x-tdai-user-key": "uk-SECRET"})
    with caplog.at_level(logging.INFO):
        async with aiohttp.ClientSession() as s, s.post(
                proxy.url + "/v1/responses", json=codex.request(codex.session(6)),
                headers=headers) as r:
            await r.read()
    lines = [r for r in caplog.records if r.name == "ctxproxy.access"]
    assert len(lines) == 1
    entry = lines[0].fields  # type: ignore[attr-defined]
    assert entry["status"] == 200
    assert entry["session_id"] == "sess-1"
    assert (entry["turns_in"], entry["turns_forwarded"]) == (6, 2)
    assert entry["items_cut"] > 0
    assert entry["bytes_forwarded"] == len(upstream.last.body)
    assert entry["bytes_in"] == len(json.dumps(codex.request(codex.session(6))))
    assert entry["input_tokens"] > 0 and "cached_tokens" in entry
    assert "ttfb_ms" in entry
    assert 0 <= entry["prepare_ms"] <= entry["total_ms"]  # held before it went upstream
    everything = "\n".join(json.dumps(getattr(r, "fields", {})) + r.getMessage()
                           for r in caplog.records)
    assert "SECRET" not in everything and "sk-client-test" not in everything


async def test_metrics_count_requests_and_cut_turns(upstream: FakeUpstream,
                                                    start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy(keep_turns=2, trim_slack=0)
    async with aiohttp.ClientSession() as s:
        async with s.post(proxy.url + "/v1/responses", json=codex.request(codex.session(5)),
                          headers=codex.headers()) as r:
            await r.read()
        async with s.get(proxy.url + "/metrics") as r:
            text = await r.text()
    assert 'ctxproxy_requests_total{route="responses",status="200"} 1.0' in text
    assert "ctxproxy_turns_cut_total 3.0" in text
