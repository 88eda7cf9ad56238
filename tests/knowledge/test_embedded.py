"""The embedded core: the CLI that fills it, and its HTTP routes on the proxy's own port."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ctxproxy.knowledge.store import FILENAME
from tests.conftest import ProxyFactory
from tests.knowledge.wikis import add_wiki, ctxproxy, tool_headers, write_wiki

Capsys = pytest.CaptureFixture[str]


async def core_post(url: str, path: str, body: Any, **headers: str) -> tuple[int, dict[str, Any]]:
    hdrs = {"x-tdai-service-id": "default", **tool_headers(url, body.get("knowledge_id")),
            **headers}
    async with aiohttp.ClientSession() as s, s.post(
        url + path, data=json.dumps(body), headers=hdrs
    ) as r:
        return r.status, await r.json()


async def call(url: str, knowledge_id: str, tool: str, **params: Any) -> dict[str, Any]:
    _, answer = await core_post(url, "/v3/tools/call", {
        "knowledge_id": knowledge_id, "tool_name": tool, "params": params})
    return answer


# --- the CLI -----------------------------------------------------------------------------


async def test_add_wiki_rerun_updates_changed_pages_and_removes_deleted_ones(
    tmp_path: Path, capsys: Capsys, start_proxy: ProxyFactory
) -> None:
    data = tmp_path / "data"
    folder = write_wiki(tmp_path / "docs")
    kid = add_wiki(capsys, data, folder)
    assert kid.startswith("wiki-") and len(kid) == 13

    (folder / "ops" / "oncall.md").unlink()
    (folder / "auth.md").write_text("# Authentication\n\nTokens are now signed with ed25519.\n")
    (folder / "glossary.md").write_text("# Glossary\n\nA shard is one slice of the index.\n")
    code, out, err = ctxproxy(capsys, data, "knowledge", "add-wiki", "--team", "team-1",
                              "--name", "Docs v2", "--summary", "new", str(folder))
    assert (code, out.strip()) == (0, kid)
    assert "1 added, 1 updated, 1 removed, 1 unchanged" in err

    proxy = await start_proxy()
    pages = await call(proxy.url, kid, "list_pages")
    assert [p["page_id"] for p in pages["data"]["pages"]] == ["auth", "glossary", "ops/deploy"]
    assert (await call(proxy.url, kid, "search", query="pager"))["data"]["results"] == []
    hits = (await call(proxy.url, kid, "search", query="ed25519"))["data"]["results"]
    assert [h["page_id"] for h in hits] == ["auth"]
    info = (await call(proxy.url, kid, "get_info"))["data"]
    assert (info["name"], info["summary"], info["page_count"]) == ("Docs v2", "new", 3)


def test_list_bind_unbind_remove(tmp_path: Path, capsys: Capsys) -> None:
    data = tmp_path / "data"
    kid = add_wiki(capsys, data, write_wiki(tmp_path / "docs"))
    code, out, _ = ctxproxy(capsys, data, "knowledge", "bind", "--agent", "coder",
                            "--user-key", "uk-very-secret", kid, "--priority", "70")
    assert code == 0
    code, out, _ = ctxproxy(capsys, data, "knowledge", "list")
    assert kid in out and "team=team-1" in out and "pages=3" in out and "coder(70)" in out
    assert "uk-very-secret" not in out
    # Only a digest of the user key is stored.
    assert b"uk-very-secret" not in (data / FILENAME).read_bytes()

    assert ctxproxy(capsys, data, "knowledge", "bind", "--agent", "coder", "--user-key", "k",
                    "wiki-00000000")[0] == 1
    assert ctxproxy(capsys, data, "knowledge", "unbind", "--agent", "coder", "--user-key",
                    "other-key", kid)[0] == 1
    assert ctxproxy(capsys, data, "knowledge", "unbind", "--agent", "coder", "--user-key",
                    "uk-very-secret", kid)[0] == 0
    assert ctxproxy(capsys, data, "knowledge", "remove", kid)[0] == 0
    assert ctxproxy(capsys, data, "knowledge", "remove", kid)[0] == 1
    assert "no knowledge yet" in ctxproxy(capsys, data, "knowledge", "list")[1]


def test_bind_takes_the_user_key_from_the_settings(tmp_path: Path, capsys: Capsys) -> None:
    data = tmp_path / "data"
    kid = add_wiki(capsys, data, write_wiki(tmp_path / "docs"))
    assert ctxproxy(capsys, data, "knowledge", "bind", "--agent", "a", kid)[0] == 1
    code, _, _ = ctxproxy(capsys, data, "knowledge", "bind", "--agent", "a", kid,
                          user_key="uk-env")
    assert code == 0


def test_add_wiki_refuses_a_missing_folder(tmp_path: Path, capsys: Capsys) -> None:
    code, out, err = ctxproxy(capsys, tmp_path / "data", "knowledge", "add-wiki", "--team", "t",
                              "--name", "n", str(tmp_path / "nope"))
    assert code == 1 and "is not a folder" in err and out == ""


# --- the HTTP routes ---------------------------------------------------------------------


@pytest.fixture
async def served(tmp_path: Path, capsys: Capsys,
                 start_proxy: ProxyFactory) -> tuple[str, str]:
    kid = add_wiki(capsys, tmp_path / "data", write_wiki(tmp_path / "docs"))
    proxy = await start_proxy(core_token="core-tok")
    return proxy.url, kid


async def test_wiki_tools_list_and_call(served: tuple[str, str]) -> None:
    url, kid = served
    status, answer = await core_post(url, "/v3/tools/list", {"knowledge_id": kid})
    assert status == 200 and answer["code"] == 0
    assert [t["name"] for t in answer["data"]["tools"]] == [
        "get_info", "search", "list_pages", "read_page"]
    hits = (await call(url, kid, "search", query="how do we roll back a deploy?"))["data"]
    assert hits["results"][0]["page_id"] == "ops/deploy"
    page = (await call(url, kid, "read_page", page_id="auth"))["data"]
    assert page["title"] == "Authentication" and "audience claim" in page["content"]
    # FTS5 syntax in the query is just words.
    weird = await call(url, kid, "search", query='title:"x" OR (NEAR AND * ^')
    assert weird["code"] == 0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"tool_name": "drop_tables"}, "unknown tool 'drop_tables'"),
        ({"tool_name": "read_page", "params": {"page_id": "nope"}}, "no page 'nope'"),
        ({"tool_name": "search", "params": {}}, "query must be a non-empty string"),
        ({"tool_name": "search", "params": {"query": "x", "limit": 10_000}}, "limit must be"),
        ({"tool_name": "search", "params": "x"}, "params must be an object"),
    ],
)
async def test_bad_tool_calls_get_a_nonzero_code_and_a_clear_message(
    served: tuple[str, str], body: dict[str, Any], message: str
) -> None:
    url, kid = served
    status, answer = await core_post(url, "/v3/tools/call", {"knowledge_id": kid, **body})
    assert answer["code"] != 0 and status == answer["code"]
    assert message in answer["message"]


async def test_unknown_knowledge_and_other_tenants_are_not_found(
    served: tuple[str, str],
) -> None:
    url, kid = served
    _, answer = await core_post(url, "/v3/tools/list", {"knowledge_id": "wiki-zzzzzzzz"})
    assert answer["code"] == 404 and "unknown knowledge_id" in answer["message"]
    # A capability is for one service: another tenant's id does not get in with it.
    _, answer = await core_post(url, "/v3/tools/list", {"knowledge_id": kid},
                                **{"x-tdai-service-id": "other_tenant"})
    assert answer["code"] == 403
    _, answer = await core_post(url, "/v3/tools/list", {"knowledge_id": kid},
                                **{"x-tdai-service-id": "other_tenant",
                                   **tool_headers(url, kid, service_id="other_tenant")})
    assert answer["code"] == 404


@pytest.mark.parametrize("service_id", ["", "has space", "x" * 201, "semi;colon"])
async def test_service_id_must_match_the_pattern(served: tuple[str, str],
                                                 service_id: str) -> None:
    url, kid = served
    status, answer = await core_post(url, "/v3/tools/list", {"knowledge_id": kid},
                                     **{"x-tdai-service-id": service_id})
    assert status == 400 and answer["code"] == 400 and "x-tdai-service-id" in answer["message"]


async def test_discovery_routes_need_the_core_token_and_the_tools_do_not(
    served: tuple[str, str],
) -> None:
    url, kid = served
    body = {"team_id": "team-1"}
    assert (await core_post(url, "/v3/knowledge/list", body))[1]["code"] == 401
    assert (await core_post(url, "/v3/knowledge/list", body,
                            authorization="Bearer wrong"))[1]["code"] == 401
    _, answer = await core_post(url, "/v3/knowledge/list", body,
                                authorization="Bearer core-tok")
    assert [i["knowledge_id"] for i in answer["data"]["items"]] == [kid]
    assert answer["data"]["items"][0]["service_url"] == url + "/v3"
    _, answer = await core_post(url, "/v3/meta/agent-fixed-asset/list-with-detail",
                                {"agent_id": "coder"}, authorization="Bearer core-tok")
    assert answer["code"] == 400 and "x-tdai-user-key" in answer["message"]
    assert (await core_post(url, "/v3/tools/list", {"knowledge_id": kid}))[1]["code"] == 0


async def test_not_json_is_a_400_envelope(served: tuple[str, str]) -> None:
    url, kid = served
    async with aiohttp.ClientSession() as s, s.post(
        url + "/v3/tools/list", data=b"{nope",
        headers={"x-tdai-service-id": "default", **tool_headers(url, kid)},
    ) as r:
        answer = await r.json()
    assert r.status == 400 and answer["code"] == 400 and "request_id" in answer
