"""The PostgreSQL memory store's full-text search: which of a question's lexemes to look
for, the bounded candidate queries, and the ranking, all in one transaction of the store's.

Bounded as memory/search.py says: the rarer lexemes' every match, the commoner ones' newest,
then ranked exactly in the database.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import TupleRow

from ctxproxy.memory.model import Hit, MemoryType, Scope
from ctxproxy.memory.pg_schema import FILTERS, M_COLUMNS, clean, memory_of
from ctxproxy.memory.search import BUDGET, MAX_WORDS, RECENT, bound

__all__ = ["MAX_QUERY_CHARS", "Search", "Stats"]

# The question is parsed by the same configuration as the documents; its first 64 lexemes
# are OR-ed, since a question shares only some words with the memory that answers it.
# Which of these lexemes (tsquery operands) any memory holds: one GIN probe each.
_PRESENT = """
SELECT p.part FROM unnest(%(parts)s::text[]) AS p(part)
WHERE EXISTS (SELECT 1 FROM memories m WHERE m.tsv @@ p.part::tsquery)
"""
_PRESENCE_FACTOR = 4  # lexemes looked up at a time: this many times MAX_WORDS, rarest first
_LEXEMES = """
SELECT lexeme FROM unnest(to_tsvector('english'::regconfig, %s)) ORDER BY positions[1] LIMIT 64
"""
# How common each lexeme is, from the statistics ANALYZE (autovacuum) keeps for the planner.
_STATS = """
SELECT c.reltuples, s.most_common_elems::text::text[], s.most_common_elem_freqs
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stats s ON s.schemaname = n.nspname AND s.tablename = c.relname
    AND s.attname = 'tsv'
WHERE c.oid = 'memories'::regclass
"""
# Bounded as in the SQLite store (see memory.store_sqlite.bound): every match of the rarer
# lexemes (found through the GIN index alone: the scope index would add a bitmap of the
# whole scope), the newest matches of the commoner ones (a walk down the scope index), then
# ranked exactly: first how many of the question's lexemes a record holds, then ts_rank.
# The scope is part of each candidate query, before its cap: another scope's volume never
# fills the cap (one tenant hiding another's memories).
_RARE = f"""rare AS MATERIALIZED (
    SELECT m.memory_id FROM memories m WHERE m.tsv @@ %(rare)s::tsquery AND {FILTERS}
    LIMIT %(cap)s
)"""
_RECENT = f"""recent AS MATERIALIZED (
    SELECT m.memory_id FROM memories m WHERE {FILTERS} AND m.tsv @@ %(common)s::tsquery
    ORDER BY m.updated_at DESC LIMIT %(recent)s
)"""
_RANKED = f"""
SELECT {M_COLUMNS}, ts_rank(d.v, %(all)s::tsquery, 1) AS score,
       (SELECT count(*) FROM unnest(%(parts)s::tsquery[]) AS p(part) WHERE d.v @@ p.part)
           AS coverage
