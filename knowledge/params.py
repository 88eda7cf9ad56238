"""Validating a knowledge call's JSON: the service's error type and its parameter readers."""

from __future__ import annotations

from typing import Any

__all__ = ["Body", "ServiceError", "choice", "integer", "optional_string", "string"]

Body = dict[str, Any]


class ServiceError(Exception):
    """A request the core refuses: ``code`` is the envelope's code and the HTTP status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def string(body: Body, key: str, max_len: int | None = None) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise ServiceError(400, f"{key} must be a non-empty string")
    if max_len is not None and len(value) > max_len:
        raise ServiceError(400, f"{key} must be at most {max_len} characters")
    return value


def optional_string(body: Body, key: str, max_len: int) -> str | None:
    if body.get(key) is None:
        return None
    return string(body, key, max_len)


def integer(body: Body, key: str, default: int, low: int, high: int) -> int:
    value = body.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ServiceError(400, f"{key} must be an integer from {low} to {high}")
    return value


def choice(body: Body, key: str, allowed: frozenset[str]) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if value not in allowed:
        raise ServiceError(400, f"{key} must be one of: {', '.join(sorted(allowed))}")
    return str(value)
