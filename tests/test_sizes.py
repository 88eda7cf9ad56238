"""Sizes a reader can hold in their head: no module over 600 lines, no function over 60 lines
unless its docstring says why (issue 45's review)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("config", "request", "injectors", "knowledge", "memory", "window", "ledger",
           "plumbing", "proxy", "bench")
MODULE_LINES = 600
FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_and_functions_are_small(path: Path) -> None:
    source = path.read_text()
    assert source.count("\n") <= MODULE_LINES, f"{path.name}: over {MODULE_LINES} lines"
    long = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            doc = ast.get_docstring(node) or ""
            if lines > FUNCTION_LINES and f"{FUNCTION_LINES} lines" not in doc:
                long.append(f"{node.name} ({lines} lines)")
    assert not long, f"{path.name}: over {FUNCTION_LINES} lines without a reason: {long}"
