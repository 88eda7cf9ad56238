"""The SQL both ledger stores share: the row's columns, the hourly roll-up the reports read,
and the sums, per dialect (0: SQLite, 1: PostgreSQL).

Reports never scan the request rows: each insert also adds its rows' numbers to one row per
(hour, session, model) in the same transaction, and the sums read those (30 days of a busy
proxy are a few thousand roll-up rows, not 100k request rows). Only a session's timeline and
a chart over less than a few hours read the request rows, through their indexes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any

from ctxproxy.ledger.model import RECORD_COLUMNS, Group, Record, Totals

__all__ = [
    "COLUMNS", "DIRECT", "HOUR", "INSERT_COLUMNS", "ROLLUP", "ROLLUP_TABLE", "ROLLUP_TABLE_V2",
    "TABLE", "backfill_sql", "cache_write_migration", "direct_migration", "direct_select_sql",
    "direct_upsert_sql", "from_row", "group_key", "hour_of", "principal_migration",
    "protocol_migration", "rollup_rows", "scopes_sql", "series_params", "series_sql",
    "timeline_sql", "to_row", "totals_from", "totals_query", "upsert_sql", "with_principal",
]

TABLE = "ctxproxy_requests"
ROLLUP = "ctxproxy_requests_hourly"
DIRECT = "ctxproxy_direct_nodes"  # the direct-cost estimate's state (ledger/counterfactual.py)
COLUMNS = ", ".join(RECORD_COLUMNS)
INSERT_COLUMNS = COLUMNS + ", recalled"
HOUR = 3600.0
SUMMED = [f.name for f in fields(Totals)][2:-2]  # requests ... cache_write_tokens
# The sums of the roll-up as versions 2 and 3 of the schema made it (4 added the last).
_SUMMED_V3 = SUMMED[: SUMMED.index("cache_write_tokens")]
# The roll-up's key: hour, then whose (the client key's principal: each sees only its own
# sums), session and model. Version 2 of the schema had no principal.
_KEY = ("hour", "principal", "session_id", "model")
_KEY_V2 = ("hour", "session_id", "model")


def _rollup_table(key: tuple[str, ...]) -> str:
    """The roll-up's columns as versions 2 and 3 made them, per dialect (``{int}``,
    ``{real}``)."""
    return (
        f"CREATE TABLE {ROLLUP} (hour {{int}} NOT NULL, "
        + "".join(f"{name} text NOT NULL, " for name in key[1:])
        + "".join(f"{name} {{int}} NOT NULL, " for name in _SUMMED_V3)
        + "first_at {real} NOT NULL, last_at {real} NOT NULL, "
        f"PRIMARY KEY ({', '.join(key)}))"
    )


ROLLUP_TABLE_V2 = _rollup_table(_KEY_V2)
ROLLUP_TABLE = _rollup_table(_KEY)

# A request row's share of each summed column.
_FROM_ROWS = {name: f"sum({name})" for name in SUMMED} | {
    "requests": "count(*)", "priced": "count(input_tokens)",
    "degraded": "sum(CASE WHEN degraded <> '' THEN 1 ELSE 0 END)",
}


def _raw_sums(summed: list[str]) -> str:
    return ", ".join(f"coalesce({_FROM_ROWS[n]}, 0)" for n in summed) + ", min(at), max(at)"


_RAW_SUMS = _raw_sums(SUMMED)
_ROLLUP_SUMS = ", ".join(f"sum({n})" for n in SUMMED) + ", min(first_at), max(last_at)"
_HOUR_OF_AT = ("CAST(at / 3600 AS INTEGER)", "floor(at / 3600)::bigint")

# Per group: the expression that names a roll-up row's group.
_KEYS: dict[Group, str] = {
    "day": "hour / 24", "hour": "hour", "session": "session_id", "model": "model", "all": "''",
}


def _where(since: int | None, session: str | None, principal: str | None, mark: str
           ) -> tuple[list[str], list[object]]:
    """The roll-up's filters and their parameters (None: not filtered by it)."""
    asked = (("hour >= ", since), ("session_id = ", session), ("principal = ", principal))
    return ([test + mark for test, value in asked if value is not None],
            [value for _, value in asked if value is not None])


