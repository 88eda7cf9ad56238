"""The direct-cost estimate's state lives in the ledger's store: replicas that record a
session's requests in turn estimate what one replica alone would have."""

from __future__ import annotations

from typing import Any

import orjson

from ctxproxy.ledger.counterfactual import PartCounter
from ctxproxy.ledger.measure import InThread, Measurer, Pending
from ctxproxy.ledger.model import Ledger, Record
from ctxproxy.ledger.recorder import Recorder
from tests.fakes import codex


def session_requests(n: int) -> list[Pending]:
    """``n`` requests of one session, each its whole history so far (as Codex sends them)."""
    items = codex.context_items()
    pending = []
    for turn in range(n):
        items += codex.tool_turn(f"turn {turn}: build part {turn}", output=f"built {turn}\n" * 400)
        body: dict[str, Any] = codex.request(items, session_id="sess-fleet")
        record = Record(at=1000.0 + turn * 5, session_id="sess-fleet", model="gpt-5", status=200,
                        input_tokens=20_000 + turn, output_tokens=10)
        pending.append(Pending(record, orjson.dumps(body), None, parsed=True))
    return pending


def recorder(ledger: Ledger) -> Recorder:
    return Recorder(ledger, InThread(Measurer(PartCounter(len))), retention_days=0)


async def direct_cached(ledger: Ledger) -> list[int | None]:
    return [r.direct_cached for r in await ledger.timeline("sess-fleet")]


async def test_replicas_in_turn_estimate_what_one_replica_does(make_ledger: Any) -> None:
    alone: Ledger = make_ledger()
    await alone.open()
    one = recorder(alone)
    one.start()
    for pending in session_requests(8):
        one.put(pending)
        await one.join()
    single = await direct_cached(alone)
    assert sum(c or 0 for c in single[1:]) > 0  # later requests share a cached prefix
    # A fresh session id for the fleet's run, in the same store.
    await one.close()
    await alone.prune(10**10)
    await alone.prune_direct(10**10)
    await alone.close()

    stores: list[Ledger] = [make_ledger() for _ in range(3)]
    for store in stores:
        await store.open()
    fleet = [recorder(store) for store in stores]
    for each in fleet:
        each.start()
    for n, pending in enumerate(session_requests(8)):
        fleet[n % 3].put(pending)  # round robin, each row written before the next request
        await fleet[n % 3].join()
    assert await direct_cached(stores[0]) == single
    for each, store in zip(fleet, stores, strict=True):
        await each.close()
        await store.close()
