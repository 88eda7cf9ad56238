"""Reading one source file into a code graph's rows, with tree-sitter.

Pure and synchronous: bytes in, a ``ParsedFile`` out. Definitions, calls, identifier uses and
imports come from tree-sitter queries (run in C); Python only sorts out nesting (which
definitions are methods, and which definition encloses each use). Names are resolved later,
at query time, by name within the repository, so a file's rows depend on that file alone and
a re-index touches only the files that changed.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from functools import cache

import tree_sitter as ts

__all__ = ["LANGUAGES", "ParsedFile", "Reference", "Symbol", "language_of", "parse"]

# File suffix -> language name.
LANGUAGES: dict[str, str] = {
    ".py": "python", ".pyi": "python",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript",
    ".ts": "typescript", ".mts": "typescript", ".cts": "typescript", ".tsx": "tsx",
    ".go": "go", ".rs": "rust",
}

MAX_SIGNATURE = 200
MAX_DOC = 1000
_UPPER = re.compile(r"^_*[A-Z][A-Z0-9_]*$")
# Uses too common to be worth a row: receivers and one-letter names.
_SKIP_REFS = frozenset({"self", "cls", "this", "super", "_"})
# Nodes around a definition that its doc comment sits above.
_WRAPPERS = frozenset({"export_statement", "lexical_declaration", "type_declaration",
                       "const_declaration"})
_CLASSLIKE = frozenset({"class", "interface", "impl"})


@dataclass(frozen=True, slots=True)
class Symbol:
    """A definition; ``parent`` is the index of the enclosing symbol in the file's list."""

    name: str
    qualname: str
    kind: str  # function, method, class, interface, type, constant
    start_line: int  # 1-based, inclusive
    end_line: int
    signature: str
    doc: str
    parent: int | None


@dataclass(frozen=True, slots=True)
class Reference:
    """A use of a name: ``kind`` is ``call`` or ``ref``; ``scope`` the enclosing symbol."""

    name: str
    kind: str
    line: int
    scope: int | None


@dataclass(slots=True)
class ParsedFile:
    language: str
    symbols: list[Symbol] = field(default_factory=list)
    references: list[Reference] = field(default_factory=list)
    imports: list[tuple[str, int]] = field(default_factory=list)  # (statement text, line)


