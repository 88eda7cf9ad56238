"""Plumbing fixtures: the memory tests' fresh PostgreSQL schema per test."""

from tests.memory.conftest import pg_url

__all__ = ["pg_url"]
