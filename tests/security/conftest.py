"""The security tests run against every store backend, with the memory tests' fixtures."""

from __future__ import annotations

from tests.memory.conftest import backend, pg_url

__all__ = ["backend", "pg_url"]
