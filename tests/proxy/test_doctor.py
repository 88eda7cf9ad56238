"""`ctxproxy doctor`: the settings with their sources (secrets hidden), the data directory,
and one line per check, exit 1 when one fails."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ctxproxy.proxy.cli import main
from tests.fakes.server import free_port
from tests.fakes.upstream import FakeUpstream


async def doctor(capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = await asyncio.to_thread(main, ["doctor"])
    return code, capsys.readouterr().out


async def test_doctor_shows_settings_and_checks_what_the_proxy_talks_to(
    upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("CTXPROXY_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CTXPROXY_UPSTREAM_URL", upstream.url + "/v1")  # type: ignore[attr-defined]
    monkeypatch.setenv("CTXPROXY_UPSTREAM_API_KEY", "sk-never-printed")
    code, out = await doctor(capsys)
    assert code == 0, out
    assert "sk-never-printed" not in out
    assert "CTXPROXY_UPSTREAM_API_KEY" in out and "(set)  [environment]" in out
    assert "CTXPROXY_KEEP_TURNS" in out and "[default]" in out
    assert f"data directory: {tmp_path}" in out
    for name in ("upstream", "store", "request stats", "core"):
        assert f"ok   {name}" in out
    assert "chat upstream" not in out  # Chat Completions go to UPSTREAM_URL: nothing more


async def test_doctor_checks_a_chat_upstream_of_its_own(
    upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("CTXPROXY_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CTXPROXY_UPSTREAM_URL", upstream.url + "/v1")  # type: ignore[attr-defined]
    monkeypatch.setenv("CTXPROXY_CHAT_URL", f"http://127.0.0.1:{free_port()}/v1")
    code, out = await doctor(capsys)
    assert code == 1, out
    assert "ok   upstream" in out
    [line] = [line for line in out.splitlines() if "chat upstream" in line]
    assert line.lstrip().startswith("FAIL chat upstream")


async def test_doctor_fails_on_an_unreachable_upstream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("CTXPROXY_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CTXPROXY_UPSTREAM_URL", f"http://u:pw-never-shown@127.0.0.1:{free_port()}/v1")
    code, out = await doctor(capsys)
    assert code == 1
    assert "FAIL upstream" in out and "ok   store" in out
    assert "pw-never-shown" not in out  # the settings table hides a URL's password too



@pytest.mark.parametrize("status,fails", [(404, True), (400, True), (401, False), (403, False)])
async def test_doctor_fails_an_upstream_url_whose_models_route_is_not_there(
    upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], status: int, fails: bool,
) -> None:
    """A base URL without /v1, say, answers, but not as the API. A 401 or 403 is the right URL
    refusing the doctor, which sends no key."""
    upstream.then_error(status)
    monkeypatch.setenv("CTXPROXY_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CTXPROXY_UPSTREAM_URL", upstream.url)  # type: ignore[attr-defined]
    code, out = await doctor(capsys)
    assert code == (1 if fails else 0), out
    [line] = [line for line in out.splitlines() if " upstream " in line]
    assert line.lstrip().startswith("FAIL upstream" if fails else "ok   upstream")
    assert f"{upstream.url}/models answered HTTP {status}" in line  # type: ignore[attr-defined]
    assert ("/v1" in line and "CTXPROXY_UPSTREAM_URL" in line) is fails
    assert "ok   store" in out
    assert [r.path for r in upstream.received] == ["/models"]
