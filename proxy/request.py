"""A parsed Responses request and who sent it: built once at the edge, read by every step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from multidict import CIMultiDictProxy

from config import Settings

Item = dict[str, Any]


class NotAResponsesRequest(ValueError):
    """The body is not JSON, or not a shape the pipeline understands: forward it untouched."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is asking. ``user_key`` is a secret: excluded from repr, never logged or forwarded."""

    team_id: str | None
    agent_id: str | None
    user_key: str | None = field(repr=False)
    session_id: str | None
    turn_id: str | None = None
    request_kind: str | None = None

    @classmethod
    def from_request(
        cls, headers: CIMultiDictProxy[str], body: dict[str, Any] | None, settings: Settings
    ) -> Identity:
        body = body or {}
        meta = _turn_metadata(headers, body)
        user_key = headers.get("x-tdai-user-key") or (
            settings.user_key.get_secret_value() if settings.user_key else None
        )
        cache_key = body.get("prompt_cache_key")
        return cls(
            team_id=headers.get("x-team-id") or settings.team_id,
            agent_id=headers.get("x-agent-id") or settings.agent_id,
            user_key=user_key or None,
            session_id=headers.get("session-id")
            or (cache_key if isinstance(cache_key, str) else None),
            turn_id=_str_or_none(meta.get("turn_id")),
            request_kind=_str_or_none(meta.get("request_kind")),
        )


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _turn_metadata(headers: CIMultiDictProxy[str], body: dict[str, Any]) -> dict[str, Any]:
    raw = headers.get("x-codex-turn-metadata")
    if raw is None:
        client_meta = body.get("client_metadata")
        if isinstance(client_meta, dict):
            raw = client_meta.get("x-codex-turn-metadata")
    if not isinstance(raw, str):
        return {}
    try:
        meta = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return meta if isinstance(meta, dict) else {}


@dataclass(slots=True)
class Exchange:
    """One request on its way through the pipeline.

    Steps replace ``body`` keys (never mutate the client's items in place) and set ``changed``;
    ``history`` is the client's whole input and ``cut`` what the window removed from it, for
    the memory step. ``notes`` go into the access-log line.
    """

    raw: bytes
    body: dict[str, Any]
    identity: Identity
    history: list[Item] = field(default_factory=list)  # the client's whole input, as sent
    cut: list[Item] = field(default_factory=list)
    turns_in: int = 0
    turns_forwarded: int = 0
    changed: bool = False
    notes: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(
        cls, raw: bytes, headers: CIMultiDictProxy[str], settings: Settings
    ) -> Exchange:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise NotAResponsesRequest(f"body is not JSON ({exc.msg})") from exc
        if not isinstance(body, dict):
            raise NotAResponsesRequest("body is not a JSON object")
        items = body.get("input")
        if items is not None and not isinstance(items, str | list):
            raise NotAResponsesRequest("input is neither a string nor a list")
        return cls(
            raw=raw,
            body=body,
            identity=Identity.from_request(headers, body, settings),
            history=items if isinstance(items, list) else [],
        )

    @property
    def items(self) -> list[Item] | None:
        items = self.body.get("input")
        return items if isinstance(items, list) else None

    def serialise(self) -> bytes:
        """The bytes to forward: the client's own when no step changed anything."""
        if not self.changed:
            return self.raw
        if has_lossy_number(self.body):
            raise NotAResponsesRequest("an integer beyond 64 bits would lose precision")
        return orjson.dumps(self.body)


_LOSSY = float(2**63)


def has_lossy_number(value: Any) -> bool:
    """True when orjson parsed an integer too big for 64 bits (it becomes a float).

    Re-serialising such a body would change the number, so the caller forwards the client's
    bytes instead. The walk visits every node of the body and most are strings: skipping them
    with one exact type test first halves its cost (bench/RESULTS.md).
    """
    stack = [value]
    while stack:
        node = stack.pop()
        if type(node) is str:
            continue
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, float) and abs(node) >= _LOSSY:
            return True
    return False
