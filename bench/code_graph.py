"""Code graph indexing: ``ctxproxy knowledge add-code`` on a generated 10k-file repository.

    .venv/bin/python -m bench.code_graph                  # writes its block of bench/RESULTS.md
    .venv/bin/python -m bench.code_graph --files 2000 --no-write

The repository is generated into a temporary folder: small files (a constant, a class with two
methods, two functions calling each other and a neighbour file's function, imports), spread
over Python, TypeScript, JavaScript, Go and Rust in equal shares. Three runs, each the whole
``index_repository`` (walk, digest, parse, write) into a fresh SQLite catalogue:

- *first index*: every file parsed and written;
- *re-run, nothing changed*: every file read and digested, none parsed;
- *re-run, 1% changed and 1% deleted*: only those parsed, written or removed.

The goal (issue 15) is a 10k-file repository in under a minute on this machine.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.harness.machine import machine, revision
from bench.harness.results import write_block
from ctxproxy.knowledge.code_index import index_repository
from ctxproxy.knowledge.store import FILENAME, Catalogue

SECTION = "## Code graph indexing"
BEGIN = "<!-- code-graph:begin (written by bench/code_graph.py) -->"
END = "<!-- code-graph:end -->"
GOAL_S = 60.0


def _python(i: int) -> str:
    return (f'"""Module {i}."""\nimport os\nfrom pkg.m{i - 1} import helper_{i - 1}\n\n'
            f"LIMIT_{i} = {i}\n\n\nclass Store{i}:\n    \"\"\"Keeps items of shard {i}.\"\"\"\n\n"
            f"    def get(self, key):\n        return self.put(key) or helper_{i}(key)\n\n"
            f"    def put(self, key):\n        return os.path.join(str(key), 'x')\n\n\n"
            f"def helper_{i}(x):\n    \"\"\"Helps {i}.\"\"\"\n    return compute_{i}(x) + "
            f"helper_{i - 1}(x)\n\n\ndef compute_{i}(x):\n    return x * LIMIT_{i}\n")


def _typescript(i: int) -> str:
    return (f'import {{ helper{i - 1} }} from "./m{i - 1}";\n\nexport const LIMIT_{i} = {i};\n\n'
            f"/** Keeps items of shard {i}. */\nexport class Store{i} {{\n"
            f"  get(key: string): number {{ return this.put(key) + helper{i}(key); }}\n"
            f"  put(key: string): number {{ return key.length; }}\n}}\n\n"
            f"export function helper{i}(x: string): number {{\n"
            f"  return compute{i}(x) + helper{i - 1}(x);\n}}\n\n"
            f"function compute{i}(x: string): number {{ return x.length * LIMIT_{i}; }}\n")


def _javascript(i: int) -> str:
    return (f'import {{ helper{i - 1} }} from "./m{i - 1}.js";\n\nexport const LIMIT_{i} = {i};'
            f"\n\n// Keeps items of shard {i}.\nexport class Store{i} {{\n"
            f"  get(key) {{ return this.put(key) + helper{i}(key); }}\n"
            f"  put(key) {{ return key.length; }}\n}}\n\n"
            f"export function helper{i}(x) {{ return compute{i}(x) + helper{i - 1}(x); }}\n\n"
            f"const compute{i} = (x) => x.length * LIMIT_{i};\n")


def _go(i: int) -> str:
    return (f'package shard\n\nimport (\n\t"fmt"\n\t"strings"\n)\n\n'
            f"// Limit{i} caps shard {i}.\nconst Limit{i} = {i}\n\n"
            f"// Store{i} keeps items.\ntype Store{i} struct{{ name string }}\n\n"
            f"// Get returns one item.\nfunc (s *Store{i}) Get(key string) int {{\n"
            f"\tfmt.Println(strings.ToUpper(s.name))\n\treturn Helper{i}(key)\n}}\n\n"
            f"func Helper{i}(x string) int {{ return Compute{i}(x) + Helper{i - 1}(x) }}\n\n"
            f"func Compute{i}(x string) int {{ return len(x) * Limit{i} }}\n")


def _rust(i: int) -> str:
    return (f"use std::collections::HashMap;\n\n/// The limit of shard {i}.\n"
            f"pub const LIMIT_{i}: usize = {i};\n\n/// Keeps items.\n"
            f"pub struct Store{i} {{ map: HashMap<String, usize> }}\n\nimpl Store{i} {{\n"
            f"    pub fn get(&self, k: &str) -> usize {{ helper_{i}(k) + self.map.len() }}\n}}\n\n"
            f"pub fn helper_{i}(x: &str) -> usize {{ compute_{i}(x) + helper_{i - 1}(x) }}\n\n"
            f"fn compute_{i}(x: &str) -> usize {{ x.len() * LIMIT_{i} }}\n")


WRITERS: list[tuple[str, Callable[[int], str]]] = [
    ("py", _python), ("ts", _typescript), ("js", _javascript), ("go", _go), ("rs", _rust),
]


def generate(root: Path, files: int) -> list[Path]:
    """``files`` small source files in folders of 100, the languages in turn."""
    paths = []
    for i in range(files):
        suffix, write = WRITERS[i % len(WRITERS)]
        path = root / f"pkg{i // 100:03d}" / f"m{i}.{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(write(i))
        paths.append(path)
    return paths


def timed(catalogue: Catalogue, root: Path) -> tuple[float, str]:
    start = time.perf_counter()
    result, parsed = index_repository(catalogue, "default", "team-bench", "bench", None, root)
    took = time.perf_counter() - start
    return took, (f"{result.added} added, {result.updated} updated, {result.removed} removed, "
                  f"{result.unchanged} unchanged; {parsed} parsed")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.code_graph", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=10_000, help="files to generate")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="ctxproxy-bench-cg-") as tmp:
        root = Path(tmp) / "repo"
        paths = generate(root, args.files)
        size = sum(p.stat().st_size for p in paths)
        catalogue = Catalogue.open(Path(tmp) / "data" / FILENAME)
        try:
            first, first_counts = timed(catalogue, root)
            print(f"first index: {first:.1f} s ({first_counts})", flush=True)
            again, again_counts = timed(catalogue, root)
            print(f"re-run: {again:.1f} s ({again_counts})", flush=True)
            step = 100
            for path in paths[::step]:
                path.write_text(path.read_text() + "\n// changed\n".replace(
                    "//", "#" if path.suffix == ".py" else "//"))
            for path in paths[step // 2::step]:
                path.unlink()
            sync, sync_counts = timed(catalogue, root)
            print(f"re-run after changes: {sync:.1f} s ({sync_counts})", flush=True)
            symbols = catalogue.read("SELECT count(*) AS n FROM code_symbols")[0]["n"]
            refs = catalogue.read("SELECT count(*) AS n FROM code_refs")[0]["n"]
        finally:
            catalogue.close()
        db_mb = (Path(tmp) / "data" / FILENAME).stat().st_size / 1e6

    command = "python -m bench.code_graph" + " ".join(["", *(argv or sys.argv[1:])])
    verdict = "met" if first < GOAL_S else "MISSED"
    text = "\n".join([
        f"Measured {datetime.date.today().isoformat()} at checkout {revision()} on "
        f"{machine()}. Command: `{command.strip()}`.",
        "",
        f"{args.files:,} generated files ({size / 1e6:.1f} MB; Python, TypeScript, JavaScript, "
        f"Go, Rust in equal shares), indexed into a fresh catalogue: {symbols:,} symbols and "
        f"{refs:,} references after the last run, {db_mb:.0f} MB of SQLite.",
        "",
        "| run | time | files/s | what it did |",
        "|---|---:|---:|---|",
        f"| first index | {first:.1f} s | {args.files / first:,.0f} | {first_counts} |",
        f"| re-run, nothing changed | {again:.1f} s | {args.files / again:,.0f} | "
        f"{again_counts} |",
        f"| re-run, 1% changed, 1% deleted | {sync:.1f} s | {args.files / sync:,.0f} | "
        f"{sync_counts} |",
        "",
        f"Goal: a 10k-file repository indexed in under {GOAL_S:.0f} s: {verdict} "
        f"({first:.1f} s).",
    ])
    print(text)
    if not args.no_write:
        write_block(SECTION, BEGIN, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
