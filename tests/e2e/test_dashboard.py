"""The dashboard in a real browser: Debian's Chromium (driven by chromedriver through
Selenium) loads each /ui page of a proxy that served a replayed 20-turn session, and the
numbers it shows are those `ctxproxy stats --json` prints. Screenshots go to the test's
folder, or to ``CTXPROXY_TEST_SCREENSHOTS`` when set (the README's comes from there)."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.economics import STRATEGIES, build_session, run_one
from ctxproxy.config import load_settings
from ctxproxy.ledger.report import percent, tokens, usd
from ctxproxy.proxy.assemble import build_app
from ctxproxy.proxy.cli import main
from tests.fakes.server import free_port, serve
from tests.test_economics_invariants import shapes_or_skip

pytestmark = pytest.mark.browser

# Read at import: the autouse env cleaner removes CTXPROXY_* before the tests run.
SCREENSHOTS = os.environ.get("CTXPROXY_TEST_SCREENSHOTS")
PRICES = "fake-model=1.25/0.125"
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")


def _browser_or_skip() -> tuple[str, str]:
    binary = next((p for name in CHROMIUM if (p := shutil.which(name))), None)
    driver = shutil.which("chromedriver")
    if binary and driver:
        return binary, driver
    message = ("Chromium and chromedriver are not installed (apt-get install chromium "
               "chromium-driver; make test installs them)")
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def chrome() -> Iterator[Any]:
    binary, driver_path = _browser_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


async def _stats(data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any,
                 *args: str) -> Any:
    monkeypatch.setenv("CTXPROXY_DATA_DIR", str(data_dir))
    monkeypatch.setenv("CTXPROXY_PRICES", PRICES)
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["stats", "--json", "--since", "all", *args]) == 0
    return orjson.loads(capsys.readouterr().out)


def _browse(driver: Any, base: str, session: str, shots: Path) -> dict[str, Any]:
    """Load each page (blocking: run in a thread) and read what it shows."""
    from selenium.webdriver.common.by import By

    seen: dict[str, Any] = {}

    def shot(name: str) -> None:
        driver.save_screenshot(str(shots / f"{name}.png"))

    def cards() -> dict[str, tuple[str, str]]:
        return {el.get_attribute("id").removeprefix("total-"):
                (el.text, el.get_attribute("data-value"))
                for el in driver.find_elements(By.CSS_SELECTOR, ".card .v")}

    driver.get(base + "/ui?since=all")
    seen["title"] = driver.title
    seen["overview"] = cards()
    seen["charts"] = [el.get_attribute("id") for el in driver.find_elements(By.TAG_NAME, "svg")]
    seen["lines"] = len(driver.find_elements(By.CSS_SELECTOR, "#cost-chart polyline"))
    shot("overview")
    driver.find_element(By.LINK_TEXT, "Sessions").click()
    driver.get(base + "/ui/sessions?since=all")
    seen["sessions"] = [el.text for el in driver.find_elements(
        By.CSS_SELECTOR, "#sessions tbody tr td:first-child")]
    shot("sessions")
    driver.find_element(By.LINK_TEXT, session).click()
    seen["session"] = cards()
    seen["timeline"] = len(driver.find_elements(By.CSS_SELECTOR, "#timeline tbody tr"))
    shot("session")
    recalled = driver.find_elements(By.CSS_SELECTOR, "#timeline a[href^='/ui/memory/']")
    seen["recalled_links"] = len(recalled)
    if recalled:
        recalled[0].click()
        seen["memory_page"] = driver.find_element(By.TAG_NAME, "h1").text
        shot("memory")
    driver.get(base + "/ui/memory")
    seen["memory_list"] = len(driver.find_elements(By.CSS_SELECTOR, "#memories tbody tr"))
    shot("memory-browser")
    return seen


@pytest.mark.timeout(300)
async def test_dashboard_shows_the_stats_numbers_in_a_real_browser(
    chrome: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any,
) -> None:
    shapes = shapes_or_skip()
    data_dir = tmp_path / "data"
    session = build_session(20, seed=1)
    run = await run_one(STRATEGIES["defaults"], session, shapes, 600.0, data_dir)
    stats = await _stats(data_dir, monkeypatch, capsys)
    [by_session] = (await _stats(data_dir, monkeypatch, capsys, "--by", "session"))["rows"]
    expected = stats["total"]
    assert expected["requests"] == len(run.bills)

    settings = load_settings(env={}, data_dir=data_dir, prices=PRICES, port=free_port(),
                             upstream_url="http://127.0.0.1:9/v1", log_level="WARNING")
    proxy = await serve(build_app(settings), port=settings.port)
    shots = Path(SCREENSHOTS) if SCREENSHOTS else tmp_path / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    try:
        seen = await asyncio.to_thread(_browse, chrome, proxy.url, by_session["key"], shots)
    finally:
        await proxy.close()

    shown = seen["overview"]
    assert seen["title"].startswith("Overview")
    for name, text in (
        ("requests", f"{expected['requests']:,}"),
        ("client_tokens", tokens(expected["client_tokens"])),
        ("forwarded_tokens", tokens(expected["forwarded_tokens"])),
        # Shares and money as the page's own value formats them: the stats JSON rounds to 6
        # places, and formatting that again may land on the other side of a display boundary
        # (0.8949996 shows 89%, its rounding 0.895 shows 90%). The value itself is checked below.
        ("cached_share", percent(float(shown["cached_share"][1]))),
        ("cost_direct", usd(float(shown["cost_direct"][1]))),
        ("cost_proxy", usd(float(shown["cost_proxy"][1]))),
        ("saving", usd(float(shown["saving"][1]))),
        ("recalled", f"{expected['recalled']:,}"),
    ):
        assert shown[name][0] == text, name
        assert float(shown[name][1]) == pytest.approx(expected[name], abs=1e-4), name
    assert seen["charts"] == ["cost-chart", "tokens-chart"] and seen["lines"] == 2
    assert seen["sessions"] == [by_session["key"]]
    assert seen["session"]["requests"][1] == str(by_session["requests"])
    assert float(seen["session"]["saving"][1]) == pytest.approx(by_session["saving"])
    assert seen["timeline"] == by_session["requests"]
    assert seen["recalled_links"] > 0 and seen["memory_page"].startswith("Memory mem_")
    assert seen["memory_list"] > 0
    assert {p.name for p in shots.iterdir()} >= {"overview.png", "sessions.png",
                                                 "session.png"}
