"""Helpers: a wiki folder on disk, and the `ctxproxy knowledge` commands run in-process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ctxproxy.config import load_settings
from ctxproxy.knowledge.capability import HEADER, Grant, mint
from ctxproxy.proxy.cli import build_parser
from ctxproxy.proxy.knowledge_wiring import CAPABILITY
from tests.conftest import SERVED

PAGES = {
    "auth.md": "# Authentication\n\nAccess tokens rotate every hour; refresh tokens live "
               "for 30 days. The gateway checks the audience claim.\n",
    "ops/deploy.md": "# Deploying\n\nWe deploy with helm charts from the main branch. "
                     "Rollbacks use helm rollback.\n",
    "ops/oncall.md": "# On-call\n\nThe on-call engineer owns the pager for a week.\n",
    ".git/ignored.md": "# Hidden\n\nnever indexed\n",
}


def write_wiki(root: Path, pages: dict[str, str] = PAGES) -> Path:
    for name, text in pages.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def ctxproxy(capsys: pytest.CaptureFixture[str], data_dir: Path, *argv: str,
             **settings: object) -> tuple[int, str, str]:
    """Run ``ctxproxy ARGV`` as main() would, against ``data_dir``; (exit code, out, err)."""
    capsys.readouterr()
    args = build_parser().parse_args(list(argv))
    code = args.func(load_settings(env={}, data_dir=data_dir, **settings), args)
    out, err = capsys.readouterr()
    return int(code or 0), out, err


def add_wiki(capsys: pytest.CaptureFixture[str], data_dir: Path, folder: Path,
             team: str = "team-1", name: str = "Design docs",
             summary: str = "How the backend is built") -> str:
    code, out, err = ctxproxy(capsys, data_dir, "knowledge", "add-wiki", "--team", team,
                              "--name", name, "--summary", summary, str(folder))
    assert code == 0, err
    return out.strip()


def tool_headers(url: str, knowledge_id: object, *, team: str = "team-1",
                 service_id: str = "default") -> dict[str, str]:
    """The capability header a ``<knowledge_tools>`` block of ``team`` would carry for this
    asset, minted by the proxy serving ``url`` (none for an id that is not a string)."""
    if not isinstance(knowledge_id, str):
        return {}
    key = SERVED[url].app[CAPABILITY]
    grant = Grant(service_id, team, "", "", knowledge_id)
    return {HEADER: mint(key, grant, now=time.time())}
