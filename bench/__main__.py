"""The benchmarks' one entry point.

    python -m bench                    # each benchmark and what it measures
    python -m bench NAME [ARGS...]     # run one: its main(ARGS)

A benchmark is a module of bench/ with a ``main`` function; its docstring's first sentence
says what it measures. The list is read from the source: listing imports none of them.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import inspect
import sys
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent


def summary(doc: str) -> str:
    """The docstring's first sentence, on one line."""
    first = " ".join(doc.split("\n\n", 1)[0].split())
    return first.split(". ", 1)[0].rstrip(".")


def benchmarks() -> dict[str, str]:
    """Every benchmark's name and the first line of its docstring, by name."""
    found: dict[str, str] = {}
    for path in sorted(HERE.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        if any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "main"
               for node in tree.body):
            found[path.stem] = summary(ast.get_docstring(tree) or "")
    return found


def run(name: str, argv: Sequence[str]) -> int:
    """Run benchmark ``name`` with ``argv`` as its arguments; its exit status."""
    module = importlib.import_module(f"bench.{name}")
    main = module.main
    sys.argv = [f"python -m bench {name}", *argv]  # for the benches that read sys.argv
    result = main(list(argv)) if inspect.signature(main).parameters else main()
    if inspect.isawaitable(result):
        result = asyncio.run(result)  # type: ignore[arg-type]
    return result if isinstance(result, int) else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    found = benchmarks()
    if not args or args[0] in ("-h", "--help"):
        width = max(map(len, found))
        print("python -m bench NAME [ARGS...]   (NAME --help: its arguments)\n")
        for name, about in found.items():
            print(f"  {name:<{width}}  {about}")
        return 0
    name, *rest = args
    if name not in found:
        print(f"no benchmark {name!r}; one of: {', '.join(found)}", file=sys.stderr)
        return 2
    return run(name, rest)


if __name__ == "__main__":
    sys.exit(main())