# Each definitions query captures the whole definition as @def.<kind> and its name as @name.
# ``impl`` is a container (Rust's impl blocks), not a symbol: its methods take its type's name.
# What JavaScript and TypeScript share (their grammars differ in the class name's node).
_ECMASCRIPT_DEFS = """
(function_declaration name: (identifier) @name) @def.function
(generator_function_declaration name: (identifier) @name) @def.function
(method_definition name: (property_identifier) @name) @def.method
(program (lexical_declaration (variable_declarator name: (identifier) @name) @def.var))
(program (export_statement
    declaration: (lexical_declaration (variable_declarator name: (identifier) @name) @def.var)))
"""
_ECMASCRIPT_USES = """
(call_expression function: [(identifier) @call
    (member_expression property: (property_identifier) @call)])
(new_expression constructor: (identifier) @call)
(identifier) @ref
"""
_QUERIES: dict[str, tuple[str, str, str]] = {
    "python": (
        """
        (function_definition name: (identifier) @name) @def.function
        (class_definition name: (identifier) @name) @def.class
        (module (expression_statement (assignment left: (identifier) @name)) @def.constant)
        """,
        """
        (call function: [(identifier) @call (attribute attribute: (identifier) @call)])
        (identifier) @ref
        """,
        "(import_statement) @import (import_from_statement) @import",
    ),
    "javascript": (
        _ECMASCRIPT_DEFS + """
        (class_declaration name: (identifier) @name) @def.class
        """,
        _ECMASCRIPT_USES,
        "(import_statement) @import",
    ),
    "typescript": (
        _ECMASCRIPT_DEFS + """
        (class_declaration name: (type_identifier) @name) @def.class
        (abstract_class_declaration name: (type_identifier) @name) @def.class
        (interface_declaration name: (type_identifier) @name) @def.interface
        (type_alias_declaration name: (type_identifier) @name) @def.type
        (enum_declaration name: (identifier) @name) @def.class
        """,
        _ECMASCRIPT_USES + "(type_identifier) @ref",
        "(import_statement) @import",
    ),
    "go": (
        """
        (function_declaration name: (identifier) @name) @def.function
        (method_declaration name: (field_identifier) @name) @def.method
        (type_declaration (type_spec name: (type_identifier) @name type: (struct_type))
            @def.class)
        (type_declaration (type_spec name: (type_identifier) @name type: (interface_type))
            @def.interface)
        (type_declaration (type_spec name: (type_identifier) @name
            type: [(type_identifier) (qualified_type) (function_type) (map_type)
                   (slice_type) (pointer_type) (channel_type) (array_type)]) @def.type)
        (const_declaration (const_spec name: (identifier) @name) @def.constant)
        """,
        """
        (call_expression function: [(identifier) @call
            (selector_expression field: (field_identifier) @call)])
        (identifier) @ref
        (type_identifier) @ref
        """,
        "(import_spec) @import",
    ),
    "rust": (
        """
        (function_item name: (identifier) @name) @def.function
        (struct_item name: (type_identifier) @name) @def.class
        (enum_item name: (type_identifier) @name) @def.class
        (union_item name: (type_identifier) @name) @def.class
        (trait_item name: (type_identifier) @name) @def.interface
        (type_item name: (type_identifier) @name) @def.type
        (const_item name: (identifier) @name) @def.constant
        (static_item name: (identifier) @name) @def.constant
        (impl_item type: [(type_identifier) @name
                          (generic_type type: (type_identifier) @name)]) @def.impl
        """,
        """
        (call_expression function: [(identifier) @call
            (field_expression field: (field_identifier) @call)
            (scoped_identifier name: (identifier) @call)])
        (macro_invocation macro: (identifier) @call)
        (identifier) @ref
        (type_identifier) @ref
        """,
        "(use_declaration) @import (extern_crate_declaration) @import",
    ),
}
_QUERIES["tsx"] = _QUERIES["typescript"]


def language_of(path: str) -> str | None:
    """The language of a file by its suffix, or None when it is not indexed."""
    dot = path.rfind(".")
    return LANGUAGES.get(path[dot:].lower()) if dot >= 0 else None


def _ts_language(name: str) -> ts.Language:
    # Imported here: each grammar is a compiled module, loaded only when a file needs it.
    if name == "python":
        import tree_sitter_python as grammar

        return ts.Language(grammar.language())
    if name == "javascript":
        import tree_sitter_javascript as grammar_js

        return ts.Language(grammar_js.language())
    if name in ("typescript", "tsx"):
        import tree_sitter_typescript as grammar_ts

        raw = grammar_ts.language_tsx() if name == "tsx" else grammar_ts.language_typescript()
        return ts.Language(raw)
    if name == "go":
        import tree_sitter_go as grammar_go

        return ts.Language(grammar_go.language())
    if name == "rust":
        import tree_sitter_rust as grammar_rs

        return ts.Language(grammar_rs.language())
    raise ValueError(f"no grammar for {name!r}")


@dataclass(frozen=True, slots=True)
class _Grammar:
    parser: ts.Parser
    definitions: ts.Query
    uses: ts.Query
    imports: ts.Query


@cache
def _grammar(name: str) -> _Grammar:
    language = _ts_language(name)
    defs, uses, imports = _QUERIES[name]
    return _Grammar(ts.Parser(language), ts.Query(language, defs), ts.Query(language, uses),
                    ts.Query(language, imports))


def _text(node: ts.Node) -> str:
    return (node.text or b"").decode("utf-8", errors="replace")


