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

from ledger.model import RECORD_COLUMNS, Group, Record, Totals

__all__ = [
    "COLUMNS", "HOUR", "INSERT_COLUMNS", "ROLLUP", "ROLLUP_TABLE", "TABLE", "backfill_sql",
    "from_row", "group_key", "hour_of", "rollup_rows", "series_params", "series_sql",
    "to_row", "totals_from", "totals_sql", "upsert_sql",
]

TABLE = "ctxproxy_requests"
ROLLUP = "ctxproxy_requests_hourly"
COLUMNS = ", ".join(RECORD_COLUMNS)
INSERT_COLUMNS = COLUMNS + ", recalled"
HOUR = 3600.0
SUMMED = [f.name for f in fields(Totals)][2:-2]  # requests ... degraded
_ROLLUP_COLUMNS = ["hour", "session_id", "model", *SUMMED, "first_at", "last_at"]

# The roll-up's columns, per dialect (its key: hour, session, model).
ROLLUP_TABLE = (
    f"CREATE TABLE {ROLLUP} (hour {{int}} NOT NULL, session_id text NOT NULL, "
    "model text NOT NULL, "
    + "".join(f"{name} {{int}} NOT NULL, " for name in SUMMED)
    + "first_at {real} NOT NULL, last_at {real} NOT NULL, "
    "PRIMARY KEY (hour, session_id, model))"
)

# A request row's share of each summed column.
_FROM_ROWS = {name: f"sum({name})" for name in SUMMED} | {
    "requests": "count(*)", "priced": "count(input_tokens)",
    "degraded": "sum(CASE WHEN degraded <> '' THEN 1 ELSE 0 END)",
}
_RAW_SUMS = ", ".join(f"coalesce({_FROM_ROWS[n]}, 0)" for n in SUMMED) + ", min(at), max(at)"
_ROLLUP_SUMS = ", ".join(f"sum({n})" for n in SUMMED) + ", min(first_at), max(last_at)"
_HOUR_OF_AT = ("CAST(at / 3600 AS INTEGER)", "floor(at / 3600)::bigint")

# Per group: the expression that names a roll-up row's group.
_KEYS: dict[Group, str] = {
    "day": "hour / 24", "hour": "hour", "session": "session_id", "model": "model", "all": "''",
}


def totals_sql(by: Group, *, since: bool, session: bool, mark: str,
               newest: bool = False) -> str:
    """The sums per (group, model) from the roll-up; parameters: the first hour, the session
    (each when asked for), then with ``newest`` (sessions only) the first hour again and how
    many of the most recent sessions; ``mark`` is the driver's placeholder."""
    where = ["hour >= " + mark] if since else []
    if session:
        where.append("session_id = " + mark)
    if newest:
        # The most recent sessions first (one max per session), then only their sums.
        where.append(f"session_id IN (SELECT session_id FROM {ROLLUP}"
                     + (f" WHERE hour >= {mark}" if since else "")
                     + f" GROUP BY session_id ORDER BY max(last_at) DESC LIMIT {mark})")
    order = "max(last_at) DESC" if by == "session" else "min(first_at)"
    return (
        f"SELECT {_KEYS[by]} AS k, model, {_ROLLUP_SUMS} FROM {ROLLUP}"
        + (" WHERE " + " AND ".join(where) if where else "")
        + f" GROUP BY 1, 2 ORDER BY {order}"
    )


def series_sql(dialect: int, *, hourly: bool, mark: str) -> str:
    """Sums per (step, model) from a start on; parameters: start, step, start (in hours
    from the roll-up, in seconds from the request rows)."""
    if hourly:
        return (f"SELECT (hour - {mark}) / {mark} AS k, model, {_ROLLUP_SUMS} FROM {ROLLUP}"
                f" WHERE hour >= {mark} GROUP BY 1, 2 ORDER BY 1")
    key = (f"CAST((at - {mark}) / {mark} AS INTEGER)" if dialect == 0
           else f"floor((at - {mark}) / {mark})::bigint")
    return (f"SELECT {key} AS k, model, {_RAW_SUMS} FROM {TABLE} WHERE at >= {mark}"
            " GROUP BY 1, 2 ORDER BY 1")


def upsert_sql(dialect: int, mark: str) -> str:
    """Add one (hour, session, model)'s numbers to the roll-up."""
    low, high = ("min", "max") if dialect == 0 else ("LEAST", "GREATEST")
    sets = ", ".join(f"{n} = {ROLLUP}.{n} + excluded.{n}" for n in SUMMED)
    return (
        f"INSERT INTO {ROLLUP} ({', '.join(_ROLLUP_COLUMNS)}) VALUES "
        f"({', '.join([mark] * len(_ROLLUP_COLUMNS))}) "
        f"ON CONFLICT (hour, session_id, model) DO UPDATE SET {sets}, "
        f"first_at = {low}({ROLLUP}.first_at, excluded.first_at), "
        f"last_at = {high}({ROLLUP}.last_at, excluded.last_at)"
    )


def backfill_sql(dialect: int, *, where: str = "") -> str:
    """Roll request rows up (a migration; prune re-rolls the hour it cut into)."""
    hour = _HOUR_OF_AT[dialect]
    return (f"INSERT INTO {ROLLUP} ({', '.join(_ROLLUP_COLUMNS)}) "
            f"SELECT {hour}, session_id, model, {_RAW_SUMS} FROM {TABLE} {where} "
            "GROUP BY 1, 2, 3")


def rollup_rows(records: Iterable[Record]) -> list[tuple[Any, ...]]:
    """A batch's numbers per (hour, session, model), as roll-up rows to add."""
    groups: dict[tuple[int, str, str], list[Any]] = {}
    for r in records:
        key = (int(r.at // HOUR), r.session_id, r.model)
        sums = groups.get(key)
        if sums is None:
            sums = groups[key] = [0] * len(SUMMED) + [r.at, r.at]
        values = (
            1, int(r.input_tokens is not None), r.client_tokens, r.forwarded_tokens,
            r.input_tokens, r.cached_tokens, r.output_tokens, r.direct_input, r.direct_cached,
            r.items_cut, r.outputs_masked, len(r.memory_ids), int(bool(r.degraded)),
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
