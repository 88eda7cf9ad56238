"""The indexers read only the folder they are given (issue 43): `ctxproxy knowledge add-code`
and `add-wiki`, run as a user runs them, pass over a link out of the folder (to a file or to a
folder), a link into a hidden file, a FIFO, a device and a file over the size bound, say so on
stderr, finish, and index only the rest; the tools then answer not-found for what was passed
over, and nothing from outside the folder is in the catalogue. The catalogue is SQLite only
(no PostgreSQL variant: the memory store plays no part here)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ProxyFactory
from tests.knowledge.test_code_graph import call

ROOT = Path(__file__).resolve().parents[2]
SECRET = "kept-outside-the-folder-4d1c"
PASSWD = "root:x:0:0"
TOO_BIG = (1 << 20) + 1
# The address space a run may take: a command that reads /dev/zero whole fails, not the host.
ADDRESS_SPACE_KB = 2 << 20


@dataclass(frozen=True)
class Indexer:
    command: str
    suffix: str
    read_tool: str  # the tool that serves one indexed file's text
    noun: str  # of the summary line: "1 files: ..." / "1 pages: ..."

    def read_params(self, name: str) -> dict[str, object]:
        if self.read_tool == "read_span":
            return {"path": name, "start_line": 1}
        return {"page_id": name.removesuffix(self.suffix)}


CODE = Indexer("add-code", ".py", "read_span", "files")
WIKI = Indexer("add-wiki", ".md", "read_page", "pages")
INDEXERS = [pytest.param(CODE, id="code"), pytest.param(WIKI, id="wiki")]


def _link(target: Callable[[Path], Path | str]) -> Callable[[Path, str], None]:
    def make(folder: Path, name: str) -> None:
        (folder / name).symlink_to(target(folder))
    return make


def _outside_file(folder: Path) -> Path:
    secret = folder.parent / "elsewhere" / "notes.txt"
    secret.parent.mkdir(exist_ok=True)
    secret.write_text(f"{SECRET}\n")
    return secret


def _outside_dir(folder: Path) -> Path:
    elsewhere = folder.parent / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    for suffix in (CODE.suffix, WIKI.suffix):
        (elsewhere / f"leak{suffix}").write_text(f"# {SECRET}\n")
    return elsewhere


def _hidden_file(folder: Path) -> str:
    (folder / ".env").write_text(f"TOKEN={SECRET}\n")
    return ".env"


def _fifo(folder: Path, name: str) -> None:
    os.mkfifo(folder / name)


def _big(folder: Path, name: str) -> None:
    (folder / name).write_text("#" * TOO_BIG)


# (case, the bad entry's name without its suffix, how to make it, the skip line's reason,
#  the indexed name that must not be served)
CASES = [
    ("link to /etc/passwd", "passwd", _link(lambda _: "/etc/passwd"),
     "a link out of the folder", "passwd{}"),
    ("link to a file outside", "notes", _link(_outside_file),
     "a link out of the folder", "notes{}"),
    ("link to a folder outside", "linked", _link(_outside_dir),
     "a link out of the folder", "linked/leak{}"),
    ("link into a hidden file", "settings", _link(_hidden_file),
     "a link into a hidden folder or file", "settings{}"),
    ("FIFO", "pipe", _fifo, "not a regular file", "pipe{}"),
    ("link to /dev/zero", "zero", _link(lambda _: "/dev/zero"),
     "a link out of the folder", "zero{}"),
    ("oversized file", "big", _big, "larger than 1 MiB", "big{}"),
]


def run(data_dir: Path, indexer: Indexer, folder: Path) -> subprocess.CompletedProcess[str]:
    """``ctxproxy knowledge add-...`` in a process of its own, as a user runs it."""
    argv = [sys.executable, "-m", "ctxproxy.proxy", "knowledge", indexer.command,
            "--team", "team-1", "--name", "Docs", str(folder)]
    try:
        return subprocess.run(
            ["bash", "-c", f'ulimit -v {ADDRESS_SPACE_KB} && exec "$@"', "ctxproxy", *argv],
            env={"CTXPROXY_DATA_DIR": str(data_dir), "PATH": "/usr/bin:/bin"}, cwd=ROOT,
            capture_output=True, text=True, timeout=90,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{indexer.command} did not finish (blocked on a file of {folder})")


def stored_bytes(data_dir: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(data_dir.iterdir()) if path.is_file())


def folder_with(tmp_path: Path, indexer: Indexer) -> Path:
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / f"ok{indexer.suffix}").write_text("# Fine\n\ndef fine():\n    pass\n")
    return folder


@pytest.mark.timeout(240)
@pytest.mark.parametrize("indexer", INDEXERS)
@pytest.mark.parametrize(("case", "stem", "make", "reason", "served"), CASES,
                         ids=[case[0] for case in CASES])
async def test_indexers_pass_over_what_is_not_a_file_of_the_folder(
    indexer: Indexer, case: str, stem: str, make: Callable[[Path, str], None], reason: str,
    served: str, tmp_path: Path, start_proxy: ProxyFactory,
) -> None:
    folder = folder_with(tmp_path, indexer)
    name = stem if stem == "linked" else stem + indexer.suffix
    make(folder, name)
    data_dir = tmp_path / "data"

    done = run(data_dir, indexer, folder)

    assert done.returncode == 0, done.stderr
    shown = name + "/" if stem == "linked" else name
    assert f"skipped {shown}: {reason}\n" in done.stderr
    assert f"1 {indexer.noun}: 1 added, 0 updated, 0 removed" in done.stderr
    kid = done.stdout.strip()
    proxy = await start_proxy()
    code, _ = await call(proxy.url, kid, indexer.read_tool,
                         **indexer.read_params(served.format(indexer.suffix)))
    assert code == 404
    code, _ = await call(proxy.url, kid, indexer.read_tool,
                         **indexer.read_params(f"ok{indexer.suffix}"))
    assert code == 0
    held = stored_bytes(data_dir)
    assert SECRET.encode() not in held and PASSWD.encode() not in held


@pytest.mark.timeout(240)
@pytest.mark.parametrize("indexer", INDEXERS)
async def test_reindexing_drops_a_file_that_became_a_link_out_of_the_folder(
    indexer: Indexer, tmp_path: Path, start_proxy: ProxyFactory,
) -> None:
    folder = folder_with(tmp_path, indexer)
    name = f"notes{indexer.suffix}"
    (folder / name).write_text("# Notes\n\nnothing secret yet\n")
    data_dir = tmp_path / "data"
    first = run(data_dir, indexer, folder)
    assert f"2 {indexer.noun}: 2 added" in first.stderr, first.stderr

    (folder / name).unlink()
    _link(_outside_file)(folder, name)
    again = run(data_dir, indexer, folder)

    assert again.returncode == 0, again.stderr
    assert f"skipped {name}: a link out of the folder\n" in again.stderr
    assert f"1 {indexer.noun}: 0 added, 0 updated, 1 removed, 1 unchanged" in again.stderr
    proxy = await start_proxy()
    kid = again.stdout.strip()
    code, _ = await call(proxy.url, kid, indexer.read_tool, **indexer.read_params(name))
    assert code == 404
    assert SECRET.encode() not in stored_bytes(data_dir)


@pytest.mark.timeout(240)
async def test_add_code_reads_the_checkouts_git_files_like_its_sources(
    tmp_path: Path, start_proxy: ProxyFactory,
) -> None:
    """A FIFO for .git/HEAD and a link out of the folder for .git/config: the command
    finishes, and the graph is named by the folder, not by what lies outside it."""
    folder = folder_with(tmp_path, CODE)
    (folder / ".git").mkdir()
    os.mkfifo(folder / ".git" / "HEAD")
    outside = tmp_path / "elsewhere.ini"
    outside.write_text(f'[remote "origin"]\n\turl = git@github.com:{SECRET}/x.git\n')
    (folder / ".git" / "config").symlink_to(outside)

    done = run(tmp_path / "data", CODE, folder)

    assert done.returncode == 0, done.stderr
    proxy = await start_proxy()
    code, info = await call(proxy.url, done.stdout.strip(), "get_info")
    assert code == 0 and (info["repo_slug"], info["branch"]) == ("folder", None)
    assert SECRET.encode() not in stored_bytes(tmp_path / "data")


@pytest.mark.timeout(240)
def test_a_skip_line_shows_a_names_control_characters_escaped(tmp_path: Path) -> None:
    folder = folder_with(tmp_path, CODE)
    (folder / "clear\x1b[2J\x07.py").symlink_to("/etc/passwd")

    done = run(tmp_path / "data", CODE, folder)

    assert "skipped clear\\x1b[2J\\x07.py: a link out of the folder\n" in done.stderr
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr
