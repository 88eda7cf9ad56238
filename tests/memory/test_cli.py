"""`ctxproxy memory ...` against both stores: what the commands print and what they change."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ctxproxy.memory.model import Memory, Scope, Store, user_ref
from ctxproxy.proxy.cli import main
from tests.memory.conftest import Backend

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
TEAM_A = Scope("svc", "team-a", "agent-1", "u_1")
TEAM_A2 = Scope("svc", "team-a", "agent-2", "u_1")
TEAM_B = Scope("svc", "team-b", "agent-1", "u_1")


@pytest.fixture(autouse=True)
def _keep_logging() -> Iterator[None]:
    """main() configures the root logger for a real run; give the next test its own back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


class Cli:
    """Runs `ctxproxy` in-process with the environment selecting one store."""

    def __init__(self, backend: Backend, monkeypatch: pytest.MonkeyPatch,
                 capsys: pytest.CaptureFixture[str]) -> None:
        self.backend = backend
        self.monkeypatch = monkeypatch
        self.capsys = capsys
        self.use(backend.settings)

    def use(self, settings: dict[str, Any]) -> None:
        for name, value in settings.items():
            self.monkeypatch.setenv("CTXPROXY_" + name.upper(), str(value))

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(["memory", *argv])
        out, err = self.capsys.readouterr()
        return code, out, err

    def seed(self, records: Sequence[Memory]) -> list[Memory]:
        return asyncio.run(_with(self.backend.make(), lambda s: s.upsert(records)))

    def get(self, memory_id: str) -> Memory | None:
        return asyncio.run(_with(self.backend.make(), lambda s: s.get(memory_id)))


async def _with(store: Store, action: Callable[[Store], Awaitable[T]]) -> T:
    await store.open()
    try:
        return await action(store)
    finally:
        await store.close()


