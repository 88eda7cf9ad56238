"""What a load run left in the store, measured before the bench drops it: each table's size
on disk (with its indexes and TOAST) and rows, and the sessions, requests and turns they hold,
so that a store's size can be told per session and per turn."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from ctxproxy.ledger.sql import TABLE as LEDGER

__all__ = ["Sizes", "TableSize", "measure_sizes", "size_notes"]

# Every plain table of the schema the run wrote, with its indexes and TOAST; dead rows (old
# versions of updated or deleted ones, not yet vacuumed) from the statistics.
_PG_TABLES = """
SELECT c.relname, pg_table_size(c.oid), pg_indexes_size(c.oid), coalesce(s.n_dead_tup, 0)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE n.nspname = current_schema() AND c.relkind = 'r'
ORDER BY pg_total_relation_size(c.oid) DESC
"""
# SQLite's pages by the table they belong to (an index's pages go to its table; FTS5 keeps
# its index in shadow tables of its own).
_SQLITE_TABLES = """
SELECT s.tbl_name, sum(CASE WHEN s.type = 'index' THEN 0 ELSE d.pgsize END),
       sum(CASE WHEN s.type = 'index' THEN d.pgsize ELSE 0 END)
FROM dbstat d JOIN sqlite_schema s ON s.name = d.name GROUP BY s.tbl_name
"""
SMALL = 64 * 1024  # tables under this many bytes are reported together
_LEDGER_COUNTS = f"SELECT count(DISTINCT session_id), count(*) FROM {LEDGER}"
_BY_TYPE = "SELECT type, count(*) FROM memories GROUP BY type"


@dataclass(frozen=True)
class TableSize:
    name: str
    table_bytes: int  # the rows, and TOAST on PostgreSQL
    index_bytes: int
    rows: int
    dead_rows: int = 0


@dataclass(frozen=True)
class Sizes:
    tables: tuple[TableSize, ...]
    sessions: int  # distinct sessions in the request ledger
    requests: int  # the ledger's rows
    memories: dict[str, int]  # memories by type; an episodic one is a stored turn

    @property
    def total_bytes(self) -> int:
        return sum(t.table_bytes + t.index_bytes for t in self.tables)

    @property
    def turns(self) -> int:
        return self.memories.get("episodic", 0)


async def measure_sizes(data_dir: Path, store_url: str | None) -> Sizes:
    """The store the run left: PostgreSQL's tables at ``store_url``, else the SQLite files
    of ``data_dir``."""
    return await _postgres(store_url) if store_url else _sqlite(data_dir)


async def _postgres(url: str) -> Sizes:
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("ANALYZE")  # dead rows as of now
        tables = []
        for name, table_bytes, index_bytes, dead in await (await conn.execute(_PG_TABLES)
                                                           ).fetchall():
            row = await (await conn.execute(f'SELECT count(*) FROM "{name}"')).fetchone()
            tables.append(TableSize(name, table_bytes, index_bytes, row[0] if row else 0, dead))
        ledger = await (await conn.execute(_LEDGER_COUNTS)).fetchone()
        kinds = await (await conn.execute(_BY_TYPE)).fetchall()
    sessions, requests = ledger if ledger else (0, 0)
    return Sizes(tuple(tables), sessions, requests, {str(k): int(n) for k, n in kinds})


def _sqlite(data_dir: Path) -> Sizes:
    tables: list[TableSize] = []
    for path in sorted(data_dir.glob("*.sqlite3")):
        with sqlite3.connect(path) as db:
            for name, table_bytes, index_bytes in db.execute(_SQLITE_TABLES).fetchall():
                rows = db.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]
                tables.append(TableSize(f"{path.name}: {name}", table_bytes, index_bytes, rows))
    with sqlite3.connect(data_dir / "requests.sqlite3") as db:
        sessions, requests = db.execute(_LEDGER_COUNTS).fetchone()
    with sqlite3.connect(data_dir / "memory.sqlite3") as db:
        kinds = db.execute(_BY_TYPE).fetchall()
    tables.sort(key=lambda t: t.table_bytes + t.index_bytes, reverse=True)
    return Sizes(tuple(tables), sessions, requests, {str(k): int(n) for k, n in kinds})


def size_notes(s: Sizes) -> list[str]:
    """The report's lines: the whole, per session, turn and request, then each table."""
    mib = 1024 * 1024
    whole = s.total_bytes
    shown = [t for t in s.tables if t.table_bytes + t.index_bytes >= SMALL]
    rest = [t for t in s.tables if t.table_bytes + t.index_bytes < SMALL]
    return [
        f"- The store after the run (before the bench drops it): **{whole / mib:.1f} MiB** "
        f"for {s.sessions:,} sessions, {s.requests:,} requests and {s.turns:,} turns stored "
        f"(memories by type: {', '.join(f'{k} {n:,}' for k, n in sorted(s.memories.items()))});"
        f" {whole / max(s.sessions, 1) / 1024:.0f} KiB a session, "
        f"{whole / max(s.turns, 1) / 1024:.1f} KiB a turn, "
        f"{whole / max(s.requests, 1) / 1024:.1f} KiB a request:",
        "",
        "  | table | rows (dead) | rows and TOAST MiB | indexes MiB |",
        "  |---|---:|---:|---:|",
        *(f"  | {t.name} | {t.rows:,} ({t.dead_rows:,}) | {t.table_bytes / mib:.2f} "
          f"| {t.index_bytes / mib:.2f} |" for t in shown),
        *([f"  | {len(rest)} others, under {SMALL // 1024} KiB each | "
           f"{sum(t.rows for t in rest):,} | {sum(t.table_bytes for t in rest) / mib:.2f} "
           f"| {sum(t.index_bytes for t in rest) / mib:.2f} |"] if rest else []),
    ]
