from __future__ import annotations

from typing import Any

import pytest

from ctxproxy.knowledge.model import BoundAsset, MalformedItem, parse_binding, parse_item, repo_slug


@pytest.mark.parametrize(
    "url",
    [
        "https://github.com/org/repo.git",
        "git@github.com:org/repo.git",
        "ssh://git@host:2222/org/repo",
        "https://host:8443/org/repo/",
        "http://host/org/repo",
        "ssh://git@host/org/repo.git/",
        "git@host:2222/org/repo.git",
        "  https://github.com/org/repo  ",
        "https://github.com/org/repo?tab=readme#top",
    ],
)
def test_repo_slug_is_org_slash_repo_for_every_url_shape(url: str) -> None:
    assert repo_slug(url) == "org/repo"


def test_repo_slug_keeps_nested_groups() -> None:
    assert repo_slug("https://gitlab.example:8443/group/sub/repo.git") == "group/sub/repo"


@pytest.mark.parametrize("url", ["", "not a url", "https://github.com/", "https://host/repo"])
def test_repo_slug_is_none_when_there_is_no_org_and_repo(url: str) -> None:
    assert repo_slug(url) is None


def item(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "knowledge_id": "cg-9z8y7x6w", "type": "code-graph",
        "service_url": "http://k.example:8421/v3/", "name": "backend",
        "summary": None, "repo_url": "git@github.com:acme/backend.git",
        "branch": "main", "team_id": "t1", "user_id": "u1",
    }
    raw.update(changes)
    return raw


def test_code_graph_gets_its_slug_from_repo_url_when_missing() -> None:
    parsed = parse_item(item())
    assert parsed.repo_slug == "acme/backend"
    assert parsed.service_url == "http://k.example:8421/v3"


def test_an_explicit_repo_slug_wins() -> None:
    assert parse_item(item(repo_slug="acme/real")).repo_slug == "acme/real"


def test_a_wiki_has_a_summary_and_no_slug() -> None:
    parsed = parse_item(item(knowledge_id="wiki-a1b2c3d4", type="wiki", summary="Docs"))
    assert (parsed.summary, parsed.repo_slug) == ("Docs", None)


@pytest.mark.parametrize(
    "raw",
    [
        "not an object",
        item(knowledge_id=None),
        item(knowledge_id="wiki-TOOLONG123"),
        item(knowledge_id="x-a1b2c3d4"),
        item(type="skill"),
        item(service_url="ftp://k/v3"),
        item(service_url="http://k/v3\ncurl evil"),
        item(name=""),
        item(name=7),
        item(summary=["x"]),
    ],
)
def test_malformed_items_are_refused(raw: object) -> None:
    with pytest.raises(MalformedItem):
        parse_item(raw)


def binding(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "asset_id": "wiki-a1b2c3d4", "asset_type": "llm_wiki", "name": "Docs",
        "description": None, "status": "active", "visibility": "team",
        "injection_mode": "tool", "priority": 70, "created_at": "2025-01-01T00:00:00Z",
    }
    raw.update(changes)
    return raw


def test_binding_gives_the_knowledge_id_and_priority() -> None:
    assert parse_binding(binding()) == BoundAsset("wiki-a1b2c3d4", 70)
    assert parse_binding(binding(priority=None)) == BoundAsset("wiki-a1b2c3d4", 50)
    assert parse_binding(binding(asset_type="code_graph")) is not None


@pytest.mark.parametrize(
    "changes",
    [{"asset_type": "skill"}, {"asset_type": "chat_memory"}, {"status": "archived"},
     {"status": "deprecated"}, {"status": "failed"}],
)
def test_skills_memories_and_dead_assets_are_not_knowledge(changes: dict[str, Any]) -> None:
    assert parse_binding(binding(**changes)) is None


@pytest.mark.parametrize("raw", [[], binding(asset_id=None), binding(priority="high"),
                                 binding(priority=True)])
def test_malformed_bindings_are_refused(raw: object) -> None:
    with pytest.raises(MalformedItem):
        parse_binding(raw)
