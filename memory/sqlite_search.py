"""The SQLite memory store's full-text search: its statements on the FTS5 index, run in a
reader thread or a search process of the store's own; memory.ranking weighs and re-ranks
what they find.

Search at scale: see memory/search.py for the bounding policy. The work stays inside SQLite
(three statements, a few dozen rows back): each row that crosses into Python costs a turn of
the GIL, and under load the event loop holds it.
"""

from __future__ import annotations

import functools
import sqlite3
import threading
from collections.abc import Callable, Sequence

from cachetools import LRUCache

from ctxproxy.memory.model import Hit, Scope
from ctxproxy.memory.ranking import (
    BM25_B,
    BM25_K1,
    RERANK,
    MatchCounts,
    idf_of,
    rarest,
    rerank,
)
from ctxproxy.memory.search import BUDGET, RECENT, Bounds, bound
from ctxproxy.memory.sqlite_conn import read_only
from ctxproxy.memory.sqlite_schema import COLUMNS, M_COLUMNS, json_rows, memory_of, scope_token

__all__ = ["search_in", "searcher"]

_MATCH = "SELECT rowid FROM memories_fts WHERE memories_fts MATCH"
_FILTERS = """m.service_id = :service AND m.team_id = :team AND m.agent_id = :agent
    AND m.user_ref = :user AND (m.expires_at IS NULL OR m.expires_at > :now)
    AND m.type IN (:types)"""
_RECENT_SCAN = 2000


def searcher(path: str) -> Callable[..., list[Hit]]:
    """What a search process runs (``Served``): searches on a connection of its own."""
    return functools.partial(search_in, read_only(path), MatchCounts())


def search_in(
    db: sqlite3.Connection, matches: MatchCounts, scope: Scope, words: Sequence[str],
    types: Sequence[str], limit: int, now: float,
) -> list[Hit]:
    """``SqliteStore.search`` on the connection ``db`` (``matches``: its counts' cache)."""
    words = [w for w in words if _TOKENS(w)]  # a word with no token of the index's matches nothing
    token = scope_token(scope.service_id, scope.team_id, scope.agent_id, scope.user)
    within = _within(token)
    total = int(db.execute("SELECT max(id) FROM memories").fetchone()[0] or 0)

    def count(some: Sequence[str], cap: int) -> list[int]:
        return matches.counts(
            token, some, cap, lambda missing: _counts(db, missing, cap, within), now)

    counted = rarest(count, words)
    if not counted:
        return []  # no word of the query is in any memory of the scope
    df = [n for n, _ in counted]
    idf = [idf_of(total, n) for n in df]
    sql, params = _candidates_sql(
        [_phrase(w) for _, w in counted], idf, bound(df, BUDGET), within
    )
    params.update(service=scope.service_id, team=scope.team_id, agent=scope.agent_id,
                  user=scope.user, now=now, limit=max(limit, RERANK),
                  **{f"type{i}": t for i, t in enumerate(types)})
    sql = sql.replace(":types", ", ".join(f":type{i}" for i in range(len(types))))
    ranked = sorted(json_rows(db, sql, params, "matched, score, updated, memory_id, id, "
                                               "words"), reverse=True)
    if not ranked:
        return []
    marks = ", ".join("?" * len(ranked))
    rows = {
        row[0]: memory_of(row[1:])
        for row in json_rows(
            db, f"SELECT m.id, {M_COLUMNS} FROM memories m WHERE m.id IN ({marks})",
            [r[4] for r in ranked], "id, " + COLUMNS,
        )
    }
    found = [(rows[r[4]], {int(w) for w in str(r[5]).split(",")})
             for r in ranked if r[4] in rows]
    return rerank(found, [w for _, w in counted], idf)[:limit]


def _counts(
    db: sqlite3.Connection, words: Sequence[str], cap: int, within: Callable[[str], str]
) -> list[int]:
    """Each word's matches in the scope, up to ``cap``."""
    each = ", ".join(
        f"(SELECT count(*) FROM ({_MATCH} :w{i} LIMIT :cap))" for i in range(len(words))
    )
    params: dict[str, object] = {f"w{i}": within(_phrase(w)) for i, w in enumerate(words)}
    row = db.execute(f"SELECT {each}", {**params, "cap": cap})
    return [int(n or 0) for n in row.fetchone()]


