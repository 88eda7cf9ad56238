"""The layers hold, and `make lint` would catch an import that breaks them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT)], cwd=tree, capture_output=True, text=True, timeout=120)


def copy_tree(tmp_path: Path) -> Path:
    """The ``ctxproxy`` package (its links to the top-level folders copied as folders) and the
    contracts."""
    shutil.copytree(ROOT / "ctxproxy", tmp_path / "ctxproxy",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    return lint(copy_tree(tmp_path_factory.mktemp("clean")))


def test_the_project_keeps_its_layers(clean: subprocess.CompletedProcess[str]) -> None:
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "0 broken" in clean.stdout


@pytest.mark.parametrize(("module", "line", "message"), [
    ("memory/model.py", "from ctxproxy.proxy import app",
     "ctxproxy.memory is not allowed to import ctxproxy.proxy"),
    ("knowledge/step.py", "import ctxproxy.memory.model",
     "ctxproxy.knowledge is not allowed to import ctxproxy.memory"),
    ("injectors/tokens.py", "import ctxproxy.knowledge.model",
     "ctxproxy.injectors is not allowed to import"),
    ("request/items.py", "import ctxproxy.window.policy",
     "ctxproxy.request is not allowed to import ctxproxy.window"),
    ("request/history.py", "import sqlite3", "ctxproxy.request is not allowed to import sqlite3"),
    ("window/policy.py", "import aiohttp", "ctxproxy.window is not allowed to import aiohttp"),
])
def test_an_import_against_the_layers_fails_the_lint(
    tmp_path: Path, module: str, line: str, message: str
) -> None:
    tree = copy_tree(tmp_path)
    with (tree / "ctxproxy" / module).open("a") as f:
        f.write(f"\n{line}  # noqa\n")
    result = lint(tree)
    assert result.returncode != 0
    assert message in result.stdout
