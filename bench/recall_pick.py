"""Recall's pick: the CPU a user turn's recall takes once the store has answered.

    python -m bench.recall_pick --store memory.sqlite3                  # into RESULTS.md
    python -m bench.recall_pick --store memory.sqlite3 --before 89e323a # and that commit's
    python -m bench.recall_pick --store memory.sqlite3 --no-write       # print only

``--store`` is a SQLite memory store (one a ``bench.load`` run filled, say); it is copied
first, never changed. Sessions of the store take turns, round robin as concurrent sessions
do, each turn asking one of ``bench.harness.session``'s prompts: what the store holds for it is
read first (``Recaller.gather``, not timed), then the pick (``Recaller.pick``, in the
calling thread) and the blocks' rendering (``memory.step._texts``) are timed, with the
lines the session's last four recalls showed still in view, as ``memory.step`` does.
Process-wide memos start cold and warm as the sessions go on, as in a proxy. A
``bench.load`` store holds the same turns many times over (its sessions replay seeded
scripts) and its sessions ask alike: ``--unique`` times turns that never repeat a prompt over
episodes that never repeat a text, as a real proxy's would; without it both kinds are run.

With ``--before REV`` that commit's code (``git archive``) runs the same turns in a
process of its own, alternating with this tree's, ``--rounds`` of each; the blocks both
render must be the same bytes (their digest is compared).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    from bench.harness.session import PROMPTS
except ImportError:  # a child of --before on a tree older than bench/harness/
    from bench._session import _PROMPTS as PROMPTS  # type: ignore[import-not-found,no-redef]
from bench.harness.results import write_block

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Recall's pick"
BEGIN = "<!-- recall-pick:begin (written by bench/recall_pick.py) -->"
END = "<!-- recall-pick:end -->"
IN_VIEW = 4  # the session's earlier recalls still in the window


async def _measure(store_path: Path, picks: int, seed: int, unique: bool) -> dict[str, Any]:
    """CPU ms per pick over ``picks`` turns of the store's sessions, and the digest of the
    blocks rendered (what the --before child prints)."""
    recaller, turns = await _gather(store_path, picks, seed, unique)
    return _time_picks(recaller, turns, picks)


def _sessions(store_path: Path) -> tuple[list[tuple[Any, str]], float]:
    """The store's sessions as (scope, session id), and the time of its last write."""
    from ctxproxy.memory.model import Scope  # see _gather

    db = sqlite3.connect(store_path)
    sessions = [(Scope(*row[:4]), row[4]) for row in db.execute(
        "SELECT DISTINCT service_id, team_id, agent_id, user_ref, session_id FROM memories"
        " WHERE session_id IS NOT NULL ORDER BY 1, 2, 3, 4, 5")]
    (latest,) = db.execute("SELECT max(updated_at) FROM memories").fetchone()
    db.close()
    return sessions, float(latest)


