"""The command line as a new user meets it: --version, plain `ctxproxy` printing the commands
rather than serving, help without an error code, listings that say when they are empty, a pipe
closed early, a wiki folder with no pages, and a re-sync that keeps the wiki's summary."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from ctxproxy.knowledge.store import FILENAME, Catalogue
from ctxproxy.memory.model import Memory, Scope
from ctxproxy.memory.store_sqlite import SqliteStore
from ctxproxy.proxy.cli import main
from tests.fakes.server import free_port

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str, data_dir: Path, shell: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"CTXPROXY_DATA_DIR": str(data_dir), "PATH": "/usr/bin:/bin"}
    if shell is not None:
        return subprocess.run(["bash", "-c", shell], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
    return subprocess.run([sys.executable, "-m", "ctxproxy.proxy", *argv], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_version_and_help_say_what_plain_ctxproxy_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.startswith("ctxproxy ")
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "with no command this help is printed" in capsys.readouterr().out


def test_plain_ctxproxy_prints_the_commands_and_exits_0_without_serving(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"  # a server would make it on start
    port = free_port()
    env = {"CTXPROXY_DATA_DIR": str(data_dir), "CTXPROXY_PORT": str(port),
           "PATH": "/usr/bin:/bin"}
    # A short timeout: the old behaviour served until killed.
    done = subprocess.run([sys.executable, "-m", "ctxproxy.proxy"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    assert "usage: ctxproxy" in done.stdout
    for command in ("serve", "knowledge", "memory", "stats", "explain", "doctor"):
        assert f"\n    {command}" in done.stdout, command
    assert "listening" not in done.stderr
    assert not data_dir.exists()


def test_command_groups_without_an_action_print_help_and_exit_0(tmp_path: Path) -> None:
    for group in ("knowledge", "memory"):
        done = run(group, data_dir=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "usage:" in done.stdout


def test_empty_listings_say_so_on_stderr(tmp_path: Path) -> None:
    listed = run("memory", "list", data_dir=tmp_path)
    assert (listed.returncode, listed.stdout) == (0, "")
    assert "no memories" in listed.stderr
    searched = run("memory", "search", "anything", data_dir=tmp_path)
    assert "no memory matches" in searched.stderr
    assert "no knowledge yet" in run("knowledge", "list", data_dir=tmp_path).stdout


def test_export_into_a_pipe_closed_early_ends_quietly(tmp_path: Path) -> None:
    async def seed() -> None:
        store = SqliteStore(tmp_path / "memory.sqlite3")
        await store.open()
        scope = Scope("default", "", "", "")
        await store.upsert([Memory(type="semantic", scope=scope, key=f"k{i}",
                                   text=f"fact {i} " + "x" * 500) for i in range(2000)])
        await store.close()

    asyncio.run(seed())
    done = run(data_dir=tmp_path,
               shell=f"{sys.executable} -m ctxproxy.proxy memory export | head -1")
    assert done.returncode == 0
    assert done.stdout.startswith("{")
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_a_wiki_folder_without_pages_warns_and_a_resync_keeps_the_summary(
    tmp_path: Path,
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    made = run("knowledge", "add-wiki", "--team", "t", "--name", "Empty", str(empty),
               data_dir=tmp_path)
    assert made.returncode == 0 and "no *.md files" in made.stderr
    wiki = tmp_path / "wiki"
    wiki.mkdir()
    (wiki / "a.md").write_text("# A\n\nText.\n")
    first = run("knowledge", "add-wiki", "--team", "t", "--name", "W", "--summary",
                "How we ship", str(wiki), data_dir=tmp_path)
    again = run("knowledge", "add-wiki", "--team", "t", "--name", "W", str(wiki),
                data_dir=tmp_path)
    assert first.stdout == again.stdout  # the same wiki, synced
    catalogue = Catalogue.open(tmp_path / FILENAME)
    try:
        [row] = [r for r in catalogue.knowledge(None) if r["name"] == "W"]
    finally:
        catalogue.close()
    assert row["summary"] == "How we ship"
