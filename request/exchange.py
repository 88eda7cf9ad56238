"""One request on its way through the pipeline: the parsed body, who sent it, its history,
and what the steps did to it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from multidict import CIMultiDictProxy

from ctxproxy.config import Settings
from ctxproxy.request.history import History
from ctxproxy.request.items import Item
from ctxproxy.request.protocol import RESPONSES, Protocol

__all__ = [
    "Checkpoint", "Exchange", "Identity", "NotAResponsesRequest", "Notes",
    "has_lossy_number", "owner_digest", "user_digest",
]


class NotAResponsesRequest(ValueError):
    """The body is not JSON, or not a shape the pipeline understands: forward it untouched."""


def user_digest(user_key: str | None) -> str:
    """A user key's one-way digest: how stores and caches refer to a user, never the key."""
    if not user_key:
        return ""
    return "u_" + hashlib.sha256(b"ctxproxy-user-key\0" + user_key.encode()).hexdigest()[:32]


def owner_digest(principal: str | None, user_key: str | None) -> str:
    """The user part of a memory scope: the user key's digest, and under client keys the
    principal's with it, so that two client keys never share a scope."""
    if not principal:
        return user_digest(user_key)
    joined = b"ctxproxy-owner\0" + principal.encode() + b"\0" + (user_key or "").encode()
    return "p_" + hashlib.sha256(joined).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is asking. ``user_key`` is a secret: excluded from repr, never logged or forwarded."""

    team_id: str | None
    agent_id: str | None
    user_key: str | None = field(repr=False)
    session_id: str | None
    turn_id: str | None = None
    request_kind: str | None = None
    principal: str | None = None  # the client key's principal (None: no client keys)

    @property
    def user(self) -> str:
        """The user key's digest ('' without a key)."""
        return user_digest(self.user_key)

    @property
    def owner(self) -> str:
        """The user part of this caller's memory scope (see ``owner_digest``)."""
        return owner_digest(self.principal, self.user_key)

    @classmethod
    def from_request(
        cls, headers: CIMultiDictProxy[str], body: dict[str, Any] | None, settings: Settings,
        principal: str | None = None, protocol: Protocol = RESPONSES,
    ) -> Identity:
        body = body or {}
        meta = _turn_metadata(headers, body)
        user_key = headers.get("x-tdai-user-key") or (
            settings.user_key.get_secret_value() if settings.user_key else None
        )
        return cls(
            team_id=headers.get("x-team-id") or settings.team_id,
            agent_id=headers.get("x-agent-id") or settings.agent_id,
            user_key=user_key or None,
            session_id=protocol.session(headers, body),
            turn_id=_str_or_none(meta.get("turn_id")),
            request_kind=_str_or_none(meta.get("request_kind")),
            principal=principal,
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
class Notes:
    """What the steps report for the access-log line (None: not set, left out)."""

    outputs_masked: int | None = None
    cut_digest_chars: int | None = None
    knowledge_assets: int | None = None
    memory_cache: str | None = None
    memory_recalled: int | None = None
    memory_ids: tuple[str, ...] | None = None  # the memories shown (standing and recalled)
    memory_degraded: bool | None = None
    memory_whole: bool | None = None  # no memory (late, a failed store): sent uncut
    recall_kept: int | None = None
    recall_mode: str | None = None  # hybrid, lexical, lexical-degraded

    def fields(self) -> dict[str, Any]:
        return {k: v for k in self.__slots__ if (v := getattr(self, k)) is not None}


# What a step may change, as it was before the step ran.
Checkpoint = tuple[
    dict[str, Any], list[Item], int, list[int], frozenset[int], tuple[Item, ...], bool, Notes
]


@dataclass(slots=True)
class Exchange:
    """One request on its way through the pipeline.

    ``history`` is the client's whole input, as sent; steps never change it or its items.
    A step replaces ``body`` (or its keys) with new values, never mutates a list or an item
    in place, and records what it did: ``cut`` and ``first_turn`` (the window), ``starts``
    (where the forwarded turns' prompts stand in ``body["input"]``), ``masked_turns``, and
    ``stable_blocks``: the messages steps put before the first forwarded turn that keep their
    bytes until the next cut (the cut digest, then the standing memory block), in input order,
    so that a cache breakpoint can mark the last (a Messages body carries them at the end of
    ``system`` instead: ``request.protocol.Messages``).
    """

    raw: bytes
    body: dict[str, Any]
    identity: Identity
    history: History
    cut: list[Item] = field(default_factory=list)  # what the window removed, in input order
    first_turn: int = 0  # the history's first turn that is forwarded
    starts: list[int] = field(default_factory=list)
    masked_turns: frozenset[int] = frozenset()  # turns (history numbering) with masked outputs
    stable_blocks: tuple[Item, ...] = ()
    changed: bool = False
    notes: Notes = field(default_factory=Notes)
    # The steps' own state for this request, by their ``request.phases.Slot`` (a step's
    # failure does not undo it: the step's later phases still see it).
    slots: dict[object, object] = field(default_factory=dict)
    # The client's protocol, and what it needs to write the body back in its shape.
    protocol: Protocol = RESPONSES
    view: object = None

    @classmethod
    def parse(
        cls, raw: bytes, headers: CIMultiDictProxy[str], settings: Settings,
        principal: str | None = None, protocol: Protocol = RESPONSES,
    ) -> Exchange:
        """Read the body once. The steps see ``body`` in the Responses shape (``input``,
        ``instructions``) whatever the protocol; ``serialise`` writes it back in the
        client's."""
        try:
            client = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise NotAResponsesRequest(f"body is not JSON ({exc.msg})") from exc
        if not isinstance(client, dict):
            raise NotAResponsesRequest("body is not a JSON object")
        try:
            body, items, view = protocol.parse(client)
            history = History(items)
        except (TypeError, ValueError) as exc:
            raise NotAResponsesRequest(str(exc)) from exc
        return cls(
            raw=raw,
            body=body,
            identity=Identity.from_request(headers, client, settings, principal, protocol),
            history=history,
            starts=list(history.starts),
            protocol=protocol,
            view=view,
        )

    @property
    def items(self) -> list[Item] | None:
        """The input to forward as it stands now; None when there is none.

        A string input (steps never write one) reads as the history's one message: a step
        that changes the input writes it back as that list.
        """
        items = self.body.get("input")
        if isinstance(items, str):
            return list(self.history.items)
        return items if isinstance(items, list) else None

    @property
    def turns_forwarded(self) -> int:
        return self.history.turns - self.first_turn

    @property
    def is_compaction(self) -> bool:
        """A Codex compaction request: by its turn metadata, or a trailing compaction_trigger."""
        if self.identity.request_kind == "compaction":
            return True
        items = self.history.items
        return bool(items) and items[-1].get("type") == "compaction_trigger"

    @property
    def history_is_foreign(self) -> bool:
        """The history belongs to someone else: the server's, or a compaction's."""
        return bool(self.body.get("previous_response_id")) or self.is_compaction

    def uncut(self) -> bool:
        """Forward the client's input whole again: the window's cut undone (and what came
        with it: the digest of the cut turns, masked outputs); what other steps did to the
        rest of the body stays. False when there was no cut to undo."""
        if not self.first_turn:
            return False  # the window cut nothing (it masks only with a cut)
        self.body = {**self.body, "input": list(self.history.items)}
        self.cut = []
        self.first_turn = 0
        self.starts = list(self.history.starts)
        self.masked_turns = frozenset()
        self.stable_blocks = ()
        self.notes.outputs_masked = self.notes.cut_digest_chars = None
        self.changed = True
        return True

    def checkpoint(self) -> Checkpoint:
        return (dict(self.body), self.cut, self.first_turn, self.starts, self.masked_turns,
                self.stable_blocks, self.changed, replace(self.notes))

    def restore(self, saved: Checkpoint) -> None:
        (self.body, self.cut, self.first_turn, self.starts, self.masked_turns,
         self.stable_blocks, self.changed, self.notes) = saved

    def serialise(self) -> bytes:
        """The bytes to forward: the client's own when no step changed anything."""
        if not self.changed:
            return self.raw
        # Checked on the body written back: a protocol's messages hold fields its items leave
        # out (a Chat message's own keys), and those go out as the client sent them.
        body = self.body if self.protocol is RESPONSES else self.protocol.write_back(self)
        if has_lossy_number(body):
            raise NotAResponsesRequest("an integer beyond 64 bits would lose precision")
        try:
            return orjson.dumps(body)
        except orjson.JSONEncodeError as exc:  # nested deeper than orjson writes
            raise NotAResponsesRequest(f"the body cannot be written back: {exc}") from exc


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
