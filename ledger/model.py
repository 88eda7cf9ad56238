"""The ledger's row, its sums, and the interface both stores (SQLite, PostgreSQL) give."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Literal, Protocol

__all__ = ["GROUPS", "Group", "Ledger", "LedgerError", "Record", "ScopeKey", "Totals"]

# How ``totals`` groups rows: by UTC day or hour, session, model, or all in one.
Group = Literal["day", "hour", "session", "model", "all"]
GROUPS: tuple[Group, ...] = ("day", "hour", "session", "model", "all")
ScopeKey = tuple[str, str, str, str]


class LedgerError(Exception):
    """The ledger's store failed (a driver error, a file that cannot be opened), or the
    counting of its rows did (the counting process died)."""


@dataclass(frozen=True, slots=True)
class Record:
    """One request (Responses, Messages or Chat Completions): numbers and ids only, never a
    prompt's text.

    Tokens are counted off the request path: ``client_tokens`` is the client's own body,
    ``forwarded_tokens`` what went upstream (both with the proxy's tokenizer). ``input_tokens``
    and ``cached_tokens`` are the upstream's own report (None when it gave none), and
    ``cache_write_tokens`` too, from the models that price cache writes apart.
    ``direct_input`` and ``direct_cached`` are the counterfactual: the same request sent
    directly, on the upstream's scale (see ledger/counterfactual.py); None without a report.
    """

    at: float
    session_id: str
    model: str
    status: int
    service_id: str = ""
    team_id: str = ""
    agent_id: str = ""
    user_ref: str = ""
    principal: str = ""  # the client key's ('': no client keys, or a row from before)
    client_tokens: int | None = None
    forwarded_tokens: int | None = None
    input_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None
    cache_write_tokens: int | None = None  # None: the upstream reported none
    direct_input: int | None = None
    direct_cached: int | None = None
    turns_in: int | None = None
    turns_forwarded: int | None = None
    items_cut: int = 0
    outputs_masked: int = 0
    memory_ids: tuple[str, ...] = ()
    knowledge: bool = False
    degraded: tuple[str, ...] = ()  # the steps that failed or degraded ("memory", "window")
    ttfb_ms: float | None = None
    protocol: str = ""  # the client protocol: responses, messages, chat ('': a row from before)
    request_id: int | None = field(default=None, compare=False)  # the store's row id


RECORD_COLUMNS = tuple(f.name for f in fields(Record) if f.name != "request_id")


@dataclass(slots=True)
class Totals:
    """Sums over the rows of one group and model (costs are priced from these, per model)."""

    key: str
    model: str
    requests: int = 0
    priced: int = 0  # rows with the upstream's usage (the only ones with costs)
    client_tokens: int = 0
    forwarded_tokens: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    direct_input: int = 0
    direct_cached: int = 0
    items_cut: int = 0
    outputs_masked: int = 0
    recalled: int = 0
    degraded: int = 0  # requests with a degraded step
    cache_write_tokens: int = 0  # last of the sums: schema version 4 added it
    first_at: float = 0.0
    last_at: float = 0.0


class Ledger(Protocol):
    """A store of Records. Every driver error leaves it as LedgerError."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def insert(self, records: list[Record],
                     nodes: Sequence[tuple[str, bytes, float]] = ()) -> None:
        """Add ``records``, and in the same transaction tell the direct-cost estimate's
        state of their sessions ``nodes``: (session, chain link, last used)."""
        ...

    async def direct_nodes(self, sessions: Sequence[str], since: float
                           ) -> dict[str, dict[bytes, float]]:
        """Each of ``sessions``' chain nodes used at ``since`` or later (every session asked
        has an entry, empty when the store has none)."""
        ...

    async def prune_direct(self, before: float) -> int:
        """Forget the chain nodes last used before ``before``; how many went."""
        ...

    async def prune(self, before: float) -> int:
        """Delete the rows older than ``before``; how many went."""
        ...

    # ``principal`` in the reads below: only that principal's rows (None: everyone's).

    async def totals(
        self, by: Group, *, since: float | None = None, session: str | None = None,
        limit: int | None = None, principal: str | None = None,
    ) -> list[Totals]:
        """Sums per (group, model), oldest group first (sessions: most recent first, at most
        ``limit`` sessions). A range starts at the whole hour ``since`` falls in."""
        ...

    async def series(self, start: float, step: float, *, principal: str | None = None
                     ) -> list[Totals]:
        """Sums per (step, model) from ``start`` on; a Totals' key is its step's number."""
        ...

    async def timeline(self, session: str, *, limit: int = 1000,
                       principal: str | None = None) -> list[Record]:
        """One session's rows, oldest first (its newest ``limit``)."""
        ...

    async def scopes(self, principal: str, *, limit: int) -> list[ScopeKey]:
        """The memory scopes ``principal``'s requests named, as (service, team, agent, user):
        the user part is a digest of the principal's, so no other principal's names them."""
        ...
