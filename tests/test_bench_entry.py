"""bench/ as one tool: ``python -m bench`` lists every benchmark, and the benchmarks share
code only through bench/harness/."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.__main__ import benchmarks

BENCH = Path(__file__).resolve().parent.parent / "bench"


def has_main(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "main"
               for node in tree.body)


def test_python_m_bench_lists_every_module_with_a_main() -> None:
    expected = sorted(p.stem for p in BENCH.glob("*.py")
                      if not p.stem.startswith("_") and has_main(p))
    done = subprocess.run([sys.executable, "-m", "bench"], capture_output=True, text=True,
                          check=True, cwd=BENCH.parent)
    listed = [line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ")]
    assert listed == expected
    assert len(expected) >= 18
    assert all(benchmarks()[name] for name in expected)  # each with a description


def test_an_unknown_benchmark_is_refused() -> None:
    done = subprocess.run([sys.executable, "-m", "bench", "no_such_bench"], capture_output=True,
                          text=True, cwd=BENCH.parent)
    assert done.returncode == 2
    assert "overhead" in done.stderr


def imports(path: Path) -> list[str]:
    """Every module ``path`` imports, with each imported name as ``module.name``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += [f"{node.module}.{alias.name}" for alias in node.names]
    return found


def test_benchmarks_import_no_tests_and_no_private_names_of_each_other() -> None:
    for path in sorted(BENCH.rglob("*.py")):
        for name in imports(path):
            assert not name.startswith("tests."), f"{path}: {name}"
            if name.startswith("bench."):
                parts = name.split(".")
                # An older tree's module, loaded only by recall_pick's --before child.
                if name == "bench._session._PROMPTS":
                    continue
                assert not any(p.startswith("_") for p in parts[1:]), f"{path}: {name}"


def test_every_piece_the_overhead_bench_times_runs_on_todays_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`make bench` times the proxy's own work piece by piece (bench/components.py): each
    piece is called once here, so a changed signature fails the suite, not the next bench."""
    from bench import components

    called: list[int] = []

    def once(fn: Callable[[], object], number: int, repeat: int = 7) -> float:
        fn()
        called.append(1)
        return 1.0

    monkeypatch.setattr(components, "best_us", once)
    rows = components.measure()
    assert len(called) >= 5 and all(us > 0 for _, us in rows)
