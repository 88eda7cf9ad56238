"""How the knowledge side plugs into the app: its resources, routes and pipeline step."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import AsyncIterator

from aiohttp import web

from ctxproxy.config import Settings
from ctxproxy.config.files import secret_key
from ctxproxy.knowledge.announce import CHANNEL, Changes
from ctxproxy.knowledge.capability import CapabilityKey
from ctxproxy.knowledge.client import Core, Discovery, HttpCore
from ctxproxy.knowledge.routes import EMBEDDED, add_routes, add_tool_routes
from ctxproxy.knowledge.service import EmbeddedCore, LocalCore
from ctxproxy.knowledge.step import KnowledgeStep
from ctxproxy.knowledge.store import FILENAME, Catalogue, Generation
from ctxproxy.plumbing.pg import Listener
from ctxproxy.proxy.app import METRICS, SETTINGS
from ctxproxy.proxy.chat_memory import ChatMemoryAssets
from ctxproxy.request import Step

DISCOVERY = web.AppKey("knowledge_discovery", Discovery)
CAPABILITY = web.AppKey("knowledge_capability", CapabilityKey)
LOCAL = web.AppKey("knowledge_local", ChatMemoryAssets)
LISTENER = web.AppKey("knowledge_listener", Listener)
GENERATION = web.AppKey("knowledge_generation", Generation)
CAPABILITY_KEY_FILE = "capability.key"


def install(app: web.Application) -> None:
    """Add the knowledge side's cleanup contexts and local routes to app.

    Without ``CORE_URL`` the embedded core opens first and its routes are mounted here, so
    the model can curl the wiki service on the proxy's own port; with it, only the tools
    routes of the chat-memory asset are.
    """
    settings = app[SETTINGS]
    token = settings.core_token.get_secret_value() if settings.core_token else None
    app[CAPABILITY] = capability = _capability_key(settings, token)
    # The chat-memory asset is the proxy's own, with the embedded core or a remote one.
    app[LOCAL] = local = ChatMemoryAssets(app, settings)
    if settings.core_url is None:
        app.cleanup_ctx.append(_embedded_ctx)
        add_routes(app, token, capability, local)
    elif settings.memory_enabled:
        add_tool_routes(app, capability, local)
    app.cleanup_ctx.append(_discovery_ctx)


def _capability_key(settings: Settings, core_token: str | None) -> CapabilityKey:
    """From the core token when one is set (replicas configured alike agree on it), else a
    key made once in the data directory."""
    if core_token:
        secret = hmac.new(core_token.encode(), b"ctxproxy-capability-key",
                          hashlib.sha256).digest()
    else:
        secret = secret_key(settings.data_dir, CAPABILITY_KEY_FILE)
    return CapabilityKey(secret, settings.capability_ttl_s)


def step(app: web.Application) -> Step | None:
    """The knowledge pipeline step (called at start-up, after every context is open)."""
    return KnowledgeStep(app[DISCOVERY], service_id=app[SETTINGS].service_id,
                         capability=app.get(CAPABILITY), local=app.get(LOCAL))


async def _embedded_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    path = settings.data_dir / FILENAME
    catalogue = await asyncio.to_thread(Catalogue.open, path)
    app[EMBEDDED] = EmbeddedCore(catalogue, settings.reachable_url + "/v3")
    app[GENERATION] = generation = await asyncio.to_thread(Generation.open, path)
    yield
    generation.close()
    await asyncio.to_thread(catalogue.close)


async def _discovery_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    http: HttpCore | None = None
    core: Core
    generation = None
    if settings.core_url is None:
        # In-process: no self-HTTP call on the hot path; the routes serve the model's curl.
        core = LocalCore(app[EMBEDDED], settings.service_id)
        # A `ctxproxy knowledge` command shows on the next request, not after the TTL.
        generation = app[GENERATION].current
    else:
        token = settings.core_token.get_secret_value() if settings.core_token else None
        core = http = HttpCore(
            settings.core_url,
            service_id=settings.service_id,
            token=token,
            timeout_s=settings.core_timeout_ms / 1000,
        )
    listener = None
    if settings.store_url:
        # Every replica on the store hears a change at once, not after the TTL.
        changes = Changes(settings.service_id, generation)
        generation = changes.current
        app[LISTENER] = listener = Listener(settings.store_url, CHANNEL, changes.heard)
        listener.start()
    discovery = Discovery(
        core,
        service_id=settings.service_id,
        timeout_s=settings.core_timeout_ms / 1000,
        ttl_s=settings.knowledge_ttl_s,
        negative_ttl_s=settings.knowledge_negative_ttl_s,
        lookups=app[METRICS].knowledge_cache,
        failures=app[METRICS].degraded.labels("knowledge"),
        generation=generation,
    )
    app[DISCOVERY] = discovery
    yield
    if listener is not None:
        await listener.close()
    await discovery.close()
    if http is not None:
        await http.aclose()
