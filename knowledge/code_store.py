"""A code graph's rows in the knowledge catalogue: the sync that writes them, the queries the
tools read them with.

Synchronous like the catalogue itself: the CLI calls the writes, the server the reads through
``asyncio.to_thread``. References are stored by name and resolved here at query time.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ctxproxy.knowledge.code_parse import ParsedFile
from ctxproxy.knowledge.store import Catalogue, SyncResult

__all__ = ["IndexedFile", "Repo", "identifier_words", "stored_digests", "sync_code"]

Row = dict[str, Any]
KIND = "code-graph"
PREFIX = "cg-"
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")


@dataclass(frozen=True, slots=True)
class Repo:
    """Where the indexed folder comes from, as far as its ``.git`` says."""

    url: str | None
    slug: str | None
    branch: str | None


@dataclass(frozen=True, slots=True)
class IndexedFile:
    """One changed file, read and parsed."""

    path: str  # relative, with forward slashes
    digest: str
    content: str
    parsed: ParsedFile


def identifier_words(name: str) -> list[str]:
    """The words of an identifier, for full-text search: ``parseHTTPConfig`` gives
    ``parse``, ``HTTP``, ``Config``; ``snake_case`` gives ``snake``, ``case``."""
    return _CAMEL.findall(name)


def _words(name: str, qualname: str) -> str:
    parts = [name, qualname.replace(".", " ")]
    parts += identifier_words(qualname)
    return " ".join(parts)


def stored_digests(
    catalogue: Catalogue, service_id: str, team_id: str, source: str
) -> dict[str, str]:
    """Path -> content digest of the files already indexed from ``source``."""
    rows = catalogue.read(
        "SELECT f.path, f.digest FROM code_files f JOIN knowledge k USING (knowledge_id)"
        " WHERE k.service_id = ? AND k.team_id = ? AND k.source = ? AND k.type = ?",
        (service_id, team_id, source, KIND),
    )
    return {r["path"]: r["digest"] for r in rows}


def sync_code(
    catalogue: Catalogue, service_id: str, team_id: str, name: str, summary: str | None,
    source: str, repo: Repo, present: Iterable[str], changed: Sequence[IndexedFile],
    progress: Callable[[int], None] | None = None,
) -> SyncResult:
    """Create or update the code graph of ``source`` in one transaction: ``changed`` files
    replaced, files not in ``present`` removed, the rest left as they are."""
    present = set(present)
    with catalogue.transaction() as conn:
        knowledge_id = catalogue.upsert_knowledge(
            conn, KIND, PREFIX, service_id, team_id, name, summary, source
        )
        conn.execute(
            "INSERT INTO code_graphs VALUES (?, ?, ?, ?) ON CONFLICT (knowledge_id) DO UPDATE"
            " SET repo_url = excluded.repo_url, repo_slug = excluded.repo_slug,"
            " branch = excluded.branch",
            (knowledge_id, repo.url, repo.slug, repo.branch),
        )
        old = {
            r["path"]: (r["id"], r["digest"])
            for r in conn.execute(
                "SELECT id, path, digest FROM code_files WHERE knowledge_id = ?", (knowledge_id,)
            )
        }
        gone = [file_id for path, (file_id, _) in old.items() if path not in present]
        conn.executemany("DELETE FROM code_files WHERE id = ?", [(i,) for i in gone])
        added = updated = 0
        for done, indexed in enumerate(changed, 1):
            previous = old.get(indexed.path)
            if previous is None:
                added += 1
                _insert_file(conn, knowledge_id, indexed)
            elif previous[1] != indexed.digest:  # else another run wrote it meanwhile
                updated += 1
                conn.execute("DELETE FROM code_files WHERE id = ?", (previous[0],))
                _insert_file(conn, knowledge_id, indexed)
            if progress is not None:
                progress(done)
        unchanged = len(present) - added - updated
        return SyncResult(knowledge_id, added, updated, len(gone), unchanged)


def _insert_file(conn: sqlite3.Connection, knowledge_id: str, indexed: IndexedFile) -> None:
    parsed = indexed.parsed
    lines = indexed.content.count("\n") + (0 if indexed.content.endswith("\n") else 1)
    cur = conn.execute(
        "INSERT INTO code_files (knowledge_id, path, language, digest, lines, content)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (knowledge_id, indexed.path, parsed.language, indexed.digest, lines, indexed.content),
    )
    file_id = cur.lastrowid
    ids: list[int] = []
    for symbol in parsed.symbols:
        cur = conn.execute(
            "INSERT INTO code_symbols (file_id, knowledge_id, name, qualname, kind, start_line,"
            " end_line, signature, doc, words) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (file_id, knowledge_id, symbol.name, symbol.qualname, symbol.kind,
             symbol.start_line, symbol.end_line, symbol.signature, symbol.doc,
             _words(symbol.name, symbol.qualname)),
        )
        assert cur.lastrowid is not None
        ids.append(cur.lastrowid)
    conn.executemany(
        "INSERT INTO code_refs (file_id, knowledge_id, name, kind, line, scope_id)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        [(file_id, knowledge_id, r.name, r.kind, r.line,
          None if r.scope is None else ids[r.scope]) for r in parsed.references],
    )
    conn.executemany(
        "INSERT INTO code_imports (file_id, statement, line) VALUES (?, ?, ?)",
        [(file_id, statement, line) for statement, line in parsed.imports],
    )


# --- reads -------------------------------------------------------------------------------------

_SYMBOL = (
    "s.id, s.name, s.qualname, s.kind, f.path, s.start_line, s.end_line, s.signature, s.doc"
)


def counts(catalogue: Catalogue, knowledge_id: str) -> Row:
    """Files and symbols of a graph, and its files per language."""
    languages = catalogue.read(
        "SELECT language, count(*) AS files FROM code_files WHERE knowledge_id = ?"
        " GROUP BY language ORDER BY files DESC, language",
        (knowledge_id,),
    )
    symbols = catalogue.read(
        "SELECT count(*) AS n FROM code_symbols WHERE knowledge_id = ?", (knowledge_id,)
    )
    return {"symbol_count": symbols[0]["n"],
            "languages": {r["language"]: r["files"] for r in languages}}


def search_symbols(
    catalogue: Catalogue, knowledge_id: str, terms: Sequence[str], exact: str, kind: str | None,
    limit: int,
) -> list[Row]:
    """Symbols whose name words or doc match any term (as a prefix), best first: an exact
    name first, then BM25 with the name weighing ten times the doc."""
    if not terms:
        return []
    match = " OR ".join('"' + t.replace('"', '""') + '"*' for t in terms)
    sql = (
        f"SELECT {_SYMBOL}, bm25(code_symbols_fts, 10.0, 1.0) AS rank"
        " FROM code_symbols_fts JOIN code_symbols s ON s.id = code_symbols_fts.rowid"
        " JOIN code_files f ON f.id = s.file_id"
        " WHERE code_symbols_fts MATCH ? AND s.knowledge_id = ?"
    )
    params: list[Any] = [match, knowledge_id]
    if kind is not None:
        sql += " AND s.kind = ?"
        params.append(kind)
    sql += " ORDER BY lower(s.name) = lower(?) DESC, rank, f.path, s.start_line LIMIT ?"
    params += [exact, limit]
    return catalogue.read(sql, params)


def definitions(
    catalogue: Catalogue, knowledge_id: str, name: str, path: str | None, limit: int
) -> list[Row]:
    """Symbols called ``name`` (or, with a dot, of that qualified name), in path order."""
    column = "qualname" if "." in name else "name"
    sql = (
        f"SELECT {_SYMBOL}, f.content FROM code_symbols s JOIN code_files f ON f.id = s.file_id"
        f" WHERE s.knowledge_id = ? AND s.{column} = ?"
    )
    params: list[Any] = [knowledge_id, name]
    if path is not None:
        sql += " AND f.path = ?"
        params.append(path)
    sql += " ORDER BY f.path, s.start_line LIMIT ?"
    params.append(limit)
    return catalogue.read(sql, params)


def references(
    catalogue: Catalogue, knowledge_id: str, name: str, kind: str | None, offset: int,
    limit: int,
) -> tuple[int, list[Row]]:
    """Uses of ``name`` (calls and other references), with the symbol each is in."""
    where = " WHERE r.knowledge_id = ? AND r.name = ?"
    params: list[Any] = [knowledge_id, name]
    if kind is not None:
        where += " AND r.kind = ?"
        params.append(kind)
    total = catalogue.read("SELECT count(*) AS n FROM code_refs r" + where, params)[0]["n"]
    rows = catalogue.read(
        "SELECT f.path, r.line, r.kind, s.qualname AS within, s.kind AS within_kind"
        " FROM code_refs r JOIN code_files f ON f.id = r.file_id"
        " LEFT JOIN code_symbols s ON s.id = r.scope_id" + where
        + " ORDER BY f.path, r.line LIMIT ? OFFSET ?",
        [*params, limit, offset],
    )
    return total, rows


def callers(
    catalogue: Catalogue, knowledge_id: str, name: str, limit: int
) -> tuple[int, list[Row]]:
    """The symbols (or module top levels) that call ``name``, with their first call's line."""
    where = " WHERE r.knowledge_id = ? AND r.name = ? AND r.kind = 'call'"
    total = catalogue.read(
        "SELECT count(*) AS n FROM (SELECT 1 FROM code_refs r" + where
        + " GROUP BY r.file_id, r.scope_id)",
        (knowledge_id, name),
    )[0]["n"]
    rows = catalogue.read(
        "SELECT f.path, s.qualname, s.kind, s.start_line, min(r.line) AS line,"
        " count(*) AS calls FROM code_refs r JOIN code_files f ON f.id = r.file_id"
        " LEFT JOIN code_symbols s ON s.id = r.scope_id" + where
        + " GROUP BY r.file_id, r.scope_id ORDER BY f.path, line LIMIT ?",
        (knowledge_id, name, limit),
    )
    return total, rows


