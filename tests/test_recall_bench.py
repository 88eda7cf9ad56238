"""bench.recall's results block holds one run of every store: a run of some does not replace
it (it would drop the other store's rows)."""

from __future__ import annotations

from bench.recall import parse_args


def test_a_run_of_one_store_writes_nothing_and_a_run_of_both_does() -> None:
    one = parse_args(["--stores", "sqlite"])
    assert one.no_write and one.partial
    both = parse_args(["--stores", "postgres,sqlite"])
    assert not both.no_write and not both.partial
    asked = parse_args(["--no-write"])
    assert asked.no_write and not asked.partial
