"""A long prompt that asks about an earlier task gets that task's answer back from memory."""

from __future__ import annotations

import json

from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream
from tests.memory.session import Session, memory_text, settle

DIFF = "\n".join([
    "diff --git a/src/ledger/posting.py b/src/ledger/posting.py",
    "index 3f9a2c1..b7e40d5 100644",
    "--- a/src/ledger/posting.py",
    "+++ b/src/ledger/posting.py",
    "@@ -10,7 +10,7 @@ def post(entry):",
    "-    return round(entry.amount)",
    "+    return entry.amount.quantize(CENTS)",
])
STATEMENT = " ".join(
    f"The reconciliation job {n} reads the ledger snapshot and compares balances per tenant."
    for n in range(40)
)


async def test_a_question_inside_a_long_prompt_recalls_the_earlier_tasks_output(
    upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy()  # the defaults: the finished task is cut at the next one
    s = Session(proxy, upstream)
    s.turns += 1
    s.items = [*s.items, *codex.tool_turn("task 1: fix the rounding in posting", output=DIFF)]
    s.items[-3]["arguments"] = json.dumps({"cmd": "git diff --cached"})
    await s.say("task 2: " + STATEMENT)
    await settle(proxy)

    sent = await s.say(
        "Before you start: in an earlier task you changed `src/ledger/posting.py`. Which blob "
        "hashes did the `index` line of its `git diff --cached` show? " + STATEMENT)
    task_one_forwarded = any("task 1: fix" in json.dumps(i) for i in sent["input"]
                             if i.get("role") == "user")
    assert not task_one_forwarded  # the task was cut: only memory can bring the answer
    assert "3f9a2c1..b7e40d5" in memory_text(sent)
