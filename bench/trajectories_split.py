"""Where a replay's bill goes: ``bench.trajectories`` with each group's cost split into what
its tokens were billed as (written, read, plain), its client compactions and its cut requests,
as shares of direct's cost (direct must be among the strategies).

    python -m bench.trajectories_split --protocol messages --sessions 10 \\
        --strategies direct,defaults --strategy floor:CUT_DIGEST_CHARS=0,MEMORY_ENABLED=false
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from bench import trajectories
from bench.harness.agent_runs import load_task, repo_of
from bench.harness.pricing import CACHED_PRICE, WRITE_PRICE


def split(runs: Sequence[trajectories.Run]) -> list[str]:
    """One line per (repository, session kind, strategy)."""
    groups: dict[tuple[str, str, str], list[trajectories.Run]] = {}
    for run in runs:
        groups.setdefault((run.session.repo, run.session.kind, run.strategy.name), []).append(run)
    lines = []
    for (repo, kind, name), group in groups.items():
        direct = sum(r.cost() for r in groups[(repo, kind, trajectories.DIRECT.name)])
        parts = {"written": 0.0, "read": 0.0, "plain": 0.0, "compactions": 0.0, "cuts": 0.0}
        for run in group:
            for record, bill in zip(run.records, run.bills, strict=True):
                parts["written"] += WRITE_PRICE * bill.written_tokens
                parts["read"] += CACHED_PRICE * bill.cached_tokens
                parts["plain"] += bill.input_tokens - bill.cached_tokens - bill.written_tokens
                cost = bill.cost()
                parts["compactions"] += cost if record.kind == "compaction" else 0.0
                parts["cuts"] += cost if record.cut else 0.0
        share = {k: v / direct for k, v in parts.items()}
        total = share["written"] + share["read"] + share["plain"]
        lines.append(f"{repo} {kind} {name}: {total:.3f}"
                     f" = written {share['written']:.3f} + read {share['read']:.3f} + plain "
                     f"{share['plain']:.3f}; client compactions {share['compactions']:.3f}; "
                     f"cut requests {share['cuts']:.3f} (direct: {direct:,.0f} token-units)")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    args = trajectories.parse_args([*(sys.argv[1:] if argv is None else argv), "--no-write"])
    paths = sorted(args.runs.glob("*.traj.json"))
    if args.repos:
        paths = [p for p in paths if repo_of(p.name) in set(args.repos.split(","))]
    tasks = [load_task(p) for p in trajectories.select(paths, args.all, args.count, args.held_out)]
    runs = asyncio.run(trajectories.main_async(args, tasks))
    print(trajectories.table(runs, written=args.protocol == "messages"))
    print("\n".join(split(runs)))


if __name__ == "__main__":
    main()