def totals_query(by: Group, *, since: float | None, session: str | None,
                 principal: str | None, limit: int | None, mark: str
                 ) -> tuple[str, list[object]]:
    """The sums per (group, model) from the roll-up, and the query's parameters; with
    ``limit`` (sessions only) of the most recent sessions. ``mark`` is the driver's
    placeholder; ``principal`` None: every principal's rows."""
    where, params = _where(hour_of(since), session, principal, mark)
    if by == "session" and limit is not None:
        # The most recent sessions first (one max per session), then only their sums.
        inner, inner_params = _where(hour_of(since), None, principal, mark)
        where.append(f"session_id IN (SELECT session_id FROM {ROLLUP}"
                     + (" WHERE " + " AND ".join(inner) if inner else "")
                     + f" GROUP BY session_id ORDER BY max(last_at) DESC LIMIT {mark})")
        params += [*inner_params, limit]
    order = "max(last_at) DESC" if by == "session" else "min(first_at)"
    sql = (
        f"SELECT {_KEYS[by]} AS k, model, {_ROLLUP_SUMS} FROM {ROLLUP}"
        + (" WHERE " + " AND ".join(where) if where else "")
        + f" GROUP BY 1, 2 ORDER BY {order}"
    )
    return sql, params


def series_sql(dialect: int, *, hourly: bool, mark: str, principal: bool = False) -> str:
    """Sums per (step, model) from a start on; parameters: start, step, start (in hours
    from the roll-up, in seconds from the request rows), then the principal if asked."""
    whose = f" AND principal = {mark}" if principal else ""
    if hourly:
        return (f"SELECT (hour - {mark}) / {mark} AS k, model, {_ROLLUP_SUMS} FROM {ROLLUP}"
                f" WHERE hour >= {mark}{whose} GROUP BY 1, 2 ORDER BY 1")
    key = (f"CAST((at - {mark}) / {mark} AS INTEGER)" if dialect == 0
           else f"floor((at - {mark}) / {mark})::bigint")
    return (f"SELECT {key} AS k, model, {_RAW_SUMS} FROM {TABLE} WHERE at >= {mark}{whose}"
            " GROUP BY 1, 2 ORDER BY 1")


def timeline_sql(mark: str, *, principal: bool) -> str:
    """One session's newest rows, oldest first; parameters: the session, the principal if
    asked, how many."""
    whose = f" AND principal = {mark}" if principal else ""
    return (f"SELECT * FROM (SELECT request_id, {COLUMNS} FROM {TABLE} "
            f"WHERE session_id = {mark}{whose} ORDER BY at DESC, request_id DESC "
            f"LIMIT {mark}) t ORDER BY at, request_id")


def with_principal(params: tuple[Any, ...], principal: str | None) -> tuple[Any, ...]:
    """``params`` and the principal a query is filtered by, if it is."""
    return params if principal is None else (*params, principal)


def scopes_sql(mark: str) -> str:
    """The memory scopes one principal's requests named; parameters: the principal, how
    many at most."""
    return (f"SELECT DISTINCT service_id, team_id, agent_id, user_ref FROM {TABLE} "
            f"WHERE principal = {mark} LIMIT {mark}")


def _rollup_columns(key: tuple[str, ...], summed: list[str] = SUMMED) -> list[str]:
    return [*key, *summed, "first_at", "last_at"]