FROM memories m
-- A row's tsvector decompressed once, not at each of its nine uses (a third of the ranking's
-- time for a thousand candidates of a few KB each).
CROSS JOIN LATERAL (SELECT m.tsv || ''::tsvector AS v OFFSET 0) AS d
-- An array, not a join: joined, the planner would rather read the whole scope than look up
-- the few candidates by key.
WHERE m.memory_id = ANY(ARRAY(SELECT memory_id FROM pool)) AND {FILTERS}
ORDER BY coverage DESC, score DESC, m.updated_at DESC, m.memory_id DESC
LIMIT %(limit)s
"""
STATS_TTL_S = 300.0
MAX_QUERY_CHARS = 8000


class Search:
    """Searches, with the lexeme statistics they read kept for a few minutes."""

    def __init__(self) -> None:
        self._stats: Stats | None = None

    async def run(
        self,
        conn: psycopg.AsyncConnection[TupleRow],
        scope: Scope,
        query: str,
        *,
        types: Sequence[MemoryType],
        limit: int,
        now: float | None,
    ) -> tuple[list[Any], int]:
        """The ranked rows (each with its score and coverage last), and how many lexemes
        were looked for; in a transaction of ``conn`` (its SET LOCAL ends with it).

        Over 60 lines: which lexemes to look for and the bounded query made of them are one
        transaction's statements, read in the order they run."""
        cur = await conn.execute(_LEXEMES, (clean(query[:MAX_QUERY_CHARS]),))
        lexemes = [str(row[0]) for row in await cur.fetchall()]
        if not lexemes:
            return [], 0
        stats = await self._statistics(conn)
        rarest = sorted(range(len(lexemes)), key=lambda i: stats.rows(lexemes[i]))
        # The planner costs a tsvector match as next to free and would rather read the
        # whole table than the GIN index; every set read here is small by construction.
        await conn.execute("SET LOCAL enable_seqscan = off")
        # A lexeme no memory holds looks rarest of all to the statistics, and finds
        # nothing: a long prompt's new names and typos would leave the search empty.
        held: list[int] = []
        step = MAX_WORDS * _PRESENCE_FACTOR
        for at in range(0, len(rarest), step):  # the rarest first, until enough are held
            looked = rarest[at : at + step]
            # A lexeme the statistics list is held (as of the last ANALYZE): only the
            # rest are probed. GIN scans are bitmap scans, so a probe of a common lexeme
            # would read its whole posting list; a rare one's is short.
            unlisted = [quote(lexemes[i]) for i in looked if lexemes[i] not in stats.freq]
            present: set[str] = set()
            if unlisted:
                cur = await conn.execute(_PRESENT, {"parts": unlisted})
                present = {str(row[0]) for row in await cur.fetchall()}
            held += [i for i in looked
                     if lexemes[i] in stats.freq or quote(lexemes[i]) in present]
            if len(held) >= MAX_WORDS:
                break
        if not held:
            return [], 0
        chosen = [lexemes[i] for i in sorted(held[:MAX_WORDS])]
        plan = bound([round(stats.rows(lex)) for lex in chosen], BUDGET)
        params: dict[str, Any] = {
            "service_id": scope.service_id,
            "team_id": scope.team_id,
            "agent_id": scope.agent_id,
            "user_ref": scope.user,
            "types": list(types),
            "now": time.time() if now is None else now,
            "limit": limit,
            "all": " | ".join(quote(lex) for lex in chosen),
            "parts": [quote(lex) for lex in chosen],
            "rare": " | ".join(quote(chosen[i]) for i in plan.rare),
            "common": " | ".join(quote(chosen[i]) for i in plan.common),
            "cap": 2 * BUDGET,
            "recent": RECENT,
        }
        named = {"rare": _RARE} if plan.rare else {}
        if plan.common:
            named["recent"] = _RECENT
        union = " UNION ".join(f"SELECT memory_id FROM {name}" for name in named)
        ctes = [*named.values(), f"pool AS ({union})"]
        # Planned with the actual lexemes (no generic plan), so that the planner knows a
        # rare lexeme from a common one.
        cur = await conn.execute(f"WITH {', '.join(ctes)} {_RANKED}", params, prepare=False)
        return await cur.fetchall(), len(chosen)

    async def _statistics(self, conn: psycopg.AsyncConnection[TupleRow]) -> Stats:
        """The lexeme statistics, read again every few minutes."""
        stats = self._stats
        # A table not analyzed yet is looked at again soon: it may be filling up.
        ttl = STATS_TTL_S if stats is not None and stats.total else STATS_TTL_S / 10
        if stats is None or time.monotonic() - stats.read_at > ttl:
            cur = await conn.execute(_STATS)
            row = await cur.fetchone()
            stats = Stats.of(row)
            self._stats = stats
        return stats


def hits(rows: Sequence[Any], chosen: int) -> list[Hit]:
    """``Search.run``'s rows as hits, their relevance in (0, 1) as in the SQLite store: the
    share of the question's lexemes matched, ts_rank breaking ties."""
    found = []
    for row in rows:
        score, matched = max(float(row[-2]), 0.0), int(row[-1])
        relevance = (matched + score / (1.0 + score)) / (chosen + 1)
        found.append(Hit(memory_of(row[:-2]), max(relevance, 1e-9)))
    return found


@dataclass(frozen=True, slots=True)
class Stats:
    """How many records hold a lexeme, as the table statistics estimate it."""

    total: float = 0.0  # 0: never analyzed, every lexeme counts as rare
    freq: dict[str, float] = field(default_factory=dict)  # the most common lexemes
    floor: float = 0.0  # the frequency under which a lexeme is not in ``freq``
    read_at: float = field(default_factory=time.monotonic)

    @classmethod
    def of(cls, row: Sequence[Any] | None) -> Stats:
        if row is None or row[0] is None or float(row[0]) <= 0 or not row[1] or not row[2]:
            return cls()
        elems, freqs = list(row[1]), [float(f) for f in row[2]]
        # After one frequency per element: their minimum and maximum.
        floor = freqs[len(elems)] if len(freqs) > len(elems) else min(freqs, default=0.0)
        return cls(float(row[0]), dict(zip(elems, freqs, strict=False)), floor)

    def rows(self, lexeme: str) -> float:
        # A lexeme not in the list is rarer than its rarest: the planner guesses half that.
        return self.total * self.freq.get(lexeme, self.floor / 2)


def _quote(lexeme: str) -> str:
    """A lexeme as a tsquery operand, taken literally."""
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


def quote(lexeme: str) -> str:
    """A lexeme as a tsquery operand, taken literally."""
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"
