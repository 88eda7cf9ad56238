"""The trust tests run against every store backend, with the memory tests' fixtures."""

from tests.memory.conftest import backend, pg_url, store

__all__ = ["backend", "pg_url", "store"]