async def _gather(store_path: Path, picks: int, seed: int, unique: bool
                  ) -> tuple[Any, list[tuple[str, Any, Any, int]]]:
    """A Recaller over the store, and each turn's (session, what the store found for its
    question, the standing memories, their cost): the reads the pick is timed without."""
    # Imported here: with --before, a child process puts the old tree first on sys.path.
    from ctxproxy.injectors import memory_blocks, tokens
    from ctxproxy.memory.recall import Recaller, Weights
    from ctxproxy.memory.store_sqlite import SqliteStore
    from ctxproxy.proxy.memory_wiring import _cost

    async def here(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    sessions, latest = _sessions(store_path)
    store = SqliteStore(store_path)
    await store.open()
    recaller = Recaller(
        store, weights=Weights(), k=5, budget=1200, cost=_cost,
        overhead=lambda kind: tokens.count(memory_blocks.block_overhead(kind)), offload=here,
    )
    tokens.encoding_name()
    rng = random.Random(seed)
    chosen = rng.sample(sessions, min(len(sessions), max(1, picks // 6)))
    # A minute after the store's last write: the same scores, and bytes, in every run.
    now = latest + 60
    turns = []
    for n in range(picks):
        scope, session = chosen[n % len(chosen)]
        step = n // len(chosen) + 1
        query = f"{rng.choice(PROMPTS)} (step {step})"
        if unique:  # no two sessions ask alike, as bench.load's do (a turn, a prompt)
            query = query[:-1] + f", session {n % len(chosen)})"
        found = await recaller.gather(scope, session, query, now)
        candidates = await recaller.standing_candidates(scope, session, set(), now)
        standing = recaller.standing(candidates, now)
        turns.append((session, found, standing, recaller.cost(standing) if standing else 0))
    await store.close()
    return recaller, turns


def _time_picks(recaller: Any, turns: list[tuple[str, Any, Any, int]], picks: int
                ) -> dict[str, Any]:
    """Each turn's pick and rendering, timed in thread CPU, with the lines the session's last
    IN_VIEW recalls showed still in view."""
    from ctxproxy.memory.step import _texts  # see _gather

    in_view: dict[str, deque[tuple[tuple[str, frozenset[str]], ...]]] = {}
    digest = hashlib.sha256()
    spent = 0.0
    for session, found, standing, used in turns:
        kept = in_view.setdefault(session, deque(maxlen=IN_VIEW))
        shown: dict[str, set[str]] = {}
        for lines in kept:
            for memory_id, seen in lines:
                shown.setdefault(memory_id, set()).update(seen)
        start = time.thread_time()
        picking = recaller.pick(found, window=set(), exclude={m.memory_id for m in standing},
                                shown=shown, budget=recaller.budget - used, min_score=0.25)
        try:
            picking.send(None)  # never suspends: the offload runs here
            raise RuntimeError("pick suspended")
        except StopIteration as done:
            picked = done.value
        standing_text, recall_text, lines = _texts(standing, picked)
        spent += time.thread_time() - start
        kept.append(lines)
        digest.update(f"{standing_text}\0{recall_text}\0".encode())
    return {"ms": 1000 * spent / picks, "digest": digest.hexdigest()[:16]}


def _child(tree: Path, store: Path, picks: int, seed: int, unique: bool) -> dict[str, Any]:
    # The tree's packages first on sys.path (its bench/ too: the session's prompts); this file
    # loaded by its path, since an older tree has no copy of it.
    code = ("import asyncio, importlib.util, json, sys; sys.path.insert(0, sys.argv[1]); "
            "spec = importlib.util.spec_from_file_location('recall_pick', sys.argv[2]); "
            "bench = importlib.util.module_from_spec(spec); spec.loader.exec_module(bench); "
            "from pathlib import Path; print(json.dumps(asyncio.run(bench._measure("
            "Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == '1'))))")
    out = subprocess.run(
        [sys.executable, "-c", code, str(tree), __file__, str(store), str(picks), str(seed),
         "1" if unique else "0"],
        cwd=tree, check=True, capture_output=True, text=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _copy(source: Path, to: Path, unique: bool) -> None:
    # immutable: not a byte of the store, nor a -wal or -shm file beside it, is written.
    with (sqlite3.connect(f"file:{source.resolve()}?immutable=1", uri=True) as db,
          sqlite3.connect(to) as copy):
        db.backup(copy)
        if unique:  # each episode's text its own: its id on a last line
            copy.execute("UPDATE memories SET text = text || char(10) || '  (' || memory_id"
                         " || ')' WHERE type = 'episodic'")


def _run(args: argparse.Namespace, tmp: Path, trees: dict[str, Path], unique: bool) -> list[str]:
    """One kind of turns, every tree in turn for each round: the report's lines, and whether
    every tree rendered the same bytes (the last line)."""
    store = tmp / f"memory-{int(unique)}.sqlite3"
    _copy(args.store, store, unique)
    times: dict[str, list[float]] = {name: [] for name in trees}
    digests: dict[str, set[str]] = {name: set() for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            result = _child(tree, store, args.picks, args.seed, unique)
            times[name].append(result["ms"])
            digests[name].add(result["digest"])
    kind = "unique prompts and texts (--unique)" if unique else "bench.load's prompts and texts"
    lines = [f"{kind}:"]
    for name in trees:
        ms = times[name]
        lines.append(f"  {name:>20}: {statistics.median(ms):.3f} ms CPU per pick (median of"
                     f" {', '.join(f'{t:.3f}' for t in ms)}); blocks {sorted(digests[name])}")
    same = len({d for ds in digests.values() for d in ds}) == 1
    lines.append("  same bytes" if same else "  DIFFERENT BYTES")
    return lines


def _sha(rev: str) -> str:
    return subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()


def _holds(store: Path) -> str:
    with sqlite3.connect(f"file:{store.resolve()}?immutable=1", uri=True) as db:
        episodes, texts = db.execute("SELECT count(*), count(DISTINCT text) FROM memories"
                                     " WHERE type = 'episodic'").fetchone()
    return f"{episodes} episodes, {texts} distinct texts"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, required=True, help="a SQLite memory store")
    parser.add_argument("--picks", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--before", help="also time this commit's code, alternating")
    parser.add_argument("--unique", action="store_true",
                        help="only turns that never repeat a prompt or an episode's text")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ctxproxy-pick-") as name:
        tmp = Path(name)
        trees = {"now": ROOT}
        if args.before:
            old = tmp / "before"
            old.mkdir()
            archive = subprocess.run(["git", "archive", args.before], cwd=ROOT, check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
            trees = {f"before ({args.before})": old, **trees}
        lines: list[str] = []
        for unique in [True] if args.unique else [False, True]:
            lines += _run(args, tmp, trees, unique)
    text = "\n".join([
        f"{args.picks} picks over {args.store.name} ({_holds(args.store)}), {args.rounds} rounds,"
        f" trees alternating; at {_sha('HEAD')}{' vs ' + _sha(args.before) if args.before else ''};"
        f" {platform.python_implementation()} {platform.python_version()},"
        f" {os.cpu_count()} CPUs, {datetime.date.today()}", *lines])
    print(text)
    if not args.no_write:
        command = "python -m bench.recall_pick " + " ".join(argv or sys.argv[1:])
        write_block(SECTION, BEGIN, END, (
            "The CPU time (thread time) of a user turn's `Recaller.pick` and the blocks' rendering"
            " over a copy of a SQLite store a `bench.load` run filled; the same turns through"
            f" each tree, which must render the same bytes.\n\n`{command}`\n\n```\n{text}\n```"))
    return 0 if all(line != "  DIFFERENT BYTES" for line in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
