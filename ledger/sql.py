"""The SQL both ledger stores share: the row's columns and the sums, per dialect."""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime
from typing import Any

from ledger.model import RECORD_COLUMNS, Group, Record, Totals

__all__ = ["COLUMNS", "TABLE", "from_row", "group_key", "to_row", "totals_from", "totals_sql"]

TABLE = "ctxproxy_requests"
COLUMNS = ", ".join(RECORD_COLUMNS)

# Per group: the expression that names a row's group (SQLite, PostgreSQL).
_KEYS: dict[Group, tuple[str, str]] = {
    "day": ("CAST(at / 86400 AS INTEGER)", "floor(at / 86400)::bigint"),
    "hour": ("CAST(at / 3600 AS INTEGER)", "floor(at / 3600)::bigint"),
    "session": ("session_id", "session_id"),
    "model": ("model", "model"),
    "all": ("''", "''"),
}

_SUMS = """count(*), count(input_tokens), coalesce(sum(client_tokens), 0),
    coalesce(sum(forwarded_tokens), 0), coalesce(sum(input_tokens), 0),
    coalesce(sum(cached_tokens), 0), coalesce(sum(output_tokens), 0),
    coalesce(sum(direct_input), 0), coalesce(sum(direct_cached), 0),
    coalesce(sum(items_cut), 0), coalesce(sum(outputs_masked), 0),
    coalesce(sum(recalled), 0), coalesce(sum(CASE WHEN degraded <> '' THEN 1 ELSE 0 END), 0),
    min(at), max(at)"""


def totals_sql(by: Group | None, dialect: int, *, since: bool, session: bool,
               mark: str) -> str:
    """The sums per (group, model); ``dialect`` 0 is SQLite, 1 PostgreSQL; ``mark`` the
    driver's placeholder. ``by=None``: per step of a series, the first two parameters being
    its start and its step (seconds)."""
    if by is None:
        key = (f"CAST((at - {mark}) / {mark} AS INTEGER)" if dialect == 0
               else f"floor((at - {mark}) / {mark})::bigint")
    else:
        key = _KEYS[by][dialect]
    where = ["at >= " + mark] if since else []
    if session:
        where.append("session_id = " + mark)
    order = "max(at) DESC" if by == "session" else "min(at)"
    return (
        f"SELECT {key} AS k, model, {_SUMS} FROM {TABLE}"
        + (" WHERE " + " AND ".join(where) if where else "")
        + f" GROUP BY 1, 2 ORDER BY {order}"
    )


def group_key(by: Group, value: Any) -> str:
    if by == "day":
        return datetime.fromtimestamp(int(value) * 86400, UTC).strftime("%Y-%m-%d")
    if by == "hour":
        return datetime.fromtimestamp(int(value) * 3600, UTC).strftime("%Y-%m-%d %H:00")
    return str(value)


_SUMMED = [f.name for f in fields(Totals)][2:]


def totals_from(by: Group, row: tuple[Any, ...]) -> Totals:
    key, model, *sums = row
    values = {name: int(v) for name, v in zip(_SUMMED[:-2], sums, strict=False)}
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


INSERT_COLUMNS = COLUMNS + ", recalled"


def from_row(row: tuple[Any, ...]) -> Record:
    """A Record from ``SELECT request_id, COLUMNS``."""
    values = dict(zip(("request_id", *RECORD_COLUMNS), row, strict=True))
    values["memory_ids"] = tuple(values["memory_ids"].split()) if values["memory_ids"] else ()
    values["degraded"] = tuple(values["degraded"].split(",")) if values["degraded"] else ()
    values["knowledge"] = bool(values["knowledge"])
    return Record(**values)
