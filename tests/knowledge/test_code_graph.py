"""Code graphs in the embedded core: `knowledge add-code`, the tools over the proxy's own HTTP
routes, incremental sync, and discovery in the `<knowledge_tools>` block."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream
from tests.knowledge.test_discovery_e2e import WHO, block_of, ids, post, run_curl
from tests.knowledge.wikis import add_wiki, ctxproxy, tool_headers, write_wiki

Capsys = pytest.CaptureFixture[str]

REPO = {
    "store/cache.py": '''"""A small cache."""
from store.backend import load_rows

MAX_ENTRIES = 128


class Cache:
    """Keeps recently read rows in memory."""

    def get(self, key):
        """Return the row for key, loading it on a miss."""
        if key not in self.rows:
            self.rows[key] = load_rows(key)
        return self.rows[key]

    def clear(self):
        self.rows = {}
''',
    "store/backend.py": '''import sqlite3


def load_rows(key):
    """Read the rows of key from the database."""
    return connect().execute("SELECT 1", (key,))


def connect():
    return sqlite3.connect(":memory:")
''',
    "web/app.ts": '''import { renderPage } from "./render";

export const DEFAULT_PORT = 8080;

/** Serves the application's pages. */
export class Server {
  start(): void { renderPage("home"); this.listen(); }
  listen(): void {}
}

interface Handler { handle(): void }
''',
    "web/render.js": '''// Renders one page into HTML.
export function renderPage(name) {
  return escapeHtml(name);
}

const escapeHtml = (s) => s.replace("<", "&lt;");
''',
    "cmd/main.go": '''package main

import "fmt"

// Retries is how often a request is tried.
const Retries = 3

// Worker runs jobs.
type Worker struct{ name string }

// Run runs one job.
func (w *Worker) Run() { fmt.Println(w.name); loadRows() }

func loadRows() int { return Retries }
''',
    "src/lib.rs": '''use std::collections::HashMap;

/// The index of a shard.
pub struct Index { map: HashMap<String, u32> }

impl Index {
    /// Look one key up.
    pub fn lookup(&self, k: &str) -> Option<u32> { normalize(k); self.map.get(k).copied() }
}

fn normalize(k: &str) -> String { k.to_lowercase() }
''',
    "node_modules/dep/index.js": "export function vendored() {}\n",
    ".hidden/secret.py": "def hidden():\n    pass\n",
    "README.md": "# not code\n",
}


def write_repo(root: Path, files: dict[str, str] = REPO) -> Path:
    """``files`` under ``root``, and a ``.git`` whose origin is github.com/acme/shop."""
    write_wiki(root, files)
    git = root / ".git"
    git.mkdir(exist_ok=True)
    (git / "config").write_text(
        '[core]\n\tbare = false\n[remote "origin"]\n'
        "\turl = git@github.com:acme/shop.git\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n"
    )
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    return root


def add_code(capsys: Capsys, data_dir: Path, folder: Path, team: str = "team-1",
             name: str = "Shop") -> tuple[str, str]:
    code, out, err = ctxproxy(capsys, data_dir, "knowledge", "add-code", "--team", team,
                              "--name", name, "--summary", "The shop's code", str(folder))
    assert code == 0, err
    return out.strip(), err


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"  # the one start_proxy uses


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return write_repo(tmp_path / "shop")


@pytest.fixture
def graph_id(repo: Path, data_dir: Path, capsys: Capsys) -> str:
    return add_code(capsys, data_dir, repo)[0]


async def call(url: str, knowledge_id: str, tool: str, **params: Any) -> tuple[int, Any]:
    body = {"knowledge_id": knowledge_id, "tool_name": tool, "params": params}
    async with aiohttp.ClientSession() as s, s.post(
        url + "/v3/tools/call", data=json.dumps(body),
        headers={"x-tdai-service-id": "default", "content-type": "application/json",
                 **tool_headers(url, knowledge_id)},
    ) as r:
        answer = await r.json()
        return answer["code"], answer.get("data", answer["message"])


async def data(url: str, knowledge_id: str, tool: str, **params: Any) -> Any:
    code, result = await call(url, knowledge_id, tool, **params)
    assert code == 0, result
    return result


# --- the CLI -----------------------------------------------------------------------------


def test_add_code_indexes_the_languages_and_skips_hidden_and_dependency_folders(
    repo: Path, data_dir: Path, capsys: Capsys
) -> None:
    kid, err = add_code(capsys, data_dir, repo)
    assert re.fullmatch(r"cg-[0-9a-z]{8}", kid)
    assert "6 files: 6 added, 0 updated, 0 removed, 0 unchanged (6 parsed)" in err
    assert "parsing 6/6 files" in err  # the progress line
    code, out, _ = ctxproxy(capsys, data_dir, "knowledge", "list")
    assert code == 0
    assert f"{kid}  code-graph  team=team-1  files=6  Shop" in out
    assert "repo: acme/shop (main)" in out


def test_add_code_refuses_a_folder_already_indexed_as_a_wiki(
    tmp_path: Path, data_dir: Path, capsys: Capsys
) -> None:
    folder = write_wiki(tmp_path / "docs")
    add_wiki(capsys, data_dir, folder)
    code, _, err = ctxproxy(capsys, data_dir, "knowledge", "add-code", "--team", "team-1",
                            "--name", "x", str(folder))
    assert code == 1 and "already indexed as wiki-" in err


async def test_rerun_reindexes_only_the_changed_and_deleted_files(
    repo: Path, data_dir: Path, capsys: Capsys, start_proxy: ProxyFactory
) -> None:
    kid, _ = add_code(capsys, data_dir, repo)
    kid2, err = add_code(capsys, data_dir, repo)
    assert kid2 == kid
    assert "0 added, 0 updated, 0 removed, 6 unchanged (0 parsed)" in err

    (repo / "cmd" / "main.go").unlink()
    backend = repo / "store" / "backend.py"
    backend.write_text(backend.read_text().replace("def connect():", "def open_db():")
                       .replace("connect()", "open_db()"))
    (repo / "web" / "util.ts").write_text("export function pad(s: string) { return s; }\n")
    _, err = add_code(capsys, data_dir, repo)
    assert "6 files: 1 added, 1 updated, 1 removed, 4 unchanged (2 parsed)" in err

    proxy = await start_proxy()
    assert (await call(proxy.url, kid, "get_definition", name="Worker.Run"))[0] == 404
    assert (await call(proxy.url, kid, "get_definition", name="connect"))[0] == 404
    opened = await data(proxy.url, kid, "get_definition", name="open_db")
    assert opened["definitions"][0]["path"] == "store/backend.py"
    pad = await data(proxy.url, kid, "search_symbols", query="pad")
    assert [r["path"] for r in pad["results"]] == ["web/util.ts"]
    # Untouched files keep their rows (and their callers of the changed file still resolve).
    callers = await data(proxy.url, kid, "callers", name="load_rows")
    assert [c["caller"] for c in callers["callers"]] == ["Cache.get"]
    info = await data(proxy.url, kid, "get_info")
    assert info["file_count"] == 6 and "go" not in info["languages"]


# --- the tools, over the proxy's own routes ----------------------------------------------


async def test_tools_list_names_the_code_graph_tools(
    graph_id: str, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy()
    async with aiohttp.ClientSession() as s, s.post(
        proxy.url + "/v3/tools/list", data=json.dumps({"knowledge_id": graph_id}),
        headers={"x-tdai-service-id": "default", **tool_headers(proxy.url, graph_id)},
    ) as r:
        answer = await r.json()
    assert answer["code"] == 0 and answer["data"]["type"] == "code-graph"
    assert [t["name"] for t in answer["data"]["tools"]] == [
        "get_info", "search_symbols", "get_definition", "find_references", "callers",
        "callees", "file_outline", "read_span"]


async def test_get_info_and_search_symbols(graph_id: str, start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy()
    info = await data(proxy.url, graph_id, "get_info")
    assert (info["name"], info["summary"], info["repo_slug"], info["branch"]) == (
        "Shop", "The shop's code", "acme/shop", "main")
    assert info["file_count"] == 6 and info["languages"] == {
        "python": 2, "go": 1, "javascript": 1, "rust": 1, "typescript": 1}

    # By name (camelCase and snake_case words), the exact name first.
    hits = (await data(proxy.url, graph_id, "search_symbols", query="load_rows"))["results"]
    assert hits[0]["qualname"] == "load_rows" and hits[0]["path"] == "store/backend.py"
    hits = (await data(proxy.url, graph_id, "search_symbols", query="render page"))["results"]
    assert hits[0]["name"] == "renderPage" and hits[0]["doc"] == "Renders one page into HTML."
    # By docstring, and filtered by kind.
    hits = (await data(proxy.url, graph_id, "search_symbols", query="recently read"))["results"]
    assert [h["qualname"] for h in hits] == ["Cache", "load_rows"]  # both words, then one
    hits = (await data(proxy.url, graph_id, "search_symbols", query="shard",
                       kind="class"))["results"]
    assert [(h["qualname"], h["path"]) for h in hits] == [("Index", "src/lib.rs")]
    # The block's example call says `search`: it answers as search_symbols.
    hits = (await data(proxy.url, graph_id, "search", query="Retries"))["results"]
    assert hits[0]["kind"] == "constant" and hits[0]["path"] == "cmd/main.go"
    # Query syntax is never FTS5 syntax.
    assert (await data(proxy.url, graph_id, "search_symbols", query='"* OR NEAR('))[
        "results"] == []


async def test_get_definition_gives_span_signature_doc_and_source(
    graph_id: str, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy()
    found = await data(proxy.url, graph_id, "get_definition", name="Cache.get")
    (get,) = found["definitions"]
    assert (get["kind"], get["path"], get["start_line"], get["end_line"]) == (
        "method", "store/cache.py", 10, 14)
    assert get["signature"] == "def get(self, key):"
    assert get["doc"] == "Return the row for key, loading it on a miss."
    assert get["source"].startswith("    def get(self, key):") and not get["truncated"]
    run = (await data(proxy.url, graph_id, "get_definition", name="Run"))["definitions"][0]
    assert (run["qualname"], run["kind"], run["doc"]) == ("Worker.Run", "method",
                                                          "Run runs one job.")
    lookup = (await data(proxy.url, graph_id, "get_definition", name="lookup"))["definitions"]
    assert lookup[0]["qualname"] == "Index.lookup" and lookup[0]["doc"] == "Look one key up."
    short = await data(proxy.url, graph_id, "get_definition", name="Cache", max_chars=100)
    assert len(short["definitions"][0]["source"]) == 100 and short["definitions"][0]["truncated"]
    code, message = await call(proxy.url, graph_id, "get_definition", name="nope")
    assert code == 404 and "search_symbols" in message


async def test_find_references_callers_and_callees(
    graph_id: str, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy()
    refs = await data(proxy.url, graph_id, "find_references", name="load_rows")
    assert refs["total"] == 2
    assert [(r["path"], r["line"], r["kind"], r["within"]) for r in refs["references"]] == [
        ("store/cache.py", 2, "ref", None), ("store/cache.py", 13, "call", "Cache.get")]
    only_calls = await data(proxy.url, graph_id, "find_references", name="load_rows",
                            kind="call", limit=1)
    assert only_calls["total"] == 1 and len(only_calls["references"]) == 1

    callers = await data(proxy.url, graph_id, "callers", name="renderPage")
    assert [(c["caller"], c["kind"], c["path"]) for c in callers["callers"]] == [
        ("Server.start", "method", "web/app.ts")]
    callers = await data(proxy.url, graph_id, "callers", name="Index.normalize")
    assert [c["caller"] for c in callers["callers"]] == ["Index.lookup"]

    callees = await data(proxy.url, graph_id, "callees", name="Cache.get")
    assert [(c["name"], [d["path"] for d in c["defined_in"]]) for c in callees["callees"]] == [
        ("load_rows", ["store/backend.py"])]
    callees = await data(proxy.url, graph_id, "callees", name="load_rows")
    by_name = {c["name"]: c["defined_in"] for c in callees["callees"]}
    assert by_name["connect"][0]["qualname"] == "connect"
    assert by_name["execute"] == []  # a library's: not in the repository
    go = await data(proxy.url, graph_id, "callees", name="Worker.Run", path="cmd/main.go")
    assert {c["name"] for c in go["callees"]} == {"Println", "loadRows"}


async def test_file_outline_and_read_span(graph_id: str, start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy()
    outline = await data(proxy.url, graph_id, "file_outline", path="web/app.ts")
    assert outline["language"] == "typescript"
    assert outline["imports"] == [{"statement": 'import { renderPage } from "./render";',
                                   "line": 1}]
    assert [(s["qualname"], s["kind"]) for s in outline["symbols"]] == [
        ("DEFAULT_PORT", "constant"), ("Server", "class"), ("Server.start", "method"),
        ("Server.listen", "method"), ("Handler", "interface")]
    span = await data(proxy.url, graph_id, "read_span", path="store/backend.py",
                      start_line=4, end_line=6)
    assert span["text"] == 'def load_rows(key):\n    """Read the rows of key from the database.'\
        '"""\n    return connect().execute("SELECT 1", (key,))'
    assert (span["start_line"], span["end_line"], span["total_lines"]) == (4, 6, 10)
    code, message = await call(proxy.url, graph_id, "file_outline", path="cache.py")
    assert code == 404 and "store/cache.py" in message  # a hint at the right path
    code, _ = await call(proxy.url, graph_id, "file_outline", path="node_modules/dep/index.js")
    assert code == 404


@pytest.mark.parametrize(("tool", "params"), [
    ("search_symbols", {}),
    ("search_symbols", {"query": "x", "limit": 500}),
    ("search_symbols", {"query": "x", "kind": "module"}),
    ("get_definition", {"name": 7}),
    ("get_definition", {"name": "x" * 400}),
    ("find_references", {"name": "x", "kind": "write"}),
    ("read_span", {"path": "store/backend.py", "start_line": 0}),
    ("read_span", {"path": "store/backend.py", "start_line": 99}),
    ("read_span", {"path": "store/backend.py", "start_line": 5, "end_line": 2}),
])
async def test_bad_params_get_a_400_naming_the_param(
    tool: str, params: dict[str, Any], graph_id: str, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy()
    code, message = await call(proxy.url, graph_id, tool, **params)
    assert code == 400
    assert any(key in message for key in ("query", "limit", "kind", "name", "start_line",
                                          "end_line"))


async def test_unknown_tool_and_unknown_id(graph_id: str, start_proxy: ProxyFactory) -> None:
    proxy = await start_proxy()
    code, message = await call(proxy.url, graph_id, "read_page", page_id="x")
    assert code == 404 and "get_definition" in message
    code, _ = await call(proxy.url, "cg-00000000", "get_info")
    assert code == 404


async def test_outputs_are_bounded(
    tmp_path: Path, data_dir: Path, capsys: Capsys, start_proxy: ProxyFactory
) -> None:
    lines = ["def fetch():\n    pass\n"]
    lines += [f"def g{i}():\n    return fetch()\n" for i in range(600)]
    kid, _ = add_code(capsys, data_dir, write_repo(tmp_path / "big", {"big.py": "".join(lines)}))
    proxy = await start_proxy()
    refs = await data(proxy.url, kid, "find_references", name="fetch")
    assert refs["total"] == 600 and len(refs["references"]) == 50
    callers = await data(proxy.url, kid, "callers", name="fetch", limit=200)
    assert callers["total"] == 600 and len(callers["callers"]) == 200
    outline = await data(proxy.url, kid, "file_outline", path="big.py")
    assert len(outline["symbols"]) == 500 and outline["truncated"]
    span = await data(proxy.url, kid, "read_span", path="big.py", start_line=1,
                      end_line=100_000)
    assert span["end_line"] == 400


# --- discovery ---------------------------------------------------------------------------


async def test_a_bound_code_graph_is_in_the_block_and_its_curl_lines_work(
    graph_id: str, tmp_path: Path, data_dir: Path, capsys: Capsys, upstream: FakeUpstream,
    start_proxy: ProxyFactory,
) -> None:
    wiki = add_wiki(capsys, data_dir, write_wiki(tmp_path / "docs"))
    for kid, priority in ((graph_id, "80"), (wiki, "20")):
        ctxproxy(capsys, data_dir, "knowledge", "bind", "--agent", "coder", "--user-key",
                 "uk-secret-1", kid, "--priority", priority)
    proxy = await start_proxy()
    await post(proxy.url, codex.request(codex.session(2), session_id="sess-7"),
               codex.headers(session_id="sess-7", **WHO))
    block = block_of(upstream)
    assert ids(block) == [graph_id, wiki]  # by priority
    assert block is not None
    graph = block.find("knowledge")
    assert graph is not None
    assert (graph.get("type"), graph.get("repo_slug"), graph.get("name")) == (
        "code-graph", "acme/shop", "Shop")
    assert graph.get("service_url") == proxy.url + "/v3"

    listing = await run_curl(graph.findtext("list_tools") or "")
    assert "search_symbols" in [t["name"] for t in listing["data"]["tools"]]
    line = graph.findtext("call_tool") or ""
    assert "x-conversation-id: sess-7" in shlex.split(line)
    found = await run_curl(line.replace("what you are looking for", "Cache"))
    assert found["data"]["results"][0]["qualname"] == "Cache"
    definition = await run_curl(line.replace(
        '"tool_name": "search", "params": {"query": "what you are looking for"}',
        '"tool_name": "get_definition", "params": {"name": "renderPage"}'))
    assert definition["data"]["definitions"][0]["path"] == "web/render.js"


async def test_the_team_catalogue_lists_the_code_graph_without_a_binding(
    graph_id: str, upstream: FakeUpstream, start_proxy: ProxyFactory
) -> None:
    proxy = await start_proxy()
    await post(proxy.url, codex.request(codex.session(1)), codex.headers(**{"x-team-id": "team-1"}))
    assert ids(block_of(upstream)) == [graph_id]
    await post(proxy.url, codex.request(codex.session(1)), codex.headers(**{"x-team-id": "team-2"}))
    assert "<knowledge_tools>" not in (upstream.last.json.get("instructions") or "")


async def test_removing_a_code_graph_removes_its_rows_and_bindings(
    graph_id: str, data_dir: Path, capsys: Capsys, start_proxy: ProxyFactory
) -> None:
    ctxproxy(capsys, data_dir, "knowledge", "bind", "--agent", "coder", "--user-key", "k",
             graph_id)
    assert ctxproxy(capsys, data_dir, "knowledge", "remove", graph_id)[0] == 0
    from ctxproxy.knowledge.store import FILENAME, Catalogue

    catalogue = Catalogue.open(data_dir / FILENAME)
    try:
        for table in ("code_files", "code_symbols", "code_refs", "code_imports",
                      "code_graphs", "bindings", "code_symbols_fts"):
            assert catalogue.read(f"SELECT count(*) AS n FROM {table}")[0]["n"] == 0, table
    finally:
        catalogue.close()
