from __future__ import annotations

from pathlib import Path

from ctxproxy.config import describe_settings

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_readme_lists_every_setting_with_its_default() -> None:
    # scripts/readme_settings.py rewrites the table; this keeps it from going stale.
    for name, default, _ in describe_settings():
        assert f"| `{name}` | `{default.replace('|', chr(92) + '|')}` |" in README, name


def test_readme_gives_the_two_set_up_commands() -> None:
    assert "make run" in README and "make test" in README