def callees(catalogue: Catalogue, symbol_ids: Sequence[int], limit: int) -> list[Row]:
    """The names called from inside these symbols, with where each call is."""
    marks = ",".join("?" * len(symbol_ids))
    return catalogue.read(
        "SELECT r.name, min(r.line) AS line, count(*) AS calls"
        f" FROM code_refs r WHERE r.scope_id IN ({marks}) AND r.kind = 'call'"
        " GROUP BY r.name ORDER BY line, r.name LIMIT ?",
        [*symbol_ids, limit],
    )


def locate(catalogue: Catalogue, knowledge_id: str, names: Sequence[str]) -> list[Row]:
    """Where each of ``names`` is defined in the graph (a name may have several)."""
    if not names:
        return []
    marks = ",".join("?" * len(names))
    return catalogue.read(
        "SELECT s.name, s.qualname, s.kind, f.path, s.start_line FROM code_symbols s"
        " JOIN code_files f ON f.id = s.file_id"
        f" WHERE s.knowledge_id = ? AND s.name IN ({marks}) ORDER BY f.path, s.start_line",
        [knowledge_id, *names],
    )


def file_row(catalogue: Catalogue, knowledge_id: str, path: str) -> Row | None:
    rows = catalogue.read(
        "SELECT id, path, language, lines, content FROM code_files"
        " WHERE knowledge_id = ? AND path = ?",
        (knowledge_id, path),
    )
    return rows[0] if rows else None


def outline(catalogue: Catalogue, file_id: int) -> tuple[list[Row], list[Row]]:
    """A file's symbols in line order, and its imports."""
    symbols = catalogue.read(
        "SELECT name, qualname, kind, start_line, end_line, signature FROM code_symbols"
        " WHERE file_id = ? ORDER BY start_line, id",
        (file_id,),
    )
    imports = catalogue.read(
        "SELECT statement, line FROM code_imports WHERE file_id = ? ORDER BY line", (file_id,)
    )
    return symbols, imports


def similar_paths(catalogue: Catalogue, knowledge_id: str, path: str, limit: int) -> list[str]:
    """Indexed paths ending like ``path``'s last part, to help after a wrong path."""
    tail = path.rsplit("/", 1)[-1].replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    rows = catalogue.read(
        "SELECT path FROM code_files WHERE knowledge_id = ? AND path LIKE ? ESCAPE '\\'"
        " ORDER BY path LIMIT ?",
        (knowledge_id, "%" + tail, limit),
    )
    return [r["path"] for r in rows]
