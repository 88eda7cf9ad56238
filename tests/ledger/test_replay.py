"""The ledger against the bench: a session replayed through the proxy is recorded with the
numbers the bench measures for it, direct and through the proxy."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from bench.economics import STRATEGIES, build_session, run_one
from ctxproxy.ledger.prices import Price, Prices
from ctxproxy.ledger.report import total
from ctxproxy.ledger.store_sqlite import SqliteLedger
from ctxproxy.ledger.stores import LEDGER_FILE
from ctxproxy.proxy.cli import main
from tests.test_economics_invariants import shapes_or_skip

TURNS = 20
# Unit prices make costs tokens: input 1, cached 0.1 (the bench's "cost @10%"), per token.
UNIT = Prices({"fake-model": Price(1e6, 1e5, 1e6)})


async def _ledger_rows(data_dir: Path) -> list:  # type: ignore[type-arg]
    ledger = SqliteLedger(data_dir / LEDGER_FILE)
    await ledger.open()
    try:
        return await ledger.totals("all")
    finally:
        await ledger.close()


@pytest.mark.timeout(300)
async def test_ledger_shows_the_bench_numbers_for_a_replayed_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shapes = shapes_or_skip()
    session = build_session(TURNS, seed=1)
    direct = await run_one(STRATEGIES["direct"], session, shapes, 600.0, tmp_path / "direct")
    proxied = await run_one(STRATEGIES["defaults"], session, shapes, 600.0, tmp_path / "proxy")
    totals = await _ledger_rows(tmp_path / "proxy")
    row = total(totals, UNIT)
    sent = proxied.bills  # every request the upstream billed came through the proxy
    assert row.requests == len(sent)
    # Through the proxy: the upstream's own usage, as the bench's bills say.
    assert row.input_tokens == sum(b.input_tokens for b in sent)
    assert row.cached_tokens == sum(b.cached_tokens for b in sent)
    # Direct: the counterfactual from the client's bodies equals the direct run's bills.
    assert len(direct.bills) == row.requests
    assert row.direct_input == sum(b.input_tokens for b in direct.bills)
    assert row.direct_cached == sum(b.cached_tokens for b in direct.bills)
    assert row.cost_direct == pytest.approx(direct.cost(0.1))
    assert row.cost_proxy == pytest.approx(proxied.cost(0.1))

    # `ctxproxy stats --json` prints the same numbers, read back from the store.
    monkeypatch.setenv("CTXPROXY_DATA_DIR", str(tmp_path / "proxy"))
    monkeypatch.setenv("CTXPROXY_PRICES", "fake-model=1000000/100000")
    assert await asyncio.to_thread(main, ["stats", "--json", "--since", "all"]) == 0
    shown = orjson.loads(capsys.readouterr().out)["total"]
    assert shown["requests"] == row.requests
    assert shown["direct_cached_tokens"] == sum(b.cached_tokens for b in direct.bills)
    assert shown["cost_direct"] == pytest.approx(direct.cost(0.1))
    assert shown["cost_proxy"] == pytest.approx(proxied.cost(0.1))
    assert shown["saving"] == pytest.approx(direct.cost(0.1) - proxied.cost(0.1))
