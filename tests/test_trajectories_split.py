"""bench.trajectories_split: each group's bill as shares of direct's, by what was billed."""

from __future__ import annotations

from bench import trajectories as bench
from bench.harness.agent_runs import Step, Task, build_session
from bench.harness.pricing import Bill
from bench.harness.replay import Record
from bench.trajectories_split import split


def run(strategy: bench.Strategy, bills: list[Bill], records: list[Record]) -> bench.Run:
    task = Task("django__django-1", "system", "fix it", (Step("t", "ls", "out", "e"),))
    return bench.Run(strategy, build_session([task]), bills, records, 0, 0, 0, 0, 0, {}, 0.0)


def test_each_part_of_a_bill_is_a_share_of_directs_cost() -> None:
    direct = run(bench.DIRECT, [Bill("", 1000, 0, 0, 0.0), Bill("", 1000, 900, 0, 1.0)],
                 [Record("turn", 0), Record("compaction", 0)])  # 1000 + 190 = 1190
    proxy = bench.Strategy("proxy", {}, "the defaults")
    cut = run(proxy, [Bill("", 500, 0, 0, 0.0, written_tokens=400),  # 100 + 500 written
                      Bill("", 500, 400, 0, 1.0, written_tokens=100)],  # 40 read, 125 written
              [Record("turn", 0), Record("turn", 0, cut=True)])
    lines = split([direct, cut])
    assert lines[0].startswith("django 1 task direct: 1.000 = written 0.000 + read 0.076 + "
                               "plain 0.924; client compactions 0.160; cut requests 0.000")
    # 500 written at 1.25 = 625, 40 read, 100 plain: 765 of 1190
    assert lines[1].startswith("django 1 task proxy: 0.643 = written 0.525 + read 0.034 + "
                               "plain 0.084; client compactions 0.000; cut requests 0.139")
