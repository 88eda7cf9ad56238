"""The ``<knowledge_tools>`` block: which knowledge assets the model may query, and how.

Pure: the same assets, service id and session give the same bytes, so the provider's prompt
cache stays warm across a session. Built with lxml, never by string concatenation, so no name
or summary can close the block early; every value in a curl command is shell-quoted.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Protocol

from lxml import etree

__all__ = ["CAPABILITY_HEADER", "GUIDANCE", "Listed", "Ranked", "curl_command", "render"]


class Listed(Protocol):
    """One knowledge asset as the block lists it (``knowledge.model.KnowledgeItem`` is one)."""

    @property
    def knowledge_id(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def service_url(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def summary(self) -> str | None: ...
    @property
    def repo_slug(self) -> str | None: ...


class Ranked(Protocol):
    """An asset and the priority it is listed by (``knowledge.model.Asset`` is one)."""

    @property
    def item(self) -> Listed: ...
    @property
    def priority(self) -> int: ...

TAG = "knowledge_tools"
# The header a curl line carries its capability in (knowledge.capability mints and checks it).
CAPABILITY_HEADER = "x-ctxproxy-capability"
MAX_NAME = 200
MAX_SUMMARY = 1000

GUIDANCE = (
    "Knowledge assets of your team that you can query over HTTP with your shell. "
    "A wiki holds written docs (design, decisions, conventions, runbooks): search it before "
    "guessing how something is meant to work. A code graph indexes a repository's symbols and "
    "their relations: use it to find definitions, callers, callees and the impact of a change. "
    "Chat memory holds your own earlier turns and sessions, tool outputs included: search it "
    "when you need something said or seen before that is no longer in view. "
    "Run an asset's list_tools command first to see its tools and their params, then its "
    "call_tool command with the tool_name and params you need (edit the JSON after -d). "
    "Answers are JSON: code 0 means success and the result is in data."
)

# Characters XML 1.0 cannot carry at all; lxml refuses them, so they are dropped.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _clean(text: str, limit: int) -> str:
    text = _NOT_XML.sub("", text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def curl_command(
    url: str, service_id: str, session_id: str | None, payload: dict[str, object],
    capability: str | None = None,
) -> str:
    """One copy-pasteable curl line; every argument goes through ``shlex.quote``."""
    argv = ["curl", "-sS", "-X", "POST", url, "-H", "content-type: application/json"]
    argv += ["-H", f"x-tdai-service-id: {service_id}"]
    # A header value cannot hold control characters; without a clean session, no header.
    if session_id and not _CONTROL.search(session_id):
        argv += ["-H", f"x-conversation-id: {session_id}"]
    if capability and not _CONTROL.search(capability):
        argv += ["-H", f"{CAPABILITY_HEADER}: {capability}"]
    argv += ["-d", json.dumps(payload, ensure_ascii=True)]
    return " ".join(shlex.quote(arg) for arg in argv)


def _example_call(item: Listed) -> dict[str, object]:
    query = "what you are looking for"
    return {"knowledge_id": item.knowledge_id, "tool_name": "search", "params": {"query": query}}


def _knowledge(
    item: Listed, service_id: str, session_id: str | None, capability: str | None
) -> etree._Element:
    el = etree.Element("knowledge")
    el.set("id", item.knowledge_id)
    el.set("type", item.type)
    el.set("service_url", _clean(item.service_url, len(item.service_url)))
    el.set("name", _clean(item.name, MAX_NAME))
    if item.type == "code-graph" and item.repo_slug:
        el.set("repo_slug", _clean(item.repo_slug, MAX_NAME))
    if item.type in ("wiki", "chat-memory") and item.summary:
        etree.SubElement(el, "summary").text = _clean(item.summary, MAX_SUMMARY)
    list_payload: dict[str, object] = {"knowledge_id": item.knowledge_id}
    etree.SubElement(el, "list_tools").text = curl_command(
        item.service_url + "/tools/list", service_id, session_id, list_payload, capability
    )
    etree.SubElement(el, "call_tool").text = curl_command(
        item.service_url + "/tools/call", service_id, session_id, _example_call(item),
        capability,
    )
    return el


def render(
    assets: Sequence[Ranked], *, service_id: str, session_id: str | None,
    capabilities: Mapping[str, str] | None = None,
) -> str | None:
    """The block for ``assets`` (by priority, then id), or None when there are none; each
    asset's curl lines carry its capability from ``capabilities`` (by knowledge id)."""
    if not assets:
        return None
    caps = capabilities or {}
    root = etree.Element(TAG)
    etree.SubElement(root, "guidance").text = GUIDANCE
    for asset in sorted(assets, key=lambda a: (-a.priority, a.item.knowledge_id)):
        item = asset.item
        root.append(_knowledge(item, service_id, session_id, caps.get(item.knowledge_id)))
    text: str = etree.tostring(root, encoding="unicode", pretty_print=True)
    return text.rstrip("\n")