def _candidates_sql(
    phrases: Sequence[str], idf: Sequence[float], plan: Bounds, within: Callable[[str], str]
) -> tuple[str, dict[str, object]]:
    """One statement: the bounded candidates of the words in scope, alive and of the asked
    types (``:types``), the best first: words matched, BM25 with term frequency 1,
    updated_at, memory_id (the ranking), rowid, and the indices of the words each holds."""
    params: dict[str, object] = {f"p{i}": within(p) for i, p in enumerate(phrases)}
    params.update({f"idf{i}": v for i, v in enumerate(idf)})
    rare = " OR ".join(phrases[i] for i in plan.rare)
    hits = [f"SELECT rowid AS id, {i} AS w, :idf{i} AS idf, 1 AS rare FROM memories_fts "
            f"WHERE memories_fts MATCH :p{i}" for i in plan.rare]
    ctes = []
    pool = "c.rare = 1"
    if plan.common:
        # Which of the rare words' matches and of the newest matches hold a common word.
        params["common"] = within(" OR ".join(phrases[i] for i in plan.common))
        params.update(scan=_RECENT_SCAN, recent=RECENT)
        ctes.append(f"""recent(id) AS MATERIALIZED (
            SELECT m.id FROM ({_MATCH} :common ORDER BY rowid DESC LIMIT :scan) AS f
            CROSS JOIN memories m ON m.id = f.rowid
            WHERE {_FILTERS} LIMIT :recent)""")
        pool += " OR c.id IN (SELECT id FROM recent)"
        for i in plan.common:
            # Rare-word matches and newest matches overlap: each row is found once.
            common = f"SELECT rowid AS id, {i} AS w, :idf{i} AS idf, 0 AS rare FROM memories_fts"
            params[f"n{i}"] = within(f"{phrases[i]} NOT ({rare})" if rare else phrases[i])
            hits.append(f"{common} WHERE memories_fts MATCH :n{i}"
                        " AND rowid >= (SELECT min(id) FROM recent)")
            if rare:
                params[f"q{i}"] = within(f"{phrases[i]} AND ({rare})")
                hits.append(f"{common} WHERE memories_fts MATCH :q{i}")
    ctes += [
        "hits AS (" + " UNION ALL ".join(hits) + ")",
        """cand AS (
            SELECT id, count(*) AS matched, sum(idf) AS idf, group_concat(w) AS words,
                   max(rare) AS rare
            FROM hits GROUP BY id)""",
    ]
    sql = f"""WITH {", ".join(ctes)}
        SELECT c.matched, c.idf / (1.0 + {BM25_K1} * (1.0 - {BM25_B} + {BM25_B} * m.chars
                / avg(m.chars) OVER ())) AS score,
            m.updated_at AS updated, m.memory_id, c.id, c.words
        FROM cand AS c CROSS JOIN memories m ON m.id = c.id
        WHERE ({pool}) AND {_FILTERS}
        ORDER BY 1 DESC, 2 DESC, 3 DESC, 4 DESC
        LIMIT :limit"""
    return sql, params


def _within(token: str) -> Callable[[str], str]:
    """A full-text query confined to the records of the scope whose ``scope_token`` this is."""
    return lambda query: f'scope : "{token}" AND ({query})'


def _phrase(word: str) -> str:
    """``word`` for a full-text query: each of the index's tokens of it quoted, so that none
    is read as query syntax, and all of them required (not as a phrase: the index keeps no
    positions). Most words are one token."""
    quoted = ['"' + t.replace('"', '""') + '"' for t in _TOKENS(word)]
    return quoted[0] if len(quoted) == 1 else "(" + " AND ".join(quoted) + ")"


class _Tokens:
    """A word as the index's tokenizer splits it (unicode61; its stemmer runs on the query).
    Letters and digits of ASCII are one token. Another word may be several, or none: SQLite's
    tables are Unicode 6.1 and Python's newer, so a letter added since is a separator in the
    index and part of a word here. Asked of SQLite itself, on a table of its own, and kept."""

    def __init__(self, size: int = 16384) -> None:
        self._kept: LRUCache[str, tuple[str, ...]] = LRUCache(size)
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def __call__(self, word: str) -> tuple[str, ...]:
        if word.isascii():
            return (word,)
        with self._lock:
            tokens = self._kept.get(word)
            if tokens is None:
                tokens = self._kept[word] = self._split(word)
            return tokens

    def _split(self, word: str) -> tuple[str, ...]:
        if self._db is None:
            self._db = sqlite3.connect(":memory:", isolation_level=None,
                                       check_same_thread=False)
            self._db.executescript(
                "CREATE VIRTUAL TABLE t USING fts5(x, tokenize='unicode61');"
                "CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance');")
        self._db.execute("INSERT INTO t (rowid, x) VALUES (1, ?)", (word,))
        try:
            return tuple(row[0] for row in self._db.execute("SELECT term FROM v ORDER BY offset"))
        finally:
            self._db.execute("DELETE FROM t")


_TOKENS = _Tokens()
