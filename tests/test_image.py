"""The Dockerfile copies every package the project installs: ``ctxproxy`` and the folders its
entries link to (a missing one only shows as an ImportError when the image starts)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_dockerfile_copies_every_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {p.split(".")[0] for p in include} == {"ctxproxy"}
    linked = {p.name for p in (ROOT / "ctxproxy").iterdir() if p.is_symlink()}
    copied = set(re.findall(r"^COPY (\w+) \1$", (ROOT / "Dockerfile").read_text(), re.M))
    assert copied == {"ctxproxy", *linked}