def upsert_sql(dialect: int, mark: str) -> str:
    """Add one (hour, principal, session, model)'s numbers to the roll-up."""
    low, high = ("min", "max") if dialect == 0 else ("LEAST", "GREATEST")
    sets = ", ".join(f"{n} = {ROLLUP}.{n} + excluded.{n}" for n in SUMMED)
    columns = _rollup_columns(_KEY)
    return (
        f"INSERT INTO {ROLLUP} ({', '.join(columns)}) VALUES "
        f"({', '.join([mark] * len(columns))}) "
        f"ON CONFLICT ({', '.join(_KEY)}) DO UPDATE SET {sets}, "
        f"first_at = {low}({ROLLUP}.first_at, excluded.first_at), "
        f"last_at = {high}({ROLLUP}.last_at, excluded.last_at)"
    )


def backfill_sql(dialect: int, *, where: str = "", version: int = 4) -> str:
    """Roll request rows up (a migration; prune re-rolls the hour it cut into) into the
    roll-up of schema ``version``: 2 had no principal, 3 no cache writes."""
    key = _KEY if version >= 3 else _KEY_V2
    summed = SUMMED if version >= 4 else _SUMMED_V3
    hour = _HOUR_OF_AT[dialect]
    groups = ", ".join(str(n) for n in range(1, len(key) + 1))
    return (f"INSERT INTO {ROLLUP} ({', '.join(_rollup_columns(key, summed))}) "
            f"SELECT {hour}, {', '.join(key[1:])}, {_raw_sums(summed)} FROM {TABLE} {where} "
            f"GROUP BY {groups}")


def principal_migration(dialect: int) -> tuple[str, ...]:
    """Version 3: each row says whose it is (the client key's principal; '': no client keys,
    or a row written before), and the roll-up is rebuilt with it in its key."""
    kinds = {"int": "INTEGER", "real": "REAL"} if dialect == 0 else {
        "int": "bigint", "real": "double precision"}
    return (
        f"ALTER TABLE {TABLE} ADD COLUMN principal text NOT NULL DEFAULT ''",
        f"CREATE INDEX {TABLE}_principal_scope ON {TABLE} "
        "(principal, service_id, team_id, agent_id, user_ref)",
        f"DROP TABLE {ROLLUP}",
        ROLLUP_TABLE.format(**kinds),
        f"CREATE INDEX {ROLLUP}_session ON {ROLLUP} (session_id, hour)",
        f"CREATE INDEX {ROLLUP}_principal ON {ROLLUP} (principal, hour)",
        backfill_sql(dialect, version=3),
    )


def cache_write_migration(dialect: int) -> tuple[str, ...]:
    """Version 4: the cache writes the upstream reported (NULL: none reported, as in every
    row written before), and their sum in the roll-up."""
    kind = "INTEGER" if dialect == 0 else "bigint"
    return (
        f"ALTER TABLE {TABLE} ADD COLUMN cache_write_tokens {kind}",
        f"ALTER TABLE {ROLLUP} ADD COLUMN cache_write_tokens {kind} NOT NULL DEFAULT 0",
    )


def protocol_migration() -> tuple[str, ...]:
    """Version 5: the client protocol of each row ('': written before, when only the
    Responses API was recorded and then Messages requests as if they were)."""
    return (f"ALTER TABLE {TABLE} ADD COLUMN protocol text NOT NULL DEFAULT ''",)


def direct_migration(dialect: int) -> tuple[str, ...]:
    """Version 6: each session's prompt-cache chain nodes, with when each was last used, so
    that whichever replica records a session's next request continues its estimate."""
    blob, real, rowid = ("BLOB", "REAL", " WITHOUT ROWID") if dialect == 0 else (
        "bytea", "double precision", "")
    return (
        f"CREATE TABLE {DIRECT} (session_id text NOT NULL, link {blob} NOT NULL, "
        f"used_at {real} NOT NULL, PRIMARY KEY (session_id, link)){rowid}",
        f"CREATE INDEX {DIRECT}_used ON {DIRECT} (used_at)",
    )


