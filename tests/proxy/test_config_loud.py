"""Configuration that fails loudly: a store URL ctxproxy cannot use, a misspelled variable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ctxproxy.config import SettingsError, load_settings


def run_ctxproxy(args: list[str], env: dict[str, str], tmp_path: Path
                 ) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "CTXPROXY_DATA_DIR": str(tmp_path),
           "CTXPROXY_LOG_FORMAT": "text", **env}
    return subprocess.run([sys.executable, "-m", "ctxproxy.proxy", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_store_url_with_another_scheme_stops_start_up_in_one_line(tmp_path: Path) -> None:
    run = run_ctxproxy(["serve"], {"CTXPROXY_STORE_URL": "mysql://app:s3cret@db:3306/mem"},
                       tmp_path)
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0
    assert "CTXPROXY_STORE_URL" in run.stderr
    assert "postgresql://" in run.stderr
    assert "s3cret" not in run.stderr
    assert not (tmp_path / "memory.sqlite3").exists()


@pytest.mark.parametrize("url", ["sqlite:///var/lib/mem.db", "redis://cache:6379",
                                 "postgresql+psycopg://h/db", "localhost:5432/db"])
def test_only_postgresql_store_urls_are_accepted(url: str) -> None:
    with pytest.raises(SettingsError, match=r"^CTXPROXY_STORE_URL: must start with postgresql"):
        load_settings(env={"CTXPROXY_STORE_URL": url})


@pytest.mark.parametrize("url", ["postgresql://u:p@h:5432/db", "postgres://h/db"])
def test_postgresql_store_urls_are_kept(url: str) -> None:
    assert load_settings(env={"CTXPROXY_STORE_URL": url}).store_url == url


def test_an_empty_store_url_means_the_local_store() -> None:
    assert load_settings(env={"CTXPROXY_STORE_URL": ""}).store_url is None


def test_an_unknown_variable_is_named_with_the_closest_known_one(tmp_path: Path) -> None:
    run = run_ctxproxy(["memory", "list"], {"CTXPROXY_KEEP_TURN": "3",
                                            "CTXPROXY_UPSTREAM_ULR": "http://x",
                                            "CTXPROXY_ZZZ": "1"}, tmp_path)
    assert run.returncode == 0, run.stderr
    warnings = [line for line in run.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 3
    assert any("CTXPROXY_KEEP_TURN " in w and "did you mean CTXPROXY_KEEP_TURNS?" in w
               for w in warnings)
    assert any("CTXPROXY_UPSTREAM_ULR " in w and "did you mean CTXPROXY_UPSTREAM_URL?" in w
               for w in warnings)
    assert any("CTXPROXY_ZZZ " in w and "did you mean" not in w for w in warnings)


def test_known_and_test_suite_variables_bring_no_warning(tmp_path: Path) -> None:
    run = run_ctxproxy(["memory", "list"], {"CTXPROXY_KEEP_TURNS": "3",
                                            "CTXPROXY_TEST_PG_URL": "postgresql://h/db"},
                       tmp_path)
    assert run.returncode == 0, run.stderr
    assert "WARNING" not in run.stderr