def _signature(node: ts.Node) -> str:
    """The definition up to its body (``def f(x):``, ``func (s *S) Get() int``), on one line."""
    body = node.child_by_field_name("body")
    if body is not None and body.start_byte > node.start_byte:
        raw = (node.text or b"")[: body.start_byte - node.start_byte]
        head = " ".join(raw.decode("utf-8", errors="replace").split())
    else:
        head = _text(node).split("\n", 1)[0].strip()
    return head[:MAX_SIGNATURE]


def _python_doc(node: ts.Node) -> str:
    body = node.child_by_field_name("body")
    if body is None or not body.named_children:
        return ""
    first = body.named_children[0]
    if first.type == "expression_statement" and first.named_children \
            and first.named_children[0].type == "string":
        parts = [_text(c) for c in first.named_children[0].named_children
                 if c.type == "string_content"]
        return inspect.cleandoc("".join(parts))
    return ""


def _comment_doc(node: ts.Node) -> str:
    """The comment lines right above a definition (or above its ``export``)."""
    while node.parent is not None and node.parent.type in _WRAPPERS:
        node = node.parent
    lines: list[str] = []
    above = node.prev_named_sibling
    line = node.start_point.row
    while above is not None and above.type in ("comment", "line_comment", "block_comment") \
            and above.end_point.row >= line - 1:
        lines.insert(0, _text(above))
        line = above.start_point.row
        above = above.prev_named_sibling
    text = "\n".join(lines)
    text = re.sub(r"^\s*(/\*+|\*/|\*|///?|//!)", "", text, flags=re.MULTILINE)
    return text.replace("*/", "").strip()


def _kind(language: str, kind: str, node: ts.Node, name: str) -> str | None:
    """The symbol kind for a captured definition; None to drop it."""
    if kind == "var":  # a top-level JS/TS declaration: a function when it holds one
        value = node.child_by_field_name("value")
        if value is not None and value.type in (
            "arrow_function", "function_expression", "function", "generator_function"
        ):
            return "function"
        keyword = node.parent.child(0) if node.parent is not None else None
        return "constant" if keyword is not None and keyword.type == "const" else None
    if kind == "constant" and language == "python" and not _UPPER.match(name):
        return None  # Python has no const: UPPER_CASE module names are the convention
    return kind


def _go_receiver(node: ts.Node) -> str | None:
    receiver = node.child_by_field_name("receiver")
    if receiver is None:
        return None
    found = re.search(r"(\w+)(?:\[[^\]]*\])?\s*\)\s*$", _text(receiver))
    return found.group(1) if found else None


def parse(source: bytes, language: str) -> ParsedFile:
    """The symbols, uses and imports of one file."""
    grammar = _grammar(language)
    root = grammar.parser.parse(source).root_node
    out = ParsedFile(language)
    found, name_starts = _definitions(grammar, root, language)
    spans, symbols = _nest(found, language)

    # Renumber without the impl containers.
    renumber: dict[int, int] = {}
    for index, symbol in enumerate(symbols):
        if symbol is not None:
            renumber[index] = len(out.symbols)
            out.symbols.append(symbol)
    for i, symbol in enumerate(out.symbols):
        if symbol.parent is not None:
            out.symbols[i] = _with_parent(symbol, _nearest(symbol.parent, symbols, renumber))

    _uses(grammar, root, name_starts, spans, symbols, renumber, out)
    for node in ts.QueryCursor(grammar.imports).captures(root).get("import", []):
        out.imports.append((" ".join(_text(node).split())[:MAX_SIGNATURE],
                            node.start_point.row + 1))
    out.imports.sort(key=lambda i: i[1])
    return out


_Found = tuple[int, int, str, str, ts.Node]  # start byte, minus end byte, kind, name, node


