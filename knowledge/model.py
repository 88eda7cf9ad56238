"""Knowledge assets as the core describes them, parsed strictly from its JSON."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "DEFAULT_PRIORITY",
    "Asset",
    "BoundAsset",
    "KnowledgeItem",
    "MalformedItem",
    "parse_binding",
    "parse_item",
    "repo_slug",
]

DEFAULT_PRIORITY = 50
KNOWLEDGE_ID = re.compile(r"^(wiki|cg)-[0-9a-z]{8}$")
# No whitespace or control characters: the URL goes into a one-line curl command.
SERVICE_URL = re.compile(r"^https?://[^\s\x00-\x1f\x7f]+$")
TYPES = frozenset({"wiki", "code-graph"})
# KERNEL_API.md: bindings of these types are knowledge; these statuses are not live.
KNOWLEDGE_ASSET_TYPES = frozenset({"llm_wiki", "code_graph"})
DEAD_STATUSES = frozenset({"archived", "deprecated", "failed"})


class MalformedItem(ValueError):
    """An item of a core answer does not have the documented shape."""


@dataclass(frozen=True, slots=True)
class KnowledgeItem:
    """One knowledge asset (a wiki or a code graph) and where its service is."""

    knowledge_id: str
    type: str
    service_url: str
    name: str
    summary: str | None = None
    repo_slug: str | None = None


@dataclass(frozen=True, slots=True)
class BoundAsset:
    """A knowledge id bound to an agent, with the binding's priority."""

    knowledge_id: str
    priority: int = DEFAULT_PRIORITY


@dataclass(frozen=True, slots=True)
class Asset:
    """What the block shows: an item and the priority it is listed by."""

    item: KnowledgeItem
    priority: int = DEFAULT_PRIORITY

    @property
    def sort_key(self) -> tuple[int, str]:
        return (-self.priority, self.item.knowledge_id)


def _text(raw: dict[str, Any], key: str, *, required: bool) -> str | None:
    value = raw.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value):
        raise MalformedItem(f"{key} is not a non-empty string")
    return value


def parse_item(raw: object) -> KnowledgeItem:
    """A KnowledgeItem from one entry of ``data.items``; MalformedItem when it is not one."""
    if not isinstance(raw, dict):
        raise MalformedItem("item is not an object")
    knowledge_id = _text(raw, "knowledge_id", required=True)
    kind = _text(raw, "type", required=True)
    service_url = _text(raw, "service_url", required=True)
    name = _text(raw, "name", required=True)
    assert knowledge_id and kind and service_url and name  # required=True guarantees it
    if not KNOWLEDGE_ID.match(knowledge_id):
        raise MalformedItem(f"knowledge_id {knowledge_id[:40]!r} has not the documented form")
    if kind not in TYPES:
        raise MalformedItem(f"type {kind[:40]!r} is neither wiki nor code-graph")
    if not SERVICE_URL.match(service_url):
        raise MalformedItem("service_url is not an http(s) URL")
    slug = _text(raw, "repo_slug", required=False)
    repo_url = _text(raw, "repo_url", required=False)
    if kind == "code-graph" and not slug and repo_url:
        slug = repo_slug(repo_url)
    if kind != "code-graph":
        slug = None
    return KnowledgeItem(
        knowledge_id=knowledge_id,
        type=kind,
        service_url=service_url.rstrip("/"),
        name=name,
        summary=_text(raw, "summary", required=False) or None,
        repo_slug=slug or None,
    )


def parse_binding(raw: object) -> BoundAsset | None:
    """The knowledge id of one agent binding; None for skills, memories and dead assets."""
    if not isinstance(raw, dict):
        raise MalformedItem("binding is not an object")
    asset_id = _text(raw, "asset_id", required=True)
    asset_type = _text(raw, "asset_type", required=True)
    status = _text(raw, "status", required=False)
    priority = raw.get("priority", DEFAULT_PRIORITY)
    if priority is None:
        priority = DEFAULT_PRIORITY
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise MalformedItem("priority is not an integer")
    assert asset_id
    if asset_type not in KNOWLEDGE_ASSET_TYPES or status in DEAD_STATUSES:
        return None
    return BoundAsset(asset_id, priority)


_SCP_LIKE = re.compile(r"^(?:[^@/\s]+@)?(?P<host>[^:/\s]+):(?P<path>[^/].*)$")


def repo_slug(repo_url: str) -> str | None:
    """``org/repo`` from a clone URL (https, ssh://, scp-like ``git@host:org/repo``).

    Ports are never part of the slug; nested groups are kept (``group/sub/repo``).
    """
    url = repo_url.strip()
    if "://" in url:
        path = urlsplit(url).path
    else:
        match = _SCP_LIKE.match(url)
        if match is None:
            return None
        path = match["path"]
        # ``git@host:2222/org/repo`` is not valid scp syntax, but people write it meaning a port.
        first, _, rest = path.partition("/")
        if first.isdigit() and rest.count("/") >= 1:
            path = rest
    path = path.strip("/")
    if path.endswith(".git"):
        path = path[: -len(".git")]
    parts = [p for p in path.split("/") if p]
    if len(parts) < 2:
        return None
    return "/".join(parts)
