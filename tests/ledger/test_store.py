"""Both ledger stores keep the same rows and give the same sums, across a restart."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ctxproxy.ledger import store_pg, store_sqlite
from ctxproxy.ledger.model import Ledger, Record

DAY = 86_400.0
T0 = 1_800_000_000.0  # 2027-01-15 08:00 UTC


def record(at: float, session: str = "s1", model: str = "gpt-5", **kw: object) -> Record:
    values: dict[str, object] = dict(
        client_tokens=5000, forwarded_tokens=3000, input_tokens=3100, cached_tokens=2048,
        output_tokens=50, direct_input=5150, direct_cached=4096, turns_in=8,
        turns_forwarded=5, items_cut=12,
    )
    values.update(kw)
    return Record(at=at, session_id=session, model=model, status=200, **values)  # type: ignore[arg-type]


async def test_rows_come_back_as_written_with_ids_and_degraded_steps(ledger: Ledger) -> None:
    written = record(T0, memory_ids=("m_a", "m_b"), degraded=("memory", "window"),
                     knowledge=True, ttfb_ms=12.5, outputs_masked=2)
    await ledger.insert([written, record(T0 + 1, session="other")])
    [back] = await ledger.timeline("s1")
    assert back == written
    assert back.request_id is not None


async def test_sums_per_day_session_and_model(ledger: Ledger) -> None:
    await ledger.insert([
        record(T0), record(T0 + 60, model="o3"), record(T0 + DAY, session="s2"),
        record(T0 + DAY + 5, session="s2", input_tokens=None, cached_tokens=None,
               direct_input=None, direct_cached=None, degraded=("memory",)),
    ])
    days = await ledger.totals("day")
    assert [(t.key, t.model, t.requests) for t in days] == [
        ("2027-01-15", "gpt-5", 1), ("2027-01-15", "o3", 1), ("2027-01-16", "gpt-5", 2)]
    second = days[2]
    assert (second.priced, second.input_tokens, second.direct_input, second.degraded) == (
        1, 3100, 5150, 1)
    assert second.client_tokens == 10_000  # unpriced rows still count their tokens
    sessions = await ledger.totals("session")
    assert sessions[0].key == "s2"  # the most recent session first
    assert {t.key for t in await ledger.totals("session", limit=1)} == {"s2"}
    assert sum(t.requests for t in await ledger.totals("all", since=T0 + DAY)) == 2
    assert sum(t.requests for t in await ledger.totals("all", session="s1")) == 2


async def test_rows_survive_a_restart_and_follow_the_retention(
    make_ledger: Callable[[], Ledger],
) -> None:
    first = make_ledger()
    await first.open()
    cut = T0 - 30 * DAY
    await first.insert([record(T0 - 40 * DAY), record(cut - 60), record(cut + 60), record(T0)])
    await first.close()
    again = make_ledger()
    await again.open()  # migrations already applied: nothing to do
    try:
        assert sum(t.requests for t in await again.totals("all")) == 4
        assert await again.prune(cut) == 2
        assert [r.at for r in await again.timeline("s1")] == [cut + 60, T0]
        # The sums follow, the hour the cut fell in included.
        assert sum(t.requests for t in await again.totals("all")) == 2
    finally:
        await again.close()


async def test_timeline_keeps_the_newest_rows_oldest_first(ledger: Ledger) -> None:
    await ledger.insert([record(T0 + i) for i in range(10)])
    assert [r.at - T0 for r in await ledger.timeline("s1", limit=3)] == [7, 8, 9]


async def test_series_from_the_rows_and_from_the_hourly_rollup_agree(ledger: Ledger) -> None:
    await ledger.insert([record(T0 + 600 * i) for i in range(36)])  # 6 hours, every 10 min
    fine = await ledger.series(T0, 600)  # from the request rows
    assert len(fine) == 36 and all(t.requests == 1 for t in fine)
    hourly = await ledger.series(T0, 2 * 3600)  # from the roll-up, in steps of 2 hours
    assert [(t.key, t.requests) for t in hourly] == [("0", 12), ("1", 12), ("2", 12)]
    assert sum(t.client_tokens for t in hourly) == sum(t.client_tokens for t in fine)


async def test_cache_writes_are_kept_and_summed_where_reported(ledger: Ledger) -> None:
    await ledger.insert([record(T0), record(T0 + 1, model="gpt-6.1-sol", cache_write_tokens=900),
                         record(T0 + 2, model="gpt-6.1-sol", cache_write_tokens=100)])
    rows = await ledger.timeline("s1")
    assert [r.cache_write_tokens for r in rows] == [None, 900, 100]
    by_model = {t.model: t.cache_write_tokens for t in await ledger.totals("model")}
    assert by_model == {"gpt-5": 0, "gpt-6.1-sol": 1000}
    assert await ledger.prune(T0 + 0.5) == 1  # the hour is rolled up again from the rows
    assert [t.cache_write_tokens for t in await ledger.totals("all")] == [1000]


async def reopened(
    make_ledger: Callable[[], Ledger], monkeypatch: pytest.MonkeyPatch, version: int,
) -> Ledger:
    """A ledger opened on a store that the schema of ``version`` made."""
    old = make_ledger()
    store = store_sqlite if isinstance(old, store_sqlite.SqliteLedger) else store_pg
    monkeypatch.setattr(store, "MIGRATIONS", store.MIGRATIONS[:version])
    await old.open()
    await old.close()
    monkeypatch.undo()
    again = make_ledger()
    await again.open()
    return again


async def test_a_store_of_version_3_gains_cache_writes(
    make_ledger: Callable[[], Ledger], monkeypatch: pytest.MonkeyPatch,
) -> None:
    again = await reopened(make_ledger, monkeypatch, 3)
    try:
        await again.insert([record(T0), record(T0 + 1, cache_write_tokens=700)])
        assert [r.cache_write_tokens for r in await again.timeline("s1")] == [None, 700]
        [total] = await again.totals("all")
        assert (total.requests, total.input_tokens, total.cache_write_tokens) == (2, 6200, 700)
    finally:
        await again.close()


async def test_a_store_of_version_4_gains_each_rows_protocol(
    make_ledger: Callable[[], Ledger], monkeypatch: pytest.MonkeyPatch,
) -> None:
    again = await reopened(make_ledger, monkeypatch, 4)
    try:
        await again.insert([record(T0), record(T0 + 1, protocol="chat"),
                            record(T0 + 2, protocol="messages")])
        assert [r.protocol for r in await again.timeline("s1")] == ["", "chat", "messages"]
    finally:
        await again.close()
