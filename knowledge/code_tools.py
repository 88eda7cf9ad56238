"""The code-graph service's tools: the ``tools/call`` answers for a ``cg-`` asset.

Each tool validates its params, reads the catalogue (``knowledge.code_store``) and returns a
bounded answer: every list has a row limit the caller may lower, and source text is cut at a
character limit with ``truncated`` saying so.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ctxproxy.knowledge import code_store
from ctxproxy.knowledge.code_store import identifier_words
from ctxproxy.knowledge.params import (
    Body,
    ServiceError,
    choice,
    integer,
    optional_string,
    string,
)
from ctxproxy.knowledge.store import Catalogue

__all__ = ["CODE_TOOLS", "call_code_tool"]

MAX_NAME = 300
MAX_PATH = 1000
MAX_SOURCE_CHARS = 20_000
MAX_SPAN_LINES = 400
MAX_DOC_IN_LIST = 300
MAX_OUTLINE = 500
MAX_DEFINED_IN = 5
KINDS = frozenset({"function", "method", "class", "interface", "type", "constant"})
USE_KINDS = frozenset({"call", "ref"})


def _param(kind: str, required: bool, default: Any = None, text: str | None = None) -> Body:
    spec: Body = {"type": kind, "required": required}
    if default is not None:
        spec["default"] = default
    if text:
        spec["description"] = text
    return spec


_NAME = _param("string", True, text="a symbol's name (`get`) or qualified name (`Store.get`)")
_PATH = _param("string", False, text="a file path relative to the repository root")
CODE_TOOLS: list[Body] = [
    {"name": "get_info",
     "description": "The repository's name, slug, branch, file and symbol counts, languages.",
     "params": {}},
    {"name": "search_symbols",
     "description": "Functions, classes, methods and constants whose name or docstring "
                    "matches the query, best first (an exact name first). Also answers as "
                    "`search`.",
     "params": {"query": _param("string", True),
                "kind": _param("string", False, text=", ".join(sorted(KINDS))),
                "limit": _param("integer", False, 10)}},
    {"name": "get_definition",
     "description": "Where a symbol is defined, with its signature, docstring and source.",
     "params": {"name": _NAME, "path": _PATH, "limit": _param("integer", False, 5),
                "max_chars": _param("integer", False, 6000)}},
    {"name": "find_references",
     "description": "Every use of a name in the repository (calls and other references), "
                    "with the symbol each use is in. Names are matched, not types.",
     "params": {"name": _NAME, "kind": _param("string", False, text="call or ref"),
                "offset": _param("integer", False, 0), "limit": _param("integer", False, 50)}},
    {"name": "callers",
     "description": "The functions and methods that call a name (resolved by name).",
     "params": {"name": _NAME, "limit": _param("integer", False, 50)}},
    {"name": "callees",
     "description": "What a function or method calls, each with where it is defined in the "
                    "repository (empty when it is not: a library or builtin).",
     "params": {"name": _NAME, "path": _PATH, "limit": _param("integer", False, 100)}},
    {"name": "file_outline",
     "description": "A file's imports and symbols, in line order, with signatures.",
     "params": {"path": {**_PATH, "required": True}}},
    {"name": "read_span",
     "description": f"Lines of a file (1-based, inclusive; at most {MAX_SPAN_LINES} lines).",
     "params": {"path": {**_PATH, "required": True},
                "start_line": _param("integer", True),
                "end_line": _param("integer", False)}},
]


def _listed(row: Body) -> Body:
    doc = row["doc"]
    if len(doc) > MAX_DOC_IN_LIST:
        doc = doc[: MAX_DOC_IN_LIST - 1] + "…"
    return {"name": row["name"], "qualname": row["qualname"], "kind": row["kind"],
            "path": row["path"], "start_line": row["start_line"], "end_line": row["end_line"],
            "signature": row["signature"], "doc": doc}


def _cut(text: str, limit: int) -> tuple[str, bool]:
    return (text, False) if len(text) <= limit else (text[:limit], True)


class _Tools:
    def __init__(self, catalogue: Catalogue, row: Body) -> None:
        self.catalogue = catalogue
        self.row = row
        self.kid: str = row["knowledge_id"]

    def get_info(self, params: Body) -> Body:
        keys = ("knowledge_id", "type", "name", "summary", "repo_slug", "repo_url", "branch",
                "file_count", "created_at", "updated_at")
        return {**{key: self.row[key] for key in keys},
                **code_store.counts(self.catalogue, self.kid)}

    def search_symbols(self, params: Body) -> Body:
        query = string(params, "query", MAX_NAME)
        kind = choice(params, "kind", KINDS)
        limit = integer(params, "limit", 10, 1, 50)
        # Words only (and the words inside camelCase): never FTS5 query syntax.
        words = re.findall(r"\w+", query)[:16]
        terms = list(dict.fromkeys(words + [w for word in words for w in identifier_words(word)]))
        exact = words[-1] if words else query
        hits = code_store.search_symbols(self.catalogue, self.kid, terms[:32], exact, kind, limit)
        return {"query": query, "results": [_listed(h) for h in hits]}

    def _file(self, params: Body) -> Body:
        path = string(params, "path", MAX_PATH)
        found = code_store.file_row(self.catalogue, self.kid, path)
        if found is None:
            near = code_store.similar_paths(self.catalogue, self.kid, path, 5)
            hint = f"; did you mean: {', '.join(near)}" if near else ""
            raise ServiceError(404, f"no indexed file {path!r} in {self.kid}{hint}")
        return found

    def _definitions(self, params: Body, limit: int) -> list[Body]:
        name = string(params, "name", MAX_NAME)
        path = optional_string(params, "path", MAX_PATH)
        rows = code_store.definitions(self.catalogue, self.kid, name, path, limit)
        if not rows:
            raise ServiceError(404, f"no symbol {name!r} defined in {self.kid}"
                               + (f" in {path}" if path else "")
                               + "; search_symbols finds names")
        return rows

    def get_definition(self, params: Body) -> Body:
        limit = integer(params, "limit", 5, 1, 20)
        max_chars = integer(params, "max_chars", 6000, 100, MAX_SOURCE_CHARS)
        rows = self._definitions(params, limit)
        out = []
        budget = max_chars
        for row in rows:  # one budget for all definitions, so the answer stays bounded
            lines = row["content"].split("\n")[row["start_line"] - 1: row["end_line"]]
            source, truncated = _cut("\n".join(lines), max(budget, 0))
            budget -= len(source)
            out.append({**_listed(row), "doc": row["doc"], "source": source,
                        "truncated": truncated})
        return {"name": params["name"], "definitions": out}

    def find_references(self, params: Body) -> Body:
        name = string(params, "name", MAX_NAME)
        kind = choice(params, "kind", USE_KINDS)
        offset = integer(params, "offset", 0, 0, 1_000_000)
        limit = integer(params, "limit", 50, 1, 200)
        simple = name.rsplit(".", 1)[-1]  # uses are recorded by the name written there
        total, rows = code_store.references(self.catalogue, self.kid, simple, kind, offset, limit)
        return {"name": name, "total": total, "offset": offset, "references": rows}

    def callers(self, params: Body) -> Body:
        name = string(params, "name", MAX_NAME)
        limit = integer(params, "limit", 50, 1, 200)
        simple = name.rsplit(".", 1)[-1]
        total, rows = code_store.callers(self.catalogue, self.kid, simple, limit)
        return {"name": name, "total": total, "callers": [
            {"caller": r["qualname"], "kind": r["kind"] or "module", "path": r["path"],
             "line": r["line"], "calls": r["calls"]} for r in rows
        ]}

    def callees(self, params: Body) -> Body:
        limit = integer(params, "limit", 100, 1, 200)
        symbols = self._definitions(params, 20)
        called = code_store.callees(self.catalogue, [s["id"] for s in symbols], limit)
        where: dict[str, list[Body]] = {}
        for d in code_store.locate(self.catalogue, self.kid, [c["name"] for c in called]):
            places = where.setdefault(d["name"], [])
            if len(places) < MAX_DEFINED_IN:
                places.append({"qualname": d["qualname"], "kind": d["kind"], "path": d["path"],
                               "line": d["start_line"]})
        return {"name": params["name"],
                "symbols": [{"qualname": s["qualname"], "path": s["path"],
                             "line": s["start_line"]} for s in symbols],
                "callees": [{"name": c["name"], "line": c["line"], "calls": c["calls"],
                             "defined_in": where.get(c["name"], [])} for c in called]}

    def file_outline(self, params: Body) -> Body:
        found = self._file(params)
        symbols, imports = code_store.outline(self.catalogue, found["id"])
        return {"path": found["path"], "language": found["language"], "lines": found["lines"],
                "imports": imports[:MAX_OUTLINE], "symbols": symbols[:MAX_OUTLINE],
                "truncated": len(symbols) > MAX_OUTLINE or len(imports) > MAX_OUTLINE}

    def read_span(self, params: Body) -> Body:
        found = self._file(params)
        total = found["lines"]
        start = integer(params, "start_line", 1, 1, max(total, 1))
        end = integer(params, "end_line", min(start + 99, total), start, 10_000_000)
        end = min(end, total, start + MAX_SPAN_LINES - 1)
        lines = found["content"].split("\n")[start - 1: end]
        text, truncated = _cut("\n".join(lines), MAX_SOURCE_CHARS)
        return {"path": found["path"], "start_line": start, "end_line": end,
                "total_lines": total, "text": text, "truncated": truncated}


def call_code_tool(catalogue: Catalogue, row: Body, tool: str, params: Body) -> Body:
    """Run ``tool`` on the code graph ``row``; ServiceError 404 for an unknown tool."""
    tools = _Tools(catalogue, row)
    handlers: dict[str, Callable[[Body], Body]] = {
        "get_info": tools.get_info, "search_symbols": tools.search_symbols,
        "get_definition": tools.get_definition, "find_references": tools.find_references,
        "callers": tools.callers, "callees": tools.callees,
        "file_outline": tools.file_outline, "read_span": tools.read_span,
    }
    # The block's example call names `search` for every asset; here it means search_symbols.
    handler = handlers.get("search_symbols" if tool == "search" else tool)
    if handler is None:
        raise ServiceError(
            404, f"unknown tool {tool!r}; this code graph has: {', '.join(handlers)}"
        )
    return handler(params)