def direct_upsert_sql(dialect: int, mark: str) -> str:
    """Tell the store a node's last use; a later one already there stays (replicas race)."""
    newest = "max" if dialect == 0 else "greatest"
    return (
        f"INSERT INTO {DIRECT} (session_id, link, used_at) VALUES ({mark}, {mark}, {mark}) "
        f"ON CONFLICT (session_id, link) DO UPDATE SET "
        f"used_at = {newest}({DIRECT}.used_at, excluded.used_at)"
    )


def direct_select_sql(mark: str, sessions: int) -> str:
    """The nodes of ``sessions`` sessions used since a time (the parameters: the sessions,
    then the time)."""
    return (f"SELECT session_id, link, used_at FROM {DIRECT} WHERE session_id IN "
            f"({', '.join([mark] * sessions)}) AND used_at >= {mark}")


def rollup_rows(records: Iterable[Record]) -> list[tuple[Any, ...]]:
    """A batch's numbers per (hour, principal, session, model), as roll-up rows to add."""
    groups: dict[tuple[int, str, str, str], list[Any]] = {}
    for r in records:
        key = (int(r.at // HOUR), r.principal, r.session_id, r.model)
        sums = groups.get(key)
        if sums is None:
            sums = groups[key] = [0] * len(SUMMED) + [r.at, r.at]
        values = (
            1, int(r.input_tokens is not None), r.client_tokens, r.forwarded_tokens,
            r.input_tokens, r.cached_tokens, r.output_tokens, r.direct_input, r.direct_cached,
            r.items_cut, r.outputs_masked, len(r.memory_ids), int(bool(r.degraded)),
            r.cache_write_tokens,
        )
        for i, value in enumerate(values):
            sums[i] += value or 0
        sums[-2], sums[-1] = min(sums[-2], r.at), max(sums[-1], r.at)
    return [(*key, *sums) for key, sums in groups.items()]


def hour_of(since: float | None) -> int | None:
    """The roll-up's hour holding ``since`` (a range starts at its whole hour)."""
    return None if since is None else int(since // HOUR)


def series_params(start: float, step: float, hourly: bool) -> tuple[float, ...]:
    """``series_sql``'s parameters: whole hours for the roll-up."""
    if hourly:
        first = int(start // HOUR)
        return (first, int(step // HOUR), first)
    return (start, step, start)


def group_key(by: Group, value: Any) -> str:
    if by == "day":
        return datetime.fromtimestamp(int(value) * 86400, UTC).strftime("%Y-%m-%d")
    if by == "hour":
        return datetime.fromtimestamp(int(value) * 3600, UTC).strftime("%Y-%m-%d %H:00")
    return str(value)


def totals_from(by: Group, row: tuple[Any, ...]) -> Totals:
    key, model, *sums = row
    values = {name: int(v or 0) for name, v in zip(SUMMED, sums, strict=False)}
    return Totals(group_key(by, key), model, **values, first_at=float(sums[-2]),
                  last_at=float(sums[-1]))


def to_row(r: Record) -> tuple[Any, ...]:
    values: list[Any] = []
    for name in RECORD_COLUMNS:
        value = getattr(r, name)
        if name == "memory_ids":
            value = " ".join(value)
        elif name == "degraded":
            value = ",".join(value)
        elif name == "knowledge":
            value = int(value)
        values.append(value)
    values.append(len(r.memory_ids))
    return tuple(values)


def from_row(row: tuple[Any, ...]) -> Record:
    """A Record from ``SELECT request_id, COLUMNS``."""
    values = dict(zip(("request_id", *RECORD_COLUMNS), row, strict=True))
    values["memory_ids"] = tuple(values["memory_ids"].split()) if values["memory_ids"] else ()
    values["degraded"] = tuple(values["degraded"].split(",")) if values["degraded"] else ()
    values["knowledge"] = bool(values["knowledge"])
    return Record(**values)