def _definitions(
    grammar: _Grammar, root: ts.Node, language: str
) -> tuple[list[_Found], set[int]]:
    """The definitions, outermost first, and where their names start."""
    found: list[_Found] = []
    name_starts: set[int] = set()
    for _, captures in ts.QueryCursor(grammar.definitions).matches(root):
        name_nodes = captures.get("name")
        if not name_nodes:
            continue
        for key, nodes in captures.items():
            if key.startswith("def."):
                node, name = nodes[0], _text(name_nodes[0])
                kind = _kind(language, key[4:], node, name)
                if kind is not None:
                    found.append((node.start_byte, -node.end_byte, kind, name, node))
                    name_starts.add(name_nodes[0].start_byte)
    found.sort(key=lambda f: (f[0], f[1]))
    return found, name_starts


def _nest(
    found: list[_Found], language: str
) -> tuple[list[tuple[int, int]], list[Symbol | None]]:
    """Each definition's byte span and symbol (None for an impl container), its parent the
    innermost definition around it; indexes follow ``found``."""
    spans: list[tuple[int, int]] = []
    kinds: list[str] = []
    symbols: list[Symbol | None] = []
    stack: list[int] = []
    for start, neg_end, kind, name, node in found:
        while stack and spans[stack[-1]][1] <= start:
            stack.pop()
        parent = stack[-1] if stack else None
        parent_name = None
        if parent is not None:
            above = symbols[parent]
            parent_name = above.qualname if above is not None else found[parent][3]
        if kind == "function" and parent is not None and kinds[parent] in _CLASSLIKE:
            kind = "method"
        if language == "go" and kind == "method":
            parent_name = _go_receiver(node) or parent_name
        spans.append((start, -neg_end))
        kinds.append(kind)
        stack.append(len(spans) - 1)
        if kind == "impl":
            symbols.append(None)
            continue
        doc = _python_doc(node) if language == "python" else _comment_doc(node)
        symbols.append(Symbol(
            name=name,
            qualname=f"{parent_name}.{name}" if parent_name else name,
            kind=kind,
            start_line=node.start_point.row + 1,
            end_line=node.end_point.row + 1,
            signature=_signature(node),
            doc=doc[:MAX_DOC],
            parent=parent,
        ))
    return spans, symbols


def _nearest(
    index: int | None, symbols: list[Symbol | None], renumber: dict[int, int]
) -> int | None:
    while index is not None:
        if index in renumber:
            return renumber[index]
        symbol = symbols[index]
        index = symbol.parent if symbol is not None else None
    return None


def _with_parent(symbol: Symbol, parent: int | None) -> Symbol:
    return Symbol(symbol.name, symbol.qualname, symbol.kind, symbol.start_line, symbol.end_line,
                  symbol.signature, symbol.doc, parent)


def _uses(
    grammar: _Grammar, root: ts.Node, name_starts: set[int], spans: list[tuple[int, int]],
    symbols: list[Symbol | None], renumber: dict[int, int], out: ParsedFile,
) -> None:
    captures = ts.QueryCursor(grammar.uses).captures(root)
    calls = captures.get("call", [])
    call_starts = {node.start_byte for node in calls}
    uses = [(n.start_byte, "call", n) for n in calls]
    uses += [(n.start_byte, "ref", n) for n in captures.get("ref", [])
             if n.start_byte not in call_starts and n.start_byte not in name_starts]
    uses.sort(key=lambda u: u[0])
    # One sweep over uses and definitions, both in byte order: the innermost open definition
    # (skipping impl containers) encloses the use.
    seen: set[tuple[str, str, int]] = set()
    stack: list[int] = []
    next_def = 0
    for start, kind, node in uses:
        while next_def < len(spans) and spans[next_def][0] <= start:
            while stack and spans[stack[-1]][1] <= spans[next_def][0]:
                stack.pop()
            stack.append(next_def)
            next_def += 1
        while stack and spans[stack[-1]][1] <= start:
            stack.pop()
        name = _text(node)
        if len(name) < 2 or name in _SKIP_REFS:
            continue
        line = node.start_point.row + 1
        if (name, kind, line) in seen:
            continue
        seen.add((name, kind, line))
        scope = _nearest(stack[-1], symbols, renumber) if stack else None
        out.references.append(Reference(name, kind, line, scope))
