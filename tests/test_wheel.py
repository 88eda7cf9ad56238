"""The project installs one import name, ``ctxproxy``: its subpackages are the top-level folders
(``proxy/``, ``memory/``, ...), linked from ``ctxproxy/``, and nothing imports them by their
folder names (on PYTHONPATH those still import, as a second copy of every module)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINKED = sorted(p.name for p in (ROOT / "ctxproxy").iterdir() if p.is_symlink())
NOT_INSTALLED = {"tests", "bench", "scripts"}  # run from a checkout only


def test_every_package_folder_is_linked_from_ctxproxy() -> None:
    folders = {p.parent.name for p in ROOT.glob("*/__init__.py")} - NOT_INSTALLED - {"ctxproxy"}
    assert set(LINKED) == folders
    for name in LINKED:
        assert (ROOT / "ctxproxy" / name).resolve() == ROOT / name


def _old_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                 else [])
        found += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names
                  if n.split(".")[0] in LINKED]
    return found


def test_nothing_imports_a_package_by_its_folder_name() -> None:
    files = [p for folder in [*LINKED, *NOT_INSTALLED] for p in (ROOT / folder).rglob("*.py")]
    assert [line for p in files for line in _old_imports(p)] == []


# Without the checkout on PYTHONPATH (as the tests run), which would hold its own ctxproxy.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _run(*argv: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=CLEAN_ENV, capture_output=True,
                          text=True, timeout=120, check=True)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain virtualenv with the wheel installed ``--no-deps``, and a .pth line to this test's
    own environment after it for the dependencies; its site-packages."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"  # a copy, so the build leaves nothing (build/, *.egg-info) in the checkout
    src.mkdir()
    for name in ["pyproject.toml", "README.md"]:
        shutil.copy(ROOT / name, src / name)
    for name in ["ctxproxy", *LINKED]:
        shutil.copytree(ROOT / name, src / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp / "dist", src, cwd=tmp)
    home = tmp / "venv"
    venv.create(home, with_pip=False)
    python = home / "bin" / "python"
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                     cwd=tmp).stdout.strip())
    before = set(os.listdir(site))
    (wheel,) = (tmp / "dist").glob("ctxproxy-*.whl")
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
         "--no-index", wheel, cwd=tmp)
    added = set(os.listdir(site)) - before
    assert {n for n in added if not n.endswith(".dist-info")} == {"ctxproxy"}
    # After the wheel's own site-packages on the path, so its ctxproxy is the one imported.
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return site


def test_the_wheel_installs_only_ctxproxy(installed: Path) -> None:
    (info,) = installed.glob("ctxproxy-*.dist-info")
    assert (info / "top_level.txt").read_text().split() == ["ctxproxy"]
    for name in LINKED:
        wanted = {p.name for p in (ROOT / name).glob("*.py")}
        assert {p.name for p in (installed / "ctxproxy" / name).glob("*.py")} == wanted


def test_the_installed_command_runs_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    bin_ = installed.parents[2] / "bin"
    helped = _run(bin_ / "ctxproxy", "--help", cwd=tmp_path)
    assert "ctxproxy serve" in helped.stdout
    where = _run(bin_ / "python", "-c", "import ctxproxy.proxy.app as m; print(m.__file__)",
                 cwd=tmp_path)
    assert Path(where.stdout.strip()) == installed / "ctxproxy" / "proxy" / "app.py"
    old = subprocess.run([str(bin_ / "python"), "-c", "import proxy"], cwd=tmp_path, env=CLEAN_ENV,
                         capture_output=True, text=True, timeout=60)
    assert "No module named 'proxy'" in old.stderr