@pytest.fixture
def cli(backend: Backend, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(backend, monkeypatch, capsys)


def mem(text: str, scope: Scope = TEAM_A, type: Any = "episodic", at: float = 1_700_000_000.0,
        **extra: Any) -> Memory:
    return Memory(type=type, scope=scope, key=text, text=text, created_at=at, updated_at=at,
                  **extra)


def test_add_then_list_and_show_print_the_new_memory(cli: Cli) -> None:
    code, out, _ = cli("add", "Use Python, not Node", "--service", "svc", "--team", "team-a",
                       "--agent", "agent-1", "--user", "u_1")
    assert code == 0
    memory_id = out.strip()
    assert memory_id.startswith("mem_")

    code, out, _ = cli("list")
    assert code == 0
    assert memory_id in out and "semantic" in out and "Use Python, not Node" in out

    code, out, _ = cli("show", memory_id)
    assert code == 0
    assert "scope:    service=svc team=team-a agent=agent-1 user=u_1" in out
    assert "  Use Python, not Node" in out


def test_add_twice_is_one_memory(cli: Cli) -> None:
    first = cli("add", "Tabs, not spaces")[1]
    second = cli("add", "Tabs, not spaces")[1]

    assert first == second
    assert cli("list")[1].count("Tabs, not spaces") == 1


def test_add_takes_its_scope_from_the_settings_and_never_the_user_key(cli: Cli) -> None:
    cli.use({"service_id": "acme", "team_id": "platform", "agent_id": "codex",
             "user_key": "uk-very-secret"})
    memory_id = cli("add", "Deploys go through ArgoCD")[1].strip()

    code, out, _ = cli("show", memory_id)
    assert code == 0
    expected = f"service=acme team=platform agent=codex user={user_ref('uk-very-secret')}"
    assert expected in out
    assert "uk-very-secret" not in out + cli("export")[1]


def test_add_and_edit_redact_secrets(cli: Cli) -> None:
    memory_id = cli("add", "CI pushes with token ghp_abcdefghijklmnopqrstuvwx1234")[1].strip()
    cli("edit", memory_id, "CI reads DB_PASSWORD=hunter2-very-secret from the vault")

    out = cli("show", memory_id)[1] + cli("export")[1]
    assert "ghp_abcdefghijklmnopqrstuvwx1234" not in out
    assert "hunter2-very-secret" not in out and "DB_PASSWORD=[REDACTED]" in out


def test_list_filters_by_part_of_the_scope_and_by_type(cli: Cli) -> None:
    cli.seed([
        mem("alpha episode", TEAM_A, at=1_700_000_001),
        mem("alpha fact", TEAM_A, type="semantic", at=1_700_000_002),
        mem("second agent episode", TEAM_A2, at=1_700_000_003),
        mem("team b episode", TEAM_B, at=1_700_000_004, session_id="s-b"),
    ])

    def texts(*argv: str) -> list[str]:
        code, out, _ = cli("list", *argv)
        assert code == 0
        return [line.split("  ")[-1] for line in out.splitlines()]

    assert texts() == ["team b episode", "second agent episode", "alpha fact", "alpha episode"]
    assert texts("--team", "team-a") == ["second agent episode", "alpha fact", "alpha episode"]
    assert texts("--team", "team-a", "--agent", "agent-1") == ["alpha fact", "alpha episode"]
    assert texts("--type", "semantic") == ["alpha fact"]
    assert texts("--session", "s-b") == ["team b episode"]
    assert texts("--limit", "1") == ["team b episode"]
    assert texts("--service", "svc", "--team", "team-a", "--agent", "agent-1", "--user", "u_1",
                 "--type", "episodic") == ["alpha episode"]


def test_search_looks_in_every_filtered_scope_best_match_first(cli: Cli) -> None:
    cli.seed([
        mem("the database is PostgreSQL 15 on port 5433", TEAM_A),
        mem("database backups run nightly", TEAM_A2),
        mem("the database of team b is MySQL", TEAM_B),
        mem("unrelated note on CSS", TEAM_A),
    ])

    code, out, _ = cli("search", "database port 5433", "--team", "team-a")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 2
    assert "PostgreSQL 15 on port 5433" in lines[0] and "backups" in lines[1]


def test_show_prints_the_source_chain_recursively(cli: Cli) -> None:
    e1, e2, e3 = cli.seed([
        mem("I prefer pytest", session_id="s1", turn_index=1),
        mem("please use pytest, not unittest", session_id="s2", turn_index=4),
        mem("pytest fixtures over setUp", session_id="s3", turn_index=2),
    ])
    fact = cli.seed([mem("prefers pytest", type="semantic",
                         sources=[e1.memory_id, e2.memory_id])])[0]
    merged = cli.seed([mem("tests: pytest with fixtures", type="semantic",
                           sources=[fact.memory_id, e3.memory_id, "mem_gone"])])[0]

    code, out, _ = cli("show", merged.memory_id)

    assert code == 0
    chain = out.split("sources:\n", 1)[1].splitlines()
    assert chain[0].startswith(f"  {fact.memory_id}  semantic")
    assert chain[1].startswith(f"    {e1.memory_id}  episodic  session s1 turn 1")
    assert chain[2].startswith(f"    {e2.memory_id}  episodic  session s2 turn 4")
    assert chain[3].startswith(f"  {e3.memory_id}  episodic  session s3 turn 2")
    assert chain[4] == "  mem_gone  (forgotten)"


def test_forget_deletes_what_was_distilled_only_from_it(cli: Cli) -> None:
    e1, e2 = cli.seed([mem("episode one"), mem("episode two")])
    only_e1 = cli.seed([mem("fact from one", type="semantic",
                            sources=[e1.memory_id, "mem_forgotten_before"])])[0]
    unrelated = cli.seed([mem("fact from the gone", type="semantic",
                              sources=["mem_forgotten_before"])])[0]
    from_chain = cli.seed([mem("fact from fact", type="semantic",
                               sources=[only_e1.memory_id])])[0]
    both = cli.seed([mem("fact from both", type="semantic",
                         sources=[e1.memory_id, e2.memory_id])])[0]

    code, out, _ = cli("forget", e1.memory_id)

    assert code == 0
    gone = {e1.memory_id, only_e1.memory_id, from_chain.memory_id}
    assert {line.split()[-1] for line in out.splitlines()} == gone
    assert all(cli.get(i) is None for i in gone)
    assert all(cli.get(m.memory_id) is not None for m in (e2, both, unrelated))


def test_edit_changes_the_text_and_keeps_the_id(cli: Cli) -> None:
    memory_id = cli("add", "Node 18")[1].strip()

    code, out, _ = cli("edit", memory_id, "Node 20")

    assert code == 0 and out.strip() == memory_id
    edited = cli.get(memory_id)
    assert edited is not None and edited.text == "Node 20"
    assert "Node 18" not in cli("list")[1]


def test_export_writes_json_lines_that_round_trip(cli: Cli, tmp_path: Path) -> None:
    seeded = cli.seed([
        mem("one ☃", TEAM_A, attrs={"score": 0.9}, sources=["mem_x"]),
        mem("two", TEAM_B, session_id="s", turn_index=2, expires_at=4_000_000_000.0),
    ])
    target = tmp_path / "out.jsonl"

    code, _, err = cli("export", "-o", str(target))

    assert code == 0 and "exported 2 memories" in err
    rows = [json.loads(line) for line in target.read_text(encoding="utf-8").splitlines()]
    by_id = {r["memory_id"]: r for r in rows}
    for m in seeded:
        row = by_id[m.memory_id]
        assert Memory(**{**row, "scope": Scope(**row["scope"])}) == m
    code, out, _ = cli("export", "--team", "team-b")
    assert [json.loads(line)["text"] for line in out.splitlines()] == ["two"]


def test_unknown_id_exits_1(cli: Cli) -> None:
    for action in (["show"], ["forget"], ["edit"]):
        argv = [*action, "mem_00000000000000000000000000"] + (["x"] if action == ["edit"] else [])
        code, _, err = cli(*argv)
        assert code == 1 and "no memory mem_00000000000000000000000000" in err


def test_store_failure_exits_1_with_a_message(cli: Cli) -> None:
    cli.use(cli.backend.broken_settings)

    code, _, err = cli("list")

    assert code == 1
    assert "store error" in err and "pw@" not in err


def test_the_installed_command_runs_the_same_actions(backend: Backend, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}
    env.update({"CTXPROXY_" + k.upper(): str(v) for k, v in backend.settings.items()})

    def run(*argv: str) -> str:
        done = subprocess.run([sys.executable, "-m", "ctxproxy.proxy", "memory", *argv], env=env,
                              cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
        return done.stdout

    memory_id = run("add", "Ship on Thursdays", "--team", "release").strip()
    assert memory_id in run("list", "--team", "release")
    assert "Ship on Thursdays" in run("search", "when do we ship", "--team", "release")
